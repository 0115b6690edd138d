"""A real HTTP server on 127.0.0.1 over the session's engine, started once per test session."""

from __future__ import annotations

import pytest

from agentic_rl.server.app import create_app
from agentic_rl.server.serving import OpenAIServing
from agentic_rl.server.thread import ServerThread

MODEL_NAME = "smollm2"


@pytest.fixture(scope="session")
def serving(engine, tokenizer):
    return OpenAIServing(engine, tokenizer, model_name=MODEL_NAME)


@pytest.fixture(scope="session")
def server(serving):
    thread = ServerThread(create_app(serving))
    thread.start()
    yield thread
    thread.stop()


@pytest.fixture(scope="session")
def base_url(server):
    return f"http://{server.address}"
