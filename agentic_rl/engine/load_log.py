"""One log line per weight load for the dtype casts vLLM reports tensor by tensor.

vLLM's weight loader warns once per tensor whose stored dtype differs from the engine's ("Attempted to load weight
... with dtype torch.float32 into parameter with dtype torch.bfloat16"): 122 lines for SmolLM2-135M at every engine
start from fp32 weights (the tool model, a training checkpoint) and at every weight sync from an fp32 trainer into a
bf16 engine. Serving in another dtype than the stored one is this project's choice (`VLLMEngineConfig.dtype`), so
`counted_casts` keeps those records out of the log while a load runs and logs one line that counts them.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["VLLM_LOADER_LOGGER", "counted_casts"]

VLLM_LOADER_LOGGER = "vllm.model_executor.models.utils"
_CAST_MESSAGE = "Attempted to load weight %s with dtype %s into parameter with dtype %s"

logger = logging.getLogger(__name__)


class _CastCounter(logging.Filter):
    """Counts the cast records of one thread (the one loading); records of other threads pass to the next filter."""

    def __init__(self) -> None:
        super().__init__()
        self.casts: Counter[tuple[str, str]] = Counter()
        self.thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        if (record.thread == self.thread and record.msg == _CAST_MESSAGE and isinstance(record.args, tuple)
                and len(record.args) == 3):  # fmt: skip
            self.casts[(str(record.args[1]), str(record.args[2]))] += 1
            return False
        return True


@contextmanager
def counted_casts(what: str) -> Iterator[Counter[tuple[str, str]]]:
    """Within the block, vLLM's per-tensor dtype-cast warnings of the calling thread are counted instead of logged;
    on exit one INFO line per (stored dtype, engine dtype) pair says how many tensors `what` cast. Other records
    (and other threads' loads) pass unchanged.

    Yields:
        The counter, keyed by (stored dtype, engine dtype) as vLLM names them (`torch.float32`, ...).
    """
    counter = _CastCounter()
    loader_log = logging.getLogger(VLLM_LOADER_LOGGER)
    loader_log.addFilter(counter)
    try:
        yield counter.casts
    finally:
        loader_log.removeFilter(counter)
        for (stored, served), n in counter.casts.items():
            logger.info("%s: %d weight tensors stored as %s served as %s (the engine's dtype)", what, n, stored, served)
