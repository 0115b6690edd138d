"""The smallest `agentic-rl train` config that exercises the whole loop on the tiny random model, for tests."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def write_train_config(folder: Path, **extra) -> Path:
    """Write `folder/train.yaml` (output into `folder/run`, 2 steps of 2 tasks x 3 samples, one 32-token turn each,
    the toy `e_share` reward, fp32 engine) with the top-level fields in `extra` replaced, and return its path."""
    config = {
        "model": "tiny-random-smollm2", "data": str(ROOT.parent / "shared/data/gsm8k_train.jsonl"),
        "tools": ["calculator"], "reward": "support.toy_rewards:e_share", "output_dir": str(folder / "run"), "steps": 2,
        "rollout": {"tasks_per_step": 2, "group_size": 3, "n_parallel_agents": 8, "max_steps": 1,
                    "max_prompt_length": 1024, "max_response_length": 64, "sampling": {"temperature": 1.0, "max_tokens": 32}},
        "engine": {"dtype": "float32", "kv_cache_gib": 0.1},
        "optimizer": {"lr": 1.0e-3, "micro_batch_size": 3},
        **extra,
    }  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    return path
