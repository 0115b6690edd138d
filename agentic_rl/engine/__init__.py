"""Inference engines: the `Engine` protocol and the in-process vLLM engine (imported lazily: it pulls in vLLM)."""

from agentic_rl.engine.base import Engine, Generation, TrainableEngine

__all__ = ["Engine", "Generation", "TrainableEngine"]
