"""Tests of agentic_rl.tools.visit: the Jina Reader client with summaries (against a loopback fake) and LocalVisitTool."""

from __future__ import annotations

import pytest
from support.fake_web import (  # noqa: F401  (fixtures)
    JINA_KEY,
    OPENAI_KEY,
    FakeWeb,
    Fault,
    default_page,
    fake_web_fixture,
    fake_web_server_fixture,
    slow,
)

from agentic_rl.errors import ConfigError, ToolError
from agentic_rl.tools import corpus as corpus_module
from agentic_rl.tools.corpus import DEFAULT_CORPUS_PATH, load_corpus
from agentic_rl.tools.visit import DEFAULT_GOAL, LocalVisitTool, VisitTool

FAST = {"backoff_s": 0.01, "max_backoff_s": 0.05}
PAGE_URL = "https://example.com/articles/long"


@pytest.fixture(autouse=True)
def _no_real_keys(monkeypatch):
    for var in ("JINA_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)


def visit(fake: FakeWeb, *, summarize: bool = False, **kwargs) -> VisitTool:
    options = {"base_url": fake.url("jina"), **FAST}
    if summarize:
        options.update(summary_base_url=fake.url("openai"), summary_model="summarizer", summary_api_key=OPENAI_KEY)
    return VisitTool(**{**options, **kwargs})


def long_page(n_chars: int = 20_000) -> str:
    words = " ".join(f"word{i}" for i in range(n_chars // 6))
    return ("Title: Long\n\nMarkdown Content:\n" + words)[:n_chars]


# ------------------------------------------------------------------------------------------------------ VisitTool


async def test_visit_returns_the_page_from_the_reader(fake_web):
    out = await visit(fake_web).execute({"url": "https://example.com/a"})
    assert out == default_page("https://example.com/a")
    (req,) = fake_web.requests["jina"]
    assert req.method == "GET" and req.path == "/jina/https://example.com/a"
    assert "authorization" not in req.headers  # no key configured: none sent


async def test_visit_keeps_the_target_query_string(fake_web):
    url = "https://example.com/search?q=1&lang=en"
    assert await visit(fake_web).execute({"url": url}) == default_page(url)


async def test_visit_sends_the_jina_key_as_bearer(fake_web, monkeypatch):
    monkeypatch.setenv("JINA_API_KEY", JINA_KEY)
    await VisitTool(base_url=fake_web.url("jina")).execute({"url": "https://example.com/a"})
    assert fake_web.requests["jina"][0].headers["authorization"] == f"Bearer {JINA_KEY}"


async def test_visit_wrong_key_is_an_auth_error_without_retry(fake_web):
    with pytest.raises(
        ToolError, match=r"Jina Reader: authentication failed \(HTTP 401.*Invalid API key.*JINA_API_KEY"
    ) as info:
        await visit(fake_web, api_key="bad-jina-secret", max_retries=3).execute({"url": "https://example.com/a"})
    assert fake_web.count("jina") == 1
    assert "bad-jina-secret" not in str(info.value)


async def test_visit_retries_429_and_5xx_then_succeeds(fake_web):
    fake_web.plan("jina", 429, 503)
    out = await visit(fake_web, max_retries=2).execute({"url": "https://example.com/a"})
    assert fake_web.count("jina") == 3 and out.startswith("Title: Page at https://example.com/a")


async def test_visit_gives_up_after_retries(fake_web):
    fake_web.plan("jina", 500, 500, 500)
    with pytest.raises(ToolError, match=r"Jina Reader: HTTP 500.*gave up after 3 attempts"):
        await visit(fake_web, max_retries=2).execute({"url": "https://example.com/a"})
    assert fake_web.count("jina") == 3


async def test_visit_times_out_on_a_slow_reader(fake_web):
    fake_web.plan("jina", slow(2.0))
    with pytest.raises(ToolError, match=r"timed out after 0.2 s \(gave up after 1 attempt\)"):
        await visit(fake_web, request_timeout_s=0.2, max_retries=0).execute({"url": "https://example.com/a"})
    assert fake_web.count("jina") == 1


async def test_visit_caps_a_long_page_without_summarizer(fake_web):
    fake_web.pages[PAGE_URL] = long_page()
    out = await visit(fake_web, max_page_chars=1000).execute({"url": PAGE_URL, "goal": "anything"})
    assert len(out) <= 1000
    assert out.startswith("[page of 20000 characters, showing the start]\nTitle: Long")
    assert "...[truncated " in out
    assert fake_web.count("openai") == 0


async def test_visit_short_page_is_not_summarized(fake_web):
    out = await visit(fake_web, summarize=True, max_page_chars=1000).execute(
        {"url": "https://example.com/s", "goal": "g"}
    )
    assert out == default_page("https://example.com/s")
    assert fake_web.count("openai") == 0


async def test_visit_summarizes_long_pages_toward_the_goal(fake_web):
    fake_web.pages[PAGE_URL] = long_page()
    tool = visit(fake_web, summarize=True, max_page_chars=1000, max_summary_input_chars=5000)
    out = await tool.execute({"url": PAGE_URL, "goal": "find the population of Paris"})
    assert out.startswith(f"Summary of {PAGE_URL} (page of 20000 characters) toward the goal: find the population")
    assert "\n\nFAKE SUMMARY of " in out and out.endswith(" characters toward: find the population of Paris")
    (req,) = fake_web.requests["openai"]
    assert req.headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert req.body["model"] == "summarizer" and req.body["temperature"] == 0.0
    system, user = req.body["messages"]
    assert system["role"] == "system" and user["role"] == "user"
    assert user["content"].startswith(
        f"Goal: find the population of Paris\n\nURL: {PAGE_URL}\n\nPage content:\nTitle: Long"
    )
    assert "[page cut to its first 5000 of 20000 characters]" in user["content"]
    assert len(user["content"]) < 5300


async def test_visit_summary_without_goal_uses_the_default_goal(fake_web):
    fake_web.pages[PAGE_URL] = long_page()
    out = await visit(fake_web, summarize=True, max_page_chars=1000).execute({"url": PAGE_URL})
    assert out.endswith(f"toward: {DEFAULT_GOAL}")


@pytest.mark.parametrize(
    "fault",
    [Fault(status=500), Fault(status=200, body={"choices": []}), Fault(delay_s=2.0)],
    ids=["http-500", "empty-choices", "slow"],
)
async def test_visit_falls_back_to_the_truncated_page_when_summarization_fails(fake_web, fault):
    fake_web.pages[PAGE_URL] = long_page()
    fake_web.plan("openai", fault)
    tool = visit(fake_web, summarize=True, max_page_chars=1000, summary_timeout_s=0.3)
    out = await tool.execute({"url": PAGE_URL, "goal": "g"})
    assert out.startswith("[summarization failed (")  # the slow summary was not awaited past its 0.3 s timeout
    assert "showing the start of the page]\nTitle: Long" in out
    assert len(out) <= 1000 and "...[truncated " in out
    assert fake_web.count("openai") == 1  # the summary is not retried: the fallback is the answer


async def test_visit_falls_back_when_the_summarizer_rejects_the_key(fake_web):
    fake_web.pages[PAGE_URL] = long_page()
    tool = visit(fake_web, summarize=True, max_page_chars=1000, summary_api_key="wrong")
    out = await tool.execute({"url": PAGE_URL, "goal": "g"})
    assert out.startswith("[summarization failed (AuthenticationError")


@pytest.mark.parametrize(
    ("arguments", "match"),
    [({}, "visit needs"), ({"url": ""}, "visit needs"), ({"url": "example.com"}, "not a valid http"),
     ({"url": "ftp://example.com/x"}, "not a valid http"), ({"url": "https://a b"}, "not a valid http"),
     ({"url": "https://example.com/" + "x" * 3000}, "URL too long"), ({"url": "https://x.org", "goal": 3}, "goal")],
)  # fmt: skip
async def test_visit_invalid_arguments(fake_web, arguments, match):
    with pytest.raises(ToolError, match=match):
        await visit(fake_web).execute(arguments)
    assert fake_web.count("jina") == 0


async def test_visit_empty_page_is_an_error(fake_web):
    fake_web.pages["https://example.com/empty"] = "   \n"
    with pytest.raises(ToolError, match="empty page"):
        await visit(fake_web).execute({"url": "https://example.com/empty"})


@pytest.mark.parametrize(
    "kwargs",
    [{"summary_base_url": "http://127.0.0.1:1/v1"}, {"summary_model": "m"}, {"max_page_chars": 10}, {"timeout_s": 0}],
)
def test_visit_bad_configuration_raises_config_error(kwargs):
    with pytest.raises(ConfigError):
        VisitTool(**kwargs)


# ------------------------------------------------------------------------------------------------- LocalVisitTool


@pytest.fixture(scope="module")
def local_visit() -> LocalVisitTool:
    if not DEFAULT_CORPUS_PATH.is_file():
        pytest.skip(f"shared data not found at {DEFAULT_CORPUS_PATH}")
    return LocalVisitTool(DEFAULT_CORPUS_PATH)


def test_local_visit_by_id(local_visit):
    out = local_visit.execute({"id": "hp00001"})
    assert out.startswith("[hp00001] Scott Derrickson\n\nScott Derrickson (born July 16, 1966) is an American director")
    assert out == f"[hp00001] Scott Derrickson\n\n{local_visit.corpus.get('hp00001').text}"


def test_local_visit_by_title_is_case_insensitive(local_visit):
    assert local_visit.execute({"title": "  scott DERRICKSON "}) == local_visit.execute({"id": "hp00001"})
    assert local_visit.execute({"title": "Ed Wood (film)"}).startswith("[hp00000] Ed Wood (film)\n\n")


def test_local_visit_unknown_document_explains_how_to_find_ids(local_visit):
    with pytest.raises(ToolError, match=r"no document with id 'hp99999'.*search tool.*\[id\] title"):
        local_visit.execute({"id": "hp99999"})
    with pytest.raises(ToolError, match=r"no document with title 'No Such Title'"):
        local_visit.execute({"title": "No Such Title"})
    with pytest.raises(ToolError, match="visit needs"):
        local_visit.execute({})
    with pytest.raises(ToolError, match="must be strings"):
        local_visit.execute({"id": 5})


def test_local_visit_unknown_id_with_a_known_title_uses_the_title(local_visit):
    assert local_visit.execute({"id": "nope", "title": "Ed Wood"}).startswith("[hp00004] Ed Wood\n\n")


def test_local_visit_caps_long_documents(local_visit):
    longest = max(local_visit.corpus.docs, key=lambda d: len(d.text))
    tool = LocalVisitTool(DEFAULT_CORPUS_PATH, max_chars=300)
    out = tool.execute({"id": longest.id})
    assert len(longest.text) > 300 and len(out) <= 300
    assert out.startswith(f"[{longest.id}] {longest.title}") and "...[truncated " in out


def test_local_visit_shares_the_cached_corpus(local_visit):
    assert LocalVisitTool(DEFAULT_CORPUS_PATH).corpus is local_visit.corpus is load_corpus(DEFAULT_CORPUS_PATH)
    assert corpus_module._CORPUS_CACHE[DEFAULT_CORPUS_PATH.resolve()] is local_visit.corpus
