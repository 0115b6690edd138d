"""The `agentic-rl` command line: the only code that configures logging and prints.

`command` holds the parser, logging and the `train`, `sft`, `serve` and `view` commands; `rollout` the `rollout`
command. `python -m agentic_rl.cli` runs `main`.
"""

from agentic_rl.cli.command import main
from agentic_rl.cli.rollout import ROLLOUT_ARGS

__all__ = ["ROLLOUT_ARGS", "main"]
