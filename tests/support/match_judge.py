"""A judge endpoint for tests: an OpenAI-compatible chat-completions server on loopback that judges by normalized
answer match.

It reads the reference and the quoted prediction from the prompt `rewards.LLMJudgeReward` sends and replies "Yes"
when they are equal after HotpotQA normalization, "No" otherwise: a judge whose verdicts a test can predict (the
trajectory's `hotpotqa_em`), speaking the wire format a real judge server speaks (bearer key optional, JSON
request and response, 400 for a malformed request, 422 for a prompt that is not the judge's).

Use the `match_judge` fixture (import `match_judge_fixture` into the test module).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from agentic_rl.rewards import normalize_answer
from agentic_rl.server.thread import ServerThread

MODEL = "match-judge"
_REFERENCE = "Reference answer: "
_PREDICTION = "Predicted answer ("


@dataclass
class MatchJudge:
    """The running judge: its base URL (`.../v1`) and every verdict it gave, as `(prediction, reference, yes)`."""

    thread: ServerThread | None = None
    verdicts: list[tuple[str, str, bool]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def base_url(self) -> str:
        assert self.thread is not None
        return f"http://{self.thread.address}/v1"


def _judged(prompt: str) -> tuple[str, str] | None:
    """(prediction, reference) of a judge prompt, or None when the prompt is not one."""
    lines = prompt.splitlines()
    reference = next((line[len(_REFERENCE) :] for line in lines if line.startswith(_REFERENCE)), None)
    quoted = next((line.split("): ", 1)[1] for line in lines if line.startswith(_PREDICTION) and "): " in line), None)
    if reference is None or quoted is None:
        return None
    try:
        prediction = json.loads(quoted)
    except json.JSONDecodeError:
        return None
    return (prediction, reference) if isinstance(prediction, str) else None


def create_match_judge_app(judge: MatchJudge) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return JSONResponse({"error": {"message": "body is not JSON", "type": "invalid_request_error"}}, 400)
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list) or not messages or not body.get("model"):
            error = {"message": "model and messages are required", "type": "invalid_request_error"}
            return JSONResponse({"error": error}, 400)
        prompt = next((m.get("content", "") for m in reversed(messages) if m.get("role") == "user"), "")
        judged = _judged(prompt if isinstance(prompt, str) else "")
        if judged is None:
            return JSONResponse({"error": {"message": "not a judge prompt", "type": "invalid_request_error"}}, 422)
        prediction, reference = judged
        yes = normalize_answer(prediction) == normalize_answer(reference)
        with judge.lock:
            judge.verdicts.append((prediction, reference, yes))
        return JSONResponse({
            "id": f"chatcmpl-match-{len(judge.verdicts)}", "object": "chat.completion", "created": int(time.time()),
            "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Yes" if yes else "No"},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": len(prompt) // 4, "completion_tokens": 1, "total_tokens": len(prompt) // 4 + 1},
        })  # fmt: skip

    return app


@pytest.fixture(name="match_judge")
def match_judge_fixture() -> Iterator[MatchJudge]:
    """The match judge served on 127.0.0.1 for one test."""
    judge = MatchJudge()
    judge.thread = ServerThread(create_match_judge_app(judge))
    judge.thread.start()
    yield judge
    judge.thread.stop(timeout_s=5)
