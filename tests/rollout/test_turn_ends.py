"""How a turn ends, read from the engine's finish_reason and stop_reason, on the real engine and SmolLM2.

Stop strings, a second stop id (`<|endoftext|>` besides the template's `<|im_end|>`), length limits and aborted
requests; the limit that ended a trajectory is named with its numbers. Outputs are steered through the engine's
own sampling (structured outputs, stop ids, a logit bias), never assumed.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest
from support.engines import CALL_REGEX, DelegatingEngine, SteeredEngine

from agentic_rl.chat import ChatRenderer
from agentic_rl.environments.tool_env import ToolEnvironment
from agentic_rl.rollout.harness import HarnessConfig, TerminationReason, run_trajectory
from agentic_rl.rollout.runner import run_tasks
from agentic_rl.rollout.spec import RolloutSpec
from agentic_rl.tools.calculator import CalculatorTool, evaluate_expression
from agentic_rl.train.packing import pack_trajectories

ENDOFTEXT = "<|endoftext|>"


def _config(**overrides: Any) -> HarnessConfig:
    base: dict[str, Any] = {"max_steps": 3, "max_prompt_length": 1024, "max_response_length": 512,
                            "sampling": {"temperature": 0.0, "max_tokens": 96}}  # fmt: skip
    base.update(overrides)
    return HarnessConfig(**base)


async def _run(engine, tokenizer, task, config=None, idx=0):
    renderer = ChatRenderer(tokenizer)
    env = ToolEnvironment([CalculatorTool()], tools_in_system_prompt=not renderer.supports_tools)
    return await run_trajectory(task, idx, RolloutSpec(engine=engine, environment=env, renderer=renderer, config=config or _config()))  # fmt: skip


def _rendered_prompt(tokenizer, messages) -> str:
    """The template's own text for `messages` plus the next generation prompt (tools as `_run` passes them)."""
    tools = [CalculatorTool().schema] if ChatRenderer(tokenizer).supports_tools else None
    return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)


def _sampled_and_inserted(traj) -> tuple[list[int], list[int]]:
    ids, mask = traj.response_tokens.tolist(), traj.response_masks.tolist()
    return [t for t, m in zip(ids, mask, strict=True) if m], [t for t, m in zip(ids, mask, strict=True) if not m]


# --------------------------------------------------------------------------------------------------- stop strings


async def test_a_stop_string_ends_a_complete_turn_without_the_stop_string(engine, tokenizer, make_task):
    steered = SteeredEngine(engine, tokenizer, lambda turn: {"regex": r"The answer is [0-9]{2}\.\nDone"})
    config = _config(sampling={"temperature": 0.0, "max_tokens": 40, "stop": ["\n"]})
    traj = await _run(steered, tokenizer, make_task(), config)

    ((_, _, gen),) = steered.calls
    assert gen.finish_reason == "stop" and gen.stop_reason == "\n"
    assert not traj.failed, traj.error
    assert traj.termination_reason == TerminationReason.ENV_DONE  # a final answer, not "truncated"
    content = traj.chat_completions[-1]["content"]
    assert re.fullmatch(r"The answer is [0-9]{2}\.", content)
    assert tokenizer.decode(traj.response_tokens.tolist()) == content  # the record spells the content exactly
    assert traj.steps[0].info["stop_reason"] == "\n" and traj.steps[0].info["unrecorded_tokens"] >= 1
    assert traj.metrics["generated_tokens"] == traj.num_generated_tokens
    assert traj.metrics["alignment_mismatches"] == 0


async def test_a_stop_string_inside_a_token_keeps_the_text_before_it(engine, tokenizer, make_task):
    steered = SteeredEngine(engine, tokenizer, lambda turn: {"regex": "Hello world"})
    config = _config(sampling={"temperature": 0.0, "max_tokens": 20, "stop": ["ll"]})
    traj = await _run(steered, tokenizer, make_task(), config)

    ((_, _, gen),) = steered.calls
    assert gen.stop_reason == "ll" and "ll" in tokenizer.decode(gen.token_ids)
    assert traj.termination_reason == TerminationReason.ENV_DONE
    assert traj.chat_completions[-1]["content"] == "He"
    sampled, inserted = _sampled_and_inserted(traj)
    # Whatever the tokenization: the sampled ids that lie inside "He", then the rest of "He" re-encoded (mask 0).
    assert tokenizer.decode(sampled + inserted) == "He" == tokenizer.decode(traj.response_tokens.tolist())
    assert sampled == gen.token_ids[: len(sampled)]
    assert traj.metrics["alignment_mismatches"] == 0


async def test_a_tool_call_cut_by_its_closing_tag_as_stop_string_runs_and_the_next_prompt_is_the_render(
    engine, tokenizer, make_task
):
    steered = SteeredEngine(
        engine, tokenizer, lambda turn: {"regex": CALL_REGEX if turn == 0 else r"The answer is [0-9]+\."}
    )
    config = _config(sampling={"temperature": 0.0, "max_tokens": 64, "stop": ["</tool_call>"]})
    traj = await _run(steered, tokenizer, make_task(), config)

    assert not traj.failed, traj.error
    (prompt0, _, gen0), (prompt1, _, gen1) = steered.calls
    assert gen0.stop_reason == "</tool_call>" and gen1.stop_reason is None  # turn 1 ended on <|im_end|>
    call = traj.chat_completions[2]["content"]
    assert call.startswith("<tool_call>\n{") and call.endswith("}\n")  # without the stop string
    expression = call.split('"expression": "')[1].split('"')[0]
    assert traj.chat_completions[3] == {"role": "tool", "content": evaluate_expression(expression)}
    assert traj.metrics["well_formed_calls"] == 1
    # The next prompt is exactly what the template renders for the conversation so far.
    assert tokenizer.decode(prompt1) == _rendered_prompt(tokenizer, traj.chat_completions[:4])
    assert prompt1 == traj.prompt_tokens.tolist() + traj.response_tokens.tolist()[: len(prompt1) - len(prompt0)]
    assert traj.termination_reason == TerminationReason.ENV_DONE
    assert traj.metrics["alignment_mismatches"] == 0


# --------------------------------------------------------------------------------------------------- stop ids


def _endoftext_turns(tokenizer):
    """Turn 0: a forced calculator call; turn 1: three free tokens; each then stopped on <|endoftext|>."""
    eos2 = tokenizer.convert_tokens_to_ids(ENDOFTEXT)

    def steer(turn):
        stop = {"stop_token_ids": [eos2], "logit_bias": {eos2: 100.0}}  # masked until the regex / min_tokens ends
        return {**stop, "regex": CALL_REGEX} if turn == 0 else {**stop, "min_tokens": 3}

    return eos2, steer


@pytest.mark.parametrize("template", ["chatml", "qwen2.5"])
async def test_a_turn_ended_by_a_second_stop_id_is_complete_and_the_template_closes_it(
    engine, tokenizer, qwen_tokenizer, make_task, template
):
    tok = tokenizer if template == "chatml" else qwen_tokenizer
    eos2, steer = _endoftext_turns(tok)
    steered = SteeredEngine(engine, tok, steer)
    traj = await _run(steered, tok, make_task())

    assert not traj.failed, traj.error
    assert traj.termination_reason == TerminationReason.ENV_DONE  # not "context_limit"
    (prompt0, _, gen0), (prompt1, _, gen1) = steered.calls
    for gen in (gen0, gen1):
        assert gen.finish_reason == "stop" and gen.stop_reason == eos2 and gen.token_ids[-1] == eos2
    assistant = [m["content"] for m in traj.chat_completions if m["role"] == "assistant"]
    assert assistant == [tok.decode(gen0.token_ids[:-1]), tok.decode(gen1.token_ids[:-1])]
    assert all(ENDOFTEXT not in text for text in assistant)
    # Turn 0's ids without <|endoftext|>, then the template's <|im_end|> (inserted), then the tool turn's glue.
    n0 = len(gen0.token_ids) - 1
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert prompt1[: len(prompt0) + n0 + 1] == prompt0 + gen0.token_ids[:-1] + [im_end]
    assert tok.decode(prompt1) == _rendered_prompt(tok, traj.chat_completions[:-1])
    assert eos2 not in traj.response_tokens.tolist()
    sampled, _ = _sampled_and_inserted(traj)
    assert sampled == gen0.token_ids[:-1] + gen1.token_ids[:-1]
    assert traj.response_masks.tolist()[n0] == 0  # the inserted <|im_end|>
    logprobs = [lp for lp, m in zip(traj.response_logprobs.tolist(), traj.response_masks.tolist(), strict=True) if m]
    assert logprobs == pytest.approx(gen0.logprobs[:-1] + gen1.logprobs[:-1])
    assert [s.info["unrecorded_tokens"] for s in traj.steps] == [1, 1]
    assert traj.metrics["alignment_mismatches"] == 0


async def test_a_turn_ended_by_the_end_of_turn_token_keeps_it_as_sampled(engine, tokenizer, make_task):
    steered = SteeredEngine(engine, tokenizer, lambda turn: {"regex": r"The answer is [0-9]+\."})
    traj = await _run(steered, tokenizer, make_task())

    ((_, _, gen),) = steered.calls
    assert gen.finish_reason == "stop" and gen.token_ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert traj.response_tokens.tolist() == gen.token_ids and traj.response_masks.tolist() == [1] * len(gen.token_ids)
    assert traj.chat_completions[-1]["content"] == tokenizer.decode(gen.token_ids[:-1])
    assert "unrecorded_tokens" not in traj.steps[0].info
    assert traj.termination_reason == TerminationReason.ENV_DONE
    assert traj.metrics["alignment_mismatches"] == 0


# --------------------------------------------------------------------------------------------------- length


async def test_a_turn_cut_by_max_tokens_is_truncated_and_names_the_limit(engine, tokenizer, make_task):
    steered = SteeredEngine(engine, tokenizer, lambda turn: {"regex": CALL_REGEX})
    traj = await _run(steered, tokenizer, make_task(), _config(sampling={"max_tokens": 6, "temperature": 0.0}))

    assert steered.calls[0][2].finish_reason == "length"
    assert traj.termination_reason == TerminationReason.TRUNCATED and not traj.failed
    assert traj.metrics["tool_calls"] == 0 and traj.num_generated_tokens == 6
    assert traj.metrics["limit"] == "turn 0 was cut after 6 tokens (finish_reason 'length', max_tokens 6)"
    assert traj.metrics["alignment_mismatches"] == 0


async def test_a_turn_cut_by_the_response_budget_is_a_context_limit_naming_the_budget(engine, tokenizer, make_task):
    steered = SteeredEngine(engine, tokenizer, lambda turn: {"regex": CALL_REGEX})
    config = _config(max_response_length=60, sampling={"temperature": 0.0})
    traj = await _run(steered, tokenizer, make_task(), config)

    assert not traj.failed, traj.error
    assert traj.termination_reason == TerminationReason.CONTEXT_LIMIT
    last, turn = traj.steps[-1].info, len(traj.steps) - 1
    if last.get("truncated"):  # the last turn was given what was left of the budget, and used it all
        n = last["sampled_tokens"]
        used = len(traj.response_tokens) - n
        assert traj.metrics["limit"] == (f"turn {turn} sampled {n} tokens: the response budget (max_response_length) "
                                         f"is 60 tokens, {used} tokens used leave {n}")  # fmt: skip
    else:  # or the observation after it did not fit
        assert "observation_not_shown" in last
        assert traj.metrics["limit"].startswith(f"the observation after turn {turn} does not fit: the response budget "
                                                f"(max_response_length) is 60 tokens, {len(traj.response_tokens)} + ")  # fmt: skip


class _Window(DelegatingEngine):
    """The real engine, reporting a smaller model window (the harness clamps every turn to it)."""

    def __init__(self, inner, window: int) -> None:
        super().__init__(inner)
        self.window = window

    @property
    def max_model_len(self) -> int:
        return self.window


async def test_a_turn_cut_by_the_model_window_is_a_context_limit_naming_the_window(engine, tokenizer, make_task):
    renderer = ChatRenderer(tokenizer)
    env = ToolEnvironment([CalculatorTool()])
    prompt = renderer.prompt_ids((await env.reset(make_task())).messages, env.schemas)
    window = _Window(SteeredEngine(engine, tokenizer, lambda turn: {"regex": CALL_REGEX}), len(prompt) + 12)
    traj = await _run(window, tokenizer, make_task(), _config(sampling={"temperature": 0.0}))

    assert traj.termination_reason == TerminationReason.CONTEXT_LIMIT and not traj.failed
    assert traj.num_generated_tokens == 12
    assert traj.metrics["limit"] == (
        f"turn 0 sampled 12 tokens: the model window (max_model_len) is {len(prompt) + 12} tokens, "
        f"prompt {len(prompt)} + response 0 leave 12"
    )


# --------------------------------------------------------------------------------------------------- abort


class _Relabel(DelegatingEngine):
    """The real engine's generation, reported with another finish_reason on turn 1 of task 1 (as vLLM does for a
    request it aborted or failed; its in-process engine drops aborted requests without an output)."""

    def __init__(self, inner, tokenizer, finish_reason: str) -> None:
        super().__init__(inner)
        self.tokenizer, self.finish_reason = tokenizer, finish_reason

    async def generate(self, prompt_ids, sampling):
        generation = await self.inner.generate(prompt_ids, sampling)
        text = self.tokenizer.decode(list(prompt_ids))
        if "task one" in text and text.count("<|im_start|>assistant") == 2:
            generation = dataclasses.replace(generation, finish_reason=self.finish_reason, stop_reason=None)
        return generation


@pytest.mark.parametrize(("finish_reason", "reason"), [("abort", "aborted"), ("error", "aborted")])
async def test_an_aborted_turn_fails_its_trajectory_alone_and_is_never_trained(
    engine, tokenizer, make_task, finish_reason, reason
):
    steered = SteeredEngine(engine, tokenizer, lambda turn: {"regex": CALL_REGEX} if turn == 0 else {})
    relabelled = _Relabel(steered, tokenizer, finish_reason)
    renderer = ChatRenderer(tokenizer)
    env = ToolEnvironment([CalculatorTool()])
    config = _config(sampling={"temperature": 0.0, "max_tokens": 64})
    tasks = [make_task(0, "What is 3 + 4? task zero"), make_task(1, "What is 3 + 4? task one")]

    async def one(task, idx):
        return await run_trajectory(
            task, idx, RolloutSpec(engine=relabelled, environment=env, renderer=renderer, config=config)
        )

    trajs = await run_tasks(tasks, one, n_parallel_agents=2)

    assert not trajs[0].failed and trajs[0].termination_reason != reason
    assert trajs[1].failed and trajs[1].termination_reason == reason
    assert f"finish_reason {finish_reason!r}" in trajs[1].error and "never trained" in trajs[1].error
    aborted_prompts = [p for p, _, _ in steered.calls
                       if "task one" in tokenizer.decode(p) and tokenizer.decode(p).count("<|im_start|>assistant") == 2]  # fmt: skip
    # An aborted turn is the engine's failure: retried (each attempt aborted again), then failed with its kind.
    assert trajs[1].failure_kind == "engine" and len(aborted_prompts) == 1 + trajs[1].metrics["retries_engine"] == 3
    # The record ends where the aborted turn began: nothing of it is kept.
    assert trajs[1].prompt_tokens.tolist() + trajs[1].response_tokens.tolist() == aborted_prompts[-1]
    batch = pack_trajectories(trajs, pad_token_id=tokenizer.pad_token_id)
    assert batch.valid.tolist() == [True, False]
    assert batch.response_mask[1].sum() == 0 and batch.response_mask[0].sum() > 0


# --------------------------------------------------------------------------------------------------- prompt limits


@pytest.mark.parametrize(
    ("words", "max_prompt_length", "names"),
    [(300, 64, ["max_prompt_length is 64"]),
     (2100, 100_000, ["the model window (max_model_len) is 2048, which leaves no room for a response"]),
     (2100, 1000, ["max_prompt_length is 1000", "the model window (max_model_len) is 2048"])],
    ids=["max_prompt_length", "model_window", "both"],
)  # fmt: skip
async def test_a_prompt_too_long_names_the_limit_that_bit(
    engine, tokenizer, make_task, words, max_prompt_length, names
):
    traj = await _run(engine, tokenizer, make_task(question="word " * words),
                      _config(max_prompt_length=max_prompt_length))  # fmt: skip

    assert traj.failed and traj.termination_reason == TerminationReason.PROMPT_TOO_LONG
    assert traj.error.startswith(f"prompt has {len(traj.prompt_tokens)} tokens; ")
    for name in names:
        assert name in traj.error
    if max_prompt_length == 100_000:
        assert "max_prompt_length" not in traj.error
    assert traj.metrics["limit"] == traj.error


# --------------------------------------------------------------------------------------------------- the server


def _serving(engine, tokenizer):
    from agentic_rl.server.serving import OpenAIServing

    return OpenAIServing(engine, tokenizer, model_name="m")


def _chat(content: str, **fields) -> dict:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 64, "temperature": 0.0, **fields}


async def test_the_server_leaves_stop_strings_and_stop_tokens_out_of_its_answers(engine, tokenizer):
    serving = _serving(engine, tokenizer)
    regex = {"structured_outputs": {"regex": r"The answer is [0-9]{2}\.\nDone"}}
    chat = await serving.chat_completion(_chat("What is 6 * 7?", stop=["\n"], **regex))
    (choice,) = chat["choices"]
    assert choice["finish_reason"] == "stop"
    assert re.fullmatch(r"The answer is [0-9]{2}\.", choice["message"]["content"])

    completion = await serving.completion({"prompt": "6 * 7 =", "max_tokens": 40, "temperature": 0.0,
                                           "stop": ["\n"], **regex})  # fmt: skip
    assert re.fullmatch(r"The answer is [0-9]{2}\.", completion["choices"][0]["text"])

    eos2, steer = _endoftext_turns(tokenizer)
    steered = _serving(SteeredEngine(engine, tokenizer, lambda turn: steer(1)), tokenizer)
    (choice,) = (await steered.chat_completion(_chat("Say something.")))["choices"]
    assert choice["token_ids"][-1] == eos2 and choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == tokenizer.decode(choice["token_ids"][:-1])
    assert ENDOFTEXT not in choice["message"]["content"]


async def test_the_server_returns_each_call_of_a_json_array_as_a_tool_call(engine, tokenizer):
    one = r'\{"name": "calculator", "arguments": \{"expression": "[1-9] \+ [1-9]"\}\}'
    tools = [CalculatorTool().schema]  # the server parses tool calls for requests with tools
    body = _chat("Add twice.", max_tokens=96, tools=tools,
                 structured_outputs={"regex": rf"<tool_call>\n\[{one}, {one}\]\n</tool_call>"})  # fmt: skip
    (choice,) = (await _serving(engine, tokenizer).chat_completion(body))["choices"]

    assert choice["finish_reason"] == "tool_calls"
    calls = choice["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["calculator", "calculator"]
    assert all(re.fullmatch(r"[1-9] \+ [1-9]", json.loads(c["function"]["arguments"])["expression"]) for c in calls)


async def test_the_server_names_the_model_window_when_a_prompt_fills_it(engine, tokenizer):
    from agentic_rl.errors import RequestError

    with pytest.raises(RequestError) as caught:
        await _serving(engine, tokenizer).chat_completion(_chat("word " * 2100))
    message = str(caught.value)
    assert re.fullmatch(r"the prompt has \d+ tokens; the model window \(max_model_len\) is 2048, which leaves no room "
                        r"for a completion", message)  # fmt: skip
    assert int(message.split()[3]) >= 2048 and caught.value.status == 400
