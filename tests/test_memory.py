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
