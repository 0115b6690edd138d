"""Trajectory records produced by a rollout: what the engine sampled, what the environment inserted, rewards.

Only validation and record building live here, no I/O (the JSON record is `agentic_rl.records`). The central
record is the `TokenRun`: one exact token sequence the engine saw and extended, i.e. a prompt followed by sampled
tokens (mask 1, with the engine's logprobs and the weight version that sampled each) and inserted tokens (mask 0:
tool observations, chat-template glue).
A trajectory is one run unless its history was rewritten between turns (memory summarized it, or an OpenAI client
sent a history that does not extend the last call): each rewrite starts a new run. `RunRecorder` builds the runs of
one trajectory turn by turn, for the rollout's turn loop and for the server's capture alike; packing iterates them.

The AgentSDK fields of `Trajectory` (`prompt_tokens`, `response_tokens`, `response_masks`, `response_logprobs`) are
1-D tensors holding the last run.

Names along the token path: token ids are `*_ids` (`prompt_ids`, `response_ids`, `Generation.token_ids`), the
sampled/inserted mask is `response_mask` and log-probabilities (nats) are `*_logprobs`, from the engine through
the JSON record (`records.trajectory_to_dict`) and the packed batch. The one exception is `Trajectory` itself,
whose fields keep the AgentSDK names: `prompt_tokens`, `response_tokens`, `response_masks`, `response_logprobs`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from agentic_rl.errors import TrajectoryError

if TYPE_CHECKING:  # torch loads with the first trajectory: a config is read and checked without it
    import torch

__all__ = [
    "INSERTED_VERSION",
    "RunRecorder",
    "Step",
    "StepTrajectory",
    "TerminationReason",
    "TokenRun",
    "Trajectory",
    "FailureKind",
    "default_metrics",
    "is_finite_number",
    "per_token_versions",
]


class TerminationReason(StrEnum):
    """Why a trajectory ended (`Trajectory.termination_reason`); a `str`, so it compares equal to its value."""

    ENV_DONE = "env_done"  # the environment ended it (e.g. a final answer without a tool call)
    MAX_STEPS = "max_steps"  # `max_steps` turns used and the environment still wanted more
    TRUNCATED = "truncated"  # a turn hit the per-turn `max_tokens`; its half-written tool call is not run
    CONTEXT_LIMIT = "context_limit"  # no room left in the model window or the response budget
    PROMPT_TOO_LONG = "prompt_too_long"  # the first prompt exceeds `max_prompt_length` or fills the window (failed)
    INVALID_TASK = "invalid_task"  # the task could not be read (failed)
    ERROR = "error"  # an exception in the engine, environment or reward, or a failing close (failed)
    TIMEOUT = "timeout"  # an engine request (`turn_timeout_s`) or an environment reset/step (`env_timeout_s`) did
    # not return within its bound; it was aborted (failed)
    ABORTED = "aborted"  # the engine ended a turn as aborted (finish_reason `abort`, `error`); never trained (failed)
    CAPTURED = "captured"  # recorded by the server from an OpenAI client's calls: the client decides when it ends

    @property
    def aborts_a_turn(self) -> bool:
        """True for the reasons whose last turn was cut off before it finished (`aborted`, `timeout`: an engine
        request aborted, or an environment call cancelled)."""
        return self in (TerminationReason.ABORTED, TerminationReason.TIMEOUT)

    @property
    def cut_by_limit(self) -> bool:
        """True for the reasons where a limit ended a trajectory the environment had not ended (`max_steps`,
        `truncated`, `context_limit`)."""
        return self in (TerminationReason.MAX_STEPS, TerminationReason.TRUNCATED, TerminationReason.CONTEXT_LIMIT)


class FailureKind(StrEnum):
    """Why a failed trajectory failed, where the cause lies outside the policy and the task: an infrastructure
    failure (`Trajectory.failure_kind`). Such a trajectory is rolled out again with a fresh sample up to
    `HarnessConfig.max_retries` times and is never trained on. Failures the policy or the task caused (a prompt too
    long, an invalid task, an environment that raised) have no kind and are not retried; a malformed call, a limit or a
    wrong answer is not a failure at all."""

    ENGINE = "engine"  # the engine raised, rejected, aborted or timed out a request, or reported a non-finite logprob
    TOOL = "tool"  # a tool's transport, timeout or start-up failed (`ToolUnavailableError`), or it crashed
    ENVIRONMENT = "environment"  # an environment's reset or step past `env_timeout_s`
    REWARD = "reward"  # the reward (a judge or a reward endpoint) raised, timed out or returned a non-finite value


INSERTED_VERSION = -1
"""`TokenRun.weight_versions` entry of a token the environment inserted (no weights sampled it)."""


def is_finite_number(value: Any) -> bool:
    """Whether `value` is a finite int or float (a reward): not a bool, a string, NaN or an infinity."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def per_token_versions(weight_version: int | Sequence[int], n: int) -> list[int]:
    """`n` weight versions, one per token: `weight_version` repeated, or a copy of its `n` entries.

    Raises:
        TrajectoryError: if a sequence does not hold exactly `n` versions.
    """
    if isinstance(weight_version, numbers.Integral):
        return [int(weight_version)] * n
    versions = [int(v) for v in weight_version]
    if len(versions) != n:
        raise TrajectoryError(f"{len(versions)} weight versions for {n} sampled ids")
    return versions


@dataclass(slots=True)
class TokenRun:
    """One exact token sequence: a prompt, then sampled (mask 1) and inserted (mask 0) tokens, in order.

    Every list after `prompt_ids` has one entry per response token. The engine saw `prompt_ids + response_ids[:j]`
    when it sampled token j; nothing in a run was decoded and re-encoded.

    Attributes:
        prompt_ids: token ids of the run's first prompt.
        response_ids: token ids after the prompt: sampled ids and inserted observation / template-glue ids.
        response_mask: 1 where the engine sampled the token, 0 where it was inserted.
        response_logprobs: the engine's logprob (nats) of each sampled token, 0.0 where inserted; None when not
            recorded (a trajectory built by hand without logprobs; also what a run built with response ids and
            without this argument holds).
        weight_versions: the engine weight version that sampled each token, `INSERTED_VERSION` (-1) where inserted;
            None when not recorded (as for `response_logprobs`).
    """

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] | None = field(default_factory=list)
    weight_versions: list[int] | None = field(default_factory=list)

    def __post_init__(self) -> None:
        # A run built with response tokens but without logprobs or versions did not record them (None); an empty
        # list stays for a run that starts empty and is filled as it goes (`RunRecorder`).
        if self.response_ids:
            if self.response_logprobs == []:
                self.response_logprobs = None
            if self.weight_versions == []:
                self.weight_versions = None

    def sample(
        self, ids: Sequence[int], logprobs: Sequence[float], weight_version: int | Sequence[int]
    ) -> tuple[int, int]:
        """Append tokens the engine sampled; returns their span `[start, end)` in `response_ids`.

        Args:
            ids: the sampled token ids.
            logprobs: their logprobs (nats), one per id.
            weight_version: the engine weight version that sampled them: one int for all, or one per id
                (`Generation.weight_versions`, for tokens sampled across a weight update).

        Raises:
            TrajectoryError: if `logprobs`, or a per-id `weight_version`, is not one value per id.
        """
        if len(logprobs) != len(ids):
            raise TrajectoryError(f"{len(logprobs)} logprobs for {len(ids)} sampled ids")
        versions = per_token_versions(weight_version, len(ids))
        start = len(self.response_ids)
        self.response_ids.extend(ids)
        self.response_mask.extend([1] * len(ids))
        if self.response_logprobs is not None:
            self.response_logprobs.extend(logprobs)
        if self.weight_versions is not None:
            self.weight_versions.extend(versions)
        return start, len(self.response_ids)

    def insert(self, ids: Sequence[int]) -> None:
        """Append tokens the environment or the chat template inserted (observations, glue)."""
        self.response_ids.extend(ids)
        self.response_mask.extend([0] * len(ids))
        if self.response_logprobs is not None:
            self.response_logprobs.extend([0.0] * len(ids))
        if self.weight_versions is not None:
            self.weight_versions.extend([INSERTED_VERSION] * len(ids))

    def copy(self) -> TokenRun:
        """A copy whose lists are its own (later appends to this run do not reach it)."""
        return TokenRun(
            *(
                None if values is None else list(values)
                for values in (
                    self.prompt_ids,
                    self.response_ids,
                    self.response_mask,
                    self.response_logprobs,
                    self.weight_versions,
                )
            )
        )

    @property
    def total_length(self) -> int:
        """Prompt plus response tokens."""
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def num_sampled(self) -> int:
        """Tokens the engine sampled in this run."""
        return sum(self.response_mask)

    def extends(self, prompt_ids: Sequence[int]) -> bool:
        """Whether `prompt_ids` is this run's whole sequence followed by at least one more token."""
        head = self.total_length
        return (
            len(prompt_ids) > head
            and list(prompt_ids[: len(self.prompt_ids)]) == self.prompt_ids
            and list(prompt_ids[len(self.prompt_ids) : head]) == self.response_ids
        )

    def check(self) -> None:
        """Raise `TrajectoryError` if the per-token lists disagree in length, the mask holds values other than 0
        and 1, or a logprob is NaN or infinite."""
        n = len(self.response_ids)
        for name in ("response_mask", "response_logprobs", "weight_versions"):
            values = getattr(self, name)
            if values is not None and len(values) != n:
                raise TrajectoryError(f"token run: {name} has {len(values)} entries, response_ids has {n}")
        if any(m not in (0, 1) for m in self.response_mask):
            raise TrajectoryError("token run: response_mask must hold only 0 and 1")
        if self.response_logprobs is not None and not all(math.isfinite(x) for x in self.response_logprobs):
            raise TrajectoryError("token run: response_logprobs contains NaN or Inf values")


class RunRecorder:
    """Builds the token runs of one trajectory as its turns happen (the turn loop's and the server capture's).

    `start(prompt_ids)` begins a run (the first, or after the history was rewritten); `sample` and `insert` extend
    the current one. `runs` lists them in order.
    """

    def __init__(self) -> None:
        self.runs: list[TokenRun] = []

    @property
    def current(self) -> TokenRun:
        """The run being extended.

        Raises:
            TrajectoryError: before the first `start`.
        """
        if not self.runs:
            raise TrajectoryError("no token run started yet")
        return self.runs[-1]

    def start(self, prompt_ids: Sequence[int]) -> TokenRun:
        """Begin a new run with `prompt_ids` as its prompt."""
        self.runs.append(TokenRun(list(prompt_ids)))
        return self.runs[-1]

    def sample(
        self, ids: Sequence[int], logprobs: Sequence[float], weight_version: int | Sequence[int]
    ) -> tuple[TokenRun, tuple[int, int]]:
        """Append sampled ids to the current run (`TokenRun.sample`); returns the run and their span in its
        `response_ids`."""
        run = self.current
        return run, run.sample(ids, logprobs, weight_version)

    def insert(self, ids: Sequence[int]) -> None:
        """Append inserted ids (observation, template glue) to the current run."""
        self.current.insert(ids)

    def extend_to(self, prompt_ids: Sequence[int]) -> None:
        """Insert the ids by which `prompt_ids` extends the current run (an observation and its template glue).

        Raises:
            TrajectoryError: if `prompt_ids` does not start with the current run's whole sequence.
        """
        if not self.current.extends(prompt_ids):
            raise TrajectoryError("the prompt does not extend the current token run")
        self.current.insert(prompt_ids[self.current.total_length :])


def default_metrics() -> dict[str, Any]:
    """The metrics every trajectory starts with (times in seconds)."""
    return {
        "steps": 0,
        "toolcall_reward": 0.0,
        "res_reward": 0.0,
        "reward_time": 0.0,
        "env_time": 0.0,
        "llm_time": 0.0,
        "total_time": 0.0,
    }


def _as_1d_tensor(name: str, value: Any, dtype: torch.dtype) -> torch.Tensor:
    import torch

    if not isinstance(value, torch.Tensor):
        try:
            value = torch.as_tensor(value, dtype=torch.float64 if dtype.is_floating_point else None)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise TrajectoryError(
                f"{name} must be a 1-D tensor or a list of numbers, got {type(value).__name__}"
            ) from exc
        if value.numel() == 0:
            value = value.to(dtype)
    if value.dim() != 1:
        raise TrajectoryError(f"{name} must be 1-D, got shape {tuple(value.shape)}")
    if value.is_complex():
        raise TrajectoryError(f"{name} must be real, got {value.dtype}")
    if value.is_floating_point():
        finite = torch.isfinite(value)
        if not bool(finite.all()):
            raise TrajectoryError(f"{name} contains {int((~finite).sum())} NaN or Inf value(s)")
    if dtype.is_floating_point:
        return value.to(dtype)
    if value.is_floating_point():
        if not bool((value == value.round()).all()):
            raise TrajectoryError(f"{name} holds token ids, got non-integer values")
    return value.to(dtype)


@dataclass
class Trajectory:
    """One rollout of one task, as token ids ready for packing.

    Attributes:
        prompt_tokens: (P,) int64, the rendered first prompt (system + user turn + generation prompt). Lists and
            integer-valued float tensors are converted to int64.
        response_tokens: (R,) int64, everything after the prompt: sampled tokens and inserted observation tokens.
        response_masks: (R,) int64, 1 where the engine sampled the token, 0 where the environment inserted it.
        idx: position of the task in the input batch.
        trajectory_reward: scalar reward of the whole trajectory.
        chat_completions: the conversation as `{"role", "content"}` messages.
        metrics: `steps`, `toolcall_reward`, `res_reward` and times in seconds (`reward_time`, `env_time`,
            `llm_time`, `total_time`); rollouts add more keys (tool-call counts, alignment checks).
        response_logprobs: (R,) float32 log-probabilities (nats) the engine reported for the sampled tokens, 0 where
            `response_masks` is 0; None when not recorded.
        termination_reason: why it ended, a `TerminationReason` (a `str`).
        failed: True when the trajectory ended in an error (`error` says which); packing marks it invalid, so it
            is excluded from GRPO group statistics and the loss.
        error: the error message of a failed trajectory.
        failure_kind: a `FailureKind` (a `str`) when it failed for a reason outside the policy (retried, never
            trained), None otherwise.
        refused: why training refused its record (its tokens are not exactly what the engine sampled, or are too
            stale), None when it was not refused; a refused trajectory is also `failed`, with the reason in `error`.
            Written by `loop.sources.refuse` alone, read by `train.packing.exclusion_reason`.
        runs: its exact token runs in order (see `TokenRun`); the token fields above equal the last one. Empty
            means one run made of the token fields themselves (a trajectory built by hand): read them with
            `token_runs()`.

    Raises:
        TrajectoryError: if a token tensor is not 1-D, holds NaN, Inf or non-integer ids, the mask holds values
            other than 0 and 1, the mask or logprobs length differs from `response_tokens`, or `runs` is given and
            a run is inconsistent or the last one differs from the token fields.
    """

    prompt_tokens: torch.Tensor
    response_tokens: torch.Tensor
    response_masks: torch.Tensor
    idx: int = 0
    trajectory_reward: float | int = 0.0
    chat_completions: list[dict[str, str]] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=default_metrics)
    response_logprobs: torch.Tensor | None = None
    termination_reason: str = ""
    failed: bool = False
    error: str | None = None
    failure_kind: str | None = None
    refused: str | None = None
    runs: list[TokenRun] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        import torch

        self.prompt_tokens = _as_1d_tensor("prompt_tokens", self.prompt_tokens, torch.long)
        self.response_tokens = _as_1d_tensor("response_tokens", self.response_tokens, torch.long)
        self.response_masks = _as_1d_tensor("response_masks", self.response_masks, torch.long)
        if bool(((self.response_masks != 0) & (self.response_masks != 1)).any()):
            raise TrajectoryError("response_masks must hold only 0 and 1")
        n = self.response_tokens.numel()
        if self.response_masks.numel() != n:
            raise TrajectoryError(f"response_masks has {self.response_masks.numel()} entries, response_tokens has {n}")
        if self.response_logprobs is not None:
            self.response_logprobs = _as_1d_tensor("response_logprobs", self.response_logprobs, torch.float32)
            if self.response_logprobs.numel() != n:
                raise TrajectoryError(
                    f"response_logprobs has {self.response_logprobs.numel()} entries, response_tokens has {n}"
                )
        reward = self.trajectory_reward
        if not is_finite_number(reward):
            raise TrajectoryError(f"trajectory_reward must be a finite number, got {reward!r}")
        self.metrics = {**default_metrics(), **self.metrics}
        if self.runs:
            for run in self.runs:
                run.check()
            if self.token_runs(fields_only=True)[0] != _comparable(self.runs[-1]):
                raise TrajectoryError("the token fields must equal the last of `runs`")

    @classmethod
    def from_runs(cls, runs: Sequence[TokenRun], **fields: Any) -> Trajectory:
        """A trajectory whose token fields are the last of `runs` (other fields as keyword arguments).

        Raises:
            TrajectoryError: if `runs` is empty or a run is inconsistent.
        """
        if not runs:
            raise TrajectoryError("a trajectory needs at least one token run")
        last = runs[-1]
        return cls(
            prompt_tokens=last.prompt_ids,
            response_tokens=last.response_ids,
            response_masks=last.response_mask,
            response_logprobs=last.response_logprobs,
            runs=list(runs),
            **fields,
        )

    def token_runs(self, *, fields_only: bool = False) -> list[TokenRun]:
        """Every exact token run, in order; together they hold every token the engine sampled.

        `runs` when it was given; else one run made of the token fields (weight versions not recorded). With
        `fields_only`, always that one run.
        """
        if self.runs and not fields_only:
            return self.runs
        logprobs = None if self.response_logprobs is None else self.response_logprobs.tolist()
        return [
            TokenRun(
                self.prompt_tokens.tolist(), self.response_tokens.tolist(), self.response_masks.tolist(), logprobs, None
            )
        ]

    @property
    def num_generated_tokens(self) -> int:
        """Number of tokens the engine sampled, over every run (`response_masks.sum()` for a single run)."""
        if not self.runs:
            return int(self.response_masks.sum())
        return sum(run.num_sampled for run in self.runs)


def _comparable(run: TokenRun) -> TokenRun:
    """`run` with its logprobs as float32 values and no weight versions: what the tensor fields can hold."""
    import torch

    logprobs = (
        None if run.response_logprobs is None else torch.tensor(run.response_logprobs, dtype=torch.float32).tolist()
    )
    return TokenRun(run.prompt_ids, run.response_ids, run.response_mask, logprobs, None)


@dataclass
class Step:
    """One turn of a multi-turn trajectory.

    Attributes:
        chat_completions: the full conversation up to and including this step's assistant message.
        thought: the text inside `<think>...</think>` of the model response, or "".
        action: the tool call(s) the model wrote this turn, as text from the first `<tool_call>` on ("" for a final
            answer in the built-in harness); None when not recorded.
        observation: what the model saw before acting: the user question on turn 0, later the previous
            action's result; None when not recorded.
        model_response: the full assistant text of this turn.
        info: details of this turn: finish reason, sampled token count, `weight_version` (the engine's when the
            turn was sent), `weight_versions` (`[min, max]` of its tokens' versions: they differ when the weights
            changed while the turn was sampled), `llm_time_s` and `env_time_s` (seconds in the engine and in the
            environment), tool-call counts and errors.
        reward: this turn's reward. The harness sets it on every turn: the environment's own reward for the turn
            (`info["reward"]` of its `step()`), the turn's share of the tool-call reward, and on the last turn the
            answer's reward (less `HarnessConfig.unfinished_penalty` when a limit cut the trajectory), so that
            without environment rewards the steps' rewards add up to `trajectory_reward`
            (`rewards.shaping`). Step-level training (`GRPOConfig.advantage = "step"`) learns from it.
        done: True on the step that ended the trajectory.
        mc_return: discounted return from this step on (filled by training code).
        run: the trajectory's `TokenRun` this turn was sampled in (None for a step built by hand without one: it has
            no tokens, and `step_rows` refuses it).
        span: `[start, end)` of this turn's sampled ids in `run.response_ids`.
    """

    chat_completions: list[dict[str, str]] = field(default_factory=list)
    thought: str = ""
    action: Any = None
    observation: Any = None
    model_response: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    reward: float = 0.0
    done: bool = False
    mc_return: float = 0.0
    run: TokenRun | None = field(default=None, repr=False)
    span: tuple[int, int] = (0, 0)

    @property
    def prompt_ids(self) -> list[int]:
        """The exact prompt this turn was sampled from: its run's prompt and everything before the turn."""
        if self.run is None:
            return []
        return self.run.prompt_ids + self.run.response_ids[: self.span[0]]

    @property
    def response_ids(self) -> list[int]:
        """The ids the engine sampled in this turn."""
        return [] if self.run is None else self.run.response_ids[self.span[0] : self.span[1]]

    @property
    def response_logprobs(self) -> list[float]:
        """The engine's logprobs (nats) of `response_ids` ([] when not recorded)."""
        if self.run is None or self.run.response_logprobs is None:
            return []
        return self.run.response_logprobs[self.span[0] : self.span[1]]


@dataclass
class StepTrajectory(Trajectory):
    """A `Trajectory` that also keeps its task and per-turn `Step` records.

    Attributes:
        task: the task as the environment read it.
        steps: one `Step` per assistant turn.
        credited: True when the harness wrote each turn's reward into `Step.reward` (`rewards.shaping`): the
            step rewards are then used as they are, even when they are all 0 (e.g. a milestone and the
            `unfinished_penalty` cancel). False for steps the harness did not write (captured by the server, or
            an agent that builds its own records): if they all carry 0, step-level training puts
            `trajectory_reward` on the last step.
    """

    task: Any = None
    steps: list[Step] = field(default_factory=list)
    credited: bool = False
