"""Plugging in your own agent: subclass `BaseEngineWrapper`.

This agent answers in one turn and then asks itself to double-check once (a "reflection" turn), using the
in-process engine, the exact-token harness and an environment of its own.

    .venv/bin/python examples/custom_agent.py
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
    StepResult,
    gsm8k_reward,
    resolve_model,
    run_trajectory,
)
from agentic_rl.engine.vllm_engine import VLLMEngine, VLLMEngineConfig


class ReflectOnceEnvironment(Environment):
    """After the first answer, asks the model to check it; the second answer is final."""

    async def reset(self, request: dict[str, Any]) -> Sample:
        messages = [
            {"role": "system", "content": "Solve the problem. End with the final number."},
            {"role": "user", "content": request["question"]},
        ]
        return Sample(id=str(request["trajectory_id"]), task=request, messages=messages)

    async def step(self, sample: Sample) -> StepResult:
        answers = sum(m["role"] == "assistant" for m in sample.messages)
        if answers >= 2:
            return StepResult([], True, {})
        return StepResult([{"role": "user", "content": "Check your work and give the final number again."}], False)


class ReflectingAgent(BaseEngineWrapper):
    def initialize(self) -> None:
        model = resolve_model("smollm2-135m-instruct")
        self.engine = VLLMEngine(VLLMEngineConfig(model=model, max_model_len=2048, kv_cache_gib=0.5))
        self.engine.start_sync()
        self.renderer = ChatRenderer(self.tokenizer)
        self.environment = ReflectOnceEnvironment()
        self.config = HarnessConfig(
            max_steps=self.max_steps,
            max_prompt_length=self.max_prompt_length,
            max_response_length=self.max_response_length,
            sampling=self.sampling_params,
        )

    async def generate_trajectory(self, task: dict[str, Any], idx: int):
        return await run_trajectory(
            task,
            idx,
            RolloutSpec(
                engine=self.engine,
                environment=self.environment,
                renderer=self.renderer,
                config=self.config,
                reward_fn=gsm8k_reward,
            ),
        )


def main() -> None:
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct"))
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
            await agent.engine.close()

    for t in anyio.run(run):
        print(f"reward={t.trajectory_reward} turns={t.metrics['steps']} end={t.termination_reason}")
        for m in t.chat_completions[1:]:
            print(f"[{m['role']}] {m['content'][:200]}")


if __name__ == "__main__":
    main()
