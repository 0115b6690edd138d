"""`ToolEnvironment` reads calls in the format its chat template teaches: Llama 3's bare JSON calls run only under
`LLAMA3_JSON` (a JSON answer elsewhere stays an answer), Mistral's `[TOOL_CALLS]` under any, and `for_renderer`
takes the format from the renderer's template (no engine: messages are written by hand)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from agentic_rl.environments.tool_env import ToolEnvironment
from agentic_rl.parser import HERMES, LLAMA3_JSON, MISTRAL, QWEN3_CODER, format_tool_call
from agentic_rl.tools.calculator import CalculatorTool

TEMPLATES = Path(__file__).parents[1] / "fixtures" / "templates"
LLAMA_CALL = '{"name": "calculator", "parameters": {"expression": "6 * 7"}}'


async def step(env: ToolEnvironment, content: str):
    sample = await env.reset({"id": "t", "question": "What is 6 * 7?"})
    sample.messages.append({"role": "assistant", "content": content})
    return await env.step(sample)


async def test_a_bare_llama3_call_runs_under_its_format_only():
    observation, done, info = await step(ToolEnvironment([CalculatorTool()], call_format=LLAMA3_JSON), LLAMA_CALL)
    assert (observation, done) == ([{"role": "tool", "content": "42"}], False)
    assert info["tool_calls"] == 1
    observation, done, _ = await step(ToolEnvironment([CalculatorTool()]), LLAMA_CALL)
    assert (observation, done) == ([], True)  # a final answer under a template of another format


async def test_a_json_answer_under_the_llama3_format_ends_the_trajectory():
    env = ToolEnvironment([CalculatorTool()], call_format=LLAMA3_JSON)
    observation, done, info = await step(env, '{"answer": 42}')
    assert (observation, done, info["tool_calls"]) == ([], True, 0)
    observation, done, info = await step(env, "<|python_tag|>calculator.call(expression='6*7')")
    assert done is False and info["tool_errors"] == 1 and observation[0]["content"].startswith("Error: ")


@pytest.mark.parametrize("call_format", [None, HERMES, LLAMA3_JSON, MISTRAL])
async def test_mistral_calls_run_whatever_the_format(call_format):
    content = format_tool_call("calculator", {"expression": "6 * 7"}, MISTRAL, call_id="abcDEF123")
    observation, done, _ = await step(ToolEnvironment([CalculatorTool()], call_format=call_format), content)
    assert (observation, done) == ([{"role": "tool", "content": "42"}], False)


@pytest.mark.parametrize(
    ("template", "call_format"),
    [("meta-llama-Llama-3.1-8B-Instruct.jinja", LLAMA3_JSON), ("mistralai-Mistral-Nemo-Instruct-2407.jinja", MISTRAL),
     ("qwen3-coder-style.jinja", QWEN3_CODER), ("Qwen-Qwen2.5-7B-Instruct.jinja", HERMES)],
)  # fmt: skip
def test_for_renderer_reads_the_templates_format(template, call_format):
    renderer = SimpleNamespace(supports_tools=True, tokenizer=SimpleNamespace(chat_template=(TEMPLATES / template).read_text()))
    assert ToolEnvironment.for_renderer([CalculatorTool()], renderer).call_format == call_format
