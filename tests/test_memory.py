"""Agent memory on the real tokenizer and model: config validation, head/tail, think stripping, summaries."""

from __future__ import annotations

import logging

import anyio
import pytest

from agentic_rl.errors import ConfigError
from agentic_rl.memory import MemoryConfig, MemorySimple, MemorySummary, OpenAISummaryClient, to_template_messages


def _history(n_pairs: int = 12) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are a careful assistant."},
                {"role": "user", "content": "Find the population of three cities and add them up."}]  # fmt: skip
    for i in range(n_pairs):
        messages.append({"role": "assistant", "content": f"<think>Step {i}: I should look up city {i}.</think>"
                                                          f"Looking up city number {i} now."})  # fmt: skip
        messages.append(
            {"role": "tool", "content": f"City {i} has {1000 + 37 * i} inhabitants according to the census."}
        )
    return messages


class _FailingClient:
    calls = 0

    async def summarize(self, messages, *, system_prompt, max_tokens):
        self.calls += 1
        raise TimeoutError("summary service did not answer")


def test_config_defaults_ranges_and_assignment_validation():
    config = MemoryConfig()
    assert (config.simplify_thinking, config.use_summary, config.max_summary_length, config.max_prompt_length,
            config.before_raw_message, config.end_raw_message, config.oai_client, config.oai_model_name,
            config.train_model_tokenizer_path) == (False, False, 1024, 8192, 0, 0, None, "qwen2.5-7b-instruct", "")  # fmt: skip
    assert "{max_summary_length}" in config.summary_system_prompt
    for bad in ({"max_prompt_length": 0}, {"max_prompt_length": 128 * 1024 + 1}, {"before_raw_message": -1},
                {"end_raw_message": 1}, {"max_summary_length": 0}, {"max_summary_length": 9000},
                {"summary_system_prompt": "no placeholder"}, {"unknown_field": 1}):  # fmt: skip
        with pytest.raises(ValueError):
            MemoryConfig(**bad)
    with pytest.raises(ValueError, match="max_summary_length"):
        config.max_prompt_length = 100  # summary length 1024 no longer fits
    config.max_summary_length = 50
    config.max_prompt_length = 100
    assert config.max_prompt_length == 100


def test_prompt_messages_validate_config_updates_and_messages(tokenizer):
    memory = MemorySimple({"max_prompt_length": 4096}, tokenizer=tokenizer, messages=_history(1))
    with pytest.raises(ConfigError, match="must be a dict"):
        memory.get_prompt_messages("simplify")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_prompt_length"):
        memory.get_prompt_messages({"max_prompt_length": -5})
    with pytest.raises(ConfigError, match="role"):
        memory.add_message({"role": "robot", "content": "x"})
    with pytest.raises(ConfigError, match="content"):
        memory.add_message({"role": "user", "content": ""})
    out = memory.get_prompt_messages({"simplify_thinking": True})
    assert memory.config.simplify_thinking is True
    assert all(set(m) == {"role", "content"} and m["content"] for m in out)
    with pytest.raises(ConfigError, match="no messages"):
        MemorySimple(tokenizer=tokenizer).get_prompt_messages()


def test_lengths_are_measured_with_the_real_chat_template(tokenizer):
    messages = _history(2)
    memory = MemorySimple(tokenizer=tokenizer, messages=messages)
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert memory.count_tokens(messages) == len(tokenizer.encode(rendered, add_special_tokens=False))


def test_simplify_thinking_strips_only_between_raw_head_and_tail(tokenizer):
    messages = _history(4)
    memory = MemorySimple({"simplify_thinking": True, "before_raw_message": 3, "end_raw_message": -2},
                          tokenizer=tokenizer, messages=messages)  # fmt: skip
    out = memory.get_prompt_messages()
    assert out[:3] == messages[:3] and out[-2:] == messages[-2:]  # head keeps its <think>, tail too
    assert "<think>" in out[2]["content"] and "<think>" in out[-2]["content"]
    assert all("<think>" not in m["content"] for m in out[3:-2])
    assert out[4]["content"] == "Looking up city number 1 now."


def test_summary_replaces_the_middle_and_keeps_head_and_tail(tokenizer, base_url):
    messages = _history(12)
    client = OpenAISummaryClient(f"{base_url}/v1", model="smollm2")
    config = {"use_summary": True, "max_prompt_length": 400, "max_summary_length": 64,
              "before_raw_message": 2, "end_raw_message": -2}  # fmt: skip
    memory = MemorySummary(config, chat_client=client, tokenizer=tokenizer, messages=messages)
    assert memory.count_tokens(messages) > 400

    out = anyio.run(memory.aget_prompt_messages)
    assert out[:2] == messages[:2] and out[-2:] == messages[-2:]
    assert [m["role"] for m in out] == ["system", "user", "summary", "assistant", "tool"]
    assert out[2]["content"]
    assert memory.summaries == 1 and memory.fallbacks == 0
    assert memory.count_tokens(out) <= 400
    template_form = to_template_messages(out)
    assert template_form[2]["role"] == "user" and template_form[2]["content"].startswith("Summary of the earlier")
    tokenizer.apply_chat_template(template_form, tokenize=False)  # the template accepts it


def test_failing_summary_client_falls_back_to_truncation_with_a_warning(tokenizer, caplog):
    messages = _history(12)
    client = _FailingClient()
    memory = MemorySummary({"use_summary": True, "max_prompt_length": 300, "max_summary_length": 64,
                            "before_raw_message": 2, "end_raw_message": -1},
                           chat_client=client, tokenizer=tokenizer, messages=messages)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="agentic_rl.memory"):
        out = memory.get_prompt_messages()
    assert client.calls == 1 and memory.fallbacks == 1
    assert "summary failed" in caplog.text
    assert out[:2] == messages[:2] and out[-1] == messages[-1]
    assert memory.count_tokens(out) <= 300
    assert out[2:-1] == messages[len(messages) - len(out) + 2 : -1]  # the newest middle messages survive


def test_unreachable_summary_server_falls_back_too(tokenizer):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = OpenAISummaryClient(f"http://127.0.0.1:{port}/v1", model="x", timeout_s=5)
    memory = MemorySummary({"use_summary": True, "max_prompt_length": 300, "max_summary_length": 64,
                            "before_raw_message": 2}, chat_client=client, tokenizer=tokenizer, messages=_history(12))  # fmt: skip
    out = memory.get_prompt_messages()
    assert memory.fallbacks == 1 and memory.count_tokens(out) <= 300


def test_prompt_truncation_warning_when_raw_messages_alone_exceed_the_budget(tokenizer, caplog):
    messages = _history(6)
    memory = MemorySummary({"use_summary": True, "max_prompt_length": 50, "max_summary_length": 10,
                            "before_raw_message": 2, "end_raw_message": -2},
                           chat_client=_FailingClient(), tokenizer=tokenizer, messages=messages)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="agentic_rl.memory"):
        out = memory.get_prompt_messages()
    assert "PROMPT_TRUNCATION" in caplog.text
    assert out[:2] == messages[:2] and out[-2:] == messages[-2:]


async def test_rollout_with_summary_memory_keeps_every_prompt_under_budget(engine, tokenizer, base_url):
    from support.engines import ForcedCallEngine

    from agentic_rl.chat import ChatRenderer
    from agentic_rl.environments.tool_env import ToolEnvironment
    from agentic_rl.rollout.harness import HarnessConfig, run_trajectory
    from agentic_rl.rollout.spec import RolloutSpec
    from agentic_rl.tools.calculator import CalculatorTool

    budget = 420
    config = MemoryConfig(use_summary=True, max_prompt_length=budget, max_summary_length=48, before_raw_message=2,
                          end_raw_message=-2)  # fmt: skip
    client = OpenAISummaryClient(f"{base_url}/v1", model="smollm2")
    forced = ForcedCallEngine(engine, tokenizer, forced_turns=100)  # keeps calling tools: the history grows
    renderer = ChatRenderer(tokenizer)
    traj = await run_trajectory({"id": "long", "question": "Add up 12 + 30, then keep checking it with the calculator.", "ground_truth": "42"}, 0, RolloutSpec(engine=forced, environment=ToolEnvironment([CalculatorTool()]), renderer=renderer, config=HarnessConfig(max_steps=10, max_prompt_length=1024, max_response_length=1024,
                             sampling={"temperature": 0.7, "max_tokens": 96}), memory_factory=lambda: MemorySummary(config, chat_client=client, tokenizer=tokenizer)))  # fmt: skip

    assert not traj.failed, traj.error
    assert traj.metrics["steps"] == 10
    assert traj.metrics["summaries"] >= 1 and len(traj.runs) > 1
    prompts = [len(step.prompt_ids) for step in traj.steps]
    assert max(prompts) <= budget, prompts
    # Every step's ids are exactly what the engine saw and sampled.
    seen = [(prompt, gen.token_ids) for prompt, _, gen in forced.calls]
    assert [(s.prompt_ids, s.response_ids) for s in traj.steps] == seen
    # Within a run the prompt grows exactly; a new run starts from a summary.
    summary_header = tokenizer.encode("Summary of the earlier conversation:", add_special_tokens=False)
    for prev, step in zip(traj.steps, traj.steps[1:], strict=False):
        head = prev.prompt_ids + prev.response_ids
        if step.prompt_ids[: len(head)] != head:
            assert any(step.prompt_ids[i : i + len(summary_header)] == summary_header
                       for i in range(len(step.prompt_ids)))  # fmt: skip
    assert traj.metrics["alignment_mismatches"] == 0


# ---- what compression keeps: the task, whole turns, the rendered length --------------------------------------------

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7"}}\n</tool_call>'
TOOLS = [
    {"type": "function", "function": {
        "name": name, "description": f"The {name} tool: {description}",
        "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": description}},
                       "required": ["query"]},
    }}
    for name, description in [("calculator", "evaluates one arithmetic expression and returns the number"),
                              ("search", "searches a corpus of encyclopedia articles and returns the best five"),
                              ("visit", "reads one web page and returns its main text, without navigation")]
]  # fmt: skip


class _RecordingClient:
    """Summarizes by numbering: the n-th summary is `summary n`; records every request."""

    def __init__(self) -> None:
        self.requests: list[list[dict[str, str]]] = []

    async def summarize(self, messages, *, system_prompt, max_tokens):
        self.requests.append(list(messages))
        return f"summary {len(self.requests)}: the calls so far returned 84."


def _tool_turns(n_turns: int, calls_per_turn: int = 1, start: int = 0) -> list[dict[str, str]]:
    """`n_turns` assistant turns, each with `calls_per_turn` tool calls and one tool result per call."""
    out = []
    for i in range(start, start + n_turns):
        out.append({"role": "assistant", "content": f"Turn {i}: checking.\n" + "\n".join([CALL] * calls_per_turn)})
        out.extend({"role": "tool", "content": f"Result {i}.{k}: 84"} for k in range(calls_per_turn))
    return out


def _task() -> list[dict[str, str]]:
    return [{"role": "system", "content": "You are a careful assistant. Use the tools."},
            {"role": "user", "content": "What is 12 * 7? Check it with the calculator."}]  # fmt: skip


def _assert_whole_turns(messages: list[dict[str, str]]) -> None:
    """Every tool message follows the assistant message that called it (possibly after that call's other results)."""
    for i, m in enumerate(messages):
        if m["role"] == "tool":
            j = i
            while j > 0 and messages[j - 1]["role"] == "tool":
                j -= 1
            assert j > 0 and messages[j - 1]["role"] == "assistant", [m["role"] for m in messages]


def _rendered(renderer, messages, tools=TOOLS) -> int:
    return len(renderer.prompt_ids(to_template_messages(messages), tools))


@pytest.fixture(scope="module")
def qwen_renderer(qwen_tokenizer):
    from agentic_rl.chat import ChatRenderer

    return ChatRenderer(qwen_tokenizer)


def test_default_compression_keeps_the_system_prompt_and_the_question(tokenizer):
    messages = [*_task(), *_tool_turns(12)]
    client = _RecordingClient()
    memory = MemorySummary({"use_summary": True, "max_prompt_length": 300, "max_summary_length": 64},
                           chat_client=client, tokenizer=tokenizer, messages=messages)  # fmt: skip
    out = memory.get_prompt_messages()
    assert out[:2] == messages[:2]  # verbatim, first
    assert [m["role"] for m in out] == ["system", "user", "summary"]
    assert client.requests == [messages[2:]]  # only the turns were summarized
    # the flag off: the whole history is summarized, as before
    memory = MemorySummary({"use_summary": True, "max_prompt_length": 300, "max_summary_length": 64,
                            "keep_task": False}, chat_client=client, tokenizer=tokenizer, messages=messages)  # fmt: skip
    assert [m["role"] for m in memory.get_prompt_messages()] == ["summary"]
    assert client.requests[-1] == messages


def test_keep_task_protects_the_task_from_thinking_simplification_and_truncation(tokenizer):
    task = [{"role": "system", "content": "<think>Plan: be careful.</think>Be careful."},
            {"role": "user", "content": "<think>hint</think>What is 12 * 7?"}]  # fmt: skip
    messages = [*task, *_tool_turns(12)]
    memory = MemorySummary({"use_summary": True, "max_prompt_length": 200, "max_summary_length": 64,
                            "simplify_thinking": True}, chat_client=_FailingClient(), tokenizer=tokenizer,
                           messages=messages)  # fmt: skip
    out = memory.get_prompt_messages()
    assert out[:2] == task and memory.fallbacks == 1
    assert out[2]["role"] == "assistant" and memory.count_tokens(out) <= 200
    _assert_whole_turns(out)


@pytest.mark.parametrize("calls_per_turn", [1, 3])
def test_summaries_take_whole_turns_whatever_the_raw_bounds(tokenizer, calls_per_turn):
    messages = [*_task(), *_tool_turns(10, calls_per_turn)]
    for before, end in [(0, 0), (3, -1), (4, -2), (2, -3), (5, -4)]:  # bounds that cut into turns
        client = _RecordingClient()
        memory = MemorySummary({"use_summary": True, "max_prompt_length": 300, "max_summary_length": 64,
                                "before_raw_message": before, "end_raw_message": end},
                               chat_client=client, tokenizer=tokenizer, messages=messages)  # fmt: skip
        out = memory.get_prompt_messages()
        assert out[:2] == messages[:2] and memory.summaries == 1
        (summarized,) = client.requests
        assert summarized[0]["role"] == "assistant" and summarized[-1]["role"] == "tool"
        _assert_whole_turns(out)
        _assert_whole_turns(summarized)
        after = out.index({"role": "summary", "content": "summary 1: the calls so far returned 84."})
        assert after == len(out) - 1 or out[after + 1]["role"] == "assistant"
        assert out[-1] == (messages[-1] if end else out[after])


@pytest.mark.parametrize("calls_per_turn", [1, 2])
def test_truncation_drops_whole_turns_and_fits(tokenizer, calls_per_turn):
    messages = [*_task(), *_tool_turns(12, calls_per_turn)]
    for budget in range(150, 420, 23):
        memory = MemorySummary({"use_summary": True, "max_prompt_length": budget, "max_summary_length": 10,
                                "end_raw_message": -1}, chat_client=_FailingClient(), tokenizer=tokenizer,
                               messages=messages)  # fmt: skip
        out = memory.get_prompt_messages()
        assert out[:2] == messages[:2] and memory.fallbacks == 1
        assert out[2]["role"] == "assistant" and memory.count_tokens(out) <= budget
        assert out[2:] == messages[len(messages) - len(out) + 2 :]  # the newest turns, in order
        _assert_whole_turns(out)


def test_order_after_several_summaries(tokenizer):
    client = _RecordingClient()
    memory = MemorySummary({"use_summary": True, "max_prompt_length": 260, "max_summary_length": 32,
                            "end_raw_message": -2}, chat_client=client, tokenizer=tokenizer, messages=_task())  # fmt: skip
    for round_ in range(4):
        for m in _tool_turns(6, 2, start=6 * round_):
            memory.add_message(m)
        out = memory.get_prompt_messages()
        assert memory.summaries == round_ + 1
        assert [m["role"] for m in out] == ["system", "user", "summary", "assistant", "tool", "tool"]
        assert out[:2] == _task() and out[2]["content"].startswith(f"summary {round_ + 1}:")
        assert out[3]["content"].startswith(f"Turn {6 * round_ + 5}:")  # the newest turn, raw
        if round_:  # a later summary takes in the earlier one first, then the turns after it
            request = client.requests[-1]
            assert request[0]["content"].startswith(f"summary {round_}:") and request[1]["role"] == "assistant"
            _assert_whole_turns(request)


def test_lengths_are_measured_on_the_rendered_prompt_with_the_tool_schemas(qwen_tokenizer, qwen_renderer):
    messages = [*_task(), *_tool_turns(3)]
    memory = MemorySimple(tokenizer=qwen_tokenizer, messages=messages)
    without_tools = memory.count_tokens(messages)
    memory.render_with(qwen_renderer.prompt_ids, TOOLS)
    assert memory.count_tokens(messages) == _rendered(qwen_renderer, messages) > 1.5 * without_tools
    # a budget the tool-less measure says the history fits in: measured as rendered, it does not, so it is compressed
    budget = (without_tools + _rendered(qwen_renderer, messages)) // 2
    client = _RecordingClient()
    memory = MemorySummary({"use_summary": True, "max_prompt_length": budget, "max_summary_length": 32},
                           chat_client=client, tokenizer=qwen_tokenizer, messages=messages)  # fmt: skip
    memory.render_with(qwen_renderer.prompt_ids, TOOLS)
    out = memory.get_prompt_messages()
    assert memory.summaries == 1 and out[:2] == messages[:2]
    assert memory.count_tokens(out) == _rendered(qwen_renderer, out) <= budget
    text = qwen_renderer.decode(qwen_renderer.prompt_ids(to_template_messages(out), TOOLS))
    assert '"name": "search"' in text and messages[1]["content"] in text and messages[0]["content"] in text


def test_a_summary_request_fits_its_budget_and_cuts_a_huge_tool_result(tokenizer):
    from agentic_rl.chat import ChatRenderer
    from agentic_rl.memory import summary_request

    renderer = ChatRenderer(tokenizer)
    huge = "Row: 84 apples and 12 pears. " * 600
    messages = [*_task(), *_tool_turns(2), {"role": "assistant", "content": CALL}, {"role": "tool", "content": huge},
                *_tool_turns(2, start=3)]  # fmt: skip
    client = _RecordingClient()
    config = {"use_summary": True, "max_prompt_length": 400, "max_summary_length": 32, "end_raw_message": -2,
              "max_summary_request_length": 500}  # fmt: skip
    memory = MemorySummary(config, chat_client=client, tokenizer=tokenizer, messages=messages)
    memory.render_with(renderer.prompt_ids)
    out = memory.get_prompt_messages()
    assert memory.summaries == 1 and out[:2] == messages[:2] and out[-2:] == messages[-2:]
    (request,) = client.requests
    system_prompt = memory.config.summary_system_prompt.format(max_summary_length=32)
    assert 400 < len(renderer.prompt_ids(summary_request(request, system_prompt))) <= 500
    assert [m["role"] for m in request] == [m["role"] for m in messages[2:-2]]
    cut = request[5]["content"]
    assert cut.startswith(huge[:200]) and cut.endswith("characters cut]") and len(cut) < len(huge)
    assert request[:5] == messages[2:7] and request[6:] == messages[8:-2]  # only the huge result was cut


def test_the_summary_request_budget_is_the_engine_window_less_the_summary(tokenizer):
    from types import SimpleNamespace

    from agentic_rl.memory import ChatSummaryClient

    class _Chat:
        engine = SimpleNamespace(max_model_len=700)

        async def chat(self, messages, *, max_tokens):
            return "ok"

    config = {"use_summary": True, "max_prompt_length": 400, "max_summary_length": 64}
    assert MemorySummary(config, chat_client=_Chat(), tokenizer=tokenizer).summary_request_budget() == 636
    assert isinstance(MemorySummary(config, chat_client=_Chat()).chat_client, ChatSummaryClient)
    assert MemorySummary(config, chat_client=_RecordingClient()).summary_request_budget() is None  # unknown window
    assert MemorySummary({**config, "max_summary_request_length": 900}, chat_client=_Chat()).summary_request_budget() == 900


async def test_a_summarizing_harness_run_keeps_the_task_and_whole_turns_and_measures_as_rendered(
    qwen_tokenizer, qwen_renderer
):
    from support.engines import ScriptedEngine

    from agentic_rl.environments.tool_env import ToolEnvironment
    from agentic_rl.rollout.harness import HarnessConfig, run_trajectory
    from agentic_rl.rollout.spec import RolloutSpec
    from agentic_rl.tools.calculator import CalculatorTool

    budget, memories = 420, []
    environment = ToolEnvironment.for_renderer([CalculatorTool()], qwen_renderer)

    def memory_factory() -> MemorySummary:
        memories.append(MemorySummary({"use_summary": True, "max_prompt_length": budget, "max_summary_length": 32},
                                      chat_client=_RecordingClient(), tokenizer=qwen_tokenizer))  # fmt: skip
        return memories[-1]

    spec = RolloutSpec(engine=ScriptedEngine(qwen_tokenizer, lambda question, turn: CALL), environment=environment,
                       renderer=qwen_renderer, config=HarnessConfig(max_steps=10, max_prompt_length=2048,
                       max_response_length=2048), memory_factory=memory_factory)  # fmt: skip
    task = {"id": "t", "question": "What is 12 * 7? Keep checking it with the calculator.", "ground_truth": "84"}
    traj = await run_trajectory(task, 0, spec)
    assert not traj.failed, traj.error
    assert traj.metrics["steps"] == 10 and traj.metrics["summaries"] >= 2 and len(traj.runs) >= 3
    assert traj.metrics["alignment_mismatches"] == 0
    assert max(len(step.prompt_ids) for step in traj.steps) <= budget
    for run in traj.runs:  # every run's prompt states the tools and the task
        text = qwen_renderer.decode(run.prompt_ids)
        assert '"name": "calculator"' in text and task["question"] in text and environment.system_prompt in text
    (memory,) = memories
    messages = await memory.aget_prompt_messages()
    assert messages[:2] == traj.chat_completions[:2] and messages[2]["role"] == "summary"
    _assert_whole_turns(messages)
    assert memory.count_tokens(messages) == len(qwen_renderer.prompt_ids(to_template_messages(messages),
                                                                         environment.schemas))  # fmt: skip


async def test_blocking_prompt_messages_inside_an_event_loop_name_the_async_form(tokenizer):
    memory = MemorySummary({"use_summary": False}, tokenizer=tokenizer, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(RuntimeError, match="aget_prompt_messages"):
        memory.get_prompt_messages()
    assert await memory.aget_prompt_messages() == [{"role": "user", "content": "hi"}]
