"""Plugging in your own agent: subclass `BaseEngineWrapper`.

This agent answers in one turn and then asks itself to double-check once (a "reflection" turn), using the
in-process engine, the exact-token harness and an environment of its own.

Roll it out on its own:

    .venv/bin/python examples/custom_agent.py

Train it with GRPO (the trainer hands it the engine it syncs weights into, see `initialize`):

    .venv/bin/agentic-rl train --config examples/train_custom_agent.yaml
"""

from __future__ import annotations

from typing import Any

import anyio
from transformers import AutoTokenizer

from agentic_rl import (
    BaseEngineWrapper,
    ChatRenderer,
    Environment,
    HarnessConfig,
    RolloutSpec,
    Sample,
    resolve_model,
    run_trajectory,
)
from agentic_rl.rewards import resolve_reward

MODEL = "smollm2-135m-instruct"


class ReflectOnceEnvironment(Environment):
    """After the first answer, asks the model to check it; the second answer is final.

    One instance serves every trajectory at once: it keeps no state of its own (the turn count is read from the
    sample's messages).
    """

    async def reset(self, request: dict[str, Any]) -> Sample:
        messages = [
            {"role": "system", "content": "Solve the problem. End with the final number."},
            {"role": "user", "content": request["question"]},
        ]
        return Sample(id=str(request["trajectory_id"]), task=request, messages=messages)

    async def step(self, sample: Sample) -> tuple[Any, bool, dict[str, Any]]:
        answers = sum(m["role"] == "assistant" for m in sample.messages)
        if answers >= 2:
            return None, True, {}
        return {"role": "user", "content": "Check your work and give the final number again."}, False, {}


class ReflectingAgent(BaseEngineWrapper):
    """Answer, reflect once, answer again.

    Args:
        reward: how the final answer is scored, a reward name or `package.module:function` (default: the GSM8K
            answer check); in a training config, `agent.kwargs.reward`.
        (the others: as `BaseEngineWrapper`)
    """

    def __init__(self, *args: Any, reward: str = "gsm8k", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reward_fn = resolve_reward(reward)

    def initialize(self) -> None:
        self._own_engine = None
        if self.engine is None:  # on its own it starts an engine; in training it samples with the trainer's
            from agentic_rl.rollout.agent import start_engine

            self.engine = self._own_engine = start_engine(
                resolve_model(MODEL), {"kv_cache_gib": 0.5}, max_prompt_length=self.max_prompt_length,
                max_response_length=self.max_response_length,
            )  # fmt: skip
            self.engines = [self.engine]
        self.renderer = ChatRenderer(self.tokenizer)
        self.environment = ReflectOnceEnvironment()

    async def generate_trajectory(self, task: dict[str, Any], idx: int):
        config = HarnessConfig(  # read when generating: the trainer sets each rollout's sampling (seed, greedy eval)
            max_steps=self.max_steps,
            max_prompt_length=self.max_prompt_length,
            max_response_length=self.max_response_length,
            sampling=self.sampling_params,
        )
        spec = RolloutSpec(self.engine, self.environment, self.renderer, config, reward_fn=self.reward_fn)
        return await run_trajectory(task, idx, spec)

    async def close(self) -> None:
        await super().close()
        if self._own_engine is not None:
            await self._own_engine.close()


def main() -> None:
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(MODEL))
    agent = ReflectingAgent(
        "reflecting_agent",
        tokenizer,
        {"max_tokens": 128, "temperature": 0.7},
        max_prompt_length=512,
        max_response_length=512,
        n_parallel_agents=4,
        max_steps=2,
    )
    agent.initialize()
    tasks = [
        {"id": 0, "question": "Tom has 3 apples and buys 4 more. How many apples does he have?", "ground_truth": "7"}
    ]

    async def run():
        try:
            return await agent.generate_agent_trajectories_async(tasks)
        finally:
            await agent.close()

    for t in anyio.run(run):
        print(f"reward={t.trajectory_reward} turns={t.metrics['steps']} end={t.termination_reason}")
        for m in t.chat_completions[1:]:
            print(f"[{m['role']}] {m['content'][:200]}")


if __name__ == "__main__":
    main()
