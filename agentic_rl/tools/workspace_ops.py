"""What the coding-workspace tools run inside the sandbox: shell commands, file views and edits, the test run.

`agentic_rl.tools.workspace` has the sandbox's worker load this file as the module ``agentic_rl_workspace_ops`` (the
worker's ``preload`` option) in every interpreter of a workspace; each tool call is one cell that calls `main` with
the request as JSON, and `main` prints one reply. Everything here runs as the sandbox's user inside its isolation,
so paths and symbolic links resolve exactly as the model's own commands see them, and no path outside the
workspace is read or written by a file tool. These checks give the model clear errors; the boundary is the sandbox
(a process the model left running could swap a folder for a link between a check and its use, and would reach only
what the sandbox's own commands reach).

Only the standard library is imported, plus the worker's own helpers (the worker makes itself importable as
``agentic_rl_sandbox_worker``; on the host the package's module is used). Importing the module has no side effects.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Iterator
from typing import Any

try:  # inside the sandbox: the running worker's own module
    from agentic_rl_sandbox_worker import utf8_boundary  # type: ignore[import-not-found]
except ImportError:  # on the host
    from agentic_rl.tools.sandbox_worker import utf8_boundary

__all__ = ["OPS", "REPLY_MARKER", "OpError", "junit_key", "main", "read_junit", "resolve"]

REPLY_MARKER = "\x00agentic-rl-workspace-reply\x00"
"""What `main` prints before its JSON reply (anything printed before it is not part of the reply)."""

MAX_VIEW_BYTES = 8 * 1024 * 1024
"""Largest file `view`, `str_replace` and `insert` read, in bytes: larger ones are for the shell (head, sed, grep)."""
MAX_LISTED = 400
"""Most entries a directory's `view` lists."""
SNIPPET_CONTEXT = 4
"""Lines shown before and after an edit."""
_STATE: dict[str, str] = {}  # "cwd", "env": the shell's working directory and exported variables, kept between calls
# One line, with $0 "bash", so that the shell's own messages read "bash: line N: ..." with N the line of the command,
# as under a plain `bash -c`. $1 is a file holding the variables the previous command exported (sourced first, then
# $PWD made right again) and $1.pwd the working directory; both are written when the shell exits; $2 is the command.
_BASH = (
    '__agentic_rl_state=$1; __agentic_rl_command=$2; set --; . "$__agentic_rl_state"; cd -P . 2>/dev/null; '
    'trap \'export -p > "$__agentic_rl_state"; pwd -P > "$__agentic_rl_state.pwd"\' EXIT; '
    'eval "$__agentic_rl_command"'
)
_OUTCOME_RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}


class OpError(Exception):
    """A failure the call caused (a missing file, an ambiguous edit): its message tells the model what to do."""


# ------------------------------------------------------------------------------------------------ paths


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def resolve(root: str, path: Any) -> tuple[str, str]:
    """The file `path` names in the workspace `root`: ``(real path, path as shown to the model)``.

    Args:
        root: the workspace root, a real absolute path.
        path: relative to `root`, or absolute inside it.

    Raises:
        OpError: for an empty path, one outside `root` (``..`` past the root, an absolute path elsewhere) or one
            that a symbolic link leads out of `root`.
    """
    if not isinstance(path, str) or not path.strip() or "\x00" in path:
        raise OpError("'path' must be a file path relative to the workspace root, e.g. 'src/main.py'")
    joined = os.path.normpath(os.path.join(root, path))
    if not _inside(joined, root):
        raise OpError(
            f"{path!r} is outside the workspace: give a path relative to the workspace root ({root}), or an "
            "absolute path inside it; '..' may not climb above the root"
        )
    shown = os.path.relpath(joined, root)
    real = os.path.realpath(joined)
    if not _inside(real, os.path.realpath(root)):
        raise OpError(
            f"{shown!r} leads outside the workspace through a symbolic link (it resolves to {real}); the file "
            "tools only read and write files inside the workspace"
        )
    return real, shown


def _read_text(path: str, shown: str) -> str:
    """The UTF-8 text of the file `path`. Raises `OpError` for a missing, binary, non-UTF-8 or too large file."""
    if os.path.isdir(path):
        raise OpError(f"{shown} is a directory, not a file")
    if not os.path.exists(path):
        raise OpError(f"{shown} does not exist; view '.' to list the workspace, or create the file with create")
    if os.path.getsize(path) > MAX_VIEW_BYTES:
        raise OpError(f"{shown} is over {MAX_VIEW_BYTES // 2**20} MiB: read parts of it with bash (head, sed -n, grep)")
    with open(path, "rb") as fh:
        data = fh.read()
    if b"\x00" in data[:8192]:
        raise OpError(f"{shown} looks like a binary file; inspect it with bash (e.g. xxd | head)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise OpError(f"{shown} is not UTF-8 text (byte {exc.start}); edit it with bash instead") from None


def _write_text(path: str, text: str) -> None:
    """Writes `text` to `path` whole or not at all: into a new file beside it (the old one's permissions), then
    renamed over it, so that a write that fails (past the file-size limit, a full disk) leaves the file as it was."""
    folder, name = os.path.split(path)
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise PermissionError(errno.EACCES, "Permission denied", path)
    try:
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o666 & ~_umask()  # what open(path, "w") would have given a new file
    fd, scratch = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        os.chmod(scratch, mode)
        os.replace(scratch, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(scratch)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _numbered(lines: list[str], first: int) -> str:
    """`lines` numbered from `first` as ``cat -n`` does."""
    return "\n".join(f"{first + i:6}\t{line}" for i, line in enumerate(lines))


def _lines(text: str) -> list[str]:
    """The lines of `text` without their line breaks; a final line break does not start another line."""
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def _snippet(text: str, first: int, last: int) -> str:
    """Lines `first`..`last` (1-based) of `text` with `SNIPPET_CONTEXT` lines around them, numbered."""
    lines = _lines(text)
    start, end = max(1, first - SNIPPET_CONTEXT), min(len(lines), last + SNIPPET_CONTEXT)
    return _numbered(lines[start - 1 : end], start)


# ------------------------------------------------------------------------------------------------ file tools


def view(root: str, args: dict[str, Any]) -> str:
    """A file's lines numbered (all, or `view_range` [start, end], 1-based, end -1 = the last line), or a directory's
    entries two levels deep (hidden ones left out), cut to `max_output_bytes`."""
    path, shown = resolve(root, args["path"])
    if os.path.isdir(path):
        return _listing(path, shown)
    lines = _lines(_read_text(path, shown))
    first, last = 1, len(lines)
    if args.get("view_range") is not None:
        first, last = args["view_range"]
        last = len(lines) if last == -1 else last
        if not 1 <= first <= max(len(lines), 1) or not first <= last <= len(lines):
            raise OpError(
                f"view_range {args['view_range']} is out of bounds: {shown} has {len(lines)} lines; give "
                f"[start, end] with 1 <= start <= end <= {len(lines)}, or end -1 for the last line"
            )
    if not lines:
        return f"{shown} is empty"
    cap, out, size = args["max_output_bytes"], [], 0
    for number in range(first, last + 1):
        line = f"{number:6}\t{lines[number - 1]}"
        size += len(line.encode("utf-8")) + 1
        if size > cap and out:
            out.append(f"[output cut at line {number - 1} of {len(lines)}: view the rest with view_range]")
            break
        out.append(line)
    return "\n".join(out)


def _listing(path: str, shown: str) -> str:
    entries: list[str] = []
    for parent, dirs, files in os.walk(path):
        depth = os.path.relpath(parent, path).count(os.sep) + (parent != path)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in dirs + sorted(f for f in files if not f.startswith(".")):
            relative = os.path.relpath(os.path.join(parent, name), path)
            entries.append(relative + ("/" if name in dirs else ""))
        if depth >= 1:
            dirs[:] = []
    header = f"Entries of {shown}/ up to 2 levels deep (hidden ones not listed):"
    if not entries:
        return f"{shown}/ is empty (hidden entries are not listed)"
    more = f"\n[... and {len(entries) - MAX_LISTED} more entries]" if len(entries) > MAX_LISTED else ""
    return "\n".join([header, *sorted(entries)[:MAX_LISTED]]) + more


def create(root: str, args: dict[str, Any]) -> str:
    """Writes a new file (parent directories created); an existing one only with `overwrite`."""
    path, shown = resolve(root, args["path"])
    if os.path.isdir(path) or args["path"].endswith("/"):
        raise OpError(f"{shown}/ names a directory; give the path of a file to create")
    existed = os.path.lexists(path)
    if existed and not args.get("overwrite"):
        raise OpError(
            f"{shown} already exists; change it with str_replace or insert, or call create with "
            '"overwrite": true to replace its whole content'
        )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _write_text(path, args["file_text"])
    return f"{'Overwrote' if existed else 'Created'} {shown} ({len(_lines(args['file_text']))} lines)"


def str_replace(root: str, args: dict[str, Any]) -> str:
    """Replaces the one occurrence of `old_str` with `new_str`; zero or several occurrences are an error."""
    path, shown = resolve(root, args["path"])
    text, old, new = _read_text(path, shown), args["old_str"], args["new_str"]
    starts, at = [], text.find(old)
    while at != -1:
        starts.append(at)
        at = text.find(old, at + len(old))
    if not starts:
        raise OpError(
            f"no replacement was made: old_str does not occur in {shown}. It must match the file exactly, "
            "whitespace, indentation and line breaks included; view the file and copy the text from it"
        )
    if len(starts) > 1:
        lines = ", ".join(str(text.count("\n", 0, s) + 1) for s in starts[:20])
        raise OpError(
            f"no replacement was made: old_str occurs {len(starts)} times in {shown} (starting on lines {lines}); "
            "add surrounding lines to old_str so that it occurs exactly once"
        )
    text = text[: starts[0]] + new + text[starts[0] + len(old) :]
    _write_text(path, text)
    first = text.count("\n", 0, starts[0]) + 1
    last = first + new.count("\n")
    return f"Edited {shown}: lines {first}-{last} now read (with context):\n{_snippet(text, first, last)}"


def insert(root: str, args: dict[str, Any]) -> str:
    """Inserts `new_str` as whole lines after line `insert_line` (0: at the top)."""
    path, shown = resolve(root, args["path"])
    text = _read_text(path, shown)
    parts = text.split("\n")  # lines as `view` counts them: only "\n" ends one
    lines = [part + "\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
    after = args["insert_line"]
    if not 0 <= after <= len(lines):
        raise OpError(
            f"insert_line {after} is out of bounds: {shown} has {len(lines)} lines; give 0 to insert at the top, "
            f"or 1 to {len(lines)} to insert after that line"
        )
    new = args["new_str"] if args["new_str"].endswith("\n") else args["new_str"] + "\n"
    if after == len(lines) and lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    lines[after:after] = [new]
    text = "".join(lines)
    _write_text(path, text)
    return f"Inserted {new.count(chr(10))} lines into {shown} after line {after}:\n" + _snippet(
        text, after + 1, after + new.count("\n")
    )


# ------------------------------------------------------------------------------------------------ commands


def _capped(fh: Any, cap: int) -> str:
    """The text of the open file `fh`: whole when it fits in `cap` bytes, else its head and tail (about `cap` bytes
    in all, never splitting a UTF-8 character) around a marker giving the bytes left out."""
    size = os.fstat(fh.fileno()).st_size
    if size <= cap:
        return os.pread(fh.fileno(), size, 0).decode("utf-8", "replace")
    half = cap // 2
    head = os.pread(fh.fileno(), half + 1, 0)
    head = head[: utf8_boundary(head, half)]
    tail = os.pread(fh.fileno(), half, size - half)
    skip = 0
    while skip < min(3, len(tail)) and tail[skip] & 0xC0 == 0x80:  # a character begun before the tail
        skip += 1
    tail = tail[skip:]
    marker = f"\n[... {size - len(head) - len(tail)} bytes of output left out (limit {cap} bytes) ...]\n"
    return head.decode("utf-8", "replace") + marker + tail.decode("utf-8", "replace")


def _read(path: str) -> str:
    """The text of `path`, "" when it is missing (a shell killed before its exit trap ran)."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as fh:
            return fh.read()
    except FileNotFoundError:
        return ""


def _run(command: list[str], cwd: str, timeout_s: float, out: Any, env: dict[str, str] | None = None) -> int | None:
    """Runs `command` in its own process group, output to the file `out`; past `timeout_s` the whole group is
    killed. Returns the exit status (negative: killed by that signal), or None when it timed out."""
    proc = subprocess.Popen(
        command,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
        return None


def bash(root: str, args: dict[str, Any]) -> str:
    """Runs `command` with ``bash -c`` in the shell's working directory, with the variables it exported before (both
    kept between calls, unless a call timed out), and returns its output (stdout and stderr as they interleave), cut
    to `max_output_bytes`, with the exit status."""
    cwd, note = _STATE.get("cwd", root), ""
    if not os.path.isdir(cwd):
        cwd, note = root, f"[the working directory {_STATE['cwd']} is gone: this command ran in {root}]\n"
    fd, state_file = tempfile.mkstemp(prefix="shell-")
    with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as fh:
        fh.write(_STATE.get("env", ""))
    try:
        with tempfile.TemporaryFile() as out:
            status = _run(["bash", "-c", _BASH, "bash", state_file, args["command"]], cwd, args["timeout_s"], out)
            output = _capped(out, args["max_output_bytes"])
        pwd, env = (_read(path) for path in (state_file + ".pwd", state_file))
    finally:
        for path in (state_file, state_file + ".pwd"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    if status is not None and pwd and os.path.isdir(pwd.rstrip("\n")):
        _STATE["cwd"], _STATE["env"] = pwd.rstrip("\n"), env
    if status is None:
        end = (
            f"[command timed out after {args['timeout_s']:g} s: it and every process of its process group were "
            "killed; the working directory and variables are unchanged. Run long jobs in the background "
            "(cmd > log 2>&1 &) or pass a larger timeout_s]"
        )
    elif status < 0:
        end = f"[killed by signal {signal.Signals(-status).name}]"
    else:
        end = f"[exit code: {status}]"
    if output and not output.endswith("\n"):
        output += "\n"
    return note + (output or "(no output)\n") + end


# ------------------------------------------------------------------------------------------------ tests


def junit_key(nodeid: str) -> tuple[str, str]:
    """The ``(classname, name)`` under which pytest's JUnit XML report lists the test `nodeid`
    (``tests/test_a.py::TestX::test_y[1]`` -> ``("tests.test_a.TestX", "test_y[1]")``)."""
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    names[0] = names[0].replace("/", ".").removesuffix(".py")
    names[-1] += bracket + params
    return ".".join(names[:-1]), names[-1]


def read_junit(path: str) -> tuple[dict[tuple[str, str], str], int]:
    """Each test case of a JUnit XML report with its outcome (``passed``, ``skipped``, ``failed``, ``error``; the
    worst of a case listed twice), and how many failed with a `MemoryError` (the memory limit, most likely).

    Raises:
        ElementTree.ParseError, OSError: for a missing or malformed report.
    """
    outcomes: dict[tuple[str, str], str] = {}
    memory_errors = 0
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        tags = {child.tag for child in case}
        outcome = next((tag for tag in ("error", "failure", "skipped") if tag in tags), "passed")
        outcome = "failed" if outcome == "failure" else outcome
        if outcome in ("failed", "error"):
            memory_errors += any("MemoryError" in (c.get("message", "") + (c.text or "")) for c in case)
        key = (case.get("classname", ""), case.get("name", ""))
        if _OUTCOME_RANK[outcome] >= _OUTCOME_RANK.get(outcomes.get(key, "passed"), 0):
            outcomes[key] = outcome
    return outcomes, memory_errors


@contextlib.contextmanager
def _hidden_files(root: str, files: dict[str, str]) -> Iterator[None]:
    """Writes the hidden test `files` (workspace path -> text) for the test run only: afterwards the files they
    replaced are back as they were, and the files and folders they added are gone (the run writes no bytecode of
    them: `run_tests` sets ``PYTHONDONTWRITEBYTECODE``)."""
    saved: list[tuple[str, bytes | None]] = []
    made: list[str] = []
    try:
        for relative, content in files.items():
            path, _ = resolve(root, relative)
            missing = []
            parent = os.path.dirname(path)
            while not os.path.exists(parent):
                missing.append(parent)
                parent = os.path.dirname(parent)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            made += reversed(missing)
            try:
                with open(path, "rb") as fh:
                    before: bytes | None = fh.read()
            except (FileNotFoundError, IsADirectoryError):
                before = None
            saved.append((path, before))
            _write_text(path, content)
        yield
    finally:
        for path, before in reversed(saved):
            with contextlib.suppress(OSError):
                if before is None:
                    os.unlink(path)
                else:
                    with open(path, "wb") as fh:
                        fh.write(before)
        for folder in made:  # made for the hidden files: all in them came from the test run
            shutil.rmtree(folder, ignore_errors=True)


def run_tests(root: str, args: dict[str, Any]) -> dict[str, Any]:
    """Writes the hidden `files` into the workspace (for the run only: `_hidden_files`), runs `command` with
    ``bash -c`` in its root with pytest told to write a JUnit XML report (``PYTEST_ADDOPTS``), at most `timeout_s`
    seconds, and reads the report.

    Returns:
        ``returncode`` (None: timed out), ``report`` (whether a report was read), ``total`` and ``passed`` test
        cases, ``memory_errors``, ``listed_passed`` (how many of `listed`, pytest node ids, passed), ``not_passed``
        (up to 20 listed ids that did not pass, with their outcome or ``missing``) and ``tail`` (the output's end).
    """
    report = os.path.join(tempfile.mkdtemp(prefix="tests-"), "junit.xml")
    env = dict(os.environ)
    env["PYTEST_ADDOPTS"] = f"{env.get('PYTEST_ADDOPTS', '')} --junitxml={shlex.quote(report)}".strip()
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no trace of the hidden tests stays behind
    with _hidden_files(root, args["files"]), tempfile.TemporaryFile() as out:
        status = _run(["bash", "-c", args["command"]], root, args["timeout_s"], out, env)
        size = os.fstat(out.fileno()).st_size
        tail = os.pread(out.fileno(), 2000, max(0, size - 2000)).decode("utf-8", "replace")
    try:
        outcomes, memory_errors = read_junit(report)
    except (ElementTree.ParseError, OSError):
        outcomes, memory_errors = None, 0
    found = outcomes or {}
    listed = {nodeid: found.get(junit_key(nodeid), "missing") for nodeid in args["listed"]}
    not_passed = {nodeid: outcome for nodeid, outcome in listed.items() if outcome != "passed"}
    return {
        "returncode": status,
        "report": outcomes is not None,
        "total": len(found),
        "passed": sum(outcome == "passed" for outcome in found.values()),
        "memory_errors": memory_errors,
        "listed_passed": len(listed) - len(not_passed),
        "not_passed": dict(list(not_passed.items())[:20]),
        "tail": tail,
    }


# ------------------------------------------------------------------------------------------------ entry point

OPS: dict[str, Callable[[str, dict[str, Any]], Any]] = {
    "bash": bash,
    "view": view,
    "create": create,
    "str_replace": str_replace,
    "insert": insert,
    "run_tests": run_tests,
}
"""The calls `main` runs, by name: each takes the workspace root and the call's checked arguments."""


def _state(path: str, save: bool) -> None:
    """Loads `_STATE` from the JSON file `path` (missing or unreadable: left as it is), or saves it there."""
    try:
        if save:
            with open(path, "w", encoding="utf-8") as fh:
                json.dump(_STATE, fh)
        else:
            with open(path, encoding="utf-8") as fh:
                _STATE.update({k: v for k, v in json.load(fh).items() if isinstance(v, str)})
    except (OSError, ValueError, AttributeError):
        pass


def main(request: str) -> None:
    """Runs the call `request` (JSON ``{"op", "root", "args"}``, optionally ``"state"``: a file keeping the shell's
    working directory and exported variables between processes, for callers that start one per call) and prints
    `REPLY_MARKER` and the JSON reply: ``{"ok": result}``, or ``{"error": message}`` for a failure the call caused
    (an `OpError`, or an `OSError` such as a permission denied), all non-ASCII characters escaped."""
    call = json.loads(request)
    if call.get("state"):
        _state(call["state"], save=False)
    try:
        reply: dict[str, Any] = {"ok": OPS[call["op"]](call["root"], call["args"])}
    except OpError as exc:
        reply = {"error": str(exc)}
    except OSError as exc:
        where = f": {os.path.relpath(exc.filename, call['root'])}" if isinstance(exc.filename, str) else ""
        reply = {"error": f"{call['op']} failed: {exc.strerror or exc}{where}"}
    except MemoryError:
        reply = {"error": f"{call['op']} ran out of memory in the sandbox: work on smaller pieces (use bash)"}
    if call.get("state"):
        _state(call["state"], save=True)
    sys.stdout.write(REPLY_MARKER + json.dumps(reply))
