"""A request's raw JSON body: decoded as standard JSON only, nested at most `MAX_JSON_DEPTH` deep, text only.

Every place that is not acceptable is a 400 (`RequestError`) naming it (`messages.0.content`).
"""

from __future__ import annotations

import json
from typing import Any

from agentic_rl.errors import RequestError
from agentic_rl.parser import MAX_JSON_DEPTH, json_nesting_exceeds

__all__ = ["MAX_JSON_DEPTH", "check_json", "parse_json"]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def parse_json(raw: bytes) -> Any:
    """Decode a request body: standard JSON only (no NaN/Infinity), within Python's integer limit and nested at
    most `MAX_JSON_DEPTH` levels deep.

    Raises:
        RequestError: 400 saying why the body is not acceptable JSON.
    """
    try:
        text = raw.decode(json.detect_encoding(raw), "surrogatepass")  # as json.loads decodes bytes
    except UnicodeDecodeError as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from None
    # Refused unread past a few times the limit (decoding recurses once per level); up to there `check_json` names
    # the place that nests too deep.
    if json_nesting_exceeds(text, limit=4 * MAX_JSON_DEPTH):
        raise RequestError(f"the request body nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        body = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise RequestError(f"the request body nests deeper than {MAX_JSON_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError, a too-long integer, NaN, bad UTF-8
        raise RequestError(f"the request body is not valid JSON: {exc}") from None
    check_json(body)
    return body


def check_json(value: Any, path: str = "") -> None:
    """Check a decoded JSON value: nesting at most `MAX_JSON_DEPTH` deep, no lone surrogates in strings or keys.

    Raises:
        RequestError: 400 naming the place (`messages.0.content`).
    """
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, str):
            _check_text(item, where)
            continue
        if not isinstance(item, (dict, list)):
            continue
        if depth >= MAX_JSON_DEPTH:
            raise RequestError(f"'{where or 'body'}' nests deeper than {MAX_JSON_DEPTH} levels", param=where or None)
        pairs = item.items() if isinstance(item, dict) else enumerate(item)
        for key, child in pairs:
            child_path = f"{where}.{key}" if where else str(key)
            if isinstance(key, str):
                _check_text(key, child_path)
            stack.append((child, child_path, depth + 1))


def _check_text(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(
            f"'{where}' holds a lone UTF-16 surrogate ({text[exc.start]!r}) at character {exc.start}: it is not text",
            param=where or None,
        ) from None
