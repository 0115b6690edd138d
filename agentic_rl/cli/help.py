"""The help layout of every `agentic-rl` command."""

from __future__ import annotations

import argparse

__all__ = ["DefaultsHelp"]


class DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """Help that shows each option's default, except None: an option without a value says in its help what then."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:
            return action.help
        return super()._get_help_string(action)
