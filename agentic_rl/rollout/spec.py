"""What a rollout runs on: `RolloutSpec` bundles the engine, environment, renderer, limits and sampling, reward
and memory that every trajectory of a rollout shares; `HarnessConfig` holds its limits and sampling.

The training loop, the command line and `ToolAgentEngineWrapper` build one spec each and hand it to
`run_trajectory` / `Rollout`; nothing else travels with a trajectory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from agentic_rl.chat import ChatRenderer
from agentic_rl.config import Config, Weight
from agentic_rl.engine.base import Engine
from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.environments.base import Environment
from agentic_rl.limits import AtLeastOne
from agentic_rl.memory import MemorySimple
from agentic_rl.rewards.base import RewardCallable, RewardWithMetrics
from agentic_rl.rewards.shaping import Shaping

__all__ = ["HarnessConfig", "RewardCallable", "RewardWithMetrics", "RolloutSpec"]


class HarnessConfig(Config):
    """Limits and sampling of a rollout.

    The limits are >= 1 here; where a user's settings enter (the wrapper, the command line, a training config) they
    are held to the AgentSDK's ranges (`agentic_rl.limits`).

    Attributes:
        max_steps: most assistant turns per trajectory.
        max_prompt_length: most tokens of the first prompt.
        max_response_length: most tokens after the first prompt (sampled + inserted), the response budget.
        sampling: the `SamplingConfig` of every turn (a dict of its options is accepted). `max_tokens`, if given,
            caps each turn; it is always clamped to what is left of the window and of the response budget. A `seed`
            is offset per trajectory and turn (`derive_seed`) so that samples of one group differ. Seeded runs
            repeat exactly only with the same batch composition (`n_parallel_agents`, task order): the engine's
            numerics depend on the batch. Stop strings and further `stop_token_ids` end a turn as complete (see
            `agentic_rl.engine.turns`).
        toolcall_weight: `toolcall_reward = toolcall_weight * well-formed calls / attempted calls` (0 without calls).
            Each turn's `Step.reward` gets the part of it that its own well-formed calls earn (`rewards.shaping`).
        milestone_weight: process reward for tasks that list `milestones` (strings such as an intermediate result):
            a turn whose tool results first show a milestone gets `milestone_weight / len(milestones)` for it in its
            `Step.reward` (`rewards.turns.milestone_reward`). Step rewards only: `trajectory_reward` is unchanged, so
            only step-level training (`GRPOConfig.advantage = "step"`) learns from it. 0: off.
        unfinished_penalty: subtracted from the reward of a trajectory that a limit cut before the environment
            ended it (termination `max_steps`, `context_limit` or `truncated`: e.g. still calling tools at its last
            turn): from `trajectory_reward` and from its last `Step.reward`. A positive value makes running out of
            turns score below a wrong answer, which otherwise ties with it at 0. Not applied to a failed trajectory.
            0: off.
        check_alignment: compare each finished trajectory's ids with a full template re-render (metrics
            `alignment_mismatches`, `retokenize_drift`).
        template_rewrites: what a trajectory does where the chat template cannot append an observation exactly
            because it writes earlier turns differently once later ones follow (QwQ and the DeepSeek-R1 distills
            drop earlier `<think>` blocks and open `<think>` in the generation prompt; Qwen3 drops them once a
            user message follows). "new_run": a new exact run starts, prompted with the template's render of the
            whole conversation (the tokens the model then sees), so the trajectory has several `runs`; the
            renderer must accept such templates (`ChatRenderer(history_rewrites=True)`). "refuse": the renderer
            refuses such a template at start-up, and a trajectory that needs a rewrite (a user message under
            Qwen3 after thinking) fails with the reason. A template that leaves messages out is refused either way.
        turn_timeout_s: most seconds one `engine.generate` call may take; past it the request is aborted and the
            trajectory fails with `termination_reason="timeout"`. The default (1 hour) only catches requests that
            never return; lower it when turns are short.
        env_timeout_s: most seconds one `environment.reset` or `environment.step` call may take; past it the call is
            cancelled and the trajectory fails with `termination_reason="timeout"` (its error names the call), while
            the rest of the rollout goes on. A bound cancels only code that awaits: an environment that blocks the
            event loop (`time.sleep`, blocking I/O in an `async def`) must run that work in a worker thread
            (`await anyio.to_thread.run_sync(...)`); a rollout warns when the loop stalls.
        close_timeout_s: most seconds `environment.close` may take (it runs shielded from cancellation); past it
            the trajectory fails and the environment may have leaked resources.
        reward_timeout_s: most seconds the harness waits for `reward_fn`; past it the trajectory fails with a
            `RewardError` (`metrics["reward_error"]` says so; a failed trajectory is never trained on, so a reward
            that hung never counts as a real 0) and the rollout goes on. An async reward is cancelled there; a sync
            reward's thread cannot be stopped: rewards that can run away bound their own work in worker processes
            (`math_verify_reward`; wrap a function of your own in `rewards.ProcessReward` for the same hard bound).
        max_retries: most times a trajectory that failed for a reason outside the policy (`types.FailureKind`: the
            engine, a tool's service, an environment call past its bound, the reward) is rolled out again from the
            start with a fresh sample (each attempt's seed differs, `derive_seed(attempt=)`); its metrics count the
            retries by kind (`retries_engine`, ...). One that still fails keeps its `failure_kind` and is never
            trained on. 0: no retries.

    The three weights make the rollout's reward shaping (`shaping()`, see `rewards.shaping`).

    Raises:
        ConfigError: naming the first field that is out of range or of the wrong type.
    """

    model_config = ConfigDict(strict=True)

    max_steps: AtLeastOne = 5
    max_prompt_length: AtLeastOne = 128 * 1024
    max_response_length: AtLeastOne = 8 * 1024
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    toolcall_weight: Annotated[float, Field(allow_inf_nan=False)] = 0.1
    milestone_weight: Weight = 0.0
    unfinished_penalty: Weight = 0.0
    check_alignment: bool = True
    template_rewrites: Literal["new_run", "refuse"] = "new_run"
    turn_timeout_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 3600.0
    env_timeout_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 600.0
    close_timeout_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 30.0
    reward_timeout_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 60.0
    max_retries: Annotated[int, Field(ge=0)] = 2

    def shaping(self) -> Shaping:
        """The reward shaping of these weights: `toolcall_weight`, `milestone_weight` and `unfinished_penalty`
        (`rewards.shaping.Shaping.of`)."""
        return Shaping.of(
            toolcall_weight=self.toolcall_weight,
            milestone_weight=self.milestone_weight,
            unfinished_penalty=self.unfinished_penalty,
        )


@dataclass(frozen=True, slots=True)
class RolloutSpec:
    """Everything the trajectories of one rollout share.

    Attributes:
        engine: the token-in/token-out engine (`agentic_rl.engine.base.Engine`).
        environment: decides what each assistant turn leads to, and when a trajectory is done.
        renderer: the chat template of the engine's model.
        config: limits and sampling (`HarnessConfig`).
        reward_fn: `reward_fn(task, messages) -> float` for the final answer, sync (run in a worker thread) or
            `async def` (awaited on the rollout's loop), waited for at most `config.reward_timeout_s` seconds;
            None: 0. A `RewardWithMetrics` it returns adds its metrics to the trajectory's.
        memory_factory: builds a fresh memory per trajectory (`MemorySimple` / `MemorySummary`); None: every turn
            is prompted with the whole history.
    """

    engine: Engine
    environment: Environment
    renderer: ChatRenderer
    config: HarnessConfig = dataclasses.field(default_factory=HarnessConfig)
    reward_fn: RewardCallable | None = None
    memory_factory: Callable[[], MemorySimple] | None = None

    def with_sampling(self, sampling: SamplingConfig | Mapping[str, Any]) -> RolloutSpec:
        """The same spec with other sampling options (e.g. greedy for evaluation, or a step's seed).

        Raises:
            ConfigError: if `sampling` is not valid `SamplingConfig` options.
        """
        config = self.config.model_copy(update={"sampling": SamplingConfig.of(sampling)})
        return dataclasses.replace(self, config=config)
