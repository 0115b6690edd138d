"""The `agentic-rl` command line: the only code that configures logging and prints.

`command` holds the parser, logging and the `train`, `sft`, `serve` and `view` commands; `rollout` the `rollout`
command; `preload` the entry point, `entry`, which the `agentic-rl` script and `python -m agentic_rl.cli` run: it
restarts an engine command once with tcmalloc preloaded where it is installed, then runs `main`.
"""

from agentic_rl.cli.command import main
from agentic_rl.cli.preload import entry
from agentic_rl.cli.rollout import ROLLOUT_ARGS

__all__ = ["ROLLOUT_ARGS", "entry", "main"]
