"""The `agentic-rl` command's entry point: an engine command starts itself once more with tcmalloc preloaded.

vLLM's CPU worker asks for tcmalloc and Intel OpenMP in `LD_PRELOAD`. `benchmarks/cpu_preload.py` measured both on
a 2-core CPU (SmolLM2-135M, 64 sequences x 64 tokens, 3 alternating cycles; `benchmarks/results/cpu_preload.json`):
median tokens/s vs nothing preloaded, tcmalloc 1.73x, tcmalloc + Intel OpenMP 1.68x, Intel OpenMP 1.42x. Most of
that is steadiness: without tcmalloc, runs that met other load on the machine fell to ~150 tokens/s, while the
quietest cycle gave only +6% (tcmalloc), +3% (both), -3% (Intel OpenMP). tcmalloc also took ~240 MB off the peak
RSS. So tcmalloc (`libtcmalloc_minimal.so.4`, Debian's `libtcmalloc-minimal4`; `scripts/setup.sh` installs it as
root) is preloaded by default; Intel OpenMP (which replaces torch's GNU OpenMP in torch and vLLM's kernels) is not:
set `LD_PRELOAD` yourself to try it, e.g. `LD_PRELOAD=$VIRTUAL_ENV/lib/libiomp5.so`.

`LD_PRELOAD` acts only when a process starts, so `entry` re-executes the same command line (`os.execve`, same
interpreter and flags) with it set, once, when:

- the command starts a vLLM engine (`ENGINE_COMMANDS`: `rollout`, `serve`, `train`);
- the platform is Linux and the library is installed (`find_libraries`);
- `LD_PRELOAD` is not set already (what the user preloads is left alone);
- `AGENTIC_RL_NO_PRELOAD` is not set to a non-empty value other than `0` (the opt-out);
- this process is not itself the re-executed one (`AGENTIC_RL_PRELOADED` is set in the new process: no loop).

Otherwise, and if the re-execution fails, the command runs as it is. `main(argv)` (the command as a function, used
by tests and scripts) never re-executes. The restart costs one more import of `agentic_rl` (it imports torch: ~2 s
on a 2-core CPU). Child processes inherit `LD_PRELOAD` (the code sandbox starts its interpreters with a clean
environment).
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

__all__ = ["ENGINE_COMMANDS", "MARK", "OPT_OUT", "entry", "find_libraries", "preload_environment"]

OPT_OUT = "AGENTIC_RL_NO_PRELOAD"
MARK = "AGENTIC_RL_PRELOADED"
LIBRARIES = ("libtcmalloc_minimal.so.4",)
ENGINE_COMMANDS = frozenset({"rollout", "serve", "train"})


def library_dirs() -> list[Path]:
    """Where `find_libraries` looks, in order: this environment's `lib` (`sys.prefix/lib`, where pip's `intel-openmp`
    and conda put libraries), then the system's (Debian's multiarch folder first)."""
    multiarch = Path("/usr/lib") / f"{platform.machine()}-linux-gnu"
    return [Path(sys.prefix) / "lib", multiarch, Path("/usr/lib64"), Path("/usr/lib"), Path("/usr/local/lib")]


def find_libraries(names: Sequence[str] = LIBRARIES, dirs: Sequence[Path] | None = None) -> list[str]:
    """Absolute paths of the libraries `names` (file names) that exist, the first folder of `dirs` (default
    `library_dirs()`) holding each; names found nowhere are left out. Order follows `names`."""
    found = []
    for name in names:
        path = next((d / name for d in (library_dirs() if dirs is None else dirs) if (d / name).is_file()), None)
        if path is not None:
            found.append(str(path))
    return found


def preload_environment(environ: Mapping[str, str], libraries: Sequence[str]) -> dict[str, str] | None:
    """The environment to re-execute the command with (`environ` plus `LD_PRELOAD` of `libraries` and `MARK`), or
    None to run as it is: no libraries, `LD_PRELOAD` already set, opted out (`OPT_OUT`), or already re-executed."""
    if not libraries or environ.get("LD_PRELOAD") or environ.get(MARK):
        return None
    if environ.get(OPT_OUT, "") not in ("", "0"):
        return None
    return {**environ, "LD_PRELOAD": ":".join(libraries), MARK: "1"}


def entry(run: Callable[[], int] | None = None, libraries: Sequence[str] | None = None) -> None:
    """The `agentic-rl` console command: re-execute once with `libraries` (default `find_libraries()`) preloaded
    (see the module), then call `run` (default: the command's `main`) and exit with its status."""
    command = next((arg for arg in sys.argv[1:] if not arg.startswith("-")), None)
    if sys.platform.startswith("linux") and command in ENGINE_COMMANDS:
        env = preload_environment(os.environ, find_libraries() if libraries is None else libraries)
        if env is not None:
            try:
                os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
            except OSError as exc:  # run without them
                print(f"agentic-rl: could not restart with LD_PRELOAD ({exc}); running without it", file=sys.stderr)
    if run is None:
        from agentic_rl.cli.command import main as run
    sys.exit(run())
