"""`python -m agentic_rl.cli`: the `agentic-rl` command."""

import sys

from agentic_rl.cli.command import main

sys.exit(main())
