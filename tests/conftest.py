"""Shared fixtures: the real SmolLM2 model, its tokenizer, one in-process vLLM engine per test session and one
OpenAI-compatible HTTP server over it."""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One OpenMP thread per process: CI shares the machine with other busy processes, and torch's default of one thread
# per core slows down many times over under contention (the suite's training tests: ~60 s -> ~3 s each).
os.environ.setdefault("OMP_NUM_THREADS", "1")

from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import anyio  # noqa: E402
import pytest  # noqa: E402

DATA_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data"
TEMPLATES = Path(__file__).parent / "fixtures" / "templates"
QWEN25_TEMPLATE = TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja"
QWEN3_TEMPLATE = TEMPLATES / "Qwen-Qwen3-0.6B.jinja"


@pytest.fixture(scope="session")
def model_dir() -> Path:
    from agentic_rl.models import DEFAULT_MODEL, resolve_model

    return resolve_model(DEFAULT_MODEL)


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


@pytest.fixture(scope="session")
def qwen_tokenizer(model_dir: Path) -> Any:
    """SmolLM2's tokenizer carrying Qwen2.5's chat template (tools in the system turn, tool results as user turns)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    tok.chat_template = QWEN25_TEMPLATE.read_text()
    return tok


@pytest.fixture(scope="session")
def qwen3_tokenizer(model_dir: Path) -> Any:
    """SmolLM2's tokenizer carrying Qwen3's chat template (it writes an empty `<think>` block into the last assistant
    turn only, and drops earlier `<think>` blocks once a new user query follows). No tokens are added, so the real
    engine can sample with it."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    tok.chat_template = QWEN3_TEMPLATE.read_text()
    return tok


@pytest.fixture(scope="session")
def engine(model_dir: Path) -> Iterator[Any]:
    """One real in-process vLLM engine (CPU build) on SmolLM2-135M-Instruct, shared by the whole session."""
    from agentic_rl.engine.vllm_engine import VLLMEngine, VLLMEngineConfig

    eng = VLLMEngine(VLLMEngineConfig(model=model_dir, max_model_len=2048, kv_cache_gib=0.5))
    eng.start_sync()
    yield eng
    anyio.run(eng.close)


@pytest.fixture(scope="session")
def serving(engine, tokenizer):
    """The OpenAI-compatible serving layer over the session engine, under `support.server.MODEL_NAME`."""
    from support.server import MODEL_NAME

    from agentic_rl.server.serving import OpenAIServing

    return OpenAIServing(engine, tokenizer, model_name=MODEL_NAME)


@pytest.fixture(scope="session")
def server(serving):
    """A real HTTP server on 127.0.0.1 over `serving`, started once per test session."""
    from agentic_rl.server.app import create_app
    from agentic_rl.server.thread import ServerThread

    thread = ServerThread(create_app(serving))
    thread.start()
    yield thread
    thread.stop()


@pytest.fixture(scope="session")
def base_url(server):
    return f"http://{server.address}"


@pytest.fixture
def gsm8k_rows() -> list[dict[str, Any]]:
    import json

    path = DATA_DIR / "gsm8k_test.jsonl"
    if not path.is_file():
        pytest.skip(f"shared data not found at {path}")
    with path.open() as f:
        return [json.loads(line) for _, line in zip(range(64), f, strict=False)]


@pytest.fixture
def verl_parquet(gsm8k_rows):
    """`write(path, n=8, system=...)`: the first `n` GSM8K test rows as a parquet file in verl's layout (a `prompt`
    of chat messages, `reward_model.ground_truth`, `extra_info.index`, `data_source`), ids counting from 100;
    `system=None` leaves the system message out."""

    def write(path: Path, n: int = 8, system: str | None = "Answer with a number.") -> Path:
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = []
        for i, row in enumerate(gsm8k_rows[:n]):
            prompt = [{"role": "system", "content": system}] if system is not None else []
            rows.append({
                "data_source": "openai/gsm8k", "ability": "math",
                "prompt": [*prompt, {"role": "user", "content": row["question"]}],
                "reward_model": {"style": "rule", "ground_truth": row["answer"].split("####")[-1].strip()},
                "extra_info": {"split": "test", "index": 100 + i},
            })  # fmt: skip
        pq.write_table(pa.Table.from_pylist(rows), path)
        return path

    return write


@pytest.fixture
def make_task():
    def make(i: int = 0, question: str = "What is 12 * 7? Use the calculator.", ground_truth: str = "84") -> dict:
        return {"id": i, "question": question, "ground_truth": ground_truth}

    return make
