"""scripts/install_with_uv.py: uv installs from the package sources pip is configured with, or declines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "install_with_uv.py"


@pytest.fixture
def pip_env(tmp_path):
    """The environment the script runs in: pip reads only `tmp_path/pip.conf` (after the machine's global files,
    which it overrides) and no PIP_* variables but the ones a test sets."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = str(tmp_path / "pip.conf")
    (tmp_path / "pip.conf").write_text("")
    return env


def _run(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    """The script in its own process, as setup.sh runs it (pip's parsing stays out of the test process)."""
    return subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, env=env, check=False)


def _uv_arguments(env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    run = _run(env, "--show-arguments")
    assert run.returncode == 0, run.stderr
    shown = json.loads(run.stdout)
    return shown["args"], shown["env"]


def _flag(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


def test_pips_own_precedence_decides_what_uv_gets(pip_env, tmp_path):
    (tmp_path / "pip.conf").write_text(
        "[global]\nindex-url = https://global.example/simple\nextra-index-url = file:///global/a file:///global/b\n"
        "find-links = /wheels/one\nconstraint = /etc/c.txt\n"
        "[install]\nindex-url = https://install.example/simple\n"
    )  # fmt: skip
    pip_env["PIP_EXTRA_INDEX_URL"] = "file:///env/simple"  # a variable replaces the files' value
    args, env = _uv_arguments(pip_env)
    assert args[:2] == ["--index-strategy", "unsafe-best-match"]
    assert _flag(args, "--index-url") == ["https://install.example/simple"]
    assert _flag(args, "--extra-index-url") == ["file:///env/simple"]
    assert _flag(args, "--find-links") == ["/wheels/one"]
    assert _flag(args, "--constraint") == ["/etc/c.txt"]
    assert "--no-index" not in args


def test_a_wheelhouse_without_index_stays_without_index(pip_env):
    pip_env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS="/wheels/house", PIP_EXTRA_INDEX_URL="https://extra.example/simple")
    args, _ = _uv_arguments(pip_env)
    assert "--no-index" in args
    assert not _flag(args, "--index-url") and not _flag(args, "--extra-index-url")
    assert _flag(args, "--find-links") == ["/wheels/house"]


def test_certificate_trusted_hosts_and_pre_releases_carry_over(pip_env):
    pip_env.update(PIP_CERT="/etc/ssl/bundle.pem", PIP_TRUSTED_HOST="mirror.internal", PIP_PRE="1")
    args, env = _uv_arguments(pip_env)
    assert env == {"SSL_CERT_FILE": "/etc/ssl/bundle.pem"}
    assert _flag(args, "--allow-insecure-host") == ["mirror.internal"]
    assert _flag(args, "--prerelease") == ["allow"]


@pytest.mark.parametrize("variable, value", [("PIP_PROXY", "http://proxy.internal:3128"), ("PIP_ONLY_BINARY", ":all:"),
                                             ("PIP_PREFER_BINARY", "1")])  # fmt: skip
def test_a_setting_uv_would_not_honour_alike_declines_so_that_pip_installs(pip_env, variable, value):
    pip_env[variable] = value
    # status 3, nothing installed, the reason on stderr: setup.sh then installs with pip
    for argv in (("--show-arguments",), ("--dry-run", "pyyaml")):
        run = _run(pip_env, *argv)
        assert run.returncode == 3, run.stdout
        assert "would not apply alike" in run.stderr
        assert not run.stdout
