"""Print, one per line, the `uv pip install` arguments that give uv the package sources pip is configured with.

uv reads neither pip.conf nor PIP_* variables. This reads `pip config list` (files and environment) and passes on
`index-url`, `extra-index-url`, `find-links` and `constraint`, plus `--index-strategy unsafe-best-match`: pip takes
the best matching version from any index, uv by default only from the first index that has the package.
"""

from __future__ import annotations

import ast
import subprocess
import sys

FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
         "constraint": "--constraint"}  # fmt: skip
SECTIONS = (":env:", "global", "install")  # the sections `pip install` reads, environment first


def uv_arguments(listing: str) -> list[str]:
    """uv arguments from `pip config list` output (`section.key='value'` lines; values may list several items)."""
    values: dict[str, list[str]] = {}
    for line in listing.splitlines():
        name, sep, raw = line.partition("=")
        section, _, key = name.rpartition(".")
        if not sep or section not in SECTIONS or key not in FLAGS:
            continue
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        for item in str(value).split():
            if item not in values.setdefault(key, []):
                values[key].append(item)
    args = ["--index-strategy", "unsafe-best-match"]
    for key, items in values.items():
        if key == "index-url":
            items = items[:1]  # one primary index; the environment's wins, as in pip
        for item in items:
            args += [FLAGS[key], item]
    return args


def main() -> int:
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             check=True).stdout  # fmt: skip
    sys.stdout.write("\n".join(uv_arguments(listing)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
