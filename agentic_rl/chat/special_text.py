"""Text that is not the template's own (message contents, tool schemas), kept from becoming special tokens.

A tool result that contains `<|im_end|>` must stay text: it can neither close its turn nor open a forged one. While
a template renders, each distinct special-token string found in a message content (or tool schema) is replaced by
one character of Unicode's plane 16 (private use), and put back in the rendered text afterwards. Characters of
plane 16 and NUL that are already in the text are replaced the same way, so putting back is exact (and a sentinel
made of NUL stays unique). The render then records which spans are special tokens the template wrote and which are
text that holds special-token strings from the messages (`Rendered.pieces`), so only the template's own glue is
encoded with special tokens.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Piece", "Rendered", "SpecialText", "trie_pattern"]

_PLACEHOLDER_BASE = 0x100000
_PLACEHOLDER = re.compile("[\U00100000-\U0010ffff]")


@dataclass(frozen=True, slots=True)
class Piece:
    """A span [start, end) of rendered text: one special token the template wrote (`special_id`), or the text
    between two of them (`special_id` None; `foreign` when it holds special-token text from the messages)."""

    start: int
    end: int
    special_id: int | None
    foreign: bool


@dataclass(frozen=True, slots=True)
class Rendered:
    """A template's render with the contents put back; `pieces` is None when no content looked like a special token
    (then the whole text encodes as usual)."""

    text: str
    pieces: tuple[Piece, ...] | None


class SpecialText:
    """A tokenizer's special tokens, and the escaping of their text in what a template renders.

    Attributes:
        ids: special-token text -> id, longest text first.
    """

    def __init__(self, tokenizer: Any) -> None:
        decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
        ids: dict[str, int] = {}
        self._absorbs: dict[str, tuple[bool, bool]] = {}  # tokens that take in the whitespace before / after them
        for token_id, token in sorted(decoder.items()):
            content = getattr(token, "content", str(token))
            if content and getattr(token, "special", True) and content not in ids:
                ids[content] = token_id
                absorbs = (bool(getattr(token, "lstrip", False)), bool(getattr(token, "rstrip", False)))
                if any(absorbs):
                    self._absorbs[content] = absorbs
        self.ids = dict(sorted(ids.items(), key=lambda kv: -len(kv[0])))  # longest first
        pattern = trie_pattern(self.ids)
        self._special_re = re.compile(pattern) if pattern else None
        # What must not reach a template as is: special-token text, NUL, placeholder characters.
        self._foreign_re = re.compile("|".join([p for p in (pattern, "[\x00\U00100000-\U0010ffff]") if p]))

    def is_foreign(self, text: str) -> bool:
        """Whether `text` holds something `escape` replaces (fast: most text is checked by one trie search)."""
        if "\x00" in text or (self._special_re is not None and self._special_re.search(text) is not None):
            return True
        if text.isascii() or len(text.encode("utf-16-le", "surrogatepass")) == 2 * len(text):
            return False  # no character beyond the basic plane, so no placeholder character
        return _PLACEHOLDER.search(text) is not None

    def escape(self, value: Any, table: dict[str, str]) -> Any:
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
            return {k: self.escape(v, table) for k, v in value.items()}
        return [self.escape(v, table) for v in value]

    def _holds_foreign(self, value: Any) -> bool:
        if isinstance(value, str):
            return self.is_foreign(value)
        if isinstance(value, dict):
            value = value.values()
        elif not isinstance(value, list | tuple):
            return False
        for item in value:
            if self._holds_foreign(item):
                return True
        return False

    def restore(self, escaped_text: str, table: dict[str, str]) -> Rendered:
        """Put the original strings back into a render of escaped messages, remembering which special tokens the
        template wrote."""
        if not table:
            return Rendered(escaped_text, None)
        originals = {placeholder: found for found, placeholder in table.items()}
        text: list[str] = []
        pieces: list[Piece] = []
        length = 0

        def plain(chunk: str) -> None:
            nonlocal length
            if not chunk:
                return
            restored = _PLACEHOLDER.sub(lambda m: originals.get(m.group(), m.group()), chunk)
            pieces.append(Piece(length, length + len(restored), None, restored != chunk))
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
            pieces.append(Piece(length, length + end - start, self.ids[match.group()], False))
            text.append(escaped_text[start:end])
            length += end - start
            at = end
        plain(escaped_text[at:])
        return Rendered("".join(text), tuple(pieces))


def trie_pattern(strings: Sequence[str] | dict[str, Any]) -> str:
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
