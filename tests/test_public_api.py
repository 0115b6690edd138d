"""The package's `__all__` lists exactly the public names it exports, and importing it stays light."""

from __future__ import annotations

import subprocess
import sys

import agentic_rl


def test_all_names_exist_and_public_attributes_are_listed():
    for name in agentic_rl.__all__:
        assert hasattr(agentic_rl, name), name
    public = {n for n in dir(agentic_rl) if not n.startswith("_") and not isinstance(getattr(agentic_rl, n), type(sys))}
    public.discard("logging")
    assert public == set(agentic_rl.__all__)


def test_importing_the_package_does_not_import_vllm():
    code = "import sys, agentic_rl; print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
