"""Describing tools to a model whose chat template has no `tools` support: a Hermes-style system prompt."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

__all__ = ["tools_system_prompt"]

_TOOL_PROMPT = """ Use the tools when they help.

You can call functions. Their signatures, as JSON, are:
{schemas}

To call a function, write exactly:
<tool_call>
{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}
</tool_call>
You may make several calls in one reply; each result comes back in a tool message. When you have the answer, reply
without a tool call."""


def tools_system_prompt(base: str, schemas: Sequence[dict[str, Any]]) -> str:
    """`base` followed by a description of `schemas` (OpenAI function-tool dicts) and the `<tool_call>` format.

    Returns `base` unchanged when there are no schemas.
    """
    if not schemas:
        return base
    listed = "\n".join(json.dumps(schema["function"], ensure_ascii=False) for schema in schemas)
    return base + _TOOL_PROMPT.format(schemas=listed)
