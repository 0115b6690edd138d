"""Per-token weight versions across a weight update, and paused generation, on the real engine (tiny model).

Every assertion holds for any sampled outcome and any thread timing: the order of events comes from the engine
thread's inbox (messages are handled in the order they were sent) and from `RequestOutputKind.DELTA` outputs, not
from sleeps.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import anyio
import pytest
import torch

from agentic_rl.engine.ledger import RecordingEngine
from agentic_rl.types import TokenRun

LONG = 1500  # tokens: far more engine steps than it takes to send a weight update once the first ones arrived
SAMPLING = {"max_tokens": LONG, "min_tokens": LONG, "temperature": 1.0, "seed": 3}
PROMPT_A = list(range(100, 140))
PROMPT_B = list(range(300, 317))


def _tiny_config():
    from agentic_rl.engine.vllm_engine import VLLMEngineConfig
    from agentic_rl.models import resolve_model

    return VLLMEngineConfig(model=resolve_model("tiny-random-smollm2"), dtype="float32", max_model_len=4096,
                            kv_cache_gib=0.05)  # fmt: skip


# Session-scoped and never closed before the session ends: closing a vLLM engine in this process tears down vLLM's
# process-wide parallel state, which every other engine still running needs.
@pytest.fixture(scope="session")
def tiny():
    from agentic_rl.engine.vllm_engine import VLLMEngine

    eng = VLLMEngine(_tiny_config())
    eng.start_sync()
    yield eng
    anyio.run(eng.close)


@pytest.fixture(scope="module")
def same_weights():
    """The tiny model's own weights: loading them changes the version, not what the engine samples."""
    from transformers import AutoModelForCausalLM

    from agentic_rl.models import resolve_model

    model = AutoModelForCausalLM.from_pretrained(str(resolve_model("tiny-random-smollm2")), dtype=torch.float32)
    return [(name, p.detach()) for name, p in model.named_parameters()]


async def _until(condition) -> None:
    """Wait until `condition()` holds (state the engine thread changes), failing after 60 s."""
    with anyio.fail_after(60):
        while not condition():
            await anyio.sleep(0.005)


def _versions_of(deltas) -> list[int]:
    versions = []
    for delta in deltas:
        assert delta.weight_versions is not None and len(delta.weight_versions) == len(delta.token_ids)
        versions += delta.weight_versions
    return versions


def _switches_once(versions: list[int], old: int, new: int) -> bool:
    """True when `versions` is `[old] * a + [new] * b` with a > 0 and b > 0."""
    a = versions.count(old)
    return 0 < a < len(versions) and versions == [old] * a + [new] * (len(versions) - a)


async def test_a_request_in_flight_across_a_weight_update_has_each_tokens_version(tiny, same_weights):
    recording = RecordingEngine(tiny)
    v = tiny.weight_version
    whole = {}

    async def generate():
        whole["a"] = await recording.generate(PROMPT_A, SAMPLING)

    async with anyio.create_task_group() as tg:
        tg.start_soon(generate)
        await _until(lambda: tiny.in_flight_requests == 1)  # request A reached vLLM before B: it is never behind B
        stream = recording.stream(PROMPT_B, SAMPLING)
        first = await stream.__anext__()  # B (so A too) has tokens sampled with version v
        assert first.weight_versions == [v] * len(first.token_ids)
        await tiny.update_weights(same_weights)
        assert tiny.weight_version == v + 1
        deltas = [first, *[d async for d in stream]]
    a = whole["a"]
    streamed = _versions_of(deltas)
    assert len(streamed) == sum(len(d.token_ids) for d in deltas) == LONG
    assert len(a.weight_versions) == len(a.token_ids) == LONG
    assert _switches_once(streamed, v, v + 1) and _switches_once(a.weight_versions, v, v + 1)

    # the ledger holds each token's version, and a run that records them passes its check
    ids_b = [t for d in deltas for t in d.token_ids]
    assert recording.ledger.samples(PROMPT_B)[-1].weight_versions.tolist() == streamed
    assert recording.ledger.samples(PROMPT_A)[-1].weight_versions.tolist() == a.weight_versions
    for prompt, ids, logprobs, versions in (
        (PROMPT_A, a.token_ids, a.logprobs, a.weight_versions),
        (PROMPT_B, ids_b, [x for d in deltas for x in d.logprobs], streamed),
    ):
        run = TokenRun(prompt)
        run.sample(ids, logprobs, versions)
        assert run.weight_versions == versions
        check = recording.ledger.check_run(run)
        assert check.ok and check.weight_versions == versions
        stamped_at_send = TokenRun(prompt)  # what stamping every token with the version at send time gave
        stamped_at_send.sample(ids, logprobs, v)
        assert "weight version of response token" in recording.ledger.check_run(stamped_at_send).reason


async def test_paused_generation_samples_nothing_until_resumed(tiny, same_weights):
    v = tiny.weight_version
    whole = {}

    async def generate_while_paused():
        whole["a"] = await tiny.generate(PROMPT_A, SAMPLING)

    stream = tiny.stream(PROMPT_B, SAMPLING)
    first = await stream.__anext__()
    await tiny.pause_generation()
    await tiny.pause_generation()  # idempotent
    assert tiny.generation_paused
    async with anyio.create_task_group() as tg:
        tg.start_soon(generate_while_paused)
        await _until(lambda: tiny.in_flight_requests == 2)  # A is taken (and waits) before the updates are sent
        # Two updates while paused: a step between them would sample tokens with version v + 1, a step before
        # them would give request A tokens with version v.
        await tiny.update_weights(same_weights)
        await tiny.update_weights(same_weights)
        assert "a" not in whole and tiny.in_flight_requests == 2
        await tiny.resume_generation()
        await tiny.resume_generation()  # idempotent
        assert not tiny.generation_paused
        deltas = [first, *[d async for d in stream]]
    streamed = _versions_of(deltas)
    assert len(streamed) == LONG and _switches_once(streamed, v, v + 2)  # B kept its tokens and went on after
    assert whole["a"].weight_versions == [v + 2] * LONG  # A was sent while paused: nothing of it before the resume
    assert tiny.in_flight_requests == 0


async def test_a_generation_without_a_weight_update_has_one_version(tiny):
    out = await tiny.generate(PROMPT_A, {"max_tokens": 8, "min_tokens": 8})
    assert out.weight_versions == [tiny.weight_version] * 8


_CLOSE_WHILE_PAUSED = """
import anyio
from agentic_rl.engine.vllm_engine import VLLMEngine, VLLMEngineConfig
from agentic_rl.errors import EngineError
from agentic_rl.models import resolve_model


async def main():
    engine = VLLMEngine(VLLMEngineConfig(model=resolve_model("tiny-random-smollm2"), dtype="float32",
                                         max_model_len=256, kv_cache_gib=0.05))
    await engine.start()
    await engine.pause_generation()
    failed = []

    async def generate():
        try:
            await engine.generate([100, 101, 102], {"max_tokens": 8})
        except EngineError as exc:
            failed.append(str(exc))

    async with anyio.create_task_group() as tg:
        tg.start_soon(generate)
        with anyio.fail_after(60):
            while engine.in_flight_requests == 0:
                await anyio.sleep(0.005)
        await engine.close()
    assert failed == ["engine closed"], failed
    print("closed while paused")


if __name__ == "__main__":
    anyio.run(main)
"""


def test_closing_a_paused_engine_fails_its_pending_requests(tmp_path):
    # In a process of its own: closing an engine tears down vLLM's process-wide state that this process still needs.
    script = tmp_path / "close_paused.py"
    script.write_text(textwrap.dedent(_CLOSE_WHILE_PAUSED))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "closed while paused" in done.stdout
