"""scripts/pip_config_for_uv.py: uv gets the package sources pip is configured with."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "pip_config_for_uv.py"


def _module():
    spec = importlib.util.spec_from_file_location("pip_config_for_uv", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pips_indexes_find_links_and_constraints_become_uv_arguments():
    listing = "\n".join([
        ":env:.index-url='https://env.example/simple'",
        ":env:.find-links='/opt/wheels'",
        "global.index-url='https://file.example/simple'",
        "global.extra-index-url='file:///a/simple file:///b/simple'",
        "global.find-links='/opt/wheels'",
        "global.constraint='/etc/pip/constraints.txt'",
        "global.cert='/etc/ssl/cert.pem'",
        "user.find-links='/elsewhere'",  # not a section `pip install` reads
    ])  # fmt: skip
    assert _module().uv_arguments(listing) == [
        "--index-strategy", "unsafe-best-match",
        "--index-url", "https://env.example/simple",
        "--find-links", "/opt/wheels",
        "--extra-index-url", "file:///a/simple", "--extra-index-url", "file:///b/simple",
        "--constraint", "/etc/pip/constraints.txt",
    ]  # fmt: skip


def test_without_pip_configuration_uv_keeps_its_defaults_but_pips_index_rule():
    assert _module().uv_arguments("") == ["--index-strategy", "unsafe-best-match"]


def test_the_script_reads_this_environments_pip_configuration(tmp_path):
    env = {"PIP_CONFIG_FILE": str(tmp_path / "none.conf"), "PIP_FIND_LINKS": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, check=True, env=env).stdout
    args = out.split("\n")
    assert args[:2] == ["--index-strategy", "unsafe-best-match"]
    assert args[args.index("--find-links") + 1] == str(tmp_path)
