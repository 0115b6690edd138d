"""A run folder's trajectories -> one self-contained HTML page (data as embedded JSON, inline CSS and JS).

A run folder is what `agentic-rl rollout` writes (`trajectories.jsonl`, `summary.json` naming the model) or what
`agentic-rl train` writes (`rollouts/step_K.jsonl`, `config.json` naming the model). Each token is rendered as
the text it adds to the decoded sequence (streaming decode, so a character split over several byte-level tokens
shows on the token that completes it); pieces are stored once in a table and referenced by index.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from agentic_rl.errors import ConfigError
from agentic_rl.parser import LLAMA3_JSON, ToolCall, parse_tool_calls
from agentic_rl.types import TerminationReason

__all__ = ["RunFile", "build_view", "find_trajectory_files", "load_trajectories", "run_model", "view_records"]

logger = logging.getLogger(__name__)

_STEP_FILE = re.compile(r"step_(\d+)\.jsonl$")
# termination reasons where the response was cut by a token limit rather than ended by the model or environment
_CUT_REASONS = frozenset({TerminationReason.TRUNCATED, TerminationReason.CONTEXT_LIMIT})


@dataclass(frozen=True, slots=True)
class RunFile:
    """One JSONL file of trajectories in a run folder.

    Attributes:
        path: the file.
        source: its label in the viewer: `rollout` for `trajectories.jsonl`, `step K` for `rollouts/step_K.jsonl`.
    """

    path: Path
    source: str


def find_trajectory_files(run_dir: str | Path) -> list[RunFile]:
    """The trajectory files of a run folder: `trajectories.jsonl`, then `rollouts/step_K.jsonl` by step.

    Raises:
        ConfigError: if `run_dir` is not a folder, or holds none of those files.
    """
    run = Path(run_dir)
    if not run.is_dir():
        raise ConfigError(f"run folder {str(run)!r} does not exist or is not a folder")
    files: list[RunFile] = []
    if (run / "trajectories.jsonl").is_file():
        files.append(RunFile(run / "trajectories.jsonl", "rollout"))
    steps = [(int(m.group(1)), p) for p in (run / "rollouts").glob("step_*.jsonl") if (m := _STEP_FILE.search(p.name))]
    files += [RunFile(p, f"step {k}") for k, p in sorted(steps)]
    if not files:
        raise ConfigError(
            f"no trajectories in {str(run)!r}: expected trajectories.jsonl (agentic-rl rollout) or "
            "rollouts/step_K.jsonl (agentic-rl train)"
        )
    return files


def load_trajectories(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every trajectory record of a run folder, each with a `source` key added (see `RunFile`).

    Raises:
        ConfigError: if there are no trajectory files, a line is not a JSON object, or the files hold no records.
    """
    from agentic_rl.data import iter_jsonl

    records: list[dict[str, Any]] = []
    for run_file in find_trajectory_files(run_dir):
        for lineno, row in iter_jsonl(run_file.path):
            if not isinstance(row, dict) or "response_ids" not in row:
                raise ConfigError(f"{run_file.path}:{lineno}: not a trajectory record (no response_ids)")
            records.append({**row, "source": run_file.source})
    if not records:
        raise ConfigError(f"the trajectory files of {str(run_dir)!r} are empty")
    return records


def run_model(run_dir: str | Path) -> str | None:
    """The model a run used, as recorded in `summary.json` (rollout) or `config.json` (train); None if neither."""
    run = Path(run_dir)
    for name in ("summary.json", "config.json"):
        path = run / name
        if path.is_file():
            try:
                model = json.loads(path.read_text()).get("model")
            except (json.JSONDecodeError, AttributeError):
                logger.warning("%s is not a JSON object; ignored", path)
                continue
            if model:
                return str(model)
    return None


class _Pieces:
    """Token ids -> indices into a shared table of the text pieces they decode to."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.backend = getattr(tokenizer, "backend_tokenizer", None)  # fast tokenizers: streaming decode
        self.table: list[str] = []
        self._index: dict[str, int] = {}

    def _piece_index(self, piece: str) -> int:
        index = self._index.get(piece)
        if index is None:
            index = self._index[piece] = len(self.table)
            self.table.append(piece)
        return index

    def _decode_stream(self, ids: Sequence[int]) -> Iterator[str]:
        if self.backend is not None:
            from tokenizers.decoders import DecodeStream

            stream = DecodeStream(skip_special_tokens=False)
            for token_id in ids:
                yield stream.step(self.backend, int(token_id)) or ""  # None: an incomplete UTF-8 character
        else:
            for token in self.tokenizer.convert_ids_to_tokens(list(ids)):
                yield self.tokenizer.convert_tokens_to_string([token])

    def encode(self, ids: Sequence[int]) -> list[int]:
        """Piece indices for `ids`, decoded as one stream."""
        return [self._piece_index(piece) for piece in self._decode_stream(ids)]


def _runs(mask: Sequence[int]) -> list[tuple[int, int, int]]:
    """Maximal runs of equal mask values as `(value, start, end)`."""
    runs: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((int(mask[start]), start, i))
            start = i
    return runs


def _version_changes(versions: Sequence[int]) -> list[list[int]]:
    """`[offset, version]` where each stretch of equal weight versions starts (`[[0, v]]` for a turn sampled with
    one version; more entries when the weights changed while the turn was sampled)."""
    return [[i, int(v)] for i, v in enumerate(versions) if i == 0 or v != versions[i - 1]]


def _calls(text: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for call in parse_tool_calls(text, call_format=LLAMA3_JSON):  # every format's calls
        if isinstance(call, ToolCall):
            out.append({"name": call.name, "arguments": call.arguments})
        else:
            out.append({"error": call.message, "raw": call.raw})
    return out


def _clean(value: Any) -> Any:
    """`value` with NaN and infinities replaced by None (JSON has no such numbers)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _view_record(record: dict[str, Any], pieces: _Pieces) -> dict[str, Any]:
    """The viewer's compact form of one trajectory record (see `view_records`)."""
    ids: list[int] = record.get("response_ids") or []
    mask: list[int] = record.get("response_mask") or [1] * len(ids)
    logprobs: list[float] = record.get("response_logprobs") or [0.0] * len(ids)
    if not len(ids) == len(mask) == len(logprobs):
        raise ConfigError(
            f"trajectory {record.get('idx')} ({record.get('source')}): response_ids, response_mask and "
            f"response_logprobs have {len(ids)}, {len(mask)} and {len(logprobs)} entries"
        )
    chat: list[dict[str, Any]] = record.get("chat_completions") or []
    token_pieces = pieces.encode(ids)
    runs = _runs(mask)
    turns = _view_turns(record, chat, token_pieces, runs, logprobs)
    lead = [(start, end) for value, start, end in runs if value == 0 and start == 0]  # inserted before turn 1
    metrics = _clean(record.get("metrics") or {})
    question = next((str(m.get("content") or "") for m in chat if m.get("role") == "user"), "")
    reason = record.get("termination_reason") or ""
    cut = reason in _CUT_REASONS or any(t["info"].get("truncated") for t in turns)
    prompt_ids = record.get("prompt_ids") or []
    return {
        "idx": record.get("idx"),
        "task": record.get("task_id"),
        "source": record.get("source", ""),
        "reward": _clean(record.get("trajectory_reward")),
        "failed": bool(record.get("failed")),
        "error": record.get("error"),
        "reason": reason,
        "truncated": cut,
        "n_turns": len(turns),
        "generated": int(sum(mask)),
        "question": question[:300],
        "metrics": metrics,
        "prompt": pieces.tokenizer.decode(prompt_ids, skip_special_tokens=False) if prompt_ids else "",
        "prompt_tokens": len(prompt_ids),
        "lead": token_pieces[lead[0][0] : lead[0][1]] if lead else [],
        "continuous": len(record.get("runs") or ()) <= 1,
        "turns": turns,
    }


def _replies(chat: Sequence[dict[str, Any]]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Each assistant message of a conversation with the messages after it (up to the next assistant message)."""
    first_assistant = next((i for i, m in enumerate(chat) if m.get("role") == "assistant"), len(chat))
    replies: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    for message in chat[first_assistant:]:
        if message.get("role") == "assistant" or not replies:
            replies.append((message, []))
        else:
            replies[-1][1].append(message)
    return replies


def _view_turns(
    record: dict[str, Any],
    chat: Sequence[dict[str, Any]],
    token_pieces: list[int],
    runs: list[tuple[int, int, int]],
    logprobs: Sequence[float],
) -> list[dict[str, Any]]:
    """The turns of one trajectory: the sampled tokens of each, what was inserted after them, its message, tool
    calls, results, step info and reward (see `view_records`)."""
    replies = _replies(chat)
    steps: list[dict[str, Any]] = record.get("steps") or []
    versions: list[int] | None = record.get("weight_versions")
    if versions is not None and len(versions) != len(token_pieces):
        versions = None  # not the ids' versions (a record written by hand): shown per turn only
    model_runs = [(start, end) for value, start, end in runs if value == 1]
    turns: list[dict[str, Any]] = []
    for k in range(max(len(model_runs), len(replies), len(steps))):
        tok: list[int] = []
        lp: list[float] = []
        env: list[int] = []
        wv: list[list[int]] | None = None
        if k < len(model_runs):
            start, end = model_runs[k]
            tok = token_pieces[start:end]
            lp = [round(float(x), 4) for x in logprobs[start:end]]
            wv = None if versions is None else _version_changes(versions[start:end])
            next_start = model_runs[k + 1][0] if k + 1 < len(model_runs) else len(token_pieces)
            env = token_pieces[end:next_start]
        message, after = replies[k] if k < len(replies) else ({}, [])
        step = steps[k] if k < len(steps) else {}
        info = dict(step.get("info") or {})
        text = str(message.get("content") or "")
        turns.append(
            {
                "tok": tok,
                "lp": lp,
                "wv": wv,
                "env": env,
                "text": text,
                "calls": _clean(_calls(text)),
                "results": [{"role": m.get("role", ""), "content": str(m.get("content") or "")} for m in after],
                "not_shown": info.pop("observation_not_shown", None),
                "info": _clean(info),
                "reward": _clean(step.get("reward")),
            }
        )
    return turns


def view_records(records: Sequence[dict[str, Any]], tokenizer: Any) -> dict[str, Any]:
    """The JSON the page embeds: `{"pieces": [...], "trajectories": [...]}`.

    Args:
        records: trajectory records as written by `trajectory_to_dict` (plus an optional `source`).
        tokenizer: the run model's Hugging Face tokenizer, used to decode token ids into text pieces.

    Returns:
        `pieces`: the distinct decoded token texts. `trajectories`: one object per record with `idx`, `task`,
        `source`, `reward`, `failed`, `error`, `reason` (termination reason), `truncated` (a turn was cut by a
        token limit), `n_turns`, `generated` (sampled tokens), `question`, `metrics`, `prompt` (text),
        `prompt_tokens`, `continuous` and `turns`. Each turn holds `tok` (piece indices of the sampled tokens),
        `lp` (their logprobs, nats), `wv` (`[offset, version]` where each stretch of sampled tokens with one
        weight version starts, None when the record has no per-token versions), `env` (piece indices of the inserted tokens after them: observation and
        template glue), `text`, `calls` (parsed tool calls), `results` (the messages the environment answered
        with), `not_shown` (an observation the model never saw), `info` (finish reason, timings, weight version)
        and `reward`.

    Raises:
        ConfigError: if a record's token fields have different lengths.
    """
    pieces = _Pieces(tokenizer)
    trajectories = [_view_record(record, pieces) for record in records]
    return {"pieces": pieces.table, "trajectories": trajectories}


def _embed_json(data: Any) -> str:
    """JSON safe inside a `<script>` element: `<`, `>` and `&` are written as `\\u` escapes."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def build_view(
    run_dir: str | Path,
    *,
    output: str | Path | None = None,
    tokenizer: Any = None,
    model: str | None = None,
    page_size: int = 100,
) -> Path:
    """Write the trajectory viewer of a run folder: one HTML file that opens offline, without a server.

    Args:
        run_dir: a folder written by `agentic-rl rollout` or `agentic-rl train`.
        output: the HTML file to write; default `RUN_DIR/view.html`.
        tokenizer: the tokenizer to decode token ids with; default: loaded for `model`.
        model: registry name, local folder or hub id of the run's model; default: the one the run recorded.
        page_size: trajectories per page of the list (1..10000).

    Returns:
        The path of the written page.

    Raises:
        ConfigError: if the folder has no trajectories, no model is known, `page_size` is out of range, or a
            record is inconsistent.
    """
    if not 1 <= page_size <= 10_000:
        raise ConfigError(f"page_size must be in [1, 10000], got {page_size}")
    run = Path(run_dir)
    records = load_trajectories(run)
    if tokenizer is None:
        name = model or run_model(run)
        if name is None:
            raise ConfigError(
                f"{str(run)!r} records no model (summary.json or config.json): pass the model to decode tokens with"
            )
        from transformers import AutoTokenizer

        from agentic_rl.models import resolve_model

        tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(name)))
    data = view_records(records, tokenizer)
    data.update(
        title=run.resolve().name,
        run_dir=str(run.resolve()),
        page_size=page_size,
        model=model or run_model(run) or getattr(tokenizer, "name_or_path", ""),
    )
    template = resources.files("agentic_rl.viewer").joinpath("template.html").read_text(encoding="utf-8")
    page = template.replace("__RUN_DATA__", _embed_json(data), 1)
    out = Path(output) if output is not None else run / "view.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    logger.info("viewer of %d trajectories written to %s", len(records), out)
    return out
