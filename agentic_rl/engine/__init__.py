"""Inference engines: the `Engine` protocol and the in-process vLLM engine (imported lazily: it pulls in vLLM)."""

from agentic_rl.lazy import lazy_exports

__all__ = ["Engine", "Generation", "PausableEngine", "RecordingEngine", "RunCheck", "SampleLedger", "TrainableEngine"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        **dict.fromkeys(("Engine", "Generation", "PausableEngine", "TrainableEngine"), "agentic_rl.engine.base"),
        **dict.fromkeys(("RecordingEngine", "RunCheck", "SampleLedger"), "agentic_rl.engine.ledger"),
    },
)
