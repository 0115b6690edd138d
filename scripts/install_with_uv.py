"""`uv pip install ARGS...` into this Python's environment, from the package sources pip is configured with.

uv reads neither pip.conf nor PIP_* variables. This lets pip parse its own configuration (files and environment,
with pip's precedence) for an `install` and passes the result on: index URL, extra indexes, find-links,
constraints, `no-index`, pre-releases, trusted hosts and the certificate bundle (as `SSL_CERT_FILE`), plus
`--index-strategy unsafe-best-match` (pip takes the best version from any index; uv by default only from the first
index that has the package). uv does not byte-compile here; `scripts/setup.sh` does that on all cores.

`--show-arguments` prints the uv arguments and environment as JSON (`{"args": [...], "env": {...}}`) and installs
nothing.

Exit status: uv's (0 for `--show-arguments`); 3 when pip's configuration holds a setting uv cannot honour the same way (proxy, client
certificate, binary/source-only choices, prefer-binary), so that the caller installs with pip itself.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any


class Unmapped(Exception):
    """pip's configuration sets something this mapping does not carry over to uv."""


def pip_install_options() -> Any:
    """pip's parsed `install` options: defaults, then config files, then PIP_* variables, as pip applies them."""
    from pip._internal.commands import create_command

    options, _ = create_command("install").parse_args([])
    return options


def uv_arguments(options: Any) -> tuple[list[str], dict[str, str]]:
    """uv arguments and environment variables for pip's parsed `install` options.

    Raises:
        Unmapped: for a set option uv would not apply the same way.
    """
    unmapped = [name for name, set_ in (
        ("proxy", bool(options.proxy)), ("client-cert", bool(options.client_cert)),
        ("no-binary/only-binary", bool(options.format_control.no_binary or options.format_control.only_binary)),
        ("prefer-binary", bool(options.prefer_binary))) if set_]  # fmt: skip
    if unmapped:
        raise Unmapped(", ".join(unmapped))
    args = ["--index-strategy", "unsafe-best-match"]
    if options.no_index:
        args.append("--no-index")
    else:
        args += ["--index-url", options.index_url]
        for url in options.extra_index_urls:
            args += ["--extra-index-url", url]
    for location in options.find_links:
        args += ["--find-links", location]
    for path in options.constraints:
        args += ["--constraint", path]
    for host in options.trusted_hosts:
        args += ["--allow-insecure-host", host]
    if options.pre:
        args += ["--prerelease", "allow"]
    env = {"SSL_CERT_FILE": options.cert} if options.cert else {}
    return args, env


def main(argv: list[str]) -> int:
    try:
        args, env = uv_arguments(pip_install_options())
    except Unmapped as exc:
        sys.stderr.write(f"install_with_uv: pip's configuration sets {exc}, which uv would not apply alike\n")
        return 3
    if argv == ["--show-arguments"]:
        sys.stdout.write(json.dumps({"args": args, "env": env}) + "\n")
        return 0
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        sys.stderr.write("install_with_uv: uv is not installed\n")
        return 3
    command = [uv, "pip", "install", "--python", sys.executable, *args, *argv]
    return subprocess.run(command, env={**os.environ, **env}, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
