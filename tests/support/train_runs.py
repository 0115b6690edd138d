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


def answer_group(model, tokenizer, rewards, *, offset=0):
    """One GRPO group (`StepTrajectory` records, task id `t{offset}`) of real text answers to one question, rewarded
    `rewards`, each with the logprobs `model` gives its tokens (so a trainer on `model` is on-policy)."""
    import torch

    from agentic_rl.train.loss import response_logprobs
    from agentic_rl.train.packing import pack_trajectories
    from agentic_rl.types import StepTrajectory

    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "How many apples are left?"}],
                                           add_generation_prompt=True, tokenize=False)  # fmt: skip
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    rows = []
    for i, reward in enumerate(rewards):
        answer = tokenizer.encode(f"There are {7 * (i + offset) + 3} apples left.<|im_end|>", add_special_tokens=False)
        rows.append(StepTrajectory(prompt_tokens=prompt_ids, response_tokens=answer, response_masks=[1] * len(answer),
                                   trajectory_reward=reward, idx=i, task={"id": f"t{offset}"}))  # fmt: skip
    batch = pack_trajectories(rows, pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        logprobs = response_logprobs(model, batch)
    return [StepTrajectory(prompt_tokens=t.prompt_tokens, response_tokens=t.response_tokens,
                           response_masks=t.response_masks, response_logprobs=row[: len(t.response_tokens)].tolist(),
                           trajectory_reward=t.trajectory_reward, idx=t.idx, task=t.task)
            for row, t in zip(logprobs, rows, strict=True)]  # fmt: skip
