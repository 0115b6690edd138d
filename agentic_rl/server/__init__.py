"""OpenAI-compatible serving over the in-process engines, with token-exact trajectory capture."""

from agentic_rl.errors import RequestError
from agentic_rl.server.capture import CapturedTurn, TrajectoryRecorder
from agentic_rl.server.protocol import TRAJECTORY_HEADER
from agentic_rl.server.serving import OpenAIServing

__all__ = ["TRAJECTORY_HEADER", "CapturedTurn", "OpenAIServing", "RequestError", "TrajectoryRecorder"]
