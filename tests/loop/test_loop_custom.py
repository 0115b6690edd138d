"""Training what a user wrote: `examples/train_custom_agent.yaml` (a `BaseEngineWrapper` subclass) and
`examples/train_guess_game.yaml` (an `Environment` of one's own) train end to end on the tiny random model, from
the example configs as shipped (only sized down); records an agent tampers with are refused and counted, from the
Python API; and a user's agent trains under torchrun (tests/test_loop.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from support.processes import cli_env

ROOT = Path(__file__).resolve().parents[2]
SMALL = {
    "model": "tiny-random-smollm2", "steps": 2, "seed": 0,
    "rollout": {"tasks_per_step": 2, "group_size": 3, "n_parallel_agents": 8, "max_steps": 2, "max_prompt_length": 1024,
                "max_response_length": 64, "sampling": {"temperature": 1.0, "max_tokens": 16}},
    "engine": {"dtype": "float32", "kv_cache_gib": 0.1},
    "optimizer": {"lr": 1.0e-3, "micro_batch_size": 3},
}  # fmt: skip
TOY_REWARD = "support.toy_rewards:e_share"  # varies across random samples, so groups carry signal


def _example(name: str, folder: Path, **extra) -> Path:
    """The example config `examples/NAME`, sized down (`SMALL`), with `extra` replacing top-level fields."""
    config = yaml.safe_load((ROOT / "examples" / name).read_text())
    config.update(SMALL, output_dir=str(folder / "run"), **extra)
    path = folder / name
    path.write_text(yaml.safe_dump(config))
    return path


def _train(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentic_rl.cli", "train", "--config", str(path), "--no-progress"],
                          capture_output=True, text=True, timeout=900, env=cli_env(), cwd=ROOT)  # fmt: skip


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


def _records(run: Path, step: int) -> list[dict]:
    return [json.loads(line) for line in (run / f"rollouts/step_{step}.jsonl").read_text().splitlines()]


def _assert_exact_accounting(run: Path, rows: list[dict]) -> None:
    """Every sampled token is trained or excluded for a named reason, and the trained ones are exactly the kept
    records' mask-1 tokens."""
    for r in rows:
        assert r["tokens_sampled"] == r["tokens_trained"] + r["tokens_excluded"] > 0
        assert r["tokens_excluded"] == sum(r[f"tokens_excluded_{k}"] for k in ("failed", "aborted", "refused", "over_length"))
        kept = [t for t in _records(run, r["step"]) if not t["failed"]]
        assert r["tokens_trained"] + r["tokens_excluded_over_length"] == sum(sum(t["response_mask"]) for t in kept)


def _assert_weights_moved(run: Path) -> None:
    from transformers import AutoModelForCausalLM

    from agentic_rl.loop import weights_digest
    from agentic_rl.models import resolve_model

    initial = AutoModelForCausalLM.from_pretrained(str(resolve_model("tiny-random-smollm2")))
    assert (run / "weights_rank0.sha256").read_text().strip() != weights_digest(initial)


@pytest.mark.slow
def test_the_custom_agent_example_trains(tmp_path):
    agent = {"class": "examples.custom_agent:ReflectingAgent", "kwargs": {"reward": TOY_REWARD}}
    proc = _train(_example("train_custom_agent.yaml", tmp_path, agent=agent, data="arithmetic:train:32:1",
                           eval_data="arithmetic:heldout:3:1"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = tmp_path / "run"
    rows = _rows(run)
    assert [r["weight_version"] for r in rows] == [1, 2]
    assert all(r["refused"] == 0 and r["tokens_excluded_refused"] == 0 for r in rows)  # the harness's records pass
    assert all(r["grad_norm"] > 0 for r in rows)
    _assert_exact_accounting(run, rows)
    for t in _records(run, 2):  # the agent's own environment asked for a check after the first answer
        assert t["chat_completions"][0]["content"] == "Solve the problem. End with the final number."
        if t["metrics"]["steps"] == 2:
            assert t["chat_completions"][3] == {"role": "user", "content": "Check your work and give the final number again."}
    evaluated = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' not in line]
    assert [r["step"] for r in evaluated] == [0]  # the agent rolled out the held-out tasks too (greedy)
    assert (run / "rollouts/eval_step_2.jsonl").is_file()
    _assert_weights_moved(run)


@pytest.mark.slow
def test_the_custom_environment_example_trains(tmp_path):
    proc = _train(_example("train_guess_game.yaml", tmp_path, reward=TOY_REWARD))
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = tmp_path / "run"
    rows = _rows(run)
    assert [r["weight_version"] for r in rows] == [1, 2]
    assert all(r["refused"] == 0 for r in rows)
    _assert_exact_accounting(run, rows)
    for t in _records(run, 1):
        assert t["chat_completions"][1]["content"] == "I am thinking of a whole number from 1 to 16. Find it."
        assert t["task_id"].startswith("guess-")
    _assert_weights_moved(run)


@pytest.mark.slow
def test_records_an_agent_tampers_with_are_refused_and_counted_from_the_python_api(tmp_path):
    """`run_training(TrainConfig(...))` in a fresh interpreter, with an agent that changes one sampled token of every
    third record and drops the logprobs of the next: those records are refused, counted and never trained."""
    config = {**SMALL, "agent": {"class": "support.tampering_agent:TamperingAgent", "kwargs": {"reward": TOY_REWARD}},
              "data": "arithmetic:train:32:1", "output_dir": str(tmp_path / "run")}  # fmt: skip
    script = textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{str(ROOT)!r}]
        from agentic_rl.loop import TrainConfig, run_training
        run_training(TrainConfig.model_validate({config!r}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=900, env=cli_env(),
                          cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = tmp_path / "run"
    rows = _rows(run)
    _assert_exact_accounting(run, rows)
    for r in rows:
        records = _records(run, r["step"])
        is_refused = [(t["error"] or "").startswith("refused for training: ") for t in records]
        for i, t in enumerate(records):  # tampered records are refused unless they failed already; the others pass,
            # unless the tampering left them the only sample of their group (GRPO needs two: refused as such)
            lone = (t["error"] or "").startswith("refused for training: the only sample of its group left")
            assert is_refused[i] == (i % 3 != 2 and not (t["failed"] and not is_refused[i])) or lone, (i, t["error"])
        refused = [t for t, no in zip(records, is_refused, strict=True) if no]
        assert r["refused"] == len(refused) > 0
        assert r["tokens_excluded_refused"] == sum(sum(t["response_mask"]) for t in refused)
        reasons = {t["error"] for t in refused}
        assert any("the engine sampled" in e for e in reasons) and any("no logprobs" in e for e in reasons)
