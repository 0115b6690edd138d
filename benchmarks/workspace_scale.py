"""Coding workspaces at scale: 64 at once against 64 plain subprocesses, what each one costs on the host (disk and
memory), and what is left behind after 64 trajectories whose tool sleeps or crashes, after SIGTERM, and after
SIGKILL followed by the sweep that `--resume` runs.

    .venv/bin/python benchmarks/workspace_scale.py [--n 64] [--files 2000] [--quick]

1. Concurrency: `n` threads each register a workspace of one synthetic code base (`--files` Python files of
   4 KiB, as `workspace_start.py`), start it with the ``bash`` tool (`BashTool.session_start`) and run one
   ``echo ok`` in it; against `n` threads each running ``bash -c 'echo ok'`` as a plain subprocess in a temp
   folder. Wall time of the batch and the median latency (batch start to that workspace's answer), and their
   ratios. The manager starts at most `WorkspaceConfig.max_concurrent_starts` workspaces at once (reported).
   Copy mode and, where the kernel mounts it, overlay mode.
2. Cost per workspace, while all `n` are alive: disk = the blocks (``st_blocks * 512``, os.walk + lstat) of the
   workspace's host folder after its call (the copy, or the overlay's upper and work folders); memory = the
   highest sum of VmRSS over the workspace's process tree (`WorkspaceInfo.pids`, their descendants), sampled.
3. Leaks, counted under the workspace root: workspace folders (``ws-*``) and run folders, live processes of the
   sessions (their recorded pids, their uids, a cwd under the root) and mounts under the root (in this process's
   mount namespace and in any other process's). After `n` trajectories whose command sleeps past its timeout,
   kills its shell or segfaults, ended normally; after a child process holding `n` busy workspaces gets SIGTERM
   (handled as `agentic-rl` commands do: KeyboardInterrupt, the manager closed on the way out); and after a child
   gets SIGKILL (counted before and after `sweep_stale_workspaces`, as `--resume` runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import Goal, save, table, verdict
from workspace_start import make_codebase

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentic_rl.tools.sandbox_processes import start_ticks  # noqa: E402
from agentic_rl.tools.workspace import ENVIRONMENT_HOLDER, Workspaces, sweep_stale_workspaces  # noqa: E402
from agentic_rl.tools.workspace_tools import BashTool  # noqa: E402

CRASHES = {
    "sleep": {"command": "sleep 30", "timeout_s": 2},
    "kill -9 $$": {"command": "echo before; kill -9 $$", "timeout_s": 10},
    "segfault": {"command": "python3 -c 'import os; os.kill(os.getpid(), 11)'", "timeout_s": 10},
}


# ------------------------------------------------------------------------------------------ host readings


def disk_bytes(folder: str) -> int:
    """Blocks allocated under `folder` (itself included), in bytes: ``st_blocks * 512`` of every entry, links
    not followed."""
    total = os.lstat(folder).st_blocks * 512
    for parent, dirs, files in os.walk(folder):
        for name in dirs + files:
            try:
                total += os.lstat(os.path.join(parent, name)).st_blocks * 512
            except OSError:
                pass
    return total


def _proc_table() -> tuple[dict[int, list[int]], dict[int, int]]:
    """One scan of /proc: children of each pid, and each live pid's VmRSS in bytes."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/status", encoding="ascii", errors="replace") as fh:
                fields = dict(line.split(":", 1) for line in fh if ":" in line)
        except OSError:
            continue
        if fields.get("State", "").strip()[:1] in ("Z", "X"):
            continue
        children.setdefault(int(fields["PPid"]), []).append(int(entry))
        rss[int(entry)] = int(fields.get("VmRSS", "0 kB").split()[0]) * 1024
    return children, rss


def tree_rss(root: int, children: dict[int, list[int]], rss: dict[int, int]) -> int:
    """Sum of VmRSS of `root` and its descendants."""
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total


class TreeSampler:
    """Samples, every `interval` seconds while the `with` block runs, the RSS of each workspace's process tree
    (`roots()` gives session -> root pid), keeping each one's peak and the peak of their sum."""

    def __init__(self, roots: Callable[[], dict[str, int]], interval: float = 0.25) -> None:
        self.roots, self.interval = roots, interval
        self.peaks: dict[str, int] = {}
        self.total_peak, self._stop = 0, threading.Event()

    def sample(self) -> None:
        children, rss = _proc_table()
        total = 0
        for session, pid in self.roots().items():
            value = tree_rss(pid, children, rss)
            self.peaks[session] = max(self.peaks.get(session, 0), value)
            total += value
        self.total_peak = max(self.total_peak, total)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> TreeSampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


# ------------------------------------------------------------------------------------------ 1 + 2: concurrency


def _batch(n: int, one: Callable[[int], None]) -> tuple[float, list[float]]:
    """Runs `one(i)` for i < n in n threads released at once; wall time and each one's latency, in seconds."""
    gate = threading.Barrier(n + 1)
    latencies = [0.0] * n
    errors: list[BaseException] = []
    t0 = 0.0

    def worker(i: int) -> None:
        gate.wait()
        try:
            one(i)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        latencies[i] = time.perf_counter() - t0

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    gate.wait()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} of {n} failed; the first: {errors[0]!r}")
    return time.perf_counter() - t0, latencies


def plain_batch(n: int, scratch: Path) -> tuple[float, list[float]]:
    """`n` concurrent ``bash -c 'echo ok'`` subprocesses in a temp folder."""
    scratch.mkdir(parents=True, exist_ok=True)

    def one(i: int) -> None:
        out = subprocess.run(["bash", "-c", "echo ok"], cwd=scratch, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "ok"

    return _batch(n, one)


def workspace_batch(n: int, codebase: Path, root: Path, mode: str, starts: int) -> dict[str, Any]:
    """`n` concurrent workspaces, each started by the bash tool and running ``echo ok``; measured while all are
    alive: disk and process-tree memory per workspace. All removed after."""
    manager = Workspaces({"root": str(root), "copy_mode": mode, "max_concurrent_starts": starts})
    overlay = manager.overlay  # probed once, outside the timings
    bash = BashTool(manager)
    sessions = [f"w{i}" for i in range(n)]

    def roots() -> dict[str, int]:
        infos = {s: manager.info(s) for s in sessions}
        return {s: i.pids[0] for s, i in infos.items() if i is not None and i.pids}

    def one(i: int) -> None:
        manager.register(sessions[i], str(codebase))
        bash.session_start(sessions[i])
        out = bash.execute_session(sessions[i], {"command": "echo ok", "timeout_s": 30})
        assert "ok" in out, out

    try:
        with TreeSampler(roots) as sampler:
            wall, latencies = _batch(n, one)
        infos = [manager.info(s) for s in sessions]
        disk = [disk_bytes(os.path.dirname(i.path)) for i in infos if i is not None and i.path]
        folder = [disk_bytes(i.folder) for i in infos if i is not None and i.folder]
    finally:
        for s in sessions:
            bash.session_end(s)
            manager.release(s, ENVIRONMENT_HOLDER)
        manager.close()
    memory = sorted(sampler.peaks.values())
    return {
        "mode": "overlay" if overlay else "copy",
        "isolation": manager.isolation.mode,
        "wall_s": wall,
        "median_latency_s": statistics.median(latencies),
        "max_latency_s": max(latencies),
        "disk_bytes_median": statistics.median(disk),
        "disk_bytes_max": max(disk),
        "files_folder_bytes_median": statistics.median(folder),
        "rss_bytes_median": statistics.median(memory) if memory else 0,
        "rss_bytes_max": max(memory, default=0),
        "rss_sampled": len(memory),
        "rss_total_peak_bytes": sampler.total_peak,
    }


# ------------------------------------------------------------------------------------------ 3: leaks


def _mount_lines(root: str) -> tuple[int, int]:
    """Mount lines naming a path under `root`: in this process's namespace, and in every mount namespace any
    process is in (each namespace read once)."""

    def lines(pid: str) -> list[str]:
        with open(f"/proc/{pid}/mountinfo", encoding="utf-8", errors="replace") as fh:
            return [line for line in fh if root in line]

    own, seen, anywhere = len(lines("self")), set(), 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            ns = os.stat(f"/proc/{pid}/ns/mnt").st_ino
            if ns not in seen:
                seen.add(ns)
                anywhere += len(lines(pid))
        except OSError:
            continue
    return own, anywhere


def _processes(root: str, pids: dict[int, int | None], uids: set[int]) -> int:
    """Live processes that are the sessions': a recorded pid (same start time), a session uid, a cwd under root."""
    found = {p for p, ticks in pids.items() if ticks is not None and start_ticks(p) == ticks}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/status", encoding="ascii", errors="replace") as fh:
                state = uid = None
                for line in fh:
                    if line.startswith("State:"):
                        state = line.split()[1]
                    elif line.startswith("Uid:"):
                        uid = int(line.split()[1])
            if state in ("Z", "X"):
                continue
            if uid in uids or os.readlink(f"/proc/{entry}/cwd").startswith(root):
                found.add(int(entry))
        except (OSError, ValueError):
            continue
    return len(found)


def leaks(root: Path, pids: dict[int, int | None] | None = None, uids: set[int] | None = None) -> dict[str, int]:
    """What is left under `root`: workspace and run folders, processes, mounts."""
    runs = [r for r in root.iterdir() if r.is_dir()] if root.exists() else []
    folders = [w for r in runs for w in r.iterdir() if w.is_dir() and w.name.startswith("ws-")]
    own, anywhere = _mount_lines(str(root))
    return {"workspace_folders": len(folders), "run_folders": len(runs),
            "processes": _processes(str(root), pids or {}, uids or set()),
            "mounts_here": own, "mounts_any_namespace": anywhere}  # fmt: skip


def _record(manager: Workspaces, sessions: list[str]) -> tuple[dict[int, int | None], set[int]]:
    """The host pids (with their start ticks) and uids of the live sessions."""
    pids: dict[int, int | None] = {}
    uids: set[int] = set()
    for s in sessions:
        info = manager.info(s)
        if info is not None:
            pids.update({p: start_ticks(p) for p in info.pids})
            uids.update({info.uid} if info.uid is not None else set())
    return pids, uids


def crashing_trajectories(n: int, codebase: Path, root: Path, mode: str, starts: int) -> dict[str, Any]:
    """`n` workspace trajectories whose bash command sleeps past its timeout, kills its shell or segfaults, each
    ended normally (the tool's and the environment's release), then the manager closed; leaks counted."""
    manager = Workspaces({"root": str(root), "copy_mode": mode, "max_concurrent_starts": starts})
    bash, kinds = BashTool(manager), list(CRASHES)
    sessions = [f"c{i}" for i in range(n)]
    outcomes: dict[str, int] = {}
    recorded: list[tuple[dict[int, int | None], set[int]]] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        s, kind = sessions[i], kinds[i % len(kinds)]
        manager.register(s, str(codebase))
        bash.session_start(s)
        rec = _record(manager, [s])
        try:
            out = bash.execute_session(s, dict(CRASHES[kind]))
            outcome = f"{kind}: answered ({out.strip().splitlines()[-1][:40]})"
        except Exception as exc:  # noqa: BLE001 - a crash is what is measured
            outcome = f"{kind}: {type(exc).__name__}"
        with lock:
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            recorded.append(rec)
        bash.session_end(s)
        manager.release(s, ENVIRONMENT_HOLDER)

    try:
        wall, _ = _batch(n, one)
        before_close = leaks(root)
    finally:
        manager.close()
    pids = {p: t for r in recorded for p, t in r[0].items()}
    uids = {u for r in recorded for u in r[1]}
    return {"wall_s": wall, "outcomes": outcomes, "folders_before_close": before_close["workspace_folders"],
            "leaks": leaks(root, pids, uids)}  # fmt: skip


CHILD = r"""
import json, os, signal, sys, threading
from agentic_rl.tools.workspace import Workspaces
from agentic_rl.tools.workspace_tools import BashTool

def interrupt(signum, frame):
    raise KeyboardInterrupt  # as agentic-rl commands handle SIGTERM
signal.signal(signal.SIGTERM, interrupt)
root, codebase, n, mode, starts = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
manager = Workspaces({"root": root, "copy_mode": mode, "max_concurrent_starts": starts})
bash, started, failed, lock, all_done = BashTool(manager), [], [], threading.Lock(), threading.Event()

def one(i):
    s = f"k{i}"
    try:
        manager.register(s, codebase)
        bash.session_start(s)
        info = manager.info(s)
        held = [list(info.pids), info.uid]
    except Exception as exc:
        held = None
    with lock:
        (started if held else failed).append(held)
        if len(started) + len(failed) == n:
            all_done.set()
    try:
        bash.execute_session(s, {"command": "sleep 120 & sleep 120", "timeout_s": 200})
    except Exception:
        pass

try:
    for i in range(n):
        threading.Thread(target=one, args=(i,), daemon=True).start()
    all_done.wait(timeout=400)
    print(json.dumps({"started": started, "failed": len(failed)}), flush=True)
    threading.Event().wait()
except KeyboardInterrupt:
    sys.exit(130)
finally:
    manager.close()
"""


def killed_child(n: int, codebase: Path, root: Path, mode: str, starts: int, sig: int) -> dict[str, Any]:
    """A child holding `n` workspaces, each running a command, gets `sig` once all are busy; leaks counted after
    it exits (for SIGKILL, also after `sweep_stale_workspaces`, as a resumed run's new manager does)."""
    args = [sys.executable, "-c", CHILD, str(root), str(codebase), str(n), mode, str(starts)]
    child = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert child.stdout is not None
    line = child.stdout.readline()
    if not line:
        raise RuntimeError(f"the child ended early: {child.wait()}")
    reply = json.loads(line)
    held = reply["started"]
    time.sleep(1.0)  # the commands are running
    pids = {p: start_ticks(p) for ps, _ in held for p in ps}
    uids = {u for _, u in held if u is not None}
    alive = leaks(root, pids, uids)
    t0 = time.perf_counter()
    child.send_signal(sig)
    code = child.wait(timeout=300)
    result = {
        "exit_code": code,
        "exit_s": time.perf_counter() - t0,
        "held": len(held),
        "failed": reply["failed"],
        "while_alive": alive,
    }
    result["at_exit"] = leaks(root, pids, uids)
    t1 = time.perf_counter()
    while (
        result["at_exit"]["processes"] or result["at_exit"]["mounts_any_namespace"]
    ) and time.perf_counter() - t1 < 20:
        time.sleep(0.25)  # sandbox processes die with their parent (its PID namespace's init), not at once
        if not any(leaks(root, pids, uids)[k] for k in ("processes", "mounts_any_namespace")):
            break
    result["processes_gone_s"] = time.perf_counter() - t1
    result["leaks"] = leaks(root, pids, uids)
    if sig == signal.SIGKILL:
        t0 = time.perf_counter()
        result["swept"] = len(sweep_stale_workspaces(root))
        result["sweep_s"] = time.perf_counter() - t0
        result["leaks_after_sweep"] = leaks(root, pids, uids)
    return result


# ------------------------------------------------------------------------------------------ report


def _mib(value: float) -> str:
    return f"{value / 2**20:.1f}"


def _concurrency(args: argparse.Namespace, codebase: Path, tmp: Path, modes: list[str]) -> dict[str, Any]:
    plain_wall, plain_lat = plain_batch(args.n, tmp / "plain")
    plain = {"wall_s": plain_wall, "median_latency_s": statistics.median(plain_lat), "max_latency_s": max(plain_lat)}
    runs = {m: workspace_batch(args.n, codebase, tmp / f"root-{m}", m, args.starts) for m in modes}
    rows = [(f"{args.n} plain subprocesses", plain["wall_s"], plain["median_latency_s"], "", "", "-", "-")]
    for r in runs.values():
        r["wall_ratio"] = r["wall_s"] / plain["wall_s"]
        r["median_latency_ratio"] = r["median_latency_s"] / plain["median_latency_s"]
        rows.append((f"{args.n} workspaces ({r['mode']})", r["wall_s"], r["median_latency_s"],
                     f"{r['wall_ratio']:.0f}x", f"{r['median_latency_ratio']:.0f}x",
                     _mib(r["disk_bytes_median"]), _mib(r["rss_bytes_median"])))  # fmt: skip
    print(
        f"{args.n} at once, one `echo ok` each; code base of {args.files} files; max_concurrent_starts={args.starts}:"
    )
    print(table(["batch", "wall s", "median s", "wall ratio", "median ratio", "disk MiB/ws", "RSS MiB/ws"], rows))
    return {"plain": plain, "workspaces": runs}


def _leak_rows(name: str, counts: dict[str, int]) -> tuple[Any, ...]:
    return (name, counts["workspace_folders"], counts["run_folders"], counts["processes"],
            counts["mounts_here"], counts["mounts_any_namespace"])  # fmt: skip


def _leaks(args: argparse.Namespace, codebase: Path, tmp: Path, modes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    rows = []
    for m in modes:
        run = crashing_trajectories(args.n, codebase, tmp / f"crash-{m}", m, args.starts)
        out[f"crashing_{m}"] = run
        rows.append(_leak_rows(f"sleep/crash, ended normally ({m})", run["leaks"]))
        print(f"{args.n} trajectories ({m}, {args.leak_files} files) in {run['wall_s']:.1f} s:", run["outcomes"])
    mode = modes[-1]
    term = killed_child(args.n, codebase, tmp / "term", mode, args.starts, signal.SIGTERM)
    kill = killed_child(args.n, codebase, tmp / "kill", mode, args.starts, signal.SIGKILL)
    out["sigterm"], out["sigkill"] = term, kill
    rows.append(_leak_rows(f"child alive, {term['held']} busy ({mode}, {term['failed']} failed)", term["while_alive"]))
    rows.append(_leak_rows(f"after SIGTERM, exit {term['exit_code']} in {term['exit_s']:.1f} s", term["leaks"]))
    rows.append(_leak_rows(f"at SIGKILL's exit ({kill['exit_code']})", kill["at_exit"]))
    rows.append(_leak_rows(f"{kill['processes_gone_s']:.1f} s later", kill["leaks"]))
    rows.append(_leak_rows(f"then sweep ({kill['swept']} removed, {kill['sweep_s']:.1f} s)", kill["leaks_after_sweep"]))
    print(table(["leaks", "ws folders", "run folders", "processes", "mounts (here)", "mounts (any ns)"], rows))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--leak-files", type=int, default=200, help="files of the leak runs' code base")
    parser.add_argument("--starts", type=int, help="max_concurrent_starts (default: WorkspaceConfig's)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.quick:
        args.n, args.files = 16, 200
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    from agentic_rl.tools.workspace_config import WorkspaceConfig

    args.starts = args.starts or WorkspaceConfig().max_concurrent_starts
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        codebase = make_codebase(tmp / "code", args.files)
        probe = Workspaces({"root": str(tmp / "probe")})
        modes = ["copy", "overlay"] if probe.overlay else ["copy"]
        probe.close()
        concurrency = _concurrency(args, codebase, tmp, modes)
        small = codebase if args.leak_files == args.files else make_codebase(tmp / "small", args.leak_files)
        leak = _leaks(args, small, tmp, modes)
    ends = [r["leaks"] for k, r in leak.items() if k.startswith("crashing")]
    ends += [leak["sigterm"]["leaks"], leak["sigkill"]["leaks_after_sweep"]]
    left = sum(v for counts in ends for v in counts.values())
    result = {"n": args.n, "files": args.files, "leak_files": args.leak_files, "max_concurrent_starts": args.starts, "modes": modes,
              "concurrency": concurrency, "leaks": leak, "seconds": time.perf_counter() - started}  # fmt: skip
    goal = Goal("things left (folders, processes, mounts) after normal end, SIGTERM, SIGKILL + sweep", left, "==", 0,
                digits=0)  # fmt: skip
    save("workspace_scale", result, args.out, args.quick, verdict(goal, note=f"modes {', '.join(modes)}"))


if __name__ == "__main__":
    main()
