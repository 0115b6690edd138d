"""Supervised traces in the rollout's own token format: a scripted policy replayed through the real turn loop.

A trace is a list of assistant texts (tool calls, then a final answer). `replay_traces` runs each one through
`run_trajectory` with a `ReplayEngine` that "samples" the scripted text: the environment executes the tool calls
for real, and the record (prompt ids, `response_mask`, observation and template glue ids) is built by exactly the
code that records a rollout. So supervised fine-tuning on these trajectories trains the very token sequences a
later rollout will produce and read.

`gsm8k_traces` turns GSM8K solutions into calculator traces: every `<<expression=value>>` annotation becomes one
calculator call, the last turn restates the solution and ends with the answer on its own line (what
`gsm8k_reward` reads). A trace whose calculator output disagrees with the annotation is dropped and counted.

`hotpotqa_traces` turns HotpotQA's supporting facts into research traces for the local `search` and `visit` tools:
search the question, visit each supporting document (searching its title first when no result so far named it),
then quote the supporting sentences and give the answer in `<answer></answer>` (what `hotpotqa_f1_reward` reads).
Each tool result the trace expects is computed by the same tools when the trace is built, so a replay that reads
anything else is dropped.
"""

from __future__ import annotations

import logging
import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentic_rl.chat import ChatRenderer
from agentic_rl.engine.base import Generation
from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.environments.base import Environment
from agentic_rl.parser import HERMES, format_tool_call
from agentic_rl.rollout.harness import run_trajectory
from agentic_rl.rollout.runner import run_tasks
from agentic_rl.rollout.spec import HarnessConfig, RewardCallable, RolloutSpec
from agentic_rl.tools.base import Tool
from agentic_rl.types import StepTrajectory, TerminationReason

__all__ = [
    "ReplayEngine",
    "Trace",
    "TraceStats",
    "gsm8k_trace",
    "gsm8k_traces",
    "hotpotqa_trace",
    "hotpotqa_traces",
    "replay_traces",
    "tool_call_text",
]

logger = logging.getLogger(__name__)

_ANNOTATION = re.compile(r"<<([^<>=]+)=([^<>]+)>>")


def tool_call_text(name: str, arguments: Mapping[str, Any], call_format: str = HERMES) -> str:
    """One call as a model of `call_format` writes it (`parser.format_tool_call`; the default, a `<tool_call>` JSON
    block, is what the tool system prompt teaches), which `parse_tool_calls` reads back in that format."""
    return format_tool_call(name, dict(arguments), call_format)


@dataclass(frozen=True, slots=True)
class Trace:
    """A scripted trajectory: the task and the assistant text of every turn, in order.

    Attributes:
        task: `{"id", "question", "ground_truth", ...}` as the rollout takes it.
        turns: the assistant texts; every turn but the last normally holds tool calls.
        expected_observations: per tool call, in order, the text its result must equal for the trace to be kept
            (None: any result).
    """

    task: dict[str, Any]
    turns: tuple[str, ...]
    expected_observations: tuple[str | None, ...] = ()


@dataclass
class TraceStats:
    """What `replay_traces` kept and why it dropped the rest (counts of traces)."""

    kept: int = 0
    dropped_observation_mismatch: int = 0
    dropped_failed: int = 0
    dropped_incomplete: int = 0
    reasons: list[str] = field(default_factory=list)


class ReplayEngine:
    """An `Engine` whose turn k "samples" `turns[k]`: its token ids (as the renderer encodes the text), closed by the
    end-of-turn id, each with logprob 0. One instance serves one trajectory.

    A turn longer than the request's `max_tokens` is cut and reported as `length`, as a real engine would.
    """

    def __init__(self, renderer: ChatRenderer, turns: Sequence[str], *, max_model_len: int = 1 << 20) -> None:
        self.renderer = renderer
        self.turns = list(turns)
        self._max_model_len = max_model_len
        self.weight_version = 0
        self.turn = 0

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingConfig) -> Generation:
        text = self.turns[min(self.turn, len(self.turns) - 1)]
        self.turn += 1
        ids = [*self.renderer.encode(text), self.renderer.end_of_turn_id]
        limit = sampling.max_tokens or len(ids)
        if len(ids) > limit:
            return Generation(token_ids=ids[:limit], logprobs=[0.0] * limit, finish_reason="length")
        stop = self.renderer.end_of_turn_id
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop", stop_reason=stop)


def _number(text: str) -> float | None:
    try:
        return float(text.strip().replace(",", "").rstrip("."))
    except ValueError:
        return None


def _same_value(observed: str, expected: str) -> bool:
    a, b = _number(observed), _number(expected)
    if a is None or b is None:
        return observed.strip() == expected.strip()
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)


def gsm8k_trace(row: Mapping[str, Any], index: int, call_format: str = HERMES) -> Trace | None:
    """A calculator trace from one GSM8K row (`{"question", "answer"}`), or None without an annotation.

    Each `<<expression=value>>` becomes a calculator call (its result must equal `value`); the last turn is the
    solution without annotations and without the `####` line, followed by the final answer on its own line. Calls
    are written in `call_format` (the chat template's, `parser.tool_call_format`).
    """
    answer = str(row["answer"])
    if "####" not in answer:
        return None
    body, final = answer.rsplit("####", 1)
    final = final.strip().replace(",", "")
    calls = _ANNOTATION.findall(body)
    if not calls:
        return None
    reasoning = _ANNOTATION.sub("", body).strip()
    turns = [tool_call_text("calculator", {"expression": expression.strip()}, call_format) for expression, _ in calls]
    turns.append(f"{reasoning}\n{final}")
    task = {"id": index, "question": str(row["question"]), "ground_truth": final}
    return Trace(task=task, turns=tuple(turns), expected_observations=tuple(value.strip() for _, value in calls))


def gsm8k_traces(
    rows: Sequence[Mapping[str, Any]],
    *,
    count: int,
    max_calls: int = 4,
    seed: int = 0,
    call_weights: Sequence[float] | None = None,
    call_format: str = HERMES,
) -> list[Trace]:
    """`count` GSM8K calculator traces with 1 to `max_calls` calls, in set shares of each call count.

    GSM8K alone has mostly 2-4 annotations, which teaches a model to keep calling even when one call answers; so
    problems are drawn (seeded) per call count: `call_weights[k - 1]` is the relative share of traces with k calls
    (default: equal shares). A call count with too few problems leaves its share to the others. Calls are written in
    `call_format`.

    Raises:
        ValueError: if `count` < 1, `max_calls` < 1, or `call_weights` is not `max_calls` non-negative numbers with
            a positive sum.
    """
    if count < 1 or max_calls < 1:
        raise ValueError(f"count and max_calls must be >= 1, got {count} and {max_calls}")
    weights = list(call_weights) if call_weights is not None else [1.0] * max_calls
    if len(weights) != max_calls or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"call_weights must be {max_calls} non-negative numbers with a positive sum, got {weights}")
    by_calls: dict[int, list[Trace]] = {k: [] for k in range(1, max_calls + 1)}
    for index, row in enumerate(rows):
        trace = gsm8k_trace(row, index, call_format)
        if trace is not None and len(trace.expected_observations) <= max_calls:
            by_calls[len(trace.expected_observations)].append(trace)
    rng = random.Random(seed)
    for bucket in by_calls.values():
        rng.shuffle(bucket)
    chosen: list[Trace] = []
    taken = dict.fromkeys(by_calls, 0)
    while len(chosen) < count and any(by_calls[k] for k in by_calls if weights[k - 1] > 0):
        # the call count furthest below its share takes the next trace
        k = min(
            (k for k in by_calls if by_calls[k] and weights[k - 1] > 0), key=lambda k: (taken[k] / weights[k - 1], k)
        )
        chosen.append(by_calls[k].pop())
        taken[k] += 1
    rng.shuffle(chosen)
    return chosen


def _well_formed(row: Any) -> bool:
    """A HotpotQA row this module can read: a non-empty string question and answer, `context` as
    `[[title, [sentence, ...]], ...]` with one `context_doc_ids` string per paragraph, and `supporting_facts` as
    `[[title, sentence index], ...]` naming titles of the context."""
    if not isinstance(row, Mapping):
        return False
    question, answer = row.get("question"), row.get("answer")
    context, ids, facts = row.get("context"), row.get("context_doc_ids"), row.get("supporting_facts")
    if not (isinstance(question, str) and question.strip() and isinstance(answer, str) and answer.strip()):
        return False
    if not (isinstance(context, list) and isinstance(ids, list) and len(ids) == len(context) and ids):
        return False
    if not all(isinstance(i, str) for i in ids):
        return False
    for paragraph in context:
        if not (
            isinstance(paragraph, list)
            and len(paragraph) == 2
            and isinstance(paragraph[0], str)
            and isinstance(paragraph[1], list)
            and all(isinstance(x, str) for x in paragraph[1])
        ):
            return False
    titles = {paragraph[0] for paragraph in context}
    if not (isinstance(facts, list) and facts):
        return False
    return all(
        isinstance(f, list) and len(f) == 2 and f[0] in titles and isinstance(f[1], int) and not isinstance(f[1], bool)
        for f in facts
    )


def _supporting_documents(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(corpus id, title) of each distinct supporting-fact title, in order of first mention."""
    ids = dict(zip((title for title, _ in row["context"]), row["context_doc_ids"], strict=True))
    documents: dict[str, str] = {}
    for title, _ in row["supporting_facts"]:
        documents.setdefault(ids[title], title)
    return list(documents.items())


def _supporting_sentences(row: Mapping[str, Any]) -> list[str]:
    sentences = dict(row["context"])
    picked: list[str] = []
    for title, index in row["supporting_facts"]:
        lines = sentences[title]
        line = f"{title}: {lines[index].strip()}" if 0 <= index < len(lines) and lines[index].strip() else None
        if line is not None and line not in picked:
            picked.append(line)
    return picked


def hotpotqa_trace(
    row: Mapping[str, Any],
    index: int,
    *,
    search: Tool,
    visit: Tool,
    top_k: int | None = 3,
    call_format: str = HERMES,
) -> Trace | None:
    """A research trace from one HotpotQA row (`question`, `answer`, `supporting_facts`, `context`,
    `context_doc_ids`, as in the shared data), or None for a row of another shape (see `_well_formed`) or when a
    supporting document cannot be found by searching.

    Turns: `search` the question (asking for `top_k` hits; None: the tool's default); per supporting document (those
    the question's results name first, in rank order), `visit` it by id, after a `search` for its title when no
    earlier result named its id; the last turn quotes the supporting sentences and ends with
    `<answer>answer</answer>`. `search` and `visit` run here, synchronously, to
    choose the turns and to fix the tool results the replay must read (`expected_observations`). Calls are written
    in `call_format`.
    """
    if not _well_formed(row):
        return None
    documents = _supporting_documents(row)
    question = row["question"]
    turns: list[str] = []
    observations: list[str] = []

    def call(tool: Tool, arguments: dict[str, Any]) -> str:
        observation = str(tool.execute(arguments))
        turns.append(tool_call_text(tool.name, arguments, call_format))
        observations.append(observation)
        return observation

    def query(text: str) -> dict[str, Any]:
        return {"query": text} if top_k is None else {"query": text, "top_k": top_k}

    first = call(search, query(question))
    documents.sort(key=lambda doc: first.find(f"[{doc[0]}]") if f"[{doc[0]}]" in first else len(first))
    for doc_id, title in documents:
        if not any(f"[{doc_id}]" in seen for seen in observations) and f"[{doc_id}]" not in call(search, query(title)):
            return None
        call(visit, {"id": doc_id})
    answer = row["answer"].strip()
    facts = "\n".join(f"- {line}" for line in _supporting_sentences(row))
    turns.append(f"The documents say:\n{facts}\n<answer>{answer}</answer>" if facts else f"<answer>{answer}</answer>")
    task = {"id": row.get("id", index), "question": question, "ground_truth": answer}
    return Trace(task=task, turns=tuple(turns), expected_observations=tuple(observations))


def hotpotqa_traces(
    rows: Sequence[Mapping[str, Any]],
    *,
    count: int,
    seed: int = 0,
    search: Tool,
    visit: Tool,
    top_k: int | None = 3,
    call_format: str = HERMES,
) -> list[Trace]:
    """Up to `count` research traces (`hotpotqa_trace`) from `rows`, drawn in a seeded order; rows without a trace
    (another shape, or a supporting document no search finds) are skipped, and their number is logged. Calls are
    written in `call_format`.

    Raises:
        ValueError: if `count` < 1.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    traces: list[Trace] = []
    skipped = 0
    for i in order:
        if len(traces) == count:
            break
        trace = hotpotqa_trace(rows[i], i, search=search, visit=visit, top_k=top_k, call_format=call_format)
        if trace is None:
            skipped += 1
        else:
            traces.append(trace)
    if skipped or len(traces) < count:
        logger.warning(
            "research traces: %d of %d asked for; %d rows skipped (not HotpotQA-shaped, or a supporting "
            "document no search finds)",
            len(traces),
            count,
            skipped,
        )
    return traces


async def replay_traces(
    traces: Sequence[Trace],
    *,
    renderer: ChatRenderer,
    environment: Environment,
    config: HarnessConfig,
    reward_fn: RewardCallable | None = None,
    n_parallel_agents: int = 8,
) -> tuple[list[StepTrajectory], TraceStats]:
    """Run every trace through the real turn loop and keep the exact, complete ones.

    A trace is dropped (and counted) when its trajectory failed, when it did not end after its last scripted turn
    (e.g. `max_steps` too small), or when a tool result differs from its `expected_observations`.

    Returns:
        The kept trajectories (in trace order; `task` and `idx` as given) and the counts.
    """
    stats = TraceStats()

    async def replay(trace: Trace, idx: int) -> StepTrajectory:
        engine = ReplayEngine(renderer, trace.turns)
        result = await run_trajectory(
            trace.task,
            idx,
            RolloutSpec(engine=engine, environment=environment, renderer=renderer, config=config, reward_fn=reward_fn),
        )
        assert isinstance(result, StepTrajectory)  # no pause given: never a checkpoint
        return result

    results = await run_tasks(list(traces), replay, n_parallel_agents=n_parallel_agents)
    kept: list[StepTrajectory] = []
    for trace, trajectory in zip(traces, results, strict=True):
        reason = _drop_reason(trace, trajectory)
        if reason is None:
            kept.append(trajectory)
            continue
        stats.reasons.append(f"task {trace.task.get('id')}: {reason}")
        if reason.startswith("failed"):
            stats.dropped_failed += 1
        elif reason.startswith("tool result"):
            stats.dropped_observation_mismatch += 1
        else:
            stats.dropped_incomplete += 1
    stats.kept = len(kept)
    logger.info(
        "traces: %d kept, %d tool-result mismatches, %d failed, %d incomplete",
        stats.kept,
        stats.dropped_observation_mismatch,
        stats.dropped_failed,
        stats.dropped_incomplete,
    )
    return kept, stats


def _drop_reason(trace: Trace, trajectory: StepTrajectory) -> str | None:
    if trajectory.failed:
        return f"failed: {trajectory.error}"
    if (
        trajectory.metrics.get("steps") != len(trace.turns)
        or trajectory.termination_reason != TerminationReason.ENV_DONE
    ):
        return f"incomplete: {trajectory.metrics.get('steps')} of {len(trace.turns)} turns, {trajectory.termination_reason}"
    observations = [m["content"] for m in trajectory.chat_completions if m.get("role") == "tool"]
    if len(observations) != len(trace.expected_observations):
        return f"tool result count {len(observations)} != {len(trace.expected_observations)}"
    for observed, expected in zip(observations, trace.expected_observations, strict=True):
        if expected is not None and not _same_value(observed, expected):
            return f"tool result {observed!r} != {expected!r}"
    return None
