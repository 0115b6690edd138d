"""Agent frameworks, used as their documentation shows, against the server; each run is captured exactly.

Every agent makes two model calls: the first is forced to call the calculator (`tool_choice` naming it, or
`required`, enforced by the engine's structured outputs), the second is forced to answer in text
(`tool_choice="none"`) or through the framework's output tool. Nothing depends on what the small model would write
on its own. Each run's calls carry one `X-Trajectory-Id`; the captured trajectory must be one exact token sequence
whose sampled parts are what the framework received.
"""

from __future__ import annotations

import dataclasses
import json
import uuid

import httpx
import pytest
from support.exact import assert_captured_exactly
from support.server import MODEL_NAME

from agentic_rl.parser import ToolCall, parse_tool_calls
from agentic_rl.server.protocol import TRAJECTORY_HEADER
from agentic_rl.tools.calculator import evaluate_expression

QUESTION = "What is 6 * 7? Use the calculator."
MAX_TOKENS = 40


class Calculator:
    """The tool the agents call; remembers what it was asked."""

    def __init__(self) -> None:
        self.expressions: list[str] = []

    def __call__(self, expression: str) -> str:
        """Evaluate an arithmetic expression such as 6 * 7."""
        self.expressions.append(expression)
        try:
            return evaluate_expression(expression)
        except Exception as exc:  # the model may write any string the schema allows
            return f"Error: {exc}"

    def function(self):
        """A plain function with the tool's name, signature and docstring (what frameworks inspect)."""

        def calculator(expression: str) -> str:
            """Evaluate an arithmetic expression such as 6 * 7."""
            return self(expression)

        return calculator


def _record(base_url: str, tid: str) -> dict:
    r = httpx.get(f"{base_url}/v1/trajectories/{tid}", params={"pop": "true"}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def _check_two_call_run(record: dict, tokenizer, calculator: Calculator, answer: str | None, *, streamed: bool):
    """The capture is exact; call 1 sampled the calculator call the tool received, call 2 the answer the agent got."""
    assert_captured_exactly(record, tokenizer, calls=2)
    first, second = record["steps"]
    assert [s["info"]["streamed"] for s in record["steps"]] == [streamed, streamed]
    sampled = tokenizer.decode(first["response_ids"], skip_special_tokens=True)
    (call,) = [c for c in parse_tool_calls(sampled) if isinstance(c, ToolCall)]
    assert call.name == "calculator" and calculator.expressions == [call.arguments["expression"]]
    if answer is not None:
        text = tokenizer.decode(second["response_ids"], skip_special_tokens=True)
        assert text == answer


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_openai_agents_runner_with_a_function_tool(base_url, tokenizer, streamed):
    from agents import (
        Agent,
        AgentHooks,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    tid = f"agents-{uuid.uuid4().hex}"
    calculator = Calculator()

    class AnswerAfterTheTool(AgentHooks):
        async def on_tool_end(self, context, agent, tool, result):
            agent.model_settings = dataclasses.replace(agent.model_settings, tool_choice="none")

    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="local", max_retries=0)
    agent = Agent(
        name="calculator_agent",
        instructions="Use the calculator, then answer.",
        tools=[function_tool(calculator.function())],
        model=OpenAIChatCompletionsModel(model=MODEL_NAME, openai_client=client),
        model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, max_tokens=MAX_TOKENS,
                                     temperature=0.0, extra_headers={TRAJECTORY_HEADER: tid}),
        reset_tool_choice=False,
        hooks=AnswerAfterTheTool(),
    )  # fmt: skip
    if streamed:
        result = Runner.run_streamed(agent, QUESTION, max_turns=3)
        text_deltas = []
        async for event in result.stream_events():
            if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
                text_deltas.append(event.data.delta)
        assert "".join(text_deltas) == result.final_output
    else:
        result = await Runner.run(agent, QUESTION, max_turns=3)
    assert isinstance(result.final_output, str)
    _check_two_call_run(_record(base_url, tid), tokenizer, calculator, result.final_output, streamed=streamed)


@pytest.mark.parametrize("mode", ["invoke", "stream_messages"])
def test_langgraph_react_agent_with_langchain_openai(base_url, tokenizer, mode):
    from langchain_core.messages import AIMessage, AIMessageChunk, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    tid = f"langgraph-{uuid.uuid4().hex}"
    calculator = Calculator()
    calculator_tool = tool(calculator.function())
    llm = ChatOpenAI(model=MODEL_NAME, base_url=f"{base_url}/v1", api_key="local", temperature=0.0,
                     max_tokens=MAX_TOKENS, max_retries=0, default_headers={TRAJECTORY_HEADER: tid})  # fmt: skip

    def model(state, runtime):  # call the calculator first, then answer in text
        answered = isinstance(state["messages"][-1], ToolMessage)
        return llm.bind_tools([calculator_tool], tool_choice="none" if answered else "calculator",
                              parallel_tool_calls=False)  # fmt: skip

    agent = create_react_agent(model, [calculator_tool])
    inputs = {"messages": [("user", QUESTION)]}
    if mode == "invoke":
        messages = agent.invoke(inputs)["messages"]
        answer = messages[-1]
        assert isinstance(answer, AIMessage) and not answer.tool_calls
        text = answer.content
    else:
        chunks = [chunk for chunk, meta in agent.stream(inputs, stream_mode="messages") if isinstance(chunk, AIMessageChunk)]
        calls = [c for c in chunks if c.tool_call_chunks]
        assert calls and calls[0].tool_call_chunks[0]["name"] == "calculator"
        text = "".join(c.content for c in chunks if not c.tool_call_chunks and isinstance(c.content, str))
    _check_two_call_run(_record(base_url, tid), tokenizer, calculator, text, streamed=mode != "invoke")


def test_langchain_with_structured_output(base_url, tokenizer):
    """`with_structured_output` sends `response_format` json_schema; the engine keeps the answer to that schema."""
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    class Answer(BaseModel):
        value: int = Field(ge=0, le=9999)

    tid = f"structured-{uuid.uuid4().hex}"
    llm = ChatOpenAI(model=MODEL_NAME, base_url=f"{base_url}/v1", api_key="local", temperature=0.0, max_tokens=96,
                     max_retries=0, default_headers={TRAJECTORY_HEADER: tid})  # fmt: skip
    answer = llm.with_structured_output(Answer).invoke(QUESTION)
    assert isinstance(answer, Answer)
    (step,) = _record(base_url, tid)["steps"]
    assert Answer.model_validate_json(tokenizer.decode(step["response_ids"], skip_special_tokens=True)) == answer


@pytest.mark.parametrize("kind", ["run", "run_stream", "output_type"])
async def test_pydantic_ai_agent_with_a_tool(base_url, tokenizer, kind):
    from pydantic import BaseModel
    from pydantic_ai import Agent
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.messages import ToolReturnPart
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    tid = f"pydantic-ai-{uuid.uuid4().hex}"
    calculator = Calculator()

    class CalculatorFirst(AbstractCapability):
        """The documented way to vary `tool_choice` per step: the calculator first, then no function tool."""

        def get_model_settings(self):
            def settings(ctx):
                used = any(isinstance(p, ToolReturnPart) for m in ctx.messages for p in getattr(m, "parts", ()))
                return {"tool_choice": "none" if used else ["calculator"]}

            return settings

    class Answer(BaseModel):
        value: int

    model = OpenAIChatModel(MODEL_NAME, provider=OpenAIProvider(base_url=f"{base_url}/v1", api_key="local"))
    settings = {"max_tokens": MAX_TOKENS, "temperature": 0.0, "parallel_tool_calls": False,
                "extra_headers": {TRAJECTORY_HEADER: tid}}  # fmt: skip
    agent = Agent(model, tools=[calculator.function()], capabilities=[CalculatorFirst()], model_settings=settings,
                  output_type=Answer if kind == "output_type" else str)  # fmt: skip
    if kind == "run_stream":
        async with agent.run_stream(QUESTION) as run:
            pieces = [piece async for piece in run.stream_text(delta=True)]
            output = await run.get_output()
        assert "".join(pieces) == output
    else:
        output = (await agent.run(QUESTION)).output
    record = _record(base_url, tid)
    if kind == "output_type":  # the second call is pydantic-ai's output tool, with arguments valid for Answer
        assert isinstance(output, Answer)
        _check_two_call_run(record, tokenizer, calculator, None, streamed=False)
        text = tokenizer.decode(record["steps"][1]["response_ids"], skip_special_tokens=True)
        (call,) = [c for c in parse_tool_calls(text) if isinstance(c, ToolCall)]
        assert Answer.model_validate(call.arguments) == output
    else:
        assert isinstance(output, str)
        _check_two_call_run(record, tokenizer, calculator, output, streamed=kind == "run_stream")
    assert json.dumps(record)
