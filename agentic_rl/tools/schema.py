"""JSON schemas the engine's grammar can follow: `schema_problem` is the one check of a tool's `parameters` (at
load time, `rollout.contracts`) and of a request's schemas (the OpenAI-compatible server, `server.constraints`), so
the harness accepts exactly the schemas the server does."""

from __future__ import annotations

import functools
import json
from typing import Any

__all__ = ["MAX_JSON_WHITESPACE", "schema_problem"]

# Most whitespace characters in a row inside constrained JSON: enough for indented JSON, and a small model cannot
# fill its whole budget with blanks.
MAX_JSON_WHITESPACE = 16


def schema_problem(schema: Any) -> str | None:
    """Why the engine cannot constrain its output to the JSON schema `schema`, or None when it can.

    The grammar library vLLM builds constraints with (xgrammar) compiles the schema; its reason for refusing it is
    returned (e.g. `Unsupported type "objekt"`). Without xgrammar installed (no vLLM: no engine could use the
    schema either) only JSON-ness is checked.

    Args:
        schema: the schema, as parsed JSON (a dict, or a bool).

    Returns:
        The reason, or None. Never raises.
    """
    try:
        text = json.dumps(schema, ensure_ascii=False, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return f"not JSON: {exc}"
    return _compile_problem(text)


@functools.lru_cache(maxsize=1024)
def _compile_problem(schema_json: str) -> str | None:
    """xgrammar's reason for rejecting a JSON schema, or None (cached: clients resend the same tools every call)."""
    try:
        import xgrammar
    except ImportError:
        return None
    try:
        xgrammar.Grammar.from_json_schema(schema_json, max_whitespace_cnt=MAX_JSON_WHITESPACE)
    except Exception as exc:  # xgrammar raises RuntimeError with "[time] file:line: reason"
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return reason.rsplit(": ", 1)[-1] if "json_schema_converter" in reason else reason
    return None
