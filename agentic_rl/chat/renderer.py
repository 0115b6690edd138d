"""`ChatRenderer`: a chat template's text and token ids, turn by turn.

The ids of an observation come from rendering a short stand-in conversation followed by the observation: they are
everything the template writes after the end-of-turn token of the stand-in's assistant turn (ChatML's newline,
the observation messages, the next generation prompt). The cost depends on the observation's length, not on the
length of the history. Whether a template can be followed this way is decided once, when the renderer is built
(`chat.probe`). Text that is not the template's own is encoded with special tokens split (`chat.special_text`).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentic_rl.chat.probe import PROBE_TOOLS, TemplateProblem, probe_problem
from agentic_rl.chat.special_text import Rendered, SpecialText
from agentic_rl.errors import TemplateError

__all__ = ["ChatRenderer", "Segment"]

logger = logging.getLogger(__name__)

_SENTINEL = "\x00agentic-rl-sentinel\x00"
# A closed assistant turn that observations are appended to when measuring their ids.
_STAND_IN = (
    {"role": "system", "content": "s"},
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": _SENTINEL},
)


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of trajectory tokens from one source: sampled by the engine (`sampled=True`) or inserted."""

    token_ids: tuple[int, ...]
    sampled: bool


class ChatRenderer:
    """Turns messages into token ids with a Hugging Face tokenizer's chat template, turn by turn.

    Building the renderer runs a scripted multi-turn tool loop through the template (with and without the tool
    schemas, with plain turns and with `<think>` blocks) and checks that every prompt built turn by turn equals
    the template's render of the whole conversation. Observations of role `tool` must pass; the result for role
    `user` (and for other roles, checked on first use) decides whether `observation_ids` accepts them.

    Args:
        tokenizer: a `transformers` tokenizer with a chat template.
        template_kwargs: extra variables for the template on every render (e.g. `{"enable_thinking": False}`).
        strict: raise when the tool loop cannot be followed token-exactly. With False (a server, which renders
            each request's prompt whole) the reason is kept in `tool_loop_problem` and `append_problem` refuses
            tool messages; the renderer still renders prompts.
        history_rewrites: accept (with `strict`) a template that renders every message but rewrites earlier turns
            once later ones follow: the caller then starts a new exact run where `append_problem` refuses an
            observation (`rerender_problem` says whether that works). A template that drops tool messages or fails
            to render them is still refused.

    Raises:
        TemplateError: if the tokenizer has no chat template or no single end-of-turn token, or (when `strict`) the
            template cannot be followed token-exactly through a tool loop: it fails to render one, drops tool
            messages, or (without `history_rewrites`) rewrites earlier turns once later ones follow (e.g. strips
            the `<think>` blocks of earlier assistant turns, as the QwQ and DeepSeek-R1 distill templates do, or as
            Qwen3's does with `enable_thinking=False`). The message names the reason.
    """

    def __init__(
        self,
        tokenizer: Any,
        template_kwargs: dict[str, Any] | None = None,
        *,
        strict: bool = True,
        history_rewrites: bool = False,
    ) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        # The Rust tokenizer behind a fast tokenizer gives the same ids and text without the Python wrapper's
        # per-call overhead (several times faster for the short spans of one turn).
        self._backend = tokenizer.backend_tokenizer if getattr(tokenizer, "is_fast", False) else None
        self._plain_backend: Any = None  # built on first use (copying a tokenizer takes ~0.5 s)
        self._special = SpecialText(tokenizer)
        template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else str(tokenizer.chat_template)
        self.supports_tools = "tools" in template
        self.end_of_turn_text, self.after_end_of_turn = self._find_end_of_turn()
        self.end_of_turn_id = self._single_token_id(self.end_of_turn_text)
        self._role_problems: dict[str, TemplateProblem | None] = {}
        problem = self._role_problem("tool")
        if problem is not None and strict and not (history_rewrites and problem.rewrites_history):
            hint = " (such a template can train as several exact runs: template_rewrites new_run)"
            raise TemplateError(problem.message + (hint if problem.rewrites_history else ""))
        if problem is not None and history_rewrites:
            logger.info("%s: a trajectory follows it as several exact runs, one where it rewrites", problem.message)
        self._role_problem("user")

    @property
    def tool_loop_problem(self) -> str | None:
        """Why the template cannot be followed token-exactly through a tool loop (only a renderer built with
        `strict=False` has one), or None."""
        problem = self._role_problems["tool"]
        return problem.message if problem is not None else None

    # ---- rendering -----------------------------------------------------------------------------------------

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = False,
    ) -> str:
        """The chat template's text for `messages` (tools passed only when the template supports them)."""
        kwargs: dict[str, Any] = {
            **self.template_kwargs,
            "tokenize": False,
            "add_generation_prompt": add_generation_prompt,
        }
        if tools and self.supports_tools:
            kwargs["tools"] = list(tools)
        try:
            return self.tokenizer.apply_chat_template(list(messages), **kwargs)
        except Exception as exc:
            raise TemplateError(f"chat template failed to render: {exc}") from exc

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` with no special tokens added (templates write their own); special-token text in
        `text` becomes the special token."""
        if self._backend is not None and not self._backend.encode_special_tokens:
            return self._backend.encode(text, add_special_tokens=False).ids
        # (transformers leaves that flag set after a call with `split_special_tokens=True`; its next default call
        # clears it, as this one does)
        return self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=False)

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of `text` read as plain text: special-token text in it is split into ordinary tokens."""
        if self._backend is None:
            return self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
        if self._plain_backend is None:
            # A private copy: switching the shared tokenizer's flag would race with other threads encoding glue.
            from tokenizers import Tokenizer

            plain = Tokenizer.from_str(self._backend.to_str())
            plain.encode_special_tokens = True
            self._plain_backend = plain
        return self._plain_backend.encode(text, add_special_tokens=False).ids

    def prompt_ids(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        """Ids of the first prompt: the messages plus the generation prompt.

        Message contents and tool schemas are read as plain text: only the template's own glue becomes special
        tokens.
        """
        rendered = self.render_with_pieces(messages, tools, add_generation_prompt=True)
        return self.span_ids(rendered, 0, len(rendered.text))

    def observation_ids(
        self, observation: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        """Ids to append after an assistant turn that ended on the end-of-turn token.

        They cover the rest of the closed assistant turn (e.g. ChatML's newline), the observation messages as the
        template renders them (contents read as plain text), and the generation prompt of the next assistant turn.

        Raises:
            TemplateError: if the template cannot append messages of these roles exactly (`append_problem`).
        """
        problem = self.append_problem(observation)
        if problem is not None:
            raise TemplateError(problem)
        rendered = self._glue(observation, tools)
        return self.span_ids(rendered, 0, len(rendered.text))

    def append_problem(self, observation: Sequence[dict[str, Any]]) -> str | None:
        """Why the template cannot append `observation` to a trajectory token-exactly, or None when it can.

        Decided per role, once: role `tool` when the renderer is built (it must pass), role `user` too, other roles
        on first use. E.g. Qwen3's template drops the `<think>` blocks of earlier turns when a user message
        follows, so it takes tool results exactly but not user messages.
        """
        for role in dict.fromkeys(str(m.get("role")) for m in observation):
            problem = self._role_problem(role)
            if problem is not None:
                return problem.message
        return None

    def rerender_problem(self, observation: Sequence[dict[str, Any]]) -> str | None:
        """Why even a new run, prompted with the template's render of the whole conversation, cannot show
        `observation` to the model (the template leaves messages of its roles out, or fails to render them); None
        when it can (the template only rewrites earlier turns, or appends exactly)."""
        for role in dict.fromkeys(str(m.get("role")) for m in observation):
            problem = self._role_problem(role)
            if problem is not None and not problem.rewrites_history:
                return problem.message
        return None

    def closing_ids(self) -> list[int]:
        """Ids that close an assistant turn the engine cut off before its end-of-turn token."""
        return self.encode(self.end_of_turn_text + self.after_end_of_turn)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of `token_ids`, special tokens kept, no clean-up of spaces (an exact inverse for the check)."""
        if self._backend is not None:
            return self._backend.decode(list(token_ids), skip_special_tokens=False)
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    # ---- text that is not the template's ------------------------------------------------------------------

    def render_with_pieces(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None, *, add_generation_prompt: bool
    ) -> Rendered:
        """The template's render of `messages` with contents and tool schemas read as plain text: which spans are
        the template's special tokens and which hold special-token text from the messages (for `span_ids`)."""
        table: dict[str, str] = {}
        escaped = self._special.escape(list(messages), table)
        escaped_tools = self._special.escape(list(tools), table) if tools else tools
        rendered = self.render(escaped, escaped_tools, add_generation_prompt=add_generation_prompt)
        return self._special.restore(rendered, table)

    def span_ids(self, rendered: Rendered, start: int, end: int) -> list[int]:
        """Ids of `rendered.text[start:end]`: the template's special tokens as special tokens, the rest (where it
        holds special-token text from the messages) as plain text."""
        pieces = rendered.pieces
        if pieces is None or not any(p.foreign and p.start < end and p.end > start for p in pieces):
            return self.encode(rendered.text[start:end])
        ids: list[int] = []
        for piece in pieces:
            lo, hi = max(piece.start, start), min(piece.end, end)
            if lo >= hi:
                continue
            if piece.special_id is not None and (lo, hi) == (piece.start, piece.end):
                ids.append(piece.special_id)
            else:
                ids.extend(self.encode_plain(rendered.text[lo:hi]))
        return ids

    # ---- glue measurement and the start-up check -----------------------------------------------------------

    def _glue(self, observation: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None) -> Rendered:
        """The template's text after the stand-in assistant turn's end-of-turn token, with `observation` added."""
        table: dict[str, str] = {}
        escaped = self._special.escape(list(observation), table)
        escaped_tools = self._special.escape(list(tools), table) if tools else tools
        after = self.render([*_STAND_IN, *escaped], escaped_tools, add_generation_prompt=True)
        at = after.find(_SENTINEL)
        if at < 0:
            raise TemplateError(
                "the chat template does not write an earlier assistant turn's content as given once an observation "
                "follows it (it replaces or drops it)"
            )
        if not after.startswith(self.end_of_turn_text, at + len(_SENTINEL)):
            raise TemplateError(
                f"the chat template does not close an assistant turn with {self.end_of_turn_text!r} when an "
                f"observation follows it"
            )
        return self._special.restore(after[at + len(_SENTINEL) + len(self.end_of_turn_text) :], table)

    def _glue_text(self, observation: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None) -> str:
        return self._glue(observation, tools).text

    def _role_problem(self, role: str) -> TemplateProblem | None:
        if role not in self._role_problems:
            found: list[TemplateProblem] = []
            tool_sets = [list(PROBE_TOOLS), None] if self.supports_tools else [None]
            for tools, think in itertools.product(tool_sets, (False, True)):
                if found and not found[0].rewrites_history:
                    break  # nothing follows it: no need to look further
                problem = probe_problem(self.render, self._glue_text, self.end_of_turn_text, role, tools, think=think)
                if problem is None or (problem.render_failed and tools is None and self.supports_tools):
                    continue  # a tool-use template that needs tool schemas fails where it is given none, at render
                found.insert(0 if not problem.rewrites_history else len(found), problem)  # nothing-follows first
            self._role_problems[role] = found[0] if found else None
        return self._role_problems[role]

    def _find_end_of_turn(self) -> tuple[str, str]:
        msgs = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _SENTINEL}]
        # Some tool-use templates fail without tool schemas: the end of an assistant turn does not depend on them.
        text = self.render(msgs, list(PROBE_TOOLS) if self.supports_tools else None)
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
        for token in self._special.ids:  # longest first
            if tail.startswith(token):
                return token, tail[len(token) :]
        raise TemplateError(f"cannot find the end-of-turn token in the template's assistant suffix {tail!r}")

    def _single_token_id(self, text: str) -> int:
        ids = self.encode(text)
        if len(ids) != 1:
            raise TemplateError(f"end-of-turn {text!r} is not a single token: {ids}")
        return ids[0]
