"""A ledger of everything an engine sampled, and the check of a token run against it.

A user-written agent drives the engine itself and hands back `TokenRun`s; before such a run is trained, its
sampled tokens must be what the engine sampled. `RecordingEngine` wraps any engine and records every completed
request into a `SampleLedger`: the request's prompt ids (as a digest), the sampled ids, their logprobs and the
weight version of each (the engine's `Generation.weight_versions`; for an engine that does not set them, its
`weight_version` when the request was sent). `SampleLedger.check_run` then checks a run span by span:

- the response splits into maximal spans of mask 1; a span starting at response position `s` was sampled in the
  context `prompt_ids + response_ids[:s]`;
- the ledger must hold an output sampled in exactly that context whose ids start with the span's ids (the harness
  may keep only a prefix of a generation: it drops a stop token or a stop string's tokens and inserts the
  template's glue with mask 0);
- when no output covers the whole span, it may be several generations back to back: an output that is a prefix of
  the span is taken (the longest first) and the rest of the span is checked in the context extended by it;
- the span's logprobs must equal the recorded ones after float32 rounding (or within 1e-6 nats), and, when the
  run records `weight_versions`, each sampled token's version must be the recorded one.

Contexts are keyed by a 16-byte blake2b digest of their ids packed as int64, so a lookup costs one hash of the
context, which `check_run` extends token by token along the run instead of hashing every context afresh.
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from agentic_rl.engine.base import Engine, Generation, StreamingEngine, sampled_versions
from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.types import INSERTED_VERSION, TokenRun, per_token_versions

__all__ = ["RecordedSample", "RecordingEngine", "RunCheck", "SampleLedger"]

LOGPROB_TOLERANCE = 1e-6
"""Largest difference (nats) between a run's logprob and the recorded one that still counts as equal, besides
equality after float32 rounding."""


def _hasher(ids: Sequence[int]) -> Any:
    """A blake2b hasher fed with `ids` packed as int64 (extend it with `hasher.update(array('q', more))`)."""
    return hashlib.blake2b(array("q", ids).tobytes(), digest_size=16)


def _context_key(ids: Sequence[int]) -> bytes:
    """The ledger key of a context: the 16-byte blake2b digest of `ids` packed as int64."""
    return _hasher(ids).digest()


@dataclass(frozen=True, slots=True)
class RecordedSample:
    """One completed engine request as the ledger holds it.

    Attributes:
        token_ids: the sampled ids, int64, in order (the stop token included when the engine stopped on one).
        logprobs: their logprobs (nats) rounded to float32, one per id.
        weight_versions: the weight version that sampled each id, int64, one per id.
    """

    token_ids: array
    logprobs: array
    weight_versions: array


@dataclass(frozen=True, slots=True)
class RunCheck:
    """What `SampleLedger.check_run` found.

    Attributes:
        reason: None when every sampled span of the run is what the engine sampled, else why not (one line).
        weight_versions: when `reason` is None, one entry per response token: the weight version that sampled it
            (from the ledger), `INSERTED_VERSION` (-1) where inserted; fit for `TokenRun.weight_versions` of a run
            that has none. None when `reason` is set.
    """

    reason: str | None
    weight_versions: list[int] | None = None

    @property
    def ok(self) -> bool:
        """True when the run passed."""
        return self.reason is None


class SampleLedger:
    """Every output an engine sampled, keyed by the digest of the prompt it was sampled from.

    Safe to call from several threads: a lock guards the store (`record` is called from coroutines on the engine
    caller's event loop; `check_run` may run in a worker thread).
    """

    def __init__(self) -> None:
        self._samples: dict[bytes, list[RecordedSample]] = {}
        self._count = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """How many outputs are recorded."""
        return self._count

    def record(
        self,
        prompt_ids: Sequence[int],
        token_ids: Sequence[int],
        logprobs: Sequence[float],
        weight_version: int | Sequence[int],
    ) -> None:
        """Record one output sampled from `prompt_ids`.

        Args:
            prompt_ids: the request's whole prompt, token ids.
            token_ids: the ids the engine sampled.
            logprobs: their logprobs (nats), one per id.
            weight_version: the weight version that sampled them: one per id (`Generation.weight_versions`), or
                one int for all (the engine's `weight_version` when the request was sent).

        Raises:
            TrajectoryError: if a per-id `weight_version` is not one value per id.
        """
        key = _context_key(prompt_ids)
        versions = array("q", per_token_versions(weight_version, len(token_ids)))
        sample = RecordedSample(array("q", token_ids), array("f", logprobs), versions)
        with self._lock:
            self._samples.setdefault(key, []).append(sample)
            self._count += 1

    def samples(self, prompt_ids: Sequence[int]) -> list[RecordedSample]:
        """The outputs recorded for exactly the context `prompt_ids`, oldest first ([] when none)."""
        return self._samples_at(_context_key(prompt_ids))

    def _samples_at(self, key: bytes) -> list[RecordedSample]:
        with self._lock:
            return list(self._samples.get(key, ()))

    def clear(self) -> None:
        """Drop every recorded output."""
        with self._lock:
            self._samples.clear()
            self._count = 0

    def forget_before(self, weight_version: int) -> int:
        """Drop the outputs whose first token was sampled before the engine reached `weight_version`, and empty
        outputs (what the training loop does once no record that may still be trained can hold them).

        Returns:
            How many outputs were dropped.
        """
        with self._lock:
            dropped = 0
            for key in list(self._samples):
                kept = [s for s in self._samples[key] if s.weight_versions and s.weight_versions[0] >= weight_version]
                dropped += len(self._samples[key]) - len(kept)
                if kept:
                    self._samples[key] = kept
                else:
                    del self._samples[key]
            self._count -= dropped
            return dropped

    def check_run(self, run: TokenRun) -> RunCheck:
        """Check that every sampled span of `run` is what the engine sampled (rules in the module docstring).

        Args:
            run: the token run to check; `response_logprobs` must be recorded when it has sampled tokens.
                `weight_versions`, when recorded, are checked too.

        Returns:
            A `RunCheck`: `reason` None and the weight version of every response token, or the first problem found
            (lengths that disagree, a mask value other than 0/1, no logprobs, a context the engine never sampled
            from, a token or logprob or weight version that differs from the ledger's).
        """
        problem = _shape_problem(run)
        if problem is not None:
            return RunCheck(problem)
        return _RunChecker(self, run).check()


def _shape_problem(run: TokenRun) -> str | None:
    """Why `run`'s per-token lists cannot be checked, or None."""
    n = len(run.response_ids)
    for name in ("response_mask", "response_logprobs", "weight_versions"):
        values = getattr(run, name)
        if values is not None and len(values) != n:
            return f"{name} has {len(values)} entries, response_ids has {n}"
    if any(m not in (0, 1) for m in run.response_mask):
        return "response_mask holds values other than 0 and 1"
    if run.response_logprobs is None and any(run.response_mask):
        return "no logprobs: the run has sampled tokens but response_logprobs is None"
    return None


def _sampled_spans(mask: Sequence[int]) -> list[tuple[int, int]]:
    """The maximal `[start, end)` spans of 1s in `mask`."""
    spans: list[tuple[int, int]] = []
    start = None
    for i, m in enumerate(mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(mask)))
    return spans


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class _RunChecker:
    """The check of one run: walks its sampled spans, extending the context digest as it goes."""

    def __init__(self, ledger: SampleLedger, run: TokenRun) -> None:
        self.ledger = ledger
        self.ids = run.response_ids
        self.mask = run.response_mask
        self.logprobs = run.response_logprobs or []
        self.versions = run.weight_versions
        self.found = [INSERTED_VERSION] * len(self.ids)
        self._hasher = _hasher(run.prompt_ids)
        self._hashed = 0  # response ids fed to the hasher

    def _key(self, position: int) -> bytes:
        """The digest of `prompt_ids + response_ids[:position]` (positions only grow along one span walk)."""
        if position > self._hashed:
            self._hasher.update(array("q", self.ids[self._hashed : position]).tobytes())
            self._hashed = position
        return self._hasher.digest()

    def check(self) -> RunCheck:
        for start, end in _sampled_spans(self.mask):
            problem = self._check_span(start, end)
            if problem is not None:
                return RunCheck(problem)
        return RunCheck(None, self.found)

    def _check_span(self, start: int, end: int) -> str | None:
        """Match `response_ids[start:end]` against the ledger, splitting it into back-to-back outputs if needed."""
        position = start
        while position < end:
            samples = self.ledger._samples_at(self._key(position))
            if not samples:
                where = "its start" if position == start else f"response position {position}"
                return (
                    f"sampled span [{start}, {end}): the engine never sampled from the context at {where} "
                    "(the prompt or an inserted token differs from what the engine saw)"
                )
            covered, problem = self._match(samples, position, end)
            if covered == 0:
                return f"sampled span [{start}, {end}): {problem}"
            position += covered
        return None

    def _match(self, samples: list[RecordedSample], position: int, end: int) -> tuple[int, str]:
        """How many tokens from `position` one recorded output accounts for: the whole rest of the span if an output
        starts with it, else the longest output that is a prefix of it; (0, why) when none does."""
        want = self.ids[position:end]
        whole = [s for s in samples if len(s.token_ids) >= len(want)]
        parts = sorted((s for s in samples if 0 < len(s.token_ids) < len(want)), key=lambda s: -len(s.token_ids))
        problems = []
        for sample in whole + parts:
            n = min(len(want), len(sample.token_ids))
            problem = self._differs(sample, position, n)
            if problem is None:
                self.found[position : position + n] = sample.weight_versions[:n].tolist()
                return n, ""
            problems.append(problem)
        best = max(problems, key=lambda p: p[0])
        return 0, best[1]

    def _differs(self, sample: RecordedSample, position: int, n: int) -> tuple[int, str] | None:
        """None when `sample`'s first `n` ids, logprobs and version match the run's from `position`, else a score
        (how far it matched: the ids, then the logprobs, then the versions) and where they first differ."""
        ids = self.ids[position : position + n]
        same = n if sample.token_ids[:n] == array("q", ids) else _common_prefix(sample.token_ids, ids)
        if same < n:
            return same, (
                f"response token {position + same} is {ids[same]}, the engine sampled {sample.token_ids[same]} there"
            )
        ours = array("f", self.logprobs[position : position + n])
        if ours != sample.logprobs[:n]:
            for j in range(n):
                mine, theirs = self.logprobs[position + j], sample.logprobs[j]
                if ours[j] != theirs and not abs(mine - theirs) <= LOGPROB_TOLERANCE:
                    return n, (f"logprob of response token {position + j} is {mine!r}, the engine's is {theirs!r}")
        if self.versions is not None:
            for j in range(n):
                if self.versions[position + j] != sample.weight_versions[j]:
                    return n + 1, (
                        f"weight version of response token {position + j} is "
                        f"{self.versions[position + j]}, the engine sampled it at {sample.weight_versions[j]}"
                    )
        return None


class RecordingEngine:
    """An engine proxy that records every output of `inner` into `ledger`; everything else is `inner`'s.

    `generate` records the whole result; `stream` (present only when `inner` streams) records the concatenated
    deltas when the stream ends, or what was delivered when it is closed early or fails. Every other attribute
    (`max_model_len`, `weight_version`, `update_weights`, `sleep`, `close`, `in_flight_requests`, `call`...) is
    read from `inner`, so `isinstance(proxy, TrainableEngine)` / `StreamingEngine` hold exactly when they hold for
    `inner`: constructing `RecordingEngine(inner)` gives a streaming subclass only for a streaming `inner`.

    Args:
        inner: any `Engine`.
        ledger: where to record (default: a new `SampleLedger`).
    """

    def __new__(cls, inner: Engine, ledger: SampleLedger | None = None) -> RecordingEngine:
        if cls is RecordingEngine and isinstance(inner, StreamingEngine):
            cls = _StreamingRecordingEngine
        return super().__new__(cls)

    def __init__(self, inner: Engine, ledger: SampleLedger | None = None) -> None:
        self._inner = inner
        self.ledger = ledger if ledger is not None else SampleLedger()

    @property
    def inner(self) -> Engine:
        """The wrapped engine."""
        return self._inner

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_inner":  # copy/pickle probe before __init__ ran
            raise AttributeError(name)
        return getattr(self._inner, name)

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingConfig) -> Generation:
        """`inner.generate`, recording the result with its per-token weight versions (where `inner` sets none: the
        weight version read when the request was sent)."""
        version = self._inner.weight_version
        generation = await self._inner.generate(prompt_ids, sampling)
        self.ledger.record(prompt_ids, generation.token_ids, generation.logprobs, sampled_versions(generation, version))
        return generation


class _StreamingRecordingEngine(RecordingEngine):
    """`RecordingEngine` over a `StreamingEngine`."""

    async def stream(self, prompt_ids: Sequence[int], sampling: SamplingConfig) -> AsyncIterator[Generation]:
        """`inner.stream`, recording the delivered deltas, concatenated, when the stream ends or is closed."""
        version = self._inner.weight_version
        ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        try:
            async for delta in self._inner.stream(prompt_ids, sampling):  # type: ignore[attr-defined]
                ids.extend(delta.token_ids)
                logprobs.extend(delta.logprobs)
                versions.extend(sampled_versions(delta, version))
                yield delta
        finally:
            self.ledger.record(prompt_ids, ids, logprobs, versions)
