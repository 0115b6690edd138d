"""The built-in tool agent, assembled: an in-process vLLM engine, a `ToolEnvironment` over tools, and the
`RolloutSpec` that runs them. `ToolAgentEngineWrapper`, the training loop and the command line all build it here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentic_rl.chat import ChatRenderer
from agentic_rl.engine.base import Engine, TrainableEngine
from agentic_rl.environments.tool_env import ToolEnvironment
from agentic_rl.memory import MemorySimple
from agentic_rl.rollout.bounded import close_quietly
from agentic_rl.rollout.spec import HarnessConfig, RewardCallable, RolloutSpec
from agentic_rl.tools.base import Tool

__all__ = ["close_tool_agent", "start_engine", "tool_agent_spec"]

logger = logging.getLogger(__name__)


def start_engine(
    model: str | Path,
    options: dict[str, Any],
    *,
    max_prompt_length: int,
    max_response_length: int,
    group: Any = None,
) -> TrainableEngine:
    """Build and start the in-process vLLM engine (blocks until it is ready).

    Args:
        model: local folder of the model (see `agentic_rl.models.resolve_model`).
        options: `VLLMEngineConfig` fields (`dtype`, `kv_cache_gib`, `max_model_len`, `seed`, ...).
        max_prompt_length, max_response_length: the rollout's limits (tokens); without `max_model_len` in
            `options` the window is their sum, capped by the model's `max_position_embeddings`.
        group: under torchrun, this rank's tensor-parallel engine group (`engine.tensor_parallel.EngineGroup`):
            every rank of the group calls this at the same point, each building its shard of one engine.

    Raises:
        ConfigError: for invalid options.
        EngineError: if the engine fails to start.
    """
    from agentic_rl.engine.vllm_engine import VLLMEngine, VLLMEngineConfig

    if "max_model_len" not in options:
        options = {"max_model_len": _default_window(model, max_prompt_length + max_response_length), **options}
    engine = VLLMEngine(VLLMEngineConfig(model=str(model), **options), group=group)
    t0 = time.perf_counter()
    engine.start_sync()
    logger.info("engine started in %.1f s", time.perf_counter() - t0)
    return engine


def _default_window(model: str | Path, wanted: int) -> int:
    from transformers import AutoConfig

    window = getattr(AutoConfig.from_pretrained(str(model)), "max_position_embeddings", None)
    return min(wanted, window) if window else wanted


def tool_agent_spec(
    renderer: ChatRenderer,
    engine: Engine,
    *,
    tools: Sequence[Tool],
    config: HarnessConfig,
    reward_fn: RewardCallable | None = None,
    system_prompt: str | None = None,
    memory_factory: Callable[[], MemorySimple] | None = None,
) -> RolloutSpec:
    """The spec of the built-in tool agent: a `ToolEnvironment` over `tools` under `renderer`'s chat template.

    Args:
        renderer: the model's chat template (build it, and so check the template, before starting the engine).
        engine: the engine that samples the turns.
        tools: the tools offered to the model.
        config: limits and sampling.
        reward_fn: the final answer's reward (None: 0).
        system_prompt: system message (None: the environment's default); tool descriptions are added to it when
            the chat template has no `tools` support.
        memory_factory: a fresh memory per trajectory, or None.
    """
    environment = ToolEnvironment.for_renderer(list(tools), renderer, system_prompt)
    return RolloutSpec(engine, environment, renderer, config, reward_fn=reward_fn, memory_factory=memory_factory)


async def close_tool_agent(spec: RolloutSpec, *, engine: TrainableEngine | None = None) -> None:
    """Close the environment's tools (their HTTP clients) and, when given, stop the engine the caller started.
    Call it from the event loop that ran the rollouts. The environment's `aclose` is shielded and bounded by
    `close_timeout_s`; its failure or timeout is logged as a warning, never raised (the engine is stopped either way).
    """
    await close_quietly(spec.environment.aclose, spec.config.close_timeout_s)
    if engine is not None:
        await engine.close()
