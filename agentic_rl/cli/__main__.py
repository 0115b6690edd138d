"""`python -m agentic_rl.cli`: the `agentic-rl` command (restarted once with tcmalloc preloaded for
the engine commands, see `agentic_rl.cli.preload`)."""

from agentic_rl.cli.preload import entry

entry()
