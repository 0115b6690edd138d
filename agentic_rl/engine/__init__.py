"""Inference engines: the `Engine` protocol and the in-process vLLM engine (imported lazily: it pulls in vLLM)."""

from agentic_rl.engine.base import Engine, Generation, PausableEngine, TrainableEngine
from agentic_rl.engine.ledger import RecordingEngine, RunCheck, SampleLedger

__all__ = ["Engine", "Generation", "PausableEngine", "RecordingEngine", "RunCheck", "SampleLedger", "TrainableEngine"]
