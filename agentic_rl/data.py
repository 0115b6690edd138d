"""Reading tasks (JSON Lines, parquet, Hugging Face `datasets`), corpus and question files.

A data spec names where tasks come from (`load_tasks`):

| spec | read with |
|---|---|
| `FILE.parquet` | `pyarrow.parquet` (verl's layout works as it is) |
| a folder written by `Dataset.save_to_disk` (or one split of a `DatasetDict`'s folder: `DIR/train`) | `datasets.load_from_disk` |
| `json:FILES`, `csv:FILES`, `parquet:FILES` (a path or glob) | `datasets.load_dataset(KIND, data_files=FILES, split="train")` |
| `FILE.json`, `FILE.csv` | as `json:FILE`, `csv:FILE` |
| `arithmetic:SPLIT:COUNT[:STEPS]` | generated (`agentic_rl.synthetic`) |
| `humaneval` | the 164 HumanEval problems as coding-workspace tasks (`agentic_rl.coding_tasks`) |
| anything else, e.g. `FILE.jsonl` | JSON Lines, line by line |

Any spec may end with a row range `[START:END]` (Python slice bounds, either may be left out):
`hotpotqa_dev_distractor_500.jsonl[250:]` is the file's second half, `FILE[:100]` its first 100 rows. Rows keep
the ids they have in the whole file (a JSON Lines row without an id: its line number minus one).

Each row becomes a task dict: the row's own columns, plus `question`, `ground_truth`, `id` (and `system_prompt`
when the prompt holds a system message, `milestones` when a column holds them), taken from the columns
`DataColumns` names or, by default, from the first column present among `DEFAULT_COLUMNS` (which covers GSM8K rows
and verl's layout).
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import model_validator

from agentic_rl.coding_tasks import parse_humaneval_spec
from agentic_rl.config import Config
from agentic_rl.errors import ConfigError
from agentic_rl.synthetic import parse_arithmetic_spec

__all__ = [
    "DEFAULT_COLUMNS",
    "SHARED_DATA",
    "DataColumns",
    "drop_partial_line",
    "iter_jsonl",
    "load_tasks",
    "prompt_messages",
]

#: The shared data folder beside the repository (`<repo>/../shared/data`): GSM8K, HotpotQA, MATH-500.
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

#: Where each task field is looked for when `DataColumns` names no column for it: the first column present wins.
#: A dotted name reads a field of a struct column (verl: `reward_model.ground_truth`, `extra_info.index`).
DEFAULT_COLUMNS: dict[str, tuple[str, ...]] = {
    "question": ("question", "prompt"),
    "ground_truth": ("ground_truth", "answer", "reward_model.ground_truth"),
    "id": ("id", "extra_info.index"),
    "system_prompt": ("system_prompt",),
    "milestones": ("milestones",),
}

_ROW_RANGE = re.compile(r"^(?P<spec>.+)\[(?P<start>-?\d*):(?P<end>-?\d*)\]$")

#: Fields a table (parquet, `datasets`) must provide: without them every row would fail.
_REQUIRED = ("question", "ground_truth")
_DATASETS_KINDS = ("json", "csv", "parquet")


class DataColumns(Config):
    """Which column holds each task field; None: the first of `DEFAULT_COLUMNS` present (or the row number for `id`).

    Built from a mapping (`{"question": "problem", "answer": "solution"}`) or its text form
    `question=problem,answer=solution` (the command line's `--data-columns`). `answer` is another name for
    `ground_truth`. A column name may be dotted to read a field of a struct column (`reward_model.ground_truth`).

    Attributes:
        question: the question text, or a list of chat messages (`[{"role", "content"}, ...]`, verl's `prompt`).
        ground_truth: the reference answer the reward reads.
        id: the task id (groups and records carry it).
        system_prompt: a per-task system prompt (used instead of the environment's own).
        milestones: a list of strings the turns' tool results may show (`rollout.milestone_weight`), e.g.
            `supporting_doc_ids` of the shared HotpotQA file: a search or visit that shows a supporting document's id
            earns the turn its share.

    Raises:
        ConfigError: for an unknown field, a field named twice, or a text form without `FIELD=COLUMN` pairs.
    """

    question: str | None = None
    ground_truth: str | None = None
    id: str | None = None
    system_prompt: str | None = None
    milestones: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, value: Any) -> Any:
        if isinstance(value, str):
            pairs: dict[str, str] = {}
            for item in filter(None, (part.strip() for part in value.split(","))):
                field, sep, column = (s.strip() for s in item.partition("="))
                if not sep or not field or not column:
                    raise ValueError(f"expected FIELD=COLUMN pairs separated by commas, got {item!r}")
                if field in pairs:
                    raise ValueError(f"{field!r} is mapped twice")
                pairs[field] = column
            value = pairs
        if isinstance(value, Mapping) and "answer" in value:
            value = dict(value)
            if "ground_truth" in value:
                raise ValueError("'answer' and 'ground_truth' name the same field: give one")
            value["ground_truth"] = value.pop("answer")
        return value

    def sources(self, field: str) -> tuple[str, ...]:
        """The columns to look in for `field`, in order: the one named here, else `DEFAULT_COLUMNS[field]`."""
        named = getattr(self, field)
        return (named,) if named is not None else DEFAULT_COLUMNS[field]


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[tuple[int, Any]]:
    """Yield `(line number, parsed value)` for every non-blank line of a UTF-8 JSON Lines file.

    Raises:
        FileNotFoundError: if `path` does not exist.
        ConfigError: (a `ValueError`) naming `path:line` for a line that is not valid JSON.
    """
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{lineno}: not valid JSON: {exc.msg}") from exc


def drop_partial_line(path: str | os.PathLike[str]) -> int:
    """Cut a JSON Lines file back to its last complete line, the one state a process killed mid-write can leave.

    Lines are written whole (record + newline), so only the last line can lack its newline; it is removed and the
    file synced. A missing file is left missing.

    Returns:
        The number of bytes dropped (0 when the file ends with a newline, is empty or does not exist).
    """
    if not os.path.exists(path):
        return 0
    with open(path, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        end = size
        while end > 0:  # scan back block by block for the last newline
            start = max(0, end - 65536)
            f.seek(start)
            cut = f.read(end - start).rfind(b"\n")
            if cut >= 0:
                end = start + cut + 1
                break
            end = start
        if end == size:
            return 0
        f.truncate(end)
        f.flush()
        os.fsync(f.fileno())
        return size - end


def prompt_messages(messages: list[Any], where: str) -> tuple[str, str | None]:
    """`(question, system prompt or None)` of a chat-message prompt (verl's `prompt` column).

    The prompt must be one user message, optionally after system messages (joined with a blank line when there
    are several): the rollout starts every trajectory from a system prompt and one question, so a prompt holding
    earlier turns (few-shot assistant answers, several user messages) is refused rather than cut.

    Raises:
        ConfigError: naming `where`, for a message that is not `{"role", "content": str}`, a prompt without one
            user message, or other roles than `system` and `user`.
    """
    roles = [m.get("role") if isinstance(m, dict) else None for m in messages]
    if any(not isinstance(m, dict) or not isinstance(m.get("content"), str) for m in messages):
        raise ConfigError(
            f"{where}: a chat-message prompt needs {{'role', 'content': str}} messages, got {messages!r:.200}"
        )
    if roles.count("user") != 1 or roles[-1] != "user" or set(roles) - {"system", "user"}:
        raise ConfigError(
            f"{where}: a chat-message prompt must be one user message after optional system messages, got roles {roles}"
        )
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    return messages[-1]["content"], system or None


def _lookup(row: Mapping[str, Any], column: str) -> tuple[bool, Any]:
    """`(found, value)` of `column` in `row`; a dotted name that is not a column reads into struct (dict) values."""
    if column in row:
        return True, row[column]
    node: Any = row
    for part in column.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _to_task(row: dict[str, Any], columns: dict[str, str | None], number: int, where: str) -> dict[str, Any]:
    """The task of one row: its own columns, plus the fields read from `columns` (field -> column, None: absent)."""
    task = dict(row)
    values = {field: _lookup(row, column)[1] for field, column in columns.items() if column is not None}
    question = values.get("question")
    if isinstance(question, list):  # chat messages (verl): the user message is the question
        question, system = prompt_messages(question, where)
        if system is not None and columns.get("system_prompt") is None:
            values["system_prompt"] = system
    if "question" in values:
        task["question"] = question
    for field in ("ground_truth", "system_prompt", "milestones"):
        if field in values:
            task[field] = values[field]
    task["id"] = values["id"] if values.get("id") is not None else number
    return task


def _present(fields: DataColumns, has: Any) -> dict[str, str | None]:
    """field -> the first of its sources for which `has(column)` holds (None when none does)."""
    return {field: next((c for c in fields.sources(field) if has(c)), None) for field in DEFAULT_COLUMNS}


def _schema_columns(schema: Any) -> list[str]:
    """The column names of a pyarrow schema, with the fields of struct columns as `column.field` (recursively)."""
    import pyarrow as pa

    names: list[str] = []

    def walk(prefix: str, fields: Any) -> None:
        for field in fields:
            names.append(prefix + field.name)
            if pa.types.is_struct(field.type):
                walk(f"{prefix}{field.name}.", [field.type.field(i) for i in range(field.type.num_fields)])

    walk("", schema)
    return names


def _table_tasks(table: Any, fields: DataColumns, source: str, limit: int | None) -> list[dict[str, Any]]:
    """Tasks from a pyarrow table, checking once that every named (or required) column exists.

    Raises:
        ConfigError: naming the missing column, the field it was for and the columns present.
    """
    present = _schema_columns(table.schema)
    columns = _present(fields, present.__contains__)
    for field in DEFAULT_COLUMNS:
        named = getattr(fields, field)
        if columns[field] is None and (named is not None or field in _REQUIRED):
            names = [repr(c) for c in fields.sources(field)]
            looked = ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]
            raise ConfigError(
                f"{source}: no column {looked} for the task's {field!r} (columns: {', '.join(present)}); "
                f"name one with a column mapping, e.g. {field}=COLUMN"
            )
    if limit is not None:
        table = table.slice(0, limit)
    return [_to_task(row, columns, i, f"{source} row {i}") for i, row in enumerate(table.to_pylist())]


def _jsonl_tasks(path: str | Path, fields: DataColumns, named: bool, limit: int | None) -> list[dict[str, Any]]:
    """Tasks from JSON Lines: `id` defaults to the line number minus one. A row that lacks a default column is
    kept as it is (it fails as an invalid task); a column the mapping names must be in every row.

    Raises:
        ConfigError: naming `path:line` for a line that is not JSON, or a row without a named column.
    """
    tasks: list[Any] = []
    for lineno, row in iter_jsonl(path):
        if limit is not None and len(tasks) >= limit:
            break
        if not isinstance(row, dict):
            tasks.append(row)
            continue
        if named:
            for field in DEFAULT_COLUMNS:
                column = getattr(fields, field)
                if column is not None and not _lookup(row, column)[0]:
                    raise ConfigError(
                        f"{path}:{lineno}: no column {column!r} for the task's {field!r} (columns: {', '.join(row)})"
                    )
        columns = _present(fields, lambda c, row=row: _lookup(row, c)[0])
        tasks.append(_to_task(row, columns, lineno - 1, f"{path}:{lineno}"))
    return tasks


def _missing(path: str | Path) -> FileNotFoundError:
    return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))


def _dataset_table(dataset: Any) -> Any:
    """The rows of a `datasets.Dataset` as one pyarrow table (its selection and order applied)."""
    return dataset.with_format("arrow")[:]


def _load_from_disk(folder: Path) -> Any:
    """The `datasets.Dataset` saved in `folder` (`save_to_disk`) as a pyarrow table.

    Raises:
        ConfigError: if `folder` holds no saved dataset, or a `DatasetDict` (pick a split: `DIR/SPLIT`).
    """
    import datasets

    if not (folder / "state.json").is_file() and not (folder / "dataset_dict.json").is_file():
        raise ConfigError(f"{folder}: a data folder must be one written by datasets' save_to_disk")
    loaded = datasets.load_from_disk(str(folder))
    if isinstance(loaded, datasets.DatasetDict):
        splits = ", ".join(loaded)
        raise ConfigError(f"{folder} holds the splits {splits}: pass one of them as {folder}/SPLIT")
    return _dataset_table(loaded)


def _load_dataset(kind: str, files: str) -> Any:
    """`datasets.load_dataset(kind, data_files=files, split="train")` (local files, cached by `datasets`) as a
    pyarrow table.

    Raises:
        FileNotFoundError: if `files` matches no file.
        ConfigError: if `datasets` cannot read them.
    """
    import glob

    import datasets

    if not glob.glob(files):
        raise _missing(files)
    try:
        return _dataset_table(datasets.load_dataset(kind, data_files=files, split="train"))
    except (datasets.exceptions.DatasetGenerationError, ValueError) as exc:
        raise ConfigError(f"{kind}:{files}: cannot be read as {kind}: {exc}") from exc


def _read_parquet(path: Path) -> Any:
    """A parquet file as a pyarrow table.

    Raises:
        ConfigError: if the file is not parquet.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path)
    except pa.ArrowException as exc:
        raise ConfigError(f"{path}: cannot be read as parquet: {exc}") from exc


def _generated(spec: str) -> list[dict[str, Any]] | None:
    """The tasks of a named generated source (`arithmetic:...`, `humaneval`), else None for any other spec.

    Raises:
        ConfigError: for a malformed `arithmetic:` or `humaneval:` spec, or a source whose package is missing.
    """
    try:
        generated = parse_arithmetic_spec(spec)
        return generated if generated is not None else parse_humaneval_spec(spec)
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def load_tasks(
    path: str | Path, limit: int | None = None, columns: DataColumns | Mapping[str, str] | str | None = None
) -> list[dict[str, Any]]:
    """Read tasks from a data spec (see the module's table): each row becomes `{"id", "question", "ground_truth",
    ...}` with the row's other columns kept.

    Fields come from the columns `columns` names (a `DataColumns`, a mapping or `question=problem,answer=solution`),
    else from the first of `DEFAULT_COLUMNS` present: `ground_truth` from `ground_truth`, `answer` (GSM8K) or
    `reward_model.ground_truth` (verl); `id` from `id` or `extra_info.index`, else the row number (JSON Lines: the
    line number minus one). A question that is a list of chat messages (verl's `prompt`) gives its user message as
    `question` and its system messages as `system_prompt` (see `prompt_messages`). `columns` does not apply to a
    generated source (`arithmetic:`, `humaneval`). `humaneval` writes its code bases into the cache once (see
    `agentic_rl.coding_tasks`).

    JSON Lines rows are not validated here: a malformed row becomes a failed trajectory with a clear error. A table
    (parquet, `datasets`) is checked once for its columns.

    Args:
        path: a data spec: a file, a `save_to_disk` folder, `KIND:FILES`, `arithmetic:SPLIT:COUNT[:STEPS]` or
            `humaneval`, optionally followed by a row range `[START:END]`.
        limit: keep the first `limit` rows (of the range).
        columns: which column holds each task field.

    Returns:
        The tasks, in file order.

    Raises:
        FileNotFoundError: if `path` does not exist.
        ConfigError: for a line that is not JSON (naming the line), a malformed spec or column mapping, a column
            the mapping names (or a table's question / ground truth) that is not there (naming it and the columns
            present), a chat-message prompt of another shape, a file the library cannot read, or a generated source
            whose package is missing.
        OSError: if `humaneval`'s code bases cannot be written into the cache.
    """
    spec = str(path)
    ranged = _ROW_RANGE.match(spec)
    if ranged is not None and not os.path.exists(spec):
        start, end = (int(ranged[key]) if ranged[key] else None for key in ("start", "end"))
        rows = load_tasks(ranged["spec"], columns=columns)[start:end]
        return rows[:limit] if limit is not None else rows
    generated = _generated(spec)
    if generated is not None:
        return generated[:limit] if limit is not None else generated
    fields = columns if isinstance(columns, DataColumns) else DataColumns.model_validate(columns or {})
    named = any(getattr(fields, field) is not None for field in DEFAULT_COLUMNS)
    kind, sep, files = spec.partition(":")
    if sep and kind in _DATASETS_KINDS and not os.path.exists(spec):
        return _table_tasks(_load_dataset(kind, files), fields, spec, limit)
    file = Path(spec)
    if not file.exists():
        raise _missing(file)
    if file.is_dir():
        return _table_tasks(_load_from_disk(file), fields, spec, limit)
    suffix = file.suffix.lower()
    if suffix == ".parquet":
        return _table_tasks(_read_parquet(file), fields, spec, limit)
    if suffix in (".json", ".csv"):
        return _table_tasks(_load_dataset(suffix[1:], spec), fields, spec, limit)
    return _jsonl_tasks(file, fields, named, limit)
