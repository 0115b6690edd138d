"""Tests of agentic_rl.tools.search: Serper / SerpApi clients against a loopback fake, and BM25 local search."""

from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path

import anyio
import pytest
from support.fake_web import (  # noqa: F401  (fixtures)
    NO_RESULTS_QUERY,
    SERPAPI_KEY,
    SERPER_KEY,
    FakeWeb,
    Fault,
    fake_web_fixture,
    fake_web_server_fixture,
    slow,
)

from agentic_rl.environments.base import Sample
from agentic_rl.environments.tool_env import ToolEnvironment
from agentic_rl.errors import ConfigError, ToolError
from agentic_rl.tools.search import (
    DEFAULT_CORPUS_PATH,
    LocalSearchTool,
    SerpApiSearchTool,
    SerperSearchTool,
    bm25_recall_at_k,
    cap_text,
    get_bm25_index,
)

QUESTIONS_PATH = DEFAULT_CORPUS_PATH.with_name("hotpotqa_dev_distractor_500.jsonl")
FAST = {"backoff_s": 0.01, "max_backoff_s": 0.05}  # keep retries quick in tests


def serper(fake: FakeWeb, **kwargs) -> SerperSearchTool:
    kwargs = {"api_key": SERPER_KEY, "base_url": fake.url("serper"), **FAST, **kwargs}
    return SerperSearchTool(**kwargs)


def serpapi(fake: FakeWeb, **kwargs) -> SerpApiSearchTool:
    kwargs = {"api_key": SERPAPI_KEY, "base_url": fake.url("serpapi"), **FAST, **kwargs}
    return SerpApiSearchTool(**kwargs)


@pytest.fixture(autouse=True)
def _no_real_keys(monkeypatch):
    """No test may pick up (and spend) a real key from the environment."""
    for var in ("SERPER_KEY_ID", "SERPAPI_API_KEY"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def corpus_path() -> Path:
    if not DEFAULT_CORPUS_PATH.is_file():
        pytest.skip(f"shared data not found at {DEFAULT_CORPUS_PATH}")
    return DEFAULT_CORPUS_PATH


@pytest.fixture(scope="module")
def local_search(corpus_path) -> LocalSearchTool:
    return LocalSearchTool(corpus_path)


# ------------------------------------------------------------------------------------------------------- Serper


async def test_serper_formats_numbered_results_and_sends_the_real_wire_format(fake_web):
    out = await serper(fake_web, num_results=3).execute({"query": "capital of France"})
    assert out.splitlines() == [
        'Results for "capital of France":',
        "1. capital of France - result 1",
        "   https://example.com/capital-of-france/1",
        "   Snippet 1 about capital of France.",
        "2. capital of France - result 2",
        "   https://example.com/capital-of-france/2",
        "   Snippet 2 about capital of France.",
        "3. capital of France - result 3",
        "   https://example.com/capital-of-france/3",
        "   Snippet 3 about capital of France.",
    ]
    (req,) = fake_web.requests["serper"]
    assert req.method == "POST" and req.path == "/serper/search"
    assert req.headers["x-api-key"] == SERPER_KEY
    assert req.headers["content-type"] == "application/json"
    assert req.body == {"q": "capital of France", "num": 3}


async def test_serper_batches_queries_in_one_request(fake_web):
    out = await serper(fake_web, num_results=2).execute({"query": ["alpha beta", "gamma"]})
    assert fake_web.count("serper") == 1
    assert fake_web.requests["serper"][0].body == [{"q": "alpha beta", "num": 2}, {"q": "gamma", "num": 2}]
    first, second = out.split("\n\n")
    assert first.startswith('Results for "alpha beta":\n1. alpha beta - result 1')
    assert second.startswith('Results for "gamma":\n1. gamma - result 1')
    assert "2. gamma - result 2" in second


async def test_serper_list_sent_as_a_json_string_is_batched(fake_web):
    out = await serper(fake_web, num_results=1).execute({"query": '["one", "two"]'})
    assert fake_web.requests["serper"][0].body == [{"q": "one", "num": 1}, {"q": "two", "num": 1}]
    assert 'Results for "two":' in out


async def test_serper_no_results(fake_web):
    out = await serper(fake_web).execute({"query": NO_RESULTS_QUERY})
    assert out == f'Results for "{NO_RESULTS_QUERY}":\nNo results found.'


async def test_retry_on_429_then_success(fake_web):
    fake_web.plan("serper", 429, 429)
    out = await serper(fake_web, max_retries=3).execute({"query": "q"})
    assert fake_web.count("serper") == 3
    assert out.startswith('Results for "q":\n1. q - result 1')


async def test_retry_after_header_is_honoured(fake_web):
    fake_web.plan("serper", Fault(status=429, headers={"Retry-After": "0.3"}))
    await serper(fake_web, backoff_s=0.01, max_backoff_s=1.0).execute({"query": "q"})
    gap = fake_web.requests["serper"][1].at - fake_web.requests["serper"][0].at
    assert fake_web.count("serper") == 2
    assert gap >= 0.29  # its own backoff would wait at most 0.01 s: the retry waited for the server's 0.3 s


async def test_backoff_grows_between_retries(fake_web):
    fake_web.plan("serper", 503, 503, 503)
    await serper(fake_web, max_retries=3, backoff_s=0.05, max_backoff_s=1.0).execute({"query": "q"})
    at = [r.at for r in fake_web.requests["serper"]]
    gaps = [b - a for a, b in zip(at, at[1:], strict=False)]
    assert len(gaps) == 3
    # delays are 0.05, 0.1, 0.2 s times a jitter in [0.5, 1]
    assert gaps[0] >= 0.02 and gaps[2] >= 0.1 and gaps[2] > gaps[0]


async def test_gives_up_after_n_retries_on_500(fake_web):
    fake_web.plan("serper", *[500] * 10)
    with pytest.raises(ToolError) as info:
        await serper(fake_web, max_retries=2).execute({"query": "q"})
    assert fake_web.count("serper") == 3
    message = str(info.value)
    assert "Serper" in message and "HTTP 500" in message and "Internal server error" in message
    assert "gave up after 3 attempts" in message


@pytest.mark.parametrize("status", [401, 403])
async def test_no_retry_on_auth_errors(fake_web, status):
    fake_web.plan("serper", status)
    with pytest.raises(ToolError, match=rf"authentication failed \(HTTP {status}.*SERPER_KEY_ID"):
        await serper(fake_web, max_retries=3).execute({"query": "q"})
    assert fake_web.count("serper") == 1


async def test_wrong_key_is_rejected_by_the_fake_like_the_real_service(fake_web):
    with pytest.raises(ToolError, match=r"HTTP 403.*Unauthorized") as info:
        await serper(fake_web, api_key="wrong-secret-key").execute({"query": "q"})
    assert fake_web.count("serper") == 1
    assert "wrong-secret-key" not in str(info.value)


async def test_no_retry_on_other_4xx(fake_web):
    fake_web.plan("serper", Fault(status=400, body={"message": "Not enough credits", "statusCode": 400}))
    with pytest.raises(ToolError, match=r"request rejected \(HTTP 400.*Not enough credits"):
        await serper(fake_web).execute({"query": "q"})
    assert fake_web.count("serper") == 1


async def test_timeout_on_slow_responses_is_retried_then_reported(fake_web):
    fake_web.plan("serper", slow(2.0), slow(2.0))
    with pytest.raises(ToolError, match=r"timed out after 0.2 s \(gave up after 2 attempts\)"):
        await serper(fake_web, request_timeout_s=0.2, max_retries=1).execute({"query": "q"})
    assert fake_web.count("serper") == 2  # the message says neither 2 s answer was awaited


async def test_slow_response_within_the_timeout_succeeds(fake_web):
    fake_web.plan("serper", slow(0.2))
    out = await serper(fake_web, request_timeout_s=2.0, max_retries=0).execute({"query": "q"})
    assert "1. q - result 1" in out


async def test_overall_deadline_stops_retries_before_the_environment_timeout(fake_web):
    fake_web.plan("serper", *[slow(2.0)] * 10)
    with pytest.raises(ToolError, match=r"out of time after \d attempt"):
        await serper(fake_web, timeout_s=1.0, request_timeout_s=0.4, max_retries=10).execute({"query": "q"})
    assert 1 <= fake_web.count("serper") <= 3  # attempts of >= 0.4 s each within 1 s, far fewer than 11


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_connect_errors_are_retried_then_reported():
    tool = SerperSearchTool(api_key="k", base_url=f"http://127.0.0.1:{_closed_port()}", max_retries=2, **FAST)
    with pytest.raises(ToolError, match=r"Serper: could not connect.*gave up after 3 attempts"):
        await tool.execute({"query": "q"})


def test_missing_key_raises_config_error_at_construction():
    with pytest.raises(ConfigError, match="SERPER_KEY_ID"):
        SerperSearchTool()
    with pytest.raises(ConfigError, match="SERPAPI_API_KEY"):
        SerpApiSearchTool()
    with pytest.raises(ConfigError, match="SERPER_KEY_ID"):
        SerperSearchTool(api_key="  ")


async def test_keys_are_read_from_the_environment(fake_web, monkeypatch):
    monkeypatch.setenv("SERPER_KEY_ID", SERPER_KEY)
    monkeypatch.setenv("SERPAPI_API_KEY", SERPAPI_KEY)
    assert "1. k - result 1" in await SerperSearchTool(base_url=fake_web.url("serper")).execute({"query": "k"})
    assert "1. k - result 1" in await SerpApiSearchTool(base_url=fake_web.url("serpapi")).execute({"query": "k"})


@pytest.mark.parametrize(
    "kwargs", [{"num_results": 0}, {"max_chars": 50}, {"max_retries": -1}, {"request_timeout_s": 0}, {"timeout_s": 0}]
)
def test_bad_parameters_raise_config_error(kwargs):
    with pytest.raises(ConfigError):
        SerperSearchTool(api_key="k", **kwargs)


async def test_output_is_capped_at_max_chars_with_a_marker(fake_web):
    out = await serper(fake_web, num_results=50, max_chars=500).execute({"query": ["long one", "long two"]})
    assert len(out) <= 500
    assert out.startswith('Results for "long one":')
    assert "...[truncated " in out.splitlines()[-1]
    uncapped = await serper(fake_web, num_results=50, max_chars=100_000).execute({"query": ["long one", "long two"]})
    assert len(uncapped) > 500 and uncapped.startswith(out.rsplit("\n...[truncated", 1)[0])


@pytest.mark.parametrize(
    ("arguments", "match"),
    [
        ({}, "search needs"),
        ({"query": ""}, "empty queries"),
        ({"query": []}, "search needs"),
        ({"query": ["ok", 3]}, "search needs"),
        ({"query": ["a", "b", "c", "d", "e", "f"]}, "at most 5 queries"),
        ({"query": "x" * 1001}, "query too long"),
    ],
)
async def test_invalid_arguments_raise_tool_error_without_a_request(fake_web, arguments, match):
    with pytest.raises(ToolError, match=match):
        await serper(fake_web).execute(arguments)
    assert fake_web.count("serper") == 0


def test_cap_text_never_exceeds_the_limit():
    assert cap_text("short", 10) == "short"
    for n in (201, 1000, 123_456):
        capped = cap_text("y" * n, 200)
        assert len(capped) <= 200 and capped.endswith(f"...[truncated {n - capped.index(chr(10))} characters]")


# ------------------------------------------------------------------------------------------------------ SerpApi


async def test_serpapi_sends_query_parameters_and_formats_results(fake_web):
    out = await serpapi(fake_web, num_results=2).execute({"query": "mount everest"})
    assert out.splitlines()[:4] == [
        'Results for "mount everest":',
        "1. mount everest - result 1",
        "   https://example.com/mount-everest/1",
        "   Snippet 1 about mount everest.",
    ]
    (req,) = fake_web.requests["serpapi"]
    assert req.method == "GET" and req.path == "/serpapi/search.json"
    assert req.query == {"engine": "google", "q": "mount everest", "api_key": SERPAPI_KEY, "num": "2"}


async def test_serpapi_batched_queries_run_concurrently_and_keep_order(fake_web):
    fake_web.plan("serpapi", *[Fault(gather=3)] * 3)  # each answer waits until all three requests are in
    out = await serpapi(fake_web, num_results=1).execute({"query": ["first", "second", "third"]})
    assert fake_web.count("serpapi") == 3 and fake_web.max_in_flight["serpapi"] == 3  # sent together, not in turn
    assert [line for line in out.splitlines() if line.startswith("Results")] == [
        'Results for "first":', 'Results for "second":', 'Results for "third":',
    ]  # fmt: skip


async def test_serpapi_error_body_becomes_a_tool_error(fake_web):
    fake_web.plan("serpapi", Fault(status=200, body={"error": "Your account has run out of searches."}))
    with pytest.raises(ToolError, match="SerpApi: Your account has run out of searches."):
        await serpapi(fake_web).execute({"query": "q"})
    assert fake_web.count("serpapi") == 1


async def test_serpapi_no_results_error_is_an_empty_result(fake_web):
    out = await serpapi(fake_web).execute({"query": NO_RESULTS_QUERY})
    assert out.endswith("No results found.")


async def test_serpapi_wrong_key_401_no_retry_and_key_not_leaked(fake_web, caplog):
    with pytest.raises(ToolError, match=r"authentication failed \(HTTP 401.*Invalid API key.*SERPAPI_API_KEY") as info:
        await serpapi(fake_web, api_key="my-secret-serpapi-key").execute({"query": "q"})
    assert fake_web.count("serpapi") == 1
    assert "my-secret-serpapi-key" not in str(info.value)
    assert "my-secret-serpapi-key" not in caplog.text  # httpx logs request URLs: the key is blanked


async def test_serpapi_one_failing_query_shows_as_an_error_line(fake_web):
    fake_web.plan("serpapi", Fault(status=400, body={"error": "Unsupported parameter."}))
    out = await serpapi(fake_web, num_results=1, max_retries=0).execute({"query": ["bad", "good"]})
    errors = [line for line in out.splitlines() if line.startswith("Error: ")]
    assert errors == ["Error: SerpApi: request rejected (HTTP 400 Bad Request: Unsupported parameter.)"]
    assert "1. good - result 1" in out or "1. bad - result 1" in out


async def test_serpapi_retries_5xx_then_succeeds(fake_web):
    fake_web.plan("serpapi", 502, 500)
    out = await serpapi(fake_web).execute({"query": "q"})
    assert fake_web.count("serpapi") == 3 and "1. q - result 1" in out


async def test_tool_errors_reach_the_model_as_text_through_the_environment(fake_web):
    env = ToolEnvironment([serper(fake_web, num_results=1)])
    call = '<tool_call>\n{"name": "search", "arguments": {"query": "env test"}}\n</tool_call>'
    sample = Sample(id="t0", task={}, messages=[{"role": "assistant", "content": call}])
    observation, done, info = await env.step(sample)
    assert not done and info["tool_errors"] == 0
    assert observation[0]["content"].startswith('Results for "env test":\n1. env test - result 1')
    fake_web.plan("serper", 401)
    observation, _, info = await env.step(sample)
    assert info["tool_errors"] == 1
    assert observation[0]["content"].startswith("Error: Serper: authentication failed (HTTP 401")


# ------------------------------------------------------------------------------------------------- local search


def _question(index: int) -> dict:
    with QUESTIONS_PATH.open() as f:
        for i, line in enumerate(f):
            if i == index:
                return json.loads(line)
    raise IndexError(index)


def test_local_search_finds_the_supporting_docs_of_a_known_question(local_search):
    question = _question(0)  # "Were Scott Derrickson and Ed Wood of the same nationality?"
    assert question["supporting_doc_ids"] == ["hp00001", "hp00004"]
    top5 = local_search.search_ids(question["question"], k=5)
    assert len(top5) == 5
    assert set(question["supporting_doc_ids"]) <= set(top5)


def test_local_search_output_format(local_search):
    out = local_search.execute({"query": "Scott Derrickson director", "top_k": 3})
    lines = out.splitlines()
    assert lines[0] == 'Results for "Scott Derrickson director":'
    assert lines[1] == "1. [hp00001] Scott Derrickson"
    assert lines[2].startswith("   Scott Derrickson (born July 16, 1966) is an American director")
    assert len(lines[2]) <= 3 + 300 + 3
    assert len(lines) == 7
    assert all(re.fullmatch(rf"{n}\. \[hp\d{{5}}\] \S.*", lines[2 * n - 1]) for n in (1, 2, 3))
    assert all(line.startswith("   ") and len(line) <= 306 for line in lines[2::2])


def test_local_search_batched_queries_and_default_top_k(local_search):
    out = local_search.execute({"query": ["Ed Wood filmmaker", "Sinister horror film"]})
    first, second = out.split("\n\n")
    assert "[hp00004] Ed Wood" in first and sum(line[:1].isdigit() for line in first.splitlines()) == 5
    assert "[hp00007] Sinister (film)" in second


def test_local_search_no_match_and_bad_arguments(local_search):
    assert local_search.execute({"query": "the of and"}).endswith("No results found.")  # stopwords only
    assert local_search.execute({"query": "qqxzvw"}).endswith("No results found.")  # not in the vocabulary
    for bad in ({"query": "x", "top_k": 0}, {"query": "x", "top_k": 21}, {"query": "x", "top_k": "3"}, {}):
        with pytest.raises(ToolError):
            local_search.execute(bad)
    assert local_search.search_ids("Ed Wood", k=2) == local_search.search_ids("ED  WOOD?", k=2)


def test_local_search_output_is_capped(corpus_path):
    tool = LocalSearchTool(corpus_path, max_chars=400, max_top_k=20)
    out = tool.execute({"query": "American film director", "top_k": 20})
    assert len(out) <= 400 and "...[truncated " in out


def test_index_is_built_once_per_corpus(local_search, corpus_path):
    again = LocalSearchTool(str(corpus_path), top_k=3)
    assert again.index is local_search.index  # the same object: nothing was rebuilt
    assert get_bm25_index(corpus_path) is local_search.index


def test_index_is_rebuilt_when_the_file_changes(tmp_path):
    path = tmp_path / "tiny.jsonl"
    rows = [{"id": "a", "title": "Apple", "text": "A red fruit."}, {"id": "b", "title": "Banana", "text": "Yellow."}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    first = LocalSearchTool(path, top_k=1)
    assert first.search_ids("red fruit", 1) == ["a"]
    assert LocalSearchTool(path).index is first.index
    rows.append({"id": "c", "title": "Cherry", "text": "A small red fruit, a cherry."})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    second = LocalSearchTool(path)
    assert second.index is not first.index
    assert second.search_ids("cherry", 1) == ["c"]


def test_title_is_indexed(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [{"id": "x", "title": "Zanzibar", "text": "An island."}, {"id": "y", "title": "Other", "text": "Nothing."}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert LocalSearchTool(path).search_ids("zanzibar", 5) == ["x"]


@pytest.mark.parametrize(
    ("content", "match"),
    [("", "no documents"), ("not json\n", "not valid JSON"), ('{"id": "a", "title": "t"}\n', "expected"),
     ('{"id": "a", "title": "t", "text": "x"}\n{"id": "a", "title": "u", "text": "y"}\n', "duplicate id")],
)  # fmt: skip
def test_malformed_corpus_raises_config_error(tmp_path, content, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ConfigError, match=match):
        LocalSearchTool(path)


def test_missing_corpus_raises_config_error(tmp_path):
    with pytest.raises(ConfigError, match="corpus file not found"):
        LocalSearchTool(tmp_path / "nope.jsonl")


async def test_concurrent_searches_from_16_tasks_give_correct_results(local_search):
    questions = [_question(i) for i in range(16)]
    expected = [local_search.search_ids(q["question"], 5) for q in questions]
    got: list[list[str] | None] = [None] * 16
    outputs: list[str | None] = [None] * 16

    async def worker(i: int) -> None:
        for _ in range(5):  # repeat to overlap the threads more
            got[i] = await anyio.to_thread.run_sync(local_search.search_ids, questions[i]["question"], 5)
            outputs[i] = await anyio.to_thread.run_sync(local_search.execute, {"query": questions[i]["question"]})
            assert got[i] == expected[i]

    async with anyio.create_task_group() as tg:
        for i in range(16):
            tg.start_soon(worker, i)
    assert got == expected
    for i in range(16):
        assert outputs[i].splitlines()[1].startswith(f"1. [{expected[i][0]}]")
    assert len({tuple(e) for e in expected}) == 16  # different questions, different result lists


async def test_local_search_through_the_environment_runs_in_threads(local_search):
    env = ToolEnvironment([local_search])
    call = '<tool_call>\n{"name": "search", "arguments": {"query": "Scott Derrickson", "top_k": 2}}\n</tool_call>'
    samples = [Sample(id=f"s{i}", task={}, messages=[{"role": "assistant", "content": call}]) for i in range(16)]
    results = [None] * 16

    async def run(i: int) -> None:
        results[i] = await env.step(samples[i])

    async with anyio.create_task_group() as tg:
        for i in range(16):
            tg.start_soon(run, i)
    texts = {r.observation[0]["content"] for r in results}
    assert len(texts) == 1 and "1. [hp00001] Scott Derrickson" in texts.pop()


def test_recall_at_k_on_a_subset(corpus_path):
    result = bm25_recall_at_k(corpus_path, QUESTIONS_PATH, k=5, limit=20)
    assert result["k"] == 5 and result["questions"] == 20
    assert 0.0 <= result["both_found"] <= result["mean_recall"] <= 1.0
    assert result["mean_recall"] > 0.3  # BM25 finds well over a third of the supporting documents
    wider = bm25_recall_at_k(corpus_path, QUESTIONS_PATH, k=20, limit=20)
    assert wider["mean_recall"] >= result["mean_recall"]


def test_recall_at_k_checks_its_arguments(corpus_path, tmp_path):
    with pytest.raises(ConfigError):
        bm25_recall_at_k(corpus_path, QUESTIONS_PATH, k=0)
    bad = tmp_path / "q.jsonl"
    bad.write_text('{"question": "no supporting ids"}\n')
    with pytest.raises(ConfigError, match="supporting_doc_ids"):
        bm25_recall_at_k(corpus_path, bad)


def test_local_search_index_does_not_break_a_later_vllm_engine_start(corpus_path):
    """bm25s would import numba; vLLM's start-up scan of loaded modules fails on llvmlite objects."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from agentic_rl.tools.search import LocalSearchTool\n"
        f"LocalSearchTool({str(corpus_path)!r}).execute({{'query': 'magazine'}})\n"
        "assert 'numba' not in sys.modules\n"
        "from agentic_rl.models import resolve_model\n"
        "from agentic_rl.engine.vllm_engine import VLLMEngine, VLLMEngineConfig\n"
        "e = VLLMEngine(VLLMEngineConfig(model=resolve_model('tiny-random-smollm2'), max_model_len=256, kv_cache_gib=0.05))\n"
        "e.start_sync()\n"
        "print('engine-started')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "engine-started" in proc.stdout
