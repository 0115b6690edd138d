"""`SampleLedger` and `RecordingEngine`: every sampled span of a run must be what the engine sampled.

The light tests use a tiny deterministic engine written here; the real-engine tests run multi-turn tool-agent
trajectories (and the OpenAI-compatible server's capture) over the session's vLLM engine wrapped in a
`RecordingEngine`, and assert only invariants, never what the model writes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pytest
import torch

from agentic_rl.engine.base import Engine, Generation, StreamingEngine, TrainableEngine
from agentic_rl.engine.ledger import RecordingEngine, RunCheck, SampleLedger
from agentic_rl.types import INSERTED_VERSION, TokenRun

END = 2  # the fake template's end-of-turn id
GLUE = [7, 8, 9]  # what the harness inserts between turns


class FakeEngine:
    """Deterministic: samples `length` ids that depend on the whole prompt, closed by `END`; logprobs vary too."""

    def __init__(self, length: int = 5) -> None:
        self.length = length
        self.weight_version = 0
        self.max_model_len = 4096

    async def generate(self, prompt_ids: Sequence[int], sampling) -> Generation:
        seed = sum((i + 1) * t for i, t in enumerate(prompt_ids))
        ids = [100 + (seed * 31 + 17 * i) % 900 for i in range(self.length)] + [END]
        logprobs = [-((seed + i) % 97) / 37.0 - 0.001 for i in range(len(ids))]
        return Generation(ids, logprobs, "stop")


class FakeStreamingEngine(FakeEngine):
    async def stream(self, prompt_ids: Sequence[int], sampling) -> AsyncIterator[Generation]:
        whole = await self.generate(prompt_ids, sampling)
        for i in range(0, len(whole.token_ids), 2):
            last = i + 2 >= len(whole.token_ids)
            yield Generation(whole.token_ids[i : i + 2], whole.logprobs[i : i + 2], "stop" if last else "")


class FakeTrainableEngine(FakeEngine):
    async def update_weights(self, named_tensors) -> float:
        self.weight_version += 1
        return 0.0

    async def pause_generation(self) -> None:
        return None

    async def resume_generation(self) -> None:
        return None

    async def sleep(self, level: int = 1) -> bool:
        return False

    async def wake_up(self, tags=None) -> bool:
        return False

    async def close(self) -> None:
        return None


async def _turn(engine: Engine, run: TokenRun, keep_end: bool = True) -> Generation:
    """One assistant turn the way the harness records it: sampled ids (without the end token unless kept)."""
    generation = await engine.generate(run.prompt_ids + run.response_ids, {})
    kept = len(generation.token_ids) - (0 if keep_end else 1)
    run.sample(generation.token_ids[:kept], generation.logprobs[:kept], engine.weight_version)
    return generation


async def _two_turns(engine: Engine) -> TokenRun:
    run = TokenRun([1, 5, 6])
    await _turn(engine, run)
    run.insert(GLUE)
    await _turn(engine, run)
    return run


def _reason(ledger: SampleLedger, run: TokenRun) -> str | None:
    return ledger.check_run(run).reason


# ---- the check --------------------------------------------------------------------------------------------------


async def test_an_exact_run_passes_and_gets_its_weight_versions():
    engine = RecordingEngine(FakeEngine())
    run = TokenRun([1, 5, 6])
    await _turn(engine, run)
    check = engine.ledger.check_run(run)
    assert check == RunCheck(None, [0] * len(run.response_ids)) and check.ok
    run.weight_versions = None  # a run without versions gets them from the ledger
    assert engine.ledger.check_run(run).weight_versions == [0] * len(run.response_ids)


async def test_a_kept_prefix_passes_when_the_stop_token_was_dropped():
    engine = RecordingEngine(FakeEngine())
    run = TokenRun([1, 5, 6])
    generation = await _turn(engine, run, keep_end=False)
    run.insert([END, *GLUE])  # the template closes the turn: inserted with mask 0
    assert run.response_ids[: len(generation.token_ids)] == generation.token_ids
    check = engine.ledger.check_run(run)
    assert check.ok, check.reason
    assert check.weight_versions == [0] * (len(generation.token_ids) - 1) + [INSERTED_VERSION] * 4


async def test_a_tampered_token_fails():
    engine = RecordingEngine(FakeEngine())
    run = await _two_turns(engine)
    second = len(run.response_ids) - 2
    run.response_ids[second] += 1
    assert f"response token {second} is" in _reason(engine.ledger, run)


async def test_a_tampered_logprob_fails_but_float32_rounding_passes():
    engine = RecordingEngine(FakeEngine())
    run = await _two_turns(engine)
    run.response_logprobs = torch.tensor(run.response_logprobs, dtype=torch.float32).tolist()  # via a tensor
    assert _reason(engine.ledger, run) is None
    run.response_logprobs[1] -= 1e-3
    assert "logprob of response token 1" in _reason(engine.ledger, run)


async def test_missing_logprobs_and_inconsistent_lengths_are_named():
    engine = RecordingEngine(FakeEngine())
    run = await _two_turns(engine)
    assert "no logprobs" in _reason(
        engine.ledger, TokenRun(run.prompt_ids, run.response_ids, run.response_mask, None, None)
    )
    n = len(run.response_ids)
    short = TokenRun(run.prompt_ids, run.response_ids, run.response_mask[:-1], run.response_logprobs, None)
    assert _reason(engine.ledger, short) == f"response_mask has {n - 1} entries, response_ids has {n}"
    assert "weight_versions has 1 entries" in _reason(engine.ledger, TokenRun(
        run.prompt_ids, run.response_ids, run.response_mask, run.response_logprobs, [0]))  # fmt: skip
    bad_mask = TokenRun(run.prompt_ids, run.response_ids, [2] * n, run.response_logprobs, None)
    assert "0 and 1" in _reason(engine.ledger, bad_mask)
    # a run with no sampled token and no logprobs has nothing to check
    assert SampleLedger().check_run(TokenRun([1], [7], [0], None, None)) == RunCheck(None, [INSERTED_VERSION])


async def test_a_span_whose_context_was_altered_fails():
    engine = RecordingEngine(FakeEngine())
    run = await _two_turns(engine)
    glue_at = run.response_mask.index(0)
    run.response_ids[glue_at + 1] = 55  # an inserted token changed: the second turn's context is not what it saw
    assert "never sampled from the context" in _reason(engine.ledger, run)
    run = await _two_turns(engine)
    run.prompt_ids[0] = 3
    assert "never sampled from the context at its start" in _reason(engine.ledger, run)


async def test_a_weight_version_that_differs_from_the_ledger_fails():
    inner = FakeTrainableEngine()
    engine = RecordingEngine(inner)
    run = TokenRun([1, 5, 6])
    await _turn(engine, run)
    run.insert(GLUE)
    await engine.update_weights([])  # delegated: the inner engine's version moves
    assert engine.weight_version == inner.weight_version == 1
    await _turn(engine, run)
    check = engine.ledger.check_run(run)
    assert check.ok and set(check.weight_versions) == {0, 1, INSERTED_VERSION}
    run.weight_versions[0] = 1
    assert "weight version of response token 0 is 1, the engine sampled it at 0" in _reason(engine.ledger, run)


def test_a_run_of_per_token_versions_is_checked_token_by_token():
    # one output whose first two tokens were sampled before a weight update and its last two after it
    ledger = SampleLedger()
    ledger.record([1, 5, 6], [10, 11, 12, 13], [-0.5, -0.25, -1.0, -2.0], [3, 3, 4, 4])
    assert ledger.samples([1, 5, 6])[0].weight_versions.tolist() == [3, 3, 4, 4]
    run = TokenRun([1, 5, 6])
    run.sample([10, 11, 12, 13], [-0.5, -0.25, -1.0, -2.0], [3, 3, 4, 4])
    run.insert(GLUE)
    check = ledger.check_run(run)
    assert check.ok and check.weight_versions == [3, 3, 4, 4] + [INSERTED_VERSION] * len(GLUE)
    kept_prefix = TokenRun([1, 5, 6])  # a prefix of the output, with the versions of its tokens
    kept_prefix.sample([10, 11, 12], [-0.5, -0.25, -1.0], [3, 3, 4])
    assert ledger.check_run(kept_prefix).weight_versions == [3, 3, 4]
    one_version = TokenRun([1, 5, 6])  # every token stamped with the version the request was sent at
    one_version.sample([10, 11, 12, 13], [-0.5, -0.25, -1.0, -2.0], 3)
    assert "weight version of response token 2 is 3, the engine sampled it at 4" in _reason(ledger, one_version)


async def test_the_proxy_records_the_versions_the_engine_gives_and_else_the_version_at_sending():
    class UpdatedMidway(FakeEngine):  # an engine whose weights changed after the first two tokens of each output
        async def generate(self, prompt_ids, sampling) -> Generation:
            out = await super().generate(prompt_ids, sampling)
            versions = [self.weight_version] * 2 + [self.weight_version + 1] * (len(out.token_ids) - 2)
            return Generation(out.token_ids, out.logprobs, out.finish_reason, weight_versions=versions)

    for inner, versions in ((UpdatedMidway(), [0, 0, 1, 1, 1, 1]), (FakeEngine(), [0] * 6)):
        engine = RecordingEngine(inner)
        run = TokenRun([1, 5, 6])
        out = await engine.generate(run.prompt_ids, {})
        assert engine.ledger.samples(run.prompt_ids)[0].weight_versions.tolist() == versions
        run.sample(out.token_ids, out.logprobs, versions)
        assert engine.ledger.check_run(run).weight_versions == versions


async def test_two_spans_of_two_turns_pass_and_each_is_checked():
    engine = RecordingEngine(FakeEngine())
    run = await _two_turns(engine)
    assert len(engine.ledger) == 2 and _reason(engine.ledger, run) is None
    run.response_ids[-1] += 1
    assert f"response token {len(run.response_ids) - 1} is" in _reason(engine.ledger, run)


async def test_two_generations_back_to_back_are_split_into_their_outputs():
    engine = RecordingEngine(FakeEngine())
    run = TokenRun([1, 5, 6])
    await _turn(engine, run)
    await _turn(engine, run)  # nothing inserted between: one maximal span of two outputs
    await _turn(engine, run, keep_end=False)
    assert run.response_mask == [1] * len(run.response_ids)
    check = engine.ledger.check_run(run)
    assert check.ok, check.reason
    run.response_ids[8] += 1  # inside the second output
    assert "response token 8 is" in _reason(engine.ledger, run)


async def test_clear_drops_every_recorded_output():
    engine = RecordingEngine(FakeEngine())
    run = await _two_turns(engine)
    assert len(engine.ledger) == 2 and engine.ledger.samples(run.prompt_ids)
    engine.ledger.clear()
    assert len(engine.ledger) == 0 and engine.ledger.samples(run.prompt_ids) == []
    assert "never sampled" in _reason(engine.ledger, run)


# ---- the proxy --------------------------------------------------------------------------------------------------


def test_the_proxy_has_exactly_the_capabilities_of_its_inner_engine():
    plain, streaming, trainable = (
        RecordingEngine(e) for e in (FakeEngine(), FakeStreamingEngine(), FakeTrainableEngine())
    )
    assert all(isinstance(p, (Engine, RecordingEngine)) for p in (plain, streaming, trainable))
    assert not isinstance(plain, StreamingEngine) and not isinstance(plain, TrainableEngine)
    assert isinstance(streaming, StreamingEngine) and not isinstance(streaming, TrainableEngine)
    assert isinstance(trainable, TrainableEngine) and not isinstance(trainable, StreamingEngine)
    assert plain.max_model_len == 4096 and plain.inner.max_model_len == 4096
    with pytest.raises(AttributeError):
        plain.update_weights  # noqa: B018
    shared = SampleLedger()
    assert RecordingEngine(FakeEngine(), shared).ledger is shared


async def test_a_stream_is_recorded_whole_or_as_far_as_it_was_read():
    engine = RecordingEngine(FakeStreamingEngine())
    prompt = [1, 5, 6]
    deltas = [d async for d in engine.stream(prompt, {})]
    whole = await engine.inner.generate(prompt, {})
    (sample,) = engine.ledger.samples(prompt)
    assert list(sample.token_ids) == whole.token_ids == [t for d in deltas for t in d.token_ids]
    run = TokenRun(prompt)
    run.sample(whole.token_ids, whole.logprobs, 0)
    assert _reason(engine.ledger, run) is None

    engine.ledger.clear()
    stream = engine.stream(prompt, {})
    first = await stream.__anext__()
    await stream.aclose()  # closed early: what was delivered is recorded
    (sample,) = engine.ledger.samples(prompt)
    assert list(sample.token_ids) == first.token_ids and len(first.token_ids) < len(whole.token_ids)
    run = TokenRun(prompt)
    run.sample(whole.token_ids, whole.logprobs, 0)
    assert "never sampled" in _reason(engine.ledger, run)  # the rest was never delivered


# ---- the real engine --------------------------------------------------------------------------------------------

CALL = r'<tool_call>\n\{"name": "calculator", "arguments": \{"expression": "2 \+ 2"\}\}\n</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "math",
          "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}]  # fmt: skip


def _assert_every_run_passes(ledger: SampleLedger, trajectories) -> int:
    """Every run of every finished, non-failed trajectory passes; returns how many runs were checked."""
    finished = [t for t in trajectories if not t.failed]
    assert finished, [t.error for t in trajectories]
    checked = 0
    for traj in finished:
        for run in traj.token_runs():
            check = ledger.check_run(run)
            assert check.ok, check.reason
            assert check.weight_versions == run.weight_versions
            checked += 1
        # the top-level tensors (logprobs through a float32 tensor, no weight versions) pass too
        (fields,) = traj.token_runs(fields_only=True)
        check = ledger.check_run(fields)
        assert check.ok, check.reason
        assert check.weight_versions == traj.token_runs()[-1].weight_versions
    return checked


def _tampered(run: TokenRun) -> TokenRun:
    """A copy of `run` with its last sampled token changed."""
    bad = run.copy()
    last = max(i for i, m in enumerate(bad.response_mask) if m)
    bad.response_ids[last] = (bad.response_ids[last] + 1) % 1000
    return bad


def _tool_spec(engine: Engine, tokenizer, *, memory_factory=None, max_steps: int = 3, **sampling):
    from agentic_rl.chat import ChatRenderer
    from agentic_rl.rollout.agent import tool_agent_spec
    from agentic_rl.rollout.spec import HarnessConfig
    from agentic_rl.tools.calculator import CalculatorTool

    config = HarnessConfig(max_steps=max_steps, max_prompt_length=1024, max_response_length=1024,
                           sampling={"temperature": 0.7, "max_tokens": 64, "seed": 3, **sampling})  # fmt: skip
    renderer = ChatRenderer(tokenizer)
    return tool_agent_spec(renderer, engine, tools=[CalculatorTool()], config=config, memory_factory=memory_factory)


async def test_tool_agent_rollouts_on_the_real_engine_pass_and_a_changed_token_fails(engine, tokenizer, make_task):
    from support.engines import ForcedCallEngine

    from agentic_rl.rollout.session import Rollout

    recording = RecordingEngine(engine)
    assert isinstance(recording, StreamingEngine) and isinstance(recording, TrainableEngine)
    assert recording.max_model_len == engine.max_model_len and recording.weight_version == engine.weight_version
    forced = ForcedCallEngine(recording, tokenizer, forced_turns=1)  # the turns still come from the real engine
    tasks = [make_task(i) for i in range(4)]
    result = await Rollout(_tool_spec(forced, tokenizer), n_parallel_agents=4).run(tasks)
    # a stop string inside the forced call: the harness keeps only a prefix of the generation
    stopped = await Rollout(_tool_spec(forced, tokenizer, stop=["calculator"]), n_parallel_agents=4).run(tasks)
    assert len(recording.ledger) == len(forced.calls)
    assert _assert_every_run_passes(recording.ledger, result.trajectories + stopped.trajectories) >= 4
    assert all(t.steps[0].info["unrecorded_tokens"] >= 1 for t in stopped.trajectories if not t.failed)

    run = next(t for t in result.trajectories if not t.failed).token_runs()[0]
    assert "the engine sampled" in recording.ledger.check_run(_tampered(run)).reason
    recording.ledger.clear()
    assert "never sampled" in recording.ledger.check_run(run).reason


async def test_memory_runs_on_the_real_engine_pass(engine, tokenizer):
    from support.engines import ForcedCallEngine

    from agentic_rl.chat import ChatRenderer
    from agentic_rl.engine.chat_client import EngineChatClient
    from agentic_rl.memory import MemoryConfig, MemorySummary
    from agentic_rl.rollout.harness import run_trajectory

    recording = RecordingEngine(engine)
    forced = ForcedCallEngine(recording, tokenizer, forced_turns=100)  # keeps calling tools: the history grows
    config = MemoryConfig(use_summary=True, max_prompt_length=420, max_summary_length=32, before_raw_message=2,
                          end_raw_message=-2)  # fmt: skip
    client = EngineChatClient(recording, ChatRenderer(tokenizer), sampling={"temperature": 0.7})
    spec = _tool_spec(forced, tokenizer, max_steps=6,
                      memory_factory=lambda: MemorySummary(config, chat_client=client, tokenizer=tokenizer))  # fmt: skip
    task = {
        "id": "long",
        "question": "Add up 12 + 30, then keep checking it with the calculator.",
        "ground_truth": "42",
    }
    traj = await run_trajectory(task, 0, spec)
    assert not traj.failed, traj.error
    assert traj.metrics["summaries"] >= 1 and len(traj.runs) > 1  # memory started new runs
    assert _assert_every_run_passes(recording.ledger, [traj]) == len(traj.runs)
    assert "the engine sampled" in recording.ledger.check_run(_tampered(traj.runs[0])).reason


async def test_captured_trajectories_of_the_server_over_a_recording_engine_pass(engine, tokenizer):
    from support.server import MODEL_NAME

    from agentic_rl.server.serving import OpenAIServing

    recording = RecordingEngine(engine)
    serving = OpenAIServing(recording, tokenizer, model_name=MODEL_NAME)

    async def chat(tid: str, messages: list[dict], stream: bool, **extra) -> dict:
        body = {"model": MODEL_NAME, "messages": messages, "max_tokens": 48, "tools": TOOLS, **extra}
        if not stream:
            return (await serving.chat_completion(body, trajectory_id=tid))["choices"][0]["message"]
        call = serving.prepare({**body, "stream": True}, trajectory_id=tid, chat=True, streaming=True)
        chunks = [chunk async for chunk in await serving.stream(call)]
        assert chunks
        return serving.recorder.build(tid).chat_completions[-1]

    def _call_id(message: dict) -> str:
        return (message.get("tool_calls") or [{}])[0].get("id", "call_0")

    trajectories = []
    for stream in (False, True):
        tid = f"ledger-{stream}"
        messages = [{"role": "user", "content": "What is 2 + 2? Use the calculator."}]
        assistant = await chat(tid, messages, stream, structured_outputs={"regex": CALL}, max_tokens=128)
        messages += [assistant, {"role": "tool", "tool_call_id": _call_id(assistant), "content": "4"}]
        await chat(tid, messages, stream)
        await chat(tid, [{"role": "user", "content": "Summary: 2 + 2 = 4. Say it."}], stream)  # a new run
        trajectories.append(serving.recorder.build(tid, pop=True))
    assert all(len(t.runs) >= 2 for t in trajectories)
    assert _assert_every_run_passes(recording.ledger, trajectories) >= 4
    assert "the engine sampled" in recording.ledger.check_run(_tampered(trajectories[1].runs[0])).reason


def test_forget_before_drops_only_outputs_sent_before_that_weight_version():
    ledger = SampleLedger()
    for version in (0, 1, 1, 2):
        ledger.record([1, 2, version], [7, 8], [-0.5, -0.25], version)
    assert ledger.forget_before(1) == 1 and len(ledger) == 3
    assert ledger.samples([1, 2, 0]) == [] and len(ledger.samples([1, 2, 1])) == 2
    assert ledger.forget_before(1) == 0
    assert ledger.forget_before(3) == 3 and len(ledger) == 0
