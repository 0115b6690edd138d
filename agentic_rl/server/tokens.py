"""The text and UTF-8 bytes of single tokens, as OpenAI's logprobs report them.

A vocabulary piece is not text: byte-level BPE writes `' café'` as `'ĠcafÃ©'`, SentencePiece writes spaces as `▁`
and bytes as `<0xE2>`. A token can also hold only part of a character; its `bytes` then hold the partial UTF-8
sequence, and its `token` string shows U+FFFD for the missing part.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["TokenTexts"]

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _decoder_types(tokenizer: Any) -> set[str]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return set()
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    found: set[str] = set()
    stack = [decoder]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("type"), str):
                found.add(node["type"])
            stack.extend(node.get("decoders") or [])
    return found


class TokenTexts:
    """`entry(token_id)` -> `{"token": text, "bytes": [utf-8 bytes]}` for a tokenizer (cached per id)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._byte_level: dict[str, int] | None = None
        if "ByteLevel" in _decoder_types(tokenizer):
            from transformers.convert_slow_tokenizer import bytes_to_unicode

            self._byte_level = {char: byte for byte, char in bytes_to_unicode().items()}
        self._added = {token.content for token in getattr(tokenizer, "added_tokens_decoder", {}).values()}
        self._cache: dict[int, dict[str, Any]] = {}

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes the token stands for."""
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if piece is None:
            return b""
        if piece in self._added:  # special and added tokens are written as themselves
            return piece.encode("utf-8")
        if self._byte_level is not None and all(char in self._byte_level for char in piece):
            return bytes(self._byte_level[char] for char in piece)
        match = _BYTE_PIECE.fullmatch(piece)
        if match:
            return bytes([int(match.group(1), 16)])
        return piece.replace("\u2581", " ").encode("utf-8")

    def entry(self, token_id: int) -> dict[str, Any]:
        cached = self._cache.get(token_id)
        if cached is None:
            raw = self.token_bytes(token_id)
            cached = self._cache[token_id] = {"token": raw.decode("utf-8", errors="replace"), "bytes": list(raw)}
        return {"token": cached["token"], "bytes": list(cached["bytes"])}
