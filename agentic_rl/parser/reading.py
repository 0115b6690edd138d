"""Reading an assistant turn: where its tool calls begin, the calls in order, and its reasoning.

Reasoning is not acted on: a call inside `<think>...</think>`, or inside a `<think>` left open at the end of a cut
turn, is a sketch, not a call. A `</think>` with no `<think>` before it ends reasoning that began before the text (a
template that opens `<think>` in the generation prompt): everything before it is reasoning.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from agentic_rl.parser.calls import (
    LLAMA3_JSON,
    MISTRAL_CALLS,
    PYTHON_TAG,
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_CALL_OPEN,
    ParsedToolCall,
)
from agentic_rl.parser.hermes import json_block
from agentic_rl.parser.json_text import Next, skip_blank
from agentic_rl.parser.llama3 import message_calls, tagged_block
from agentic_rl.parser.mistral import mistral_block
from agentic_rl.parser.qwen3_coder import FUNCTION_OPEN, xml_block

__all__ = ["action_text", "call_markers", "find_tool_calls", "parse_tool_calls", "split_thought", "strip_thoughts"]

_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL)
_THINK_BLOCK = re.compile(r"<think>.*?(?:</think>|$)\s*", re.DOTALL)


def call_markers(call_format: str | None = None) -> tuple[str, ...]:
    """The texts that open tool calls when `find_tool_calls` reads a turn in `call_format`: `<tool_call>` and
    `[TOOL_CALLS]` always, `<|python_tag|>` under `LLAMA3_JSON` (whose bare JSON calls open with no marker)."""
    return (
        (TOOL_CALL_OPEN, MISTRAL_CALLS, PYTHON_TAG) if call_format == LLAMA3_JSON else (TOOL_CALL_OPEN, MISTRAL_CALLS)
    )


def _block(text: str, at: int, tools: Any, find: Next) -> tuple[list[ParsedToolCall], int]:
    """The calls of the block whose marker starts at `text[at]`, and where reading goes on."""
    if text.startswith(MISTRAL_CALLS, at):
        return mistral_block(text, at, find)
    if text.startswith(PYTHON_TAG, at):
        return tagged_block(text, at, find)
    body = skip_blank(text, at + len(TOOL_CALL_OPEN))
    if text.startswith(FUNCTION_OPEN, body):
        return xml_block(text, body, tools, find)
    return json_block(text, body, find)


def find_tool_calls(
    text: str, tools: Sequence[Mapping[str, Any]] | None = None, call_format: str | None = None
) -> tuple[int, list[ParsedToolCall]]:
    """Where the tool calls of an assistant turn begin, and the calls, in order (reasoning skipped).

    Args:
        text: the assistant message content (any string: this never raises).
        tools: the tool schemas offered (OpenAI function tools); XML parameter values are converted to the types
            they give. None: XML values stay strings.
        call_format: the format the chat template teaches (`tool_call_format`). `<tool_call>` blocks (JSON or
            XML) and `[TOOL_CALLS]` are read whatever it is; `LLAMA3_JSON` also reads `<|python_tag|>` calls and a
            message that is nothing but call objects (see `agentic_rl.parser.llama3`). None: the default reading.

    Returns:
        (start, calls): the index in `text` where the first call outside reasoning begins (its marker, or the bare
        JSON of a Llama 3 call; -1 when there is none), and one `ToolCall` or `ToolCallError` per call: per JSON
        block, per element of a JSON array, per `<function=>` block, per object after `<|python_tag|>`. No entry
        means no tool call, i.e. a final answer.
    """
    if call_format == LLAMA3_JSON:
        bare = message_calls(text)
        if bare is not None:
            return bare
    markers = call_markers(call_format)
    find = Next(text)
    start, calls, pos = -1, [], 0
    prompt_reasoning = True  # until a <think> opens, a </think> ends reasoning that began in the prompt
    while True:
        at = min((i for i in (find(m, pos) for m in markers) if i >= 0), default=-1)
        think = find(THINK_OPEN, pos)
        close = find(THINK_CLOSE, pos) if prompt_reasoning else -1
        first = min((i for i in (at, think, close) if i >= 0), default=-1)
        if first < 0:
            return start, calls
        if first == at:
            block, pos = _block(text, at, tools, find)
            start = at if start < 0 else start
            calls.extend(block)
            continue
        prompt_reasoning = False
        if first == close:  # all so far was reasoning
            start, calls, pos = -1, [], close + len(THINK_CLOSE)
            continue
        end = find(THINK_CLOSE, think + len(THINK_OPEN))
        if end < 0:  # reasoning cut off: the rest of the turn
            return start, calls
        pos = end + len(THINK_CLOSE)


def parse_tool_calls(
    text: str, tools: Sequence[Mapping[str, Any]] | None = None, call_format: str | None = None
) -> list[ParsedToolCall]:
    """Every tool call of `text` outside reasoning, in order (see `find_tool_calls`).

    Args:
        text: the assistant message content (any string: this never raises).
        tools: the tool schemas offered, for the types of XML parameter values (None: they stay strings).
        call_format: the format the chat template teaches (`LLAMA3_JSON` reads Llama 3's bare JSON calls).

    Returns:
        One `ToolCall` or `ToolCallError` per call; an empty list means no tool call, i.e. a final answer.
    """
    return find_tool_calls(text, tools, call_format)[1]


def action_text(content: str, call_format: str | None = None) -> str:
    """The tool-call part of an assistant turn (its text from where its first call outside reasoning begins on,
    as `find_tool_calls` reads it in `call_format`); "" for a final answer.

    What `Step.action` records, for the rollout and the server's capture alike.
    """
    at = find_tool_calls(content, None, call_format)[0]
    return content[at:] if at >= 0 else ""


def _prompt_opened_close(text: str) -> int:
    """Where the `</think>` that closes reasoning the generation prompt opened starts: the first `</think>`, when no
    `<think>` comes before it; -1 if there is none."""
    close = text.find(THINK_CLOSE)
    return close if close >= 0 and text.find(THINK_OPEN, 0, close) < 0 else -1


def split_thought(text: str) -> tuple[str, str]:
    """Split reasoning from the rest of an assistant message.

    The reasoning is the first `<think>...</think>` block (an unclosed one runs to the end of the text), or, when a
    `</think>` comes before any `<think>`, the text before it (reasoning the generation prompt opened).

    Returns:
        (thought, remainder): the reasoning, stripped ("" if none), and the text outside it.
    """
    close = _prompt_opened_close(text)
    if close >= 0:
        return text[:close].strip(), text[close + len(THINK_CLOSE) :].strip()
    match = _THINK.search(text)
    if match is None:
        return "", text
    return match.group(1).strip(), (text[: match.start()] + text[match.end() :]).strip()


def strip_thoughts(text: str) -> str:
    """`text` without any reasoning: the text before a `</think>` that comes before any `<think>` (reasoning the
    generation prompt opened) and every `<think>` block (an unclosed one runs to the end) removed, each block
    replaced by a space (so `12<think>..</think>34` does not read `1234`); stripped."""
    close = _prompt_opened_close(text)
    if close >= 0:
        text = text[close + len(THINK_CLOSE) :]
    return _THINK_BLOCK.sub(" ", text).replace(THINK_CLOSE, " ").strip()  # and a stray closing tag
