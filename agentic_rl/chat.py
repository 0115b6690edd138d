"""Exact token bookkeeping across turns, and a check of it against a full chat-template render.

The prompt of turn k+1 is the prompt of turn k, plus the ids the engine sampled, plus the ids of what the
environment adds (observations and the template glue around them). Sampled text is never decoded and re-encoded:
that changes ids for many tokenizers (SmolLM2 re-encodes two sampled `Ċ` tokens as one `ĊĊ`).

The ids of an observation are found by rendering a fixed stand-in conversation with and without the observation
messages and tokenizing the difference, together with whatever the template writes after the end-of-turn token
that the engine sampled (ChatML's newline after `<|im_end|>`). The cost depends on the observation's length,
not on the length of the history.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentic_rl.errors import TemplateError

__all__ = ["AlignmentReport", "ChatRenderer", "Segment", "check_alignment"]

_SENTINEL = "\x00agentic-rl-sentinel\x00"
# A closed assistant turn that observations are appended to when measuring their ids.
_STAND_IN = (
    {"role": "system", "content": "s"},
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": "a"},
)


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of trajectory tokens from one source: sampled by the engine (`sampled=True`) or inserted."""

    token_ids: tuple[int, ...]
    sampled: bool


class ChatRenderer:
    """Turns messages into token ids with a Hugging Face tokenizer's chat template, turn by turn.

    Args:
        tokenizer: a `transformers` tokenizer with a chat template.
        template_kwargs: extra variables for the template on every render (e.g. `{"enable_thinking": False}`).

    Raises:
        TemplateError: if the tokenizer has no chat template, or the template rewrites earlier turns when later
            ones are added (then a trajectory cannot be one growing token sequence).
    """

    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        # The Rust tokenizer behind a fast tokenizer gives the same ids and text without the Python wrapper's
        # per-call overhead (several times faster for the short spans of one turn).
        self._backend = tokenizer.backend_tokenizer if getattr(tokenizer, "is_fast", False) else None
        self._stand_in_render: dict[str, str] = {}
        template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else str(tokenizer.chat_template)
        self.supports_tools = "tools" in template
        self.end_of_turn_text, self.after_end_of_turn = self._find_end_of_turn()
        self.end_of_turn_id = self._single_token_id(self.end_of_turn_text)

    # ---- rendering -----------------------------------------------------------------------------------------

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = False,
    ) -> str:
        """The chat template's text for `messages` (tools passed only when the template supports them)."""
        kwargs: dict[str, Any] = {**self.template_kwargs, "tokenize": False, "add_generation_prompt": add_generation_prompt}
        if tools and self.supports_tools:
            kwargs["tools"] = list(tools)
        try:
            return self.tokenizer.apply_chat_template(list(messages), **kwargs)
        except Exception as exc:
            raise TemplateError(f"chat template failed to render: {exc}") from exc

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` with no special tokens added (templates write their own)."""
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prompt_ids(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        """Ids of the first prompt: the messages plus the generation prompt."""
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    def observation_ids(
        self, observation: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        """Ids to append after an assistant turn that ended on the end-of-turn token.

        They cover the rest of the closed assistant turn (e.g. ChatML's newline), the observation messages as the
        template renders them, and the generation prompt of the next assistant turn.

        Raises:
            TemplateError: if the template does not render the stand-in conversation as a prefix of the longer one.
        """
        key = json.dumps(tools, sort_keys=True, default=str) if tools and self.supports_tools else ""
        before = self._stand_in_render.get(key)
        if before is None:  # the same for every turn of every trajectory with these tools
            before = self._stand_in_render[key] = self.render(_STAND_IN, tools)
        after = self.render([*_STAND_IN, *observation], tools, add_generation_prompt=True)
        if not after.startswith(before):
            raise TemplateError("the chat template rewrites earlier turns when an observation is added")
        return self.encode(self.after_end_of_turn + after[len(before) :])

    def closing_ids(self) -> list[int]:
        """Ids that close an assistant turn the engine cut off before its end-of-turn token."""
        return self.encode(self.end_of_turn_text + self.after_end_of_turn)

    def _find_end_of_turn(self) -> tuple[str, str]:
        msgs = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _SENTINEL}]
        text = self.render(msgs)
        at = text.rfind(_SENTINEL)
        if at < 0:
            raise TemplateError("the chat template drops assistant content")
        tail = text[at + len(_SENTINEL) :]
        candidates = [
            t for t in (getattr(self.tokenizer, "eos_token", None), "<|im_end|>", "<|eot_id|>", "<end_of_turn>") if t
        ]
        for token in candidates:
            if tail.startswith(token):
                return token, tail[len(token) :]
        for token in self.tokenizer.all_special_tokens:
            if token and tail.startswith(token):
                return token, tail[len(token) :]
        raise TemplateError(f"cannot find the end-of-turn token in the template's assistant suffix {tail!r}")

    def _single_token_id(self, text: str) -> int:
        ids = self.encode(text)
        if len(ids) != 1:
            raise TemplateError(f"end-of-turn {text!r} is not a single token: {ids}")
        return ids[0]

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of `token_ids`, special tokens kept, no clean-up of spaces (an exact inverse for the check)."""
        if self._backend is not None:
            return self._backend.decode(list(token_ids), skip_special_tokens=False)
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


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
    exactly the ids the tokenizer gives for that span of the render. The render may go on past the last segment
    only with what closes the last assistant turn (the end-of-turn token of a cut-off turn, and the template's
    text after it).

    Args:
        renderer: the renderer built on the trajectory's tokenizer.
        messages: the conversation (assistant contents are the decoded sampled text without end-of-turn).
        segments: the trajectory's ids in order, starting with the prompt (an inserted segment).
        tools: the tool schemas the prompt was rendered with.
    """
    ends_with_assistant = bool(messages) and messages[-1].get("role") == "assistant"
    rendered = renderer.render(messages, tools, add_generation_prompt=not ends_with_assistant)
    pos = 0
    mismatches = 0
    drift = 0
    detail = ""
    for index, segment in enumerate(segments):
        text = renderer.decode(segment.token_ids)
        span = rendered[pos : pos + len(text)]
        if span != text:
            mismatches += 1
            detail = detail or f"segment {index}: expected {span[:60]!r}..., ids decode to {text[:60]!r}..."
            break
        if segment.sampled:
            drift += renderer.encode(text) != list(segment.token_ids)
        else:
            expected = renderer.encode(span)
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
    rest = rendered[pos:]
    closings = ("", renderer.after_end_of_turn, renderer.end_of_turn_text + renderer.after_end_of_turn)
    if mismatches == 0 and rest not in closings:
        mismatches += 1
        detail = f"the render continues past the recorded ids with {rest[:60]!r}"
    return AlignmentReport(mismatches=mismatches, retokenize_drift=drift, detail=detail)
