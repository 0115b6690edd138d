"""A trajectory's token ids checked against a full re-render of its conversation by the chat template."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentic_rl.chat.renderer import ChatRenderer, Segment

__all__ = ["AlignmentReport", "check_alignment"]


@dataclass(frozen=True, slots=True)
class AlignmentReport:
    """Result of `check_alignment`.

    Attributes:
        mismatches: inserted tokens that differ from the template's tokenization of the same span, plus 1 for each
            segment whose text is not where the full render puts it. 0 means the ids are what the template writes.
        retokenize_drift: sampled segments whose decoded text re-encodes to other ids (expected and harmless here,
            since sampled ids are kept; it shows what building prompts from text would have corrupted).
        detail: the first problem found, or "".
    """

    mismatches: int
    retokenize_drift: int
    detail: str = ""


def check_alignment(
    renderer: ChatRenderer,
    messages: Sequence[dict[str, Any]],
    segments: Sequence[Segment],
    tools: Sequence[dict[str, Any]] | None = None,
) -> AlignmentReport:
    """Compare a trajectory's token ids with a full re-render of its conversation by the chat template.

    Each segment's decoded text must sit exactly where the full render puts it. Inserted segments must also have
    exactly the ids the template's render gives for that span, with message contents read as plain text (so a
    tool result whose special-token text was encoded as special tokens is a mismatch). When the conversation ends
    with an assistant turn and the last segment is its sampled ids, the rest is compared with the render of the
    conversation before that turn (plus the generation prompt), and the last segment's text with the turn's
    content (plus the end-of-turn token when the turn was closed): templates may write the last assistant turn in
    a form of their own (Qwen3 adds an empty `<think>` block to it), which no prompt ever contained.

    Args:
        renderer: the renderer built on the trajectory's tokenizer.
        messages: the conversation (assistant contents are the decoded sampled text without end-of-turn).
        segments: the trajectory's ids in order, starting with the prompt (an inserted segment).
        tools: the tool schemas the prompt was rendered with.
    """
    messages = list(messages)
    last_turn: dict[str, Any] | None = None
    if messages and messages[-1].get("role") == "assistant" and segments and segments[-1].sampled:
        last_turn = messages.pop()
        segments = list(segments)
        last_segment = segments.pop()
    rendered = renderer.render_with_pieces(
        messages,
        tools,
        add_generation_prompt=last_turn is not None or not (messages and messages[-1].get("role") == "assistant"),
    )
    pos = 0
    mismatches = 0
    drift = 0
    detail = ""
    for index, segment in enumerate(segments):
        text = renderer.decode(segment.token_ids)
        span = rendered.text[pos : pos + len(text)]
        if span != text:
            mismatches += 1
            detail = detail or f"segment {index}: expected {span[:60]!r}..., ids decode to {text[:60]!r}..."
            break
        if segment.sampled:
            drift += renderer.encode(text) != list(segment.token_ids)
        else:
            expected = renderer.span_ids(rendered, pos, pos + len(text))
            if expected != list(segment.token_ids):
                differing = sum(a != b for a, b in zip(expected, segment.token_ids, strict=False)) + abs(
                    len(expected) - len(segment.token_ids)
                )
                mismatches += differing
                detail = (
                    detail
                    or f"segment {index}: template ids {expected[:12]} != recorded {list(segment.token_ids)[:12]}"
                )
        pos += len(text)
    closes_last_turn = (
        bool(messages)
        and messages[-1].get("role") == "assistant"
        and rendered.text[pos:] in (renderer.end_of_turn_text + renderer.after_end_of_turn, renderer.end_of_turn_text)
    )  # a final turn ended by a stop string or cut off: the template closes it, no prompt ever held that text
    if mismatches == 0 and pos != len(rendered.text) and not closes_last_turn:
        mismatches += 1
        detail = f"the render continues past the recorded ids with {rendered.text[pos : pos + 60]!r}"
    if last_turn is not None and mismatches == 0:
        text = renderer.decode(last_segment.token_ids)
        content = str(last_turn.get("content") or "")
        if text not in (content, content + renderer.end_of_turn_text):
            mismatches += 1
            detail = f"the last sampled segment decodes to {text[:60]!r}..., the last message is {content[:60]!r}..."
        drift += renderer.encode(text) != list(last_segment.token_ids)
    return AlignmentReport(mismatches=mismatches, retokenize_drift=drift, detail=detail)
