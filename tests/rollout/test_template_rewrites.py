"""Chat templates that rewrite history (QwQ: opens `<think>` in the generation prompt and drops earlier reasoning; a
Qwen3.5-style template: the same, with XML tool calls) run as several exact token runs: each turn after an
observation starts a run whose prompt is the template's own render of the conversation, and the trained tokens of a
turn are the ones the engine sampled after exactly that prompt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.engines import CALL_REGEX, ForcedCallEngine

from agentic_rl.chat import ChatRenderer
from agentic_rl.environments.tool_env import ToolEnvironment
from agentic_rl.errors import TemplateError
from agentic_rl.rewards import gsm8k_reward
from agentic_rl.rollout.harness import HarnessConfig, run_trajectory
from agentic_rl.rollout.spec import RolloutSpec
from agentic_rl.tools.calculator import CalculatorTool

TEMPLATES = Path(__file__).parents[1] / "fixtures" / "templates"
REASONING = r"I will use the calculator\.\n</think>\n\n"
XML_CALL = (r"<tool_call>\n<function=calculator>\n<parameter=expression>\n[1-9][0-9]? [+*-] [1-9][0-9]?\n"
            r"</parameter>\n</function>\n</tool_call>")  # fmt: skip
REWRITING = {"QwQ": ("Qwen-QwQ-32B.jinja", CALL_REGEX), "Qwen3.5-style": ("qwen3.5-style.jinja", XML_CALL)}


class CountingCalculator(CalculatorTool):
    """The calculator, counting its executions (a tool runs once per call, whatever the runs)."""

    def __init__(self) -> None:
        super().__init__()
        self.executed = 0

    def execute(self, arguments: dict[str, Any]) -> str:
        self.executed += 1
        return super().execute(arguments)


def _tokenizer(tokenizer: Any, template: str) -> Any:
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = (TEMPLATES / template).read_text()
    return tok


async def _rollout(engine, tok, make_task, *, regex: str, rewrites: str = "new_run", renderer=None):
    renderer = renderer or ChatRenderer(tok, history_rewrites=True)
    forced = ForcedCallEngine(engine, tok, forced_turns=2, regex=REASONING + regex)
    calculator = CountingCalculator()
    config = HarnessConfig(max_steps=3, max_prompt_length=1024, max_response_length=768, template_rewrites=rewrites,
                           sampling={"temperature": 0.7, "max_tokens": 64, "seed": 3})  # fmt: skip
    spec = RolloutSpec(engine=forced, environment=ToolEnvironment([calculator]), renderer=renderer, config=config,
                       reward_fn=gsm8k_reward)  # fmt: skip
    trajectory = await run_trajectory(make_task(), 0, spec)
    return trajectory, forced, calculator, renderer


@pytest.mark.parametrize("family", sorted(REWRITING))
async def test_each_turn_after_a_rewrite_is_sampled_and_recorded_after_the_templates_own_render(
    engine, tokenizer, make_task, family
):
    template, regex = REWRITING[family]
    tok = _tokenizer(tokenizer, template)
    with pytest.raises(TemplateError, match="generation prompt"):
        ChatRenderer(tok)  # without history_rewrites such a template is refused at start-up, as before
    traj, forced, calculator, renderer = await _rollout(engine, tok, make_task, regex=regex)

    assert not traj.failed, traj.error
    assert len(forced.calls) == 3 and len(traj.runs) == 3  # one run per turn: each observation made the next
    assert calculator.executed == traj.metrics["tool_calls"] == 2  # each call ran once
    assert traj.metrics["template_runs"] == 2 and traj.metrics["alignment_mismatches"] == 0
    assert traj.metrics["rerendered_prompt_tokens"] == sum(len(run.prompt_ids) for run in traj.runs[1:])
    tools = ToolEnvironment([CalculatorTool()]).schemas
    assistant_at = [k for k, m in enumerate(traj.chat_completions) if m["role"] == "assistant"]
    for turn, ((prompt, _, generation), run, step) in enumerate(zip(forced.calls, traj.runs, traj.steps, strict=True)):
        assert run.prompt_ids == prompt  # the run's prompt is what the engine was given
        history = traj.chat_completions[: assistant_at[turn]]
        assert renderer.decode(prompt) == renderer.render(history, tools, add_generation_prompt=True)
        assert renderer.decode(prompt).endswith("<|im_start|>assistant\n<think>\n")
        sampled = [i for i, m in zip(run.response_ids, run.response_mask, strict=True) if m == 1]
        assert sampled == generation.token_ids[: len(sampled)] and len(sampled) > 0
        assert step.run is run and step.span == (0, len(sampled))
        kept = [lp for lp, m in zip(run.response_logprobs, run.response_mask, strict=True) if m == 1]
        assert kept == generation.logprobs[: len(sampled)]
    for earlier in traj.runs[1:]:  # the rewrite: earlier reasoning is not in the later prompts
        assert "I will use the calculator." not in renderer.decode(earlier.prompt_ids)
    assert "</tool_response>" in renderer.decode(traj.runs[2].prompt_ids)  # both tool results reached the model
    opened = len(renderer.encode("<think>\n"))  # the runs share all but the opened <think> (shared-prefix forward)
    shared = len(traj.runs[1].prompt_ids) - opened
    assert traj.runs[2].prompt_ids[:shared] == traj.runs[1].prompt_ids[:shared]


async def test_refusing_rewrites_fails_the_trajectory_with_the_templates_reason(engine, tokenizer, make_task):
    tok = _tokenizer(tokenizer, "Qwen-QwQ-32B.jinja")
    traj, forced, calculator, _ = await _rollout(engine, tok, make_task, regex=CALL_REGEX, rewrites="refuse")

    assert traj.failed and "TemplateError" in traj.error and "generation prompt" in traj.error
    assert len(forced.calls) == 1 and calculator.executed == 1 and len(traj.runs) == 1


def test_a_template_that_leaves_tool_results_out_is_refused_even_with_rewrites(tokenizer):
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from support.chat_templates import FAMILIES, family_tokenizer

    phi = next(f for f in FAMILIES if f.name == "Phi-3.5")
    with pytest.raises(TemplateError, match="leaves tool messages out of the render"):
        ChatRenderer(family_tokenizer(tokenizer, phi), history_rewrites=True)
    qwen3 = ChatRenderer(family_tokenizer(tokenizer, FAMILIES[0]), history_rewrites=True)
    user = [{"role": "user", "content": "and now?"}]
    assert qwen3.append_problem(user) is not None and qwen3.rerender_problem(user) is None


# ---- templates that must not be followed, and the budget across runs (scripted engine: the template is the test) ----

_CHATML_TURN = '{{- "<|im_start|>" + message.role + "\\n" + content + "<|im_end|>\\n" }}'
_REASONING_DROPPED = ('{%- set content = message.content %}{%- if message.role == "assistant" and not loop.last %}'
                      '{%- set content = content.split("</think>")[-1] %}{%- endif %}')  # fmt: skip
_GENERATION = '{%- if add_generation_prompt %}{{- "<|im_start|>assistant\\n" }}{%- endif %}'


def _template(tokenizer: Any, body: str, generation: str = _GENERATION) -> Any:
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = "{%- for message in messages %}" + body + "{%- endfor %}" + generation
    return tok


def test_a_template_that_hides_later_tool_results_or_has_no_generation_prompt_is_refused(tokenizer):
    hides = _template(tokenizer, '{%- if not (message.role == "tool" and loop.index0 > 4) %}'
                                 '{%- set content = message.content %}' + _CHATML_TURN + '{%- endif %}')  # fmt: skip
    with pytest.raises(TemplateError, match="leaves tool messages out of the render once the conversation is longer"):
        ChatRenderer(hides, history_rewrites=True)
    no_generation = _template(tokenizer, "{%- set content = message.content %}" + _CHATML_TURN, generation="")
    with pytest.raises(TemplateError, match="adds no generation prompt"):
        ChatRenderer(no_generation, history_rewrites=True)
    rewrites = _template(tokenizer, _REASONING_DROPPED + _CHATML_TURN)
    with pytest.raises(TemplateError, match=r"template_rewrites new_run\)$"):  # refused without rewrites, with the hint
        ChatRenderer(rewrites)


async def _scripted(tok: Any, *, max_steps: int, max_response_length: int):
    from support.engines import ScriptedEngine

    def call(question: str, turn: int) -> str:  # a distinct result per turn (7013, 7026, ...)
        expression = f"{turn + 1} * 7013"
        return f'<think>\nstep\n</think>\n<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}\n</tool_call>'

    engine = ScriptedEngine(tok, call)
    config = HarnessConfig(max_steps=max_steps, max_prompt_length=1024, max_response_length=max_response_length)
    spec = RolloutSpec(engine=engine, environment=ToolEnvironment([CalculatorTool()]),
                       renderer=ChatRenderer(tok, history_rewrites=True), config=config)  # fmt: skip
    return await run_trajectory({"id": 0, "question": "What is 6 * 7?", "ground_truth": "42"}, 0, spec)


async def test_an_observation_the_next_prompt_would_not_show_fails_the_trajectory(tokenizer):
    """Past what the start-up check covers (a longer conversation), the template starts leaving tool results out."""
    tok = _template(tokenizer, _REASONING_DROPPED + '{%- if not (message.role == "tool" and loop.index0 > 8) %}'
                               + _CHATML_TURN + '{%- endif %}')  # fmt: skip
    traj = await _scripted(tok, max_steps=6, max_response_length=4096)

    assert traj.failed and "TemplateError" in traj.error and "out of the prompt" in traj.error
    assert len(traj.runs) >= 2  # the runs before were fine


async def test_the_response_budget_binds_across_runs_when_the_template_drops_history(tokenizer):
    """A template that keeps only the system message and the last three: later prompts are no longer than the first, yet the
    trajectory samples no more than max_response_length tokens in all."""
    tok = _template(tokenizer, '{%- if loop.index0 == 0 or loop.revindex0 < 3 %}{%- set content = message.content %}'
                               + _CHATML_TURN + '{%- endif %}')  # fmt: skip
    traj = await _scripted(tok, max_steps=12, max_response_length=120)

    assert not traj.failed, traj.error
    assert len(traj.runs) > 2 and traj.metrics["template_runs"] == len(traj.runs) - 1
    from agentic_rl.rollout.summary import summarize

    summary = summarize([traj], wall_time_s=1.0)  # what `agentic-rl rollout` prints and writes
    assert summary["template_runs"] == len(traj.runs) - 1
    assert summary["rerendered_prompt_tokens"] == sum(len(run.prompt_ids) for run in traj.runs[1:])
    assert sum(run.num_sampled for run in traj.runs) <= 120
    assert traj.termination_reason in ("context_limit", "truncated")
