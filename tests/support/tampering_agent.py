"""An agent of one's own that breaks its records on purpose, to show the trainer refuses them (tests only)."""

from __future__ import annotations

from typing import Any

from examples.custom_agent import ReflectingAgent


class TamperingAgent(ReflectingAgent):
    """`ReflectingAgent`, except that the trajectory at batch position i is returned with one sampled token changed
    when i % 3 == 0, and without logprobs when i % 3 == 1 (the others untouched)."""

    async def generate_agent_trajectories_async(self, tasks: Any, **kwargs: Any) -> list[Any]:
        out = await super().generate_agent_trajectories_async(tasks, **kwargs)
        for i, t in enumerate(out):
            if t.failed:
                continue
            run = t.runs[0]
            if i % 3 == 0:
                first = run.response_mask.index(1)
                run.response_ids[first] = (run.response_ids[first] + 1) % 100
            elif i % 3 == 1:
                for r in t.runs:
                    r.response_logprobs = None
                t.response_logprobs = None
        return out
