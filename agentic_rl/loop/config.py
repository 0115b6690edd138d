"""The configuration of a training run (`TrainConfig`), read from YAML or from the folder a run recorded it in.

`agentic_rl.loop` runs it (and exports these names too).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, StrictInt, field_validator, model_validator

from agentic_rl.config import Config, Weight
from agentic_rl.data import DataColumns, load_tasks
from agentic_rl.engine.base import EngineDtype
from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.errors import ConfigError, EnvStepError
from agentic_rl.limits import MaxPromptLength, MaxResponseLength, MaxSteps, NParallelAgents
from agentic_rl.loop.ranges import check_ranges
from agentic_rl.plugins import PluginRef
from agentic_rl.tools.mcp import MCPToolsEntry
from agentic_rl.train.grpo_config import GRPOConfig
from agentic_rl.train.loggers import LoggerName

if TYPE_CHECKING:
    from agentic_rl.rollout.spec import HarnessConfig

__all__ = [
    "EngineSection",
    "JudgeSection",
    "RolloutSection",
    "TrainConfig",
    "config_tasks",
    "load_run_config",
    "load_train_config",
    "system_prompt",
]


class RolloutSection(Config):
    """Rollout settings of a training run (`tasks_per_step` tasks per rank, `group_size` samples each).

    It holds every `HarnessConfig` field (limits, sampling, reward shaping, alignment check, timeouts), under the same
    name; `harness_config()` is the turn loop's configuration.
    """

    tasks_per_step: int = Field(default=4, ge=1)
    group_size: int = Field(
        default=4,
        ge=2,
        description="samples per task: GRPO's baseline is the group's mean reward, so a group of one "
        "has advantage 0 and trains nothing",
    )
    n_parallel_agents: NParallelAgents = 16
    max_steps: MaxSteps = 2
    max_prompt_length: MaxPromptLength = 1024
    max_response_length: MaxResponseLength = 512
    sampling: SamplingConfig = Field(default_factory=lambda: SamplingConfig(temperature=1.0, max_tokens=256))
    toolcall_weight: Weight = Field(
        default=0.1,
        description="reward per share of well-formed tool calls, added to the answer's reward (0: the answer only)",
    )
    milestone_weight: Weight = Field(
        default=0.0,
        description="process reward for tasks that list 'milestones' (e.g. the intermediate results of arithmetic "
        "tasks): a turn whose tool results first show one gets milestone_weight / len(milestones) in its step "
        "reward; only optimizer.advantage=step learns from it (trajectory_reward is unchanged)",
    )
    unfinished_penalty: Weight = Field(
        default=0.0,
        description="subtracted from the reward of a trajectory a limit cut before it ended (max_steps, "
        "context_limit, truncated: e.g. still calling tools at its last turn), so that running out of turns scores "
        "below a wrong answer (0: off)",
    )
    reward_timeout_s: float = Field(
        default=60.0,
        gt=0,
        allow_inf_nan=False,
        description="most seconds a reward call may take; past it the trajectory fails with a reward error (not trained)",
    )
    turn_timeout_s: float = Field(
        default=3600.0,
        gt=0,
        allow_inf_nan=False,
        description="most seconds one engine request may take; past it the request is aborted and the trajectory "
        "fails with termination_reason timeout (not trained); the default only catches requests that never return",
    )
    env_timeout_s: float = Field(
        default=600.0,
        gt=0,
        allow_inf_nan=False,
        description="most seconds one environment reset or step may take; past it the trajectory fails with "
        "termination_reason timeout (not trained) and the rest of the rollout goes on",
    )
    close_timeout_s: float = Field(
        default=30.0,
        gt=0,
        allow_inf_nan=False,
        description="most seconds an environment's close may take; past it the trajectory fails (not trained)",
    )
    max_retries: StrictInt = Field(
        default=2,
        ge=0,
        description="most times a trajectory that failed outside the policy (engine error or abort, a tool's transport "
        "error, timeout or start-up, an environment call past env_timeout_s, a reward that failed or timed out) is "
        "rolled out again with a fresh sample; retries and what still failed are counted by kind in the metrics row "
        "(retries_<kind>, failed_<kind>); such a failure is never trained as a reward of 0 (0: no retries)",
    )
    check_alignment: bool = Field(
        default=True,
        description="compare each finished trajectory's token ids with a full chat-template re-render (metrics "
        "alignment_mismatches, retokenize_drift)",
    )
    template_rewrites: Literal["new_run", "refuse"] = Field(
        default="new_run",
        description="where the chat template rewrites earlier turns once later ones follow (QwQ, the DeepSeek-R1 "
        "distills, Qwen3 after a user message): 'new_run' starts a new exact run prompted with the template's render "
        "of the whole conversation (the trajectory then trains as several runs); 'refuse' refuses the template at "
        "start-up and fails a trajectory that needs a rewrite",
    )
    max_staleness: StrictInt = Field(
        default=0,
        ge=0,
        description="k: trajectories keep running while the trainer steps and loads weights; step t trains the groups "
        "of batches <= t (waiting for them), then finished groups of later batches in the order they finished, so "
        "that no trained token was sampled by weights more than k updates older than the ones it updates (0: "
        "lockstep, every step waits for its whole rollout)",
    )
    dynamic_sampling: bool = Field(
        default=False,
        description="DAPO's dynamic sampling: a step leaves out groups that train nothing (constant: every valid "
        "sample the same reward, GRPO advantage 0; with optimizer.overlong_filter also those whose every sample "
        "was cut) and, while it has fewer than tasks_per_step useful groups, draws the next tasks_per_step tasks of "
        "the order (at most max_extra_draws times); every drawn group is trained in its step or counted in "
        "groups_constant (one rank only), and the tokens of those left out in tokens_excluded_constant",
    )
    max_extra_draws: StrictInt = Field(
        default=2,
        ge=0,
        description="with dynamic_sampling: the most extra draws of tasks_per_step tasks per step (0: leave groups "
        "that train nothing out, draw none)",
    )
    placement: Literal["overlap", "pause"] = Field(
        default="overlap",
        description="with max_staleness > 0: 'overlap' keeps generating during the train step (memory for both); "
        "'pause' pauses generation during it (requests and KV cache stay, nothing drains)",
    )

    def harness_config(self) -> HarnessConfig:
        """The turn loop's configuration: every `HarnessConfig` field, from the field of this section of that name.

        Raises:
            ConfigError: if a value is outside the harness's range.
        """
        from agentic_rl.rollout.spec import HarnessConfig

        return HarnessConfig(**{name: getattr(self, name) for name in HarnessConfig.model_fields})


class EngineSection(Config):
    """Engine settings; fp32 by default so the engine's logprobs match the fp32 trainer's."""

    dtype: EngineDtype = "float32"
    kv_cache_gib: float = Field(default=0.5, gt=0, description="the KV cache on the CPU (accelerators: see below)")
    gpu_memory_utilization: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="on a GPU or NPU, the share of the card's memory the engine takes (its weights, activations and "
        "KV cache); the trainer has the rest (all of it while the engine sleeps: sleep_while_training)",
    )
    max_model_len: int | None = Field(
        default=None,
        ge=16,
        description="the engine window in tokens (prompt + response); None: VLLMEngineConfig's default (4096); "
        "rollout.max_prompt_length + rollout.max_response_length must fit it",
    )
    sleep_while_training: bool = False
    tensor_parallel_size: int = Field(
        default=1,
        ge=1,
        description="ranks per engine under torchrun: groups of this many consecutive ranks each run one "
        "tensor-parallel engine (it must divide the ranks of a node and the model's attention heads); only each "
        "group's first rank rolls out, the others serve its engine and train",
    )
    group_timeout_s: float = Field(
        default=600.0,
        gt=0,
        allow_inf_nan=False,
        description="with tensor_parallel_size > 1: seconds a rank of an engine group may give no sign of life "
        "before the others stop the run, naming it",
    )


class JudgeSection(Config):
    """The LLM judge of `reward: llm_judge` (`rewards.LLMJudgeReward`): greedy, `max_tokens` tokens, "yes"/"no".

    By default it asks the run's own engine, in process (the policy being trained judges its own answers: cheap,
    but it can learn to please itself; give an endpoint for a fixed judge). A failed call or an unparseable verdict
    scores 0 and counts in `judge_failures`; it never fails the trajectory or the run. In process, a judge call
    waits while generation is paused (`rollout.placement: pause`): keep `timeout_s` above a train step there.
    """

    base_url: str | None = Field(
        default=None,
        description="an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 (None: the run's own engine)",
    )
    model: str = Field(default="", description="the model name the endpoint serves (needed with base_url)")
    api_key_env: str | None = Field(default=None, description="environment variable holding the endpoint's API key")
    max_tokens: int = Field(default=4, ge=1, description="most tokens of the judge's reply")
    timeout_s: float = Field(
        default=30.0,
        gt=0,
        allow_inf_nan=False,
        description="most seconds of one judge call (below rollout.reward_timeout_s)",
    )
    max_retries: int = Field(default=1, ge=0, description="retries of a failed endpoint call")

    @model_validator(mode="after")
    def _endpoint_names_a_model(self) -> JudgeSection:
        if self.base_url is not None and not self.model:
            raise ValueError("judge.base_url needs judge.model: the model name the endpoint serves")
        return self


class TrainConfig(Config):
    """A training run, usually read from YAML (`agentic-rl train --config FILE`)."""

    model: str = "smollm2-135m-instruct"
    data: str = Field(
        default="../shared/data/gsm8k_train.jsonl",
        description="training tasks: JSON Lines, parquet (verl's layout), a datasets save_to_disk folder, "
        "json:/csv:/parquet:FILES, or a generated family such as 'arithmetic:train:4096' or 'humaneval[:144]' "
        "(see agentic_rl.data)",
    )
    data_columns: DataColumns = Field(
        default_factory=DataColumns,
        description="which column holds each task field, for data and eval_data (e.g. {question: problem, "
        "answer: solution} or 'question=problem,answer=solution'); default: GSM8K and verl column names",
    )
    tools: list[str | PluginRef | MCPToolsEntry] = Field(
        default_factory=lambda: ["calculator"],
        description="the tools offered to the model: built-in names (TOOL_NAMES), Tool / StatefulTool classes of "
        "your own as 'package.module:Class' or {class: package.module:Class, kwargs: {...}}, or an MCP server's "
        "tools as {mcp: {command: [...] | url: ..., tools: [...], timeout_s, session}} (agentic_rl.tools.mcp)",
    )
    reward: str = Field(
        default="gsm8k",
        description="a name in REWARDS, 'llm_judge' (the `judge` section), or 'package.module:function'",
    )
    judge: JudgeSection = Field(default_factory=JudgeSection)
    system_prompt_file: str | None = Field(
        default=None,
        description="a text file holding the built-in tool agent's system message (None: its default; "
        "a task's own system_prompt still wins); not with an environment or agent of your own",
    )
    reward_metrics: list[str] = Field(
        default_factory=list,
        description="reward functions (names as for reward) or diagnostics (answer_words, quotes_passage, searches, "
        "visits, found_support: rewards.research) reported, not rewarded, for every trajectory: their mean in each "
        "metrics row and, prefixed heldout_, in evaluation (e.g. [hotpotqa_f1]; not with an agent of your own)",
    )
    environment: PluginRef | None = Field(
        default=None,
        description="an Environment of your own, run under the harness: 'package.module:Class' or {class: ..., "
        "kwargs: {...}}; it gets the tools when its constructor takes a 'tools' argument (tools default to none "
        "then); None: the built-in ToolEnvironment over tools",
    )
    agent: PluginRef | None = Field(
        default=None,
        description="a BaseEngineWrapper subclass of your own that rolls out the tasks: 'package.module:Class' or "
        "{class: ..., kwargs: {...}}; built with the rollout section's limits and sampling, handed the run's engine "
        "(use_engine) and initialized; it brings its own environment, tools and reward",
    )
    output_dir: str = "runs/train"
    steps: int = Field(default=3, ge=1)
    seed: int = Field(
        default=0,
        ge=0,
        le=2**32 - 1,
        description="seeds the trainer, the data order and the engine (seed + rank); an unsigned 32-bit int",
    )
    device: str = "cpu"
    checkpoint_every: int = Field(default=0, ge=0, description="0: only the final checkpoint")
    keep_checkpoints: int = Field(
        default=2, ge=0, description="step checkpoints kept, the newest (0: all); the final one is always kept"
    )
    eval_data: str | None = Field(
        default=None,
        description="held-out tasks (a data spec as for data, e.g. 'arithmetic:heldout:64'), rolled out greedily "
        "unless eval_temperature > 0",
    )
    eval_limit: int | None = Field(default=None, ge=1, description="evaluate the first N held-out tasks (None: all)")
    eval_every: int = Field(
        default=0, ge=0, description="evaluate every K steps (0: before the first and after the last)"
    )
    eval_temperature: float = Field(
        default=0.0,
        ge=0.0,
        le=2.0,
        description="0: greedy evaluation; > 0: sampled at this temperature with the same seeds at every evaluation, "
        "so each one draws alike (for policies that loop when greedy, e.g. repeating a search)",
    )
    eval_samples: int = Field(
        default=1,
        ge=1,
        description="samples per held-out task (K); K > 1 needs eval_temperature > 0 and adds heldout_pass@k "
        "(k = 1..K, unbiased), heldout_avg@K and heldout_accuracy_stderr to the evaluation's metrics",
    )
    loggers: list[LoggerName] = Field(
        default_factory=lambda: ["jsonl"],
        description="metric sinks: jsonl (metrics.jsonl), tensorboard (tensorboard/), wandb (offline, wandb/)",
    )
    wandb_project: str = "agentic-rl"
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    engine: EngineSection = Field(default_factory=EngineSection)
    optimizer: GRPOConfig = Field(default_factory=GRPOConfig)

    @model_validator(mode="after")
    def _one_way_to_roll_out(self) -> TrainConfig:
        """An agent of your own brings its own environment, tools and reward; an environment of your own gets no
        tools unless they are named."""
        given = self.model_fields_set
        if self.agent is not None:
            defaults = {
                "environment": None,
                "tools": ["calculator"],
                "reward": "gsm8k",
                "reward_metrics": [],
                "system_prompt_file": None,
            }
            clashing = [name for name, value in defaults.items() if name in given and getattr(self, name) != value]
            if clashing:
                raise ValueError(
                    f"agent {self.agent.path!r} brings its own environment, tools and reward: remove "
                    f"{', '.join(clashing)} (pass settings to the agent with agent.kwargs)"
                )
            shaping = [
                f"rollout.{name}"
                for name in ("toolcall_weight", "milestone_weight", "unfinished_penalty")
                if getattr(self.rollout, name) != RolloutSection.model_fields[name].default
            ]
            if shaping:
                raise ValueError(
                    f"agent {self.agent.path!r} computes its own rewards: remove {', '.join(shaping)} "
                    "(pass reward settings to the agent with agent.kwargs)"
                )
        elif self.environment is not None and "tools" not in given:
            self.tools = []
        if self.environment is not None and self.system_prompt_file is not None:
            raise ValueError(
                "system_prompt_file sets the built-in tool agent's system message: an environment of "
                "your own takes its own (environment.kwargs)"
            )
        _check_trainable_sampling(self.rollout.sampling)
        if self.reward == "llm_judge" and self.judge.timeout_s >= self.rollout.reward_timeout_s:
            raise ValueError(
                f"judge.timeout_s={self.judge.timeout_s:g} must be below rollout.reward_timeout_s="
                f"{self.rollout.reward_timeout_s:g}: the harness abandons a reward past that bound"
            )
        if self.rollout.milestone_weight and self.optimizer.advantage != "step":
            raise ValueError(
                f"rollout.milestone_weight={self.rollout.milestone_weight:g} is a per-turn reward: only "
                "optimizer.advantage: step learns from it"
            )
        if self.data_columns.milestones is not None and not self.rollout.milestone_weight:
            raise ValueError(
                f"data_columns.milestones={self.data_columns.milestones!r} reads milestones that only "
                "rollout.milestone_weight > 0 rewards: set it (with optimizer.advantage: step)"
            )
        if self.rollout.unfinished_penalty and self.optimizer.overlong_filter:
            raise ValueError(
                "rollout.unfinished_penalty and optimizer.overlong_filter pull against each other: the "
                "filter keeps truncated and context_limit samples out of the loss but in their group's "
                "mean, so a penalty on them only raises their siblings' advantages; use one of them"
            )
        if self.optimizer.lr_warmup_steps >= self.steps:
            raise ValueError(
                f"optimizer.lr_warmup_steps={self.optimizer.lr_warmup_steps} must be below steps="
                f"{self.steps}: the whole run would train at a rate still rising"
            )
        if self.rollout.max_staleness and self.engine.sleep_while_training:
            raise ValueError(
                "engine.sleep_while_training needs lockstep training (rollout.max_staleness: 0): a "
                "sleeping engine cannot keep trajectories in flight; use rollout.placement: pause"
            )
        return self

    @model_validator(mode="after")
    def _sampled_eval(self) -> TrainConfig:
        """K > 1 held-out samples per task need sampling: greedy samples of a task are all the same."""
        if self.eval_samples > 1 and not self.eval_temperature:
            raise ValueError(
                f"eval_samples={self.eval_samples} needs eval_temperature > 0 (it is 0: greedy), since greedy "
                "samples of a task are all the same"
            )
        return self

    @model_validator(mode="after")
    def _ranges_across_sections(self) -> TrainConfig:
        check_ranges(self)
        return self

    @field_validator("device")
    @classmethod
    def _torch_device(cls, value: str) -> str:
        if not re.fullmatch(r"(cpu|cuda|npu|xpu|mps)(:\d+)?", value):
            raise ValueError("not a training device: cpu, cuda, npu, xpu or mps, optionally with :INDEX (cuda:0)")
        return value


def _check_trainable_sampling(sampling: SamplingConfig) -> None:
    """The trainer's logprobs follow the rollout's temperature, top-k and top-p (`SamplingDistribution`): refuse,
    with the config key, sampling it cannot follow (temperature 0, min_p, penalties, logit bias)."""
    from agentic_rl.train.sampling_distribution import SamplingDistribution

    try:
        SamplingDistribution.of(sampling)
    except ConfigError as exc:
        raise ValueError(
            f"rollout.sampling: {exc} (GRPO trains on the distribution the rollout samples from, which "
            "the trainer must compute: sample with temperature > 0 and only temperature, top_k, top_p)"
        ) from None


def load_train_config(path: str | Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """`TrainConfig.from_yaml(path, overrides)`: a training config from YAML with `KEY=VALUE` overrides.

    Raises:
        ConfigError: naming the bad override or field.
    """
    return TrainConfig.from_yaml(path, overrides)


def load_run_config(run_dir: str | Path) -> TrainConfig:
    """The config a training run recorded (`RUN_DIR/config.json`), with `output_dir` set to `run_dir` (the folder
    may have moved since): what `train(config, resume=True)` continues.

    Raises:
        FileNotFoundError: if `run_dir` has no `config.json`.
        ConfigError: if it is not a valid `TrainConfig`.
    """
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: --resume takes a folder written by 'agentic-rl train'")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} is not a training config")
    return TrainConfig.model_validate({**raw, "output_dir": str(run_dir)})


def config_tasks(config: TrainConfig, field: str, limit: int | None = None) -> list[dict[str, Any]]:
    """The tasks of `config.<field>` (`data` or `eval_data`), read before any engine starts.

    Raises:
        ConfigError: naming the field and its value, for a spec or file that gives no tasks, or, with
            `rollout.milestone_weight`, naming the task whose `milestones` is not a list of non-empty strings.
    """
    from agentic_rl.rewards.turns import task_milestones

    spec = getattr(config, field)
    try:
        tasks = load_tasks(spec, limit=limit, columns=config.data_columns)
    except (ConfigError, OSError, ValueError) as exc:
        raise ConfigError(f"TrainConfig.{field}={spec!r}: {exc}") from exc
    if not tasks:
        raise ConfigError(f"TrainConfig.{field}={spec!r} holds no tasks")
    for task in tasks if config.rollout.milestone_weight else ():
        try:
            task_milestones(task)
        except EnvStepError as exc:  # every trajectory of the task would fail: refuse the run before it starts
            raise ConfigError(f"TrainConfig.{field}={spec!r}: task {task.get('id')!r}: {exc}") from None
    return tasks


def system_prompt(config: TrainConfig) -> str | None:
    """The text of `config.system_prompt_file` (None without one), read before any engine starts.

    Raises:
        ConfigError: naming the field and the file when it cannot be read.
    """
    if config.system_prompt_file is None:
        return None
    try:
        return Path(config.system_prompt_file).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"TrainConfig.system_prompt_file={config.system_prompt_file!r}: {exc}") from exc
