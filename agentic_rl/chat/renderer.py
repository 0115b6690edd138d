"""Exact token bookkeeping across turns, and a check of it against a full chat-template render.

The prompt of turn k+1 is the prompt of turn k, plus the ids the engine sampled, plus the ids of what the
environment adds (observations and the template glue around them). Sampled text is never decoded and re-encoded:
that changes ids for many tokenizers (SmolLM2 re-encodes two sampled `Ċ` tokens as one `ĊĊ`).

The ids of an observation come from rendering a short stand-in conversation followed by the observation: they are
everything the template writes after the end-of-turn token of the stand-in's assistant turn (ChatML's newline,
the observation messages, the next generation prompt). The cost depends on the observation's length, not on the
length of the history.

Whether a template can be followed this way is decided once, when the renderer is built: a scripted tool loop
(plain turns, then turns with `<think>` blocks) is run through the same steps, and the prompt built for every turn
must equal the template's own render of the conversation so far. A template that fails raises `TemplateError`
naming what it does (it rewrites earlier turns once later ones follow, drops tool messages, or opens a block in the
generation prompt that it leaves out of the history).

Text that is not the template's own (message contents, tool schemas) is encoded with special tokens split: a tool
result that contains `<|im_end|>` stays text and can neither close its turn nor open a forged one. Only the
template's own glue is encoded with special tokens.
"""

from __future__ import annotations

import re
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
    {"role": "assistant", "content": _SENTINEL},
)
# While a template renders, each distinct special-token string found in a message content (or tool schema) is
# replaced by one character of Unicode's plane 16 (private use), and put back in the rendered text afterwards.
# Characters of plane 16 and NUL that are already in the text are replaced the same way, so putting back is exact
# and the stand-in's sentinel stays unique.
_PLACEHOLDER_BASE = 0x100000
_PLACEHOLDER = re.compile("[\U00100000-\U0010ffff]")

# The scripted tool loop every template must follow exactly (see `ChatRenderer`).
_PROBE_SYSTEM = "You are a helpful assistant."
_PROBE_USER = "What is (2 + 3) * 4?"
_PROBE_TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "e.g. 2 + 3"}},
                "required": ["expression"],
            },
        },
    },
)
_PROBE_TURNS = (
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n</tool_call>',
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "5 * 4"}}\n</tool_call>',
    "(2 + 3) * 4 = 20. The answer is 20.",
)
_PROBE_THINK = "<think>\nThe calculator gives exact results.\n</think>\n\n"
_PROBE_RESULTS = {"tool": (("5",), ("20", "calculator: 1 call left")), "user": (("5",), ("20",))}


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of trajectory tokens from one source: sampled by the engine (`sampled=True`) or inserted."""

    token_ids: tuple[int, ...]
    sampled: bool


@dataclass(frozen=True, slots=True)
class _Piece:
    """A span [start, end) of rendered text: one special token the template wrote (`special_id`), or the text
    between two of them (`special_id` None; `foreign` when it holds special-token text from the messages)."""

    start: int
    end: int
    special_id: int | None
    foreign: bool


@dataclass(frozen=True, slots=True)
class _Rendered:
    """A template's render with the contents put back; `pieces` is None when no content looked like a special token
    (then the whole text encodes as usual)."""

    text: str
    pieces: tuple[_Piece, ...] | None


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

    Raises:
        TemplateError: if the tokenizer has no chat template or no single end-of-turn token, or (when `strict`) the
            template cannot be followed token-exactly through a tool loop: it fails to render one, drops tool
            messages, rewrites earlier turns once later ones follow (e.g. strips the `<think>` blocks of earlier
            assistant turns, as the QwQ and DeepSeek-R1 distill templates do, or as Qwen3's does with
            `enable_thinking=False`). The message names the reason.
    """

    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None, *, strict: bool = True) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        # The Rust tokenizer behind a fast tokenizer gives the same ids and text without the Python wrapper's
        # per-call overhead (several times faster for the short spans of one turn).
        self._backend = tokenizer.backend_tokenizer if getattr(tokenizer, "is_fast", False) else None
        self._plain_backend: Any = None  # built on first use (copying a tokenizer takes ~0.5 s)
        self._init_special_tokens()
        template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else str(tokenizer.chat_template)
        self.supports_tools = "tools" in template
        self.end_of_turn_text, self.after_end_of_turn = self._find_end_of_turn()
        self.end_of_turn_id = self._single_token_id(self.end_of_turn_text)
        self._role_problems: dict[str, str | None] = {}
        problem = self._role_problem("tool")
        if problem is not None and strict:
            raise TemplateError(problem)
        self._role_problem("user")

    @property
    def tool_loop_problem(self) -> str | None:
        """Why the template cannot be followed token-exactly through a tool loop (only a renderer built with
        `strict=False` has one), or None."""
        return self._role_problems["tool"]

    def _init_special_tokens(self) -> None:
        decoder = getattr(self.tokenizer, "added_tokens_decoder", None) or {}
        self._special_ids: dict[str, int] = {}
        self._absorbs: dict[str, tuple[bool, bool]] = {}  # tokens that take in the whitespace before / after them
        for token_id, token in sorted(decoder.items()):
            content = getattr(token, "content", str(token))
            if content and getattr(token, "special", True) and content not in self._special_ids:
                self._special_ids[content] = token_id
                absorbs = (bool(getattr(token, "lstrip", False)), bool(getattr(token, "rstrip", False)))
                if any(absorbs):
                    self._absorbs[content] = absorbs
        self._special_ids = dict(sorted(self._special_ids.items(), key=lambda kv: -len(kv[0])))  # longest first
        pattern = _trie_pattern(self._special_ids)
        self._special_re = re.compile(pattern) if pattern else None
        # What must not reach a template as is: special-token text, NUL, placeholder characters.
        self._foreign_re = re.compile("|".join([p for p in (pattern, "[\x00\U00100000-\U0010ffff]") if p]))

    def _is_foreign(self, text: str) -> bool:
        """Whether `text` holds something `_escape` replaces (fast: most text is checked by one trie search)."""
        if "\x00" in text or (self._special_re is not None and self._special_re.search(text) is not None):
            return True
        if text.isascii() or len(text.encode("utf-16-le", "surrogatepass")) == 2 * len(text):
            return False  # no character beyond the basic plane, so no placeholder character
        return _PLACEHOLDER.search(text) is not None

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
        rendered = self._render_safe(messages, tools, add_generation_prompt=True)
        return self._span_ids(rendered, 0, len(rendered.text))

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
        return self._span_ids(rendered, 0, len(rendered.text))

    def append_problem(self, observation: Sequence[dict[str, Any]]) -> str | None:
        """Why the template cannot append `observation` to a trajectory token-exactly, or None when it can.

        Decided per role, once: role `tool` when the renderer is built (it must pass), role `user` too, other roles
        on first use. E.g. Qwen3's template drops the `<think>` blocks of earlier turns when a user message
        follows, so it takes tool results exactly but not user messages.
        """
        for role in dict.fromkeys(str(m.get("role")) for m in observation):
            problem = self._role_problem(role)
            if problem is not None:
                return problem
        return None

    def closing_ids(self) -> list[int]:
        """Ids that close an assistant turn the engine cut off before its end-of-turn token."""
        return self.encode(self.end_of_turn_text + self.after_end_of_turn)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of `token_ids`, special tokens kept, no clean-up of spaces (an exact inverse for the check)."""
        if self._backend is not None:
            return self._backend.decode(list(token_ids), skip_special_tokens=False)
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    # ---- text that is not the template's -------------------------------------------------------------------

    def _escape(self, value: Any, table: dict[str, str]) -> Any:
        """`value` with every special-token string (and NUL or placeholder character) in its strings replaced by a
        placeholder character; `table` maps each replaced string to its placeholder. `value` itself when it holds
        none (the usual case, checked without copying)."""
        if not self._holds_foreign(value):
            return value
        if isinstance(value, str):

            def placeholder(match: re.Match[str]) -> str:
                found = match.group()
                if found not in table:
                    table[found] = chr(_PLACEHOLDER_BASE + len(table))
                return table[found]

            return self._foreign_re.sub(placeholder, value)
        if isinstance(value, dict):
            return {k: self._escape(v, table) for k, v in value.items()}
        return [self._escape(v, table) for v in value]

    def _holds_foreign(self, value: Any) -> bool:
        if isinstance(value, str):
            return self._is_foreign(value)
        if isinstance(value, dict):
            value = value.values()
        elif not isinstance(value, list | tuple):
            return False
        for item in value:
            if self._holds_foreign(item):
                return True
        return False

    def _safe(self, escaped_text: str, table: dict[str, str]) -> _Rendered:
        """Put the original strings back into a render of escaped messages, remembering which special tokens the
        template wrote."""
        if not table:
            return _Rendered(escaped_text, None)
        originals = {placeholder: found for found, placeholder in table.items()}
        text: list[str] = []
        pieces: list[_Piece] = []
        length = 0

        def plain(chunk: str) -> None:
            nonlocal length
            if not chunk:
                return
            restored = _PLACEHOLDER.sub(lambda m: originals.get(m.group(), m.group()), chunk)
            pieces.append(_Piece(length, length + len(restored), None, restored != chunk))
            text.append(restored)
            length += len(restored)

        at = 0
        for match in self._special_re.finditer(escaped_text) if self._special_re is not None else ():
            start, end = match.span()
            if match.start() < at:
                continue  # taken in by the previous token's whitespace
            lstrip, rstrip = self._absorbs.get(match.group(), (False, False))
            while lstrip and start > at and escaped_text[start - 1].isspace():
                start -= 1
            while rstrip and end < len(escaped_text) and escaped_text[end].isspace():
                end += 1
            plain(escaped_text[at:start])
            pieces.append(_Piece(length, length + end - start, self._special_ids[match.group()], False))
            text.append(escaped_text[start:end])
            length += end - start
            at = end
        plain(escaped_text[at:])
        return _Rendered("".join(text), tuple(pieces))

    def _render_safe(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None, *, add_generation_prompt: bool
    ) -> _Rendered:
        table: dict[str, str] = {}
        escaped = self._escape(list(messages), table)
        escaped_tools = self._escape(list(tools), table) if tools else tools
        return self._safe(self.render(escaped, escaped_tools, add_generation_prompt=add_generation_prompt), table)

    def _span_ids(self, rendered: _Rendered, start: int, end: int) -> list[int]:
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

    def _glue(self, observation: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None) -> _Rendered:
        """The template's text after the stand-in assistant turn's end-of-turn token, with `observation` added."""
        table: dict[str, str] = {}
        escaped = self._escape(list(observation), table)
        escaped_tools = self._escape(list(tools), table) if tools else tools
        after = self.render([*_STAND_IN, *escaped], escaped_tools, add_generation_prompt=True)
        at = after.find(_SENTINEL)
        if at < 0 or not after.startswith(self.end_of_turn_text, at + len(_SENTINEL)):
            raise TemplateError(
                f"the chat template does not close an assistant turn with {self.end_of_turn_text!r} when an "
                f"observation follows it"
            )
        return self._safe(after[at + len(_SENTINEL) + len(self.end_of_turn_text) :], table)

    def _role_problem(self, role: str) -> str | None:
        if role not in self._role_problems:
            problem = None
            tool_sets = [list(_PROBE_TOOLS), None] if self.supports_tools else [None]
            for tools in tool_sets:
                for think in (False, True):
                    problem = problem or self._probe(role, tools, think=think)
            self._role_problems[role] = problem
        return self._role_problems[role]

    def _probe(self, role: str, tools: list[dict[str, Any]] | None, *, think: bool) -> str | None:
        """Run the scripted tool loop with observations of `role`: None if the prompt built for every turn equals
        the template's render of the conversation so far, else what the template does instead."""
        where = f"a multi-turn loop with {role} messages" + (" and tool schemas" if tools else "")
        head = f"the chat template cannot be followed token-exactly through {where}: "
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": _PROBE_SYSTEM},
            {"role": "user", "content": _PROBE_USER},
        ]
        results = _PROBE_RESULTS.get(role, _PROBE_RESULTS["user"])
        try:
            record = self.render(messages, tools, add_generation_prompt=True)
            regions = [(0, "system"), (_common_prefix(self.render(messages, tools), record), "generation")]
            for turn, text in enumerate(_PROBE_TURNS):
                content = (_PROBE_THINK if think else "") + text
                regions.append((len(record), "assistant"))
                messages.append({"role": "assistant", "content": content})
                record += content + self.end_of_turn_text
                if turn == len(_PROBE_TURNS) - 1:
                    return None
                observation = [{"role": role, "content": result} for result in results[turn]]
                glue = self._glue(observation, tools).text
                missing = [m["content"] for m in observation if m["content"] not in glue]
                if missing:
                    return head + f"it leaves {role} messages out of the render (no {missing[0]!r} in {glue!r})"
                regions.append((len(record), "observation"))
                record += glue
                messages.extend(observation)
                expected = self.render(messages, tools, add_generation_prompt=True)
                if expected != record:
                    return head + _explain(record, expected, regions, role, think)
                regions.append((_common_prefix(self.render(messages, tools), expected), "generation"))
        except TemplateError as exc:
            return head + str(exc)
        return None

    def _find_end_of_turn(self) -> tuple[str, str]:
        msgs = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _SENTINEL}]
        # Some tool-use templates fail without tool schemas: the end of an assistant turn does not depend on them.
        text = self.render(msgs, list(_PROBE_TOOLS) if self.supports_tools else None)
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
        for token in self._special_ids:  # longest first
            if tail.startswith(token):
                return token, tail[len(token) :]
        raise TemplateError(f"cannot find the end-of-turn token in the template's assistant suffix {tail!r}")

    def _single_token_id(self, text: str) -> int:
        ids = self.encode(text)
        if len(ids) != 1:
            raise TemplateError(f"end-of-turn {text!r} is not a single token: {ids}")
        return ids[0]


def _trie_pattern(strings: Sequence[str] | dict[str, Any]) -> str:
    """A regex matching any of `strings`, longest first, written as a trie: one alternation of many literals costs
    Python's `re` a try of each at every position, the trie only a look at the next character."""
    trie: dict[str, Any] = {}
    for string in strings:
        node = trie
        for char in string:
            node = node.setdefault(char, {})
        node[""] = {}

    def emit(node: dict[str, Any]) -> str:
        branches = [re.escape(char) + emit(child) for char, child in sorted(node.items()) if char]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body

    return emit(trie)


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _explain(record: str, expected: str, regions: list[tuple[int, str]], role: str, think: bool) -> str:
    """Say where a prompt built turn by turn first differs from the template's render of the same conversation."""
    at = _common_prefix(record, expected)
    regions = sorted(regions)
    kind, start = "observation", 0
    for region_start, region_kind in regions:
        if region_start <= at:
            start, kind = region_start, region_kind
    if kind == "system":
        what = f"it rewrites the first turns once a {role} message follows"
    elif kind == "generation":
        end = next((s for s, _ in regions if s > start), len(record))
        what = (
            f"its generation prompt {record[start:end]!r} is not how it writes that assistant turn once the turn is "
            f"in the history"
        )
        if "<think>" in record[start:end]:
            what += " (it opens a <think> block for the model and drops it from earlier turns)"
    elif kind == "assistant":
        what = (
            f"it drops or rewrites the <think> blocks of earlier assistant turns once a {role} message follows"
            if think
            else f"it rewrites the text of earlier assistant turns once a {role} message follows"
        )
    else:
        what = f"it writes a {role} message differently once a later turn follows"
    lo = max(0, at - 24)
    return f"{what}: the prompt had {record[lo : at + 24]!r}, the full render has {expected[lo : at + 24]!r}"


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
    rendered = renderer._render_safe(
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
            expected = renderer._span_ids(rendered, pos, pos + len(text))
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
