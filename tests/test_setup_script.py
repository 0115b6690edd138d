"""scripts/install_with_uv.py: uv installs from the package sources pip is configured with, or declines."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "install_with_uv.py"


@pytest.fixture
def script(monkeypatch, tmp_path):
    """The script as a module, with pip reading only `tmp_path/pip.conf` (after the machine's global files, which it
    overrides) and no PIP_* variables but the ones a test sets."""
    for name in list(os.environ):
        if name.startswith("PIP_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(tmp_path / "pip.conf"))
    (tmp_path / "pip.conf").write_text("")
    spec = importlib.util.spec_from_file_location("install_with_uv", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _flag(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


def test_pips_own_precedence_decides_what_uv_gets(script, tmp_path, monkeypatch):
    (tmp_path / "pip.conf").write_text(
        "[global]\nindex-url = https://global.example/simple\nextra-index-url = file:///global/a file:///global/b\n"
        "find-links = /wheels/one\nconstraint = /etc/c.txt\n"
        "[install]\nindex-url = https://install.example/simple\n"
    )  # fmt: skip
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "file:///env/simple")  # a variable replaces the files' value
    args, env = script.uv_arguments(script.pip_install_options())
    assert args[:2] == ["--index-strategy", "unsafe-best-match"]
    assert _flag(args, "--index-url") == ["https://install.example/simple"]
    assert _flag(args, "--extra-index-url") == ["file:///env/simple"]
    assert _flag(args, "--find-links") == ["/wheels/one"]
    assert _flag(args, "--constraint") == ["/etc/c.txt"]
    assert "--no-index" not in args


def test_a_wheelhouse_without_index_stays_without_index(script, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", "/wheels/house")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://extra.example/simple")
    args, _ = script.uv_arguments(script.pip_install_options())
    assert "--no-index" in args
    assert not _flag(args, "--index-url") and not _flag(args, "--extra-index-url")
    assert _flag(args, "--find-links") == ["/wheels/house"]


def test_certificate_trusted_hosts_and_pre_releases_carry_over(script, monkeypatch):
    monkeypatch.setenv("PIP_CERT", "/etc/ssl/bundle.pem")
    monkeypatch.setenv("PIP_TRUSTED_HOST", "mirror.internal")
    monkeypatch.setenv("PIP_PRE", "1")
    args, env = script.uv_arguments(script.pip_install_options())
    assert env == {"SSL_CERT_FILE": "/etc/ssl/bundle.pem"}
    assert _flag(args, "--allow-insecure-host") == ["mirror.internal"]
    assert _flag(args, "--prerelease") == ["allow"]


@pytest.mark.parametrize("variable, value", [("PIP_PROXY", "http://proxy.internal:3128"), ("PIP_ONLY_BINARY", ":all:"),
                                             ("PIP_PREFER_BINARY", "1")])  # fmt: skip
def test_a_setting_uv_would_not_honour_alike_declines_so_that_pip_installs(script, monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(script.Unmapped):
        script.uv_arguments(script.pip_install_options())
    # the script as setup.sh runs it: status 3, nothing installed, the reason on stderr
    run = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "pyyaml"], capture_output=True, text=True,
                         env=dict(os.environ), check=False)  # fmt: skip
    assert run.returncode == 3
    assert "would not apply alike" in run.stderr
