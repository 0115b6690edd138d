"""Run folders for the viewer: built from records of the real tokenizer, or from a real rollout on the engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def make_record(tokenizer):
    """A two-turn trajectory record (calculator call, tool result, answer) tokenized by SmolLM2's tokenizer."""
    from agentic_rl.records import trajectory_to_dict
    from agentic_rl.types import Step, StepTrajectory

    end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    def make(
        idx: int = 0,
        *,
        question: str = "What is 17 * 23?",
        answer: str = "The answer is 391.",
        reward: float = 1.0,
        failed: bool = False,
        reason: str = "env_done",
        source: str | None = None,
    ) -> dict:
        call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17 * 23"}}\n</tool_call>'
        turn1, glue, turn2 = (
            encode(call) + [end],
            encode("\n<|im_start|>tool\n391<|im_end|>\n<|im_start|>assistant\n"),
            encode(answer) + [end],
        )
        ids = turn1 + glue + turn2
        mask = [1] * len(turn1) + [0] * len(glue) + [1] * len(turn2)
        logprobs = [-0.05 * (i % 7) if m else 0.0 for i, m in enumerate(mask)]
        chat = [
            {"role": "user", "content": question},
            {"role": "assistant", "content": call},
            {"role": "tool", "content": "391"},
            {"role": "assistant", "content": answer},
        ]
        steps = [
            Step(
                action=call,
                info={
                    "finish_reason": "stop",
                    "sampled_tokens": len(turn1),
                    "llm_time_s": 0.25,
                    "env_time_s": 0.01,
                    "weight_version": 0,
                    "tool_calls": 1,
                },
            ),
            Step(
                info={"finish_reason": "stop", "sampled_tokens": len(turn2), "llm_time_s": 0.125, "weight_version": 0},
                reward=reward,
                done=True,
            ),
        ]
        traj = StepTrajectory(
            prompt_tokens=encode(f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"),
            response_tokens=ids, response_masks=mask, response_logprobs=logprobs, idx=idx, trajectory_reward=reward,
            chat_completions=chat, metrics={"steps": 2, "res_reward": reward, "llm_time": 0.375, "tool_calls": 1},
            termination_reason=reason, failed=failed, error="EngineError: boom" if failed else None,
            task={"id": f"q{idx}"}, steps=steps,
        )  # fmt: skip
        record = trajectory_to_dict(traj)
        if source is not None:
            record["source"] = source
        return record

    return make


@pytest.fixture
def write_run():
    """Writes a rollout-style run folder: `trajectories.jsonl` (or `name`) and a `summary.json` naming the model."""

    def write(folder: Path, records: list[dict[str, Any]], *, model: str | None = None,
              name: str = "trajectories.jsonl") -> Path:  # fmt: skip
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        if model is not None:
            (folder / "summary.json").write_text(json.dumps({"model": model}))
        return folder

    return write


@pytest.fixture(scope="session")
def rollout_run(engine, tokenizer, model_dir, tmp_path_factory) -> Path:
    """A run folder from a real rollout: 6 GSM8K-style tasks on the session engine, the first turn of each forced
    into a calculator call (SmolLM2 does not write them by itself), as `agentic-rl rollout` would save it."""
    import anyio
    from support.engines import ForcedCallEngine

    from agentic_rl.chat import ChatRenderer
    from agentic_rl.environments.tool_env import ToolEnvironment
    from agentic_rl.records import trajectory_to_dict
    from agentic_rl.rewards import gsm8k_reward
    from agentic_rl.rollout.harness import HarnessConfig, run_trajectory
    from agentic_rl.rollout.runner import run_tasks
    from agentic_rl.rollout.spec import RolloutSpec
    from agentic_rl.tools.calculator import CalculatorTool

    renderer = ChatRenderer(tokenizer)
    forced = ForcedCallEngine(engine, tokenizer, forced_turns=1)
    config = HarnessConfig(max_steps=2, max_prompt_length=1024, max_response_length=384,
                           sampling={"temperature": 0.7, "max_tokens": 64, "seed": 3})  # fmt: skip
    tasks = [{"id": i, "question": f"What is {a} * {b}? Use the calculator.", "ground_truth": str(a * b)}
             for i, (a, b) in enumerate([(12, 7), (17, 23), (9, 9), (31, 4), (6, 45), (13, 13)])]  # fmt: skip

    async def one(task: dict[str, Any], idx: int) -> Any:
        env = ToolEnvironment([CalculatorTool()], tools_in_system_prompt=not renderer.supports_tools)
        return await run_trajectory(task, idx, RolloutSpec(engine=forced, environment=env, renderer=renderer, config=config, reward_fn=gsm8k_reward))  # fmt: skip

    async def rollout() -> list[Any]:
        return await run_tasks(tasks, one, n_parallel_agents=6)

    trajectories = anyio.run(rollout)
    run = tmp_path_factory.mktemp("rollout_run")
    with (run / "trajectories.jsonl").open("w") as f:
        for t in trajectories:
            f.write(json.dumps(trajectory_to_dict(t)) + "\n")
    (run / "summary.json").write_text(json.dumps({"model": str(model_dir), "tasks": len(tasks)}))
    return run
