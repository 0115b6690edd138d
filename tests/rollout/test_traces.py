"""Supervised traces replayed through the real turn loop: exact records, real tool results, dropped disagreements."""

from __future__ import annotations

import json

import anyio
import pytest

from agentic_rl.chat import ChatRenderer
from agentic_rl.environments.tool_env import DEFAULT_SYSTEM_PROMPT, ToolEnvironment
from agentic_rl.parser import ToolCall, parse_tool_calls
from agentic_rl.rewards import gsm8k_reward
from agentic_rl.rollout.harness import HarnessConfig
from agentic_rl.rollout.traces import Trace, gsm8k_trace, gsm8k_traces, replay_traces, tool_call_text
from agentic_rl.tools.calculator import CalculatorTool

ROW = {
    "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How "
    "many clips did Natalia sell altogether in April and May?",
    "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether "
    "in April and May.\n#### 72",
}


def test_gsm8k_trace_turns_each_annotation_into_a_calculator_call():
    trace = gsm8k_trace(ROW, 7)
    assert trace is not None and trace.task == {"id": 7, "question": ROW["question"], "ground_truth": "72"}
    assert trace.expected_observations == ("24", "72")
    calls = [parse_tool_calls(turn) for turn in trace.turns[:-1]]
    assert [[(c.name, c.arguments) for c in turn] for turn in calls] == [
        [("calculator", {"expression": "48/2"})], [("calculator", {"expression": "48+24"})],
    ]  # fmt: skip
    assert all(isinstance(c, ToolCall) for turn in calls for c in turn)
    final = trace.turns[-1]
    assert "<<" not in final and "####" not in final and final.splitlines()[-1] == "72"
    assert gsm8k_trace({"question": "q", "answer": "no annotation\n#### 3"}, 0) is None
    assert gsm8k_trace({"question": "q", "answer": "no marker <<1+1=2>>"}, 0) is None


def test_gsm8k_traces_balance_the_call_counts_and_are_seeded(gsm8k_rows):
    rows = gsm8k_rows * 4  # 256 rows; the test split has the same annotations as the train split
    traces = gsm8k_traces(rows, count=40, max_calls=4, seed=1)
    counts = [len(t.expected_observations) for t in traces]
    assert len(traces) == 40 and max(counts) <= 4
    assert all(counts.count(k) >= 5 for k in range(1, 5)), counts  # no call count dominates
    assert [t.task["id"] for t in gsm8k_traces(rows, count=40, max_calls=4, seed=1)] == [t.task["id"] for t in traces]
    with pytest.raises(ValueError):
        gsm8k_traces(rows, count=0)


def test_gsm8k_traces_take_each_call_count_in_its_share(gsm8k_rows):
    rows = gsm8k_rows * 4
    traces = gsm8k_traces(rows, count=14, max_calls=3, seed=2, call_weights=[4, 2, 1])
    counts = [len(t.expected_observations) for t in traces]
    assert (counts.count(1), counts.count(2), counts.count(3)) == (8, 4, 2)
    short = gsm8k_traces(rows, count=70, max_calls=3, seed=2, call_weights=[4, 2, 1])  # 12 one-call rows only
    counts = [len(t.expected_observations) for t in short]
    assert len(short) == 70 and counts.count(1) == 12  # the rest of its share went to the other counts
    only_one = gsm8k_traces(rows, count=12, max_calls=3, call_weights=[1, 0, 0])
    assert {len(t.expected_observations) for t in only_one} == {1}
    for bad in ([1, 1], [-1, 1, 1], [0, 0, 0]):
        with pytest.raises(ValueError, match="call_weights"):
            gsm8k_traces(rows, count=4, max_calls=3, call_weights=bad)


def _replay(tokenizer, traces):
    renderer = ChatRenderer(tokenizer)
    environment = ToolEnvironment([CalculatorTool()], system_prompt=DEFAULT_SYSTEM_PROMPT,
                                  tools_in_system_prompt=not renderer.supports_tools)  # fmt: skip
    config = HarnessConfig(max_steps=5, max_prompt_length=2048, max_response_length=2048, sampling={"max_tokens": 512})
    kept, stats = anyio.run(lambda: replay_traces(traces, renderer=renderer, environment=environment, config=config,
                                                  reward_fn=gsm8k_reward))  # fmt: skip
    return renderer, kept, stats


def test_replayed_traces_are_exact_records_with_real_tool_results(tokenizer, gsm8k_rows):
    traces = gsm8k_traces(gsm8k_rows, count=24, max_calls=4)
    renderer, kept, stats = _replay(tokenizer, traces)
    assert stats.kept == len(kept) > 0 and stats.dropped_failed == 0
    for trajectory, trace in zip(
        kept, [t for t in traces if t.task["id"] in {k.task["id"] for k in kept}], strict=True
    ):
        assert trajectory.task["id"] == trace.task["id"]
        assert trajectory.metrics["steps"] == len(trace.turns) and trajectory.termination_reason == "env_done"
        # the turn loop compared the record with a full template re-render (check_alignment), as in a rollout
        assert trajectory.metrics["alignment_mismatches"] == 0 and trajectory.metrics["retokenize_drift"] == 0
        sampled = [i for i, m in zip(trajectory.response_tokens.tolist(), trajectory.response_masks.tolist(),
                                     strict=True) if m]  # fmt: skip
        expected = [i for turn in trace.turns for i in [*renderer.encode(turn), renderer.end_of_turn_id]]
        assert sampled == expected  # exactly the scripted text is trained; observations and glue are masked
        tools = [m["content"] for m in trajectory.chat_completions if m["role"] == "tool"]
        assert len(tools) == len(trace.expected_observations)
        assert trajectory.metrics["res_reward"] == 1.0


def test_a_trace_whose_tool_result_disagrees_is_dropped_and_counted(tokenizer):
    good = Trace(
        {"id": 0, "question": "2+3?", "ground_truth": "5"},
        (tool_call_text("calculator", {"expression": "2+3"}), "5"),
        ("5",),
    )
    wrong = Trace(
        {"id": 1, "question": "2+3?", "ground_truth": "6"},
        (tool_call_text("calculator", {"expression": "2+3"}), "6"),
        ("6",),
    )
    short = Trace({"id": 2, "question": "q?", "ground_truth": "1"}, tuple(tool_call_text("calculator", {"expression": "1"}) for _ in range(6)) + ("1",), ("1",) * 6)  # fmt: skip
    _, kept, stats = _replay(tokenizer, [good, wrong, short])
    assert [t.task["id"] for t in kept] == [0]
    assert (stats.kept, stats.dropped_observation_mismatch, stats.dropped_incomplete) == (1, 1, 1)
    assert any("'5' != '6'" in reason for reason in stats.reasons), stats.reasons
    assert json.dumps(stats.reasons)  # plain strings, for the manifest


def _hotpotqa_rows():
    from agentic_rl.data import SHARED_DATA, iter_jsonl

    path = SHARED_DATA / "hotpotqa_dev_distractor_500.jsonl"
    if not path.is_file():
        pytest.skip(f"shared data not found at {path}")
    return [row for _, row in iter_jsonl(path)]


def test_hotpotqa_traces_search_then_visit_each_supporting_document_and_replay_exactly(tokenizer):
    from agentic_rl.rewards import hotpotqa_f1_reward
    from agentic_rl.rollout.traces import hotpotqa_traces
    from agentic_rl.tools.registry import build_tools

    rows = _hotpotqa_rows()[250:]
    search, visit = build_tools(["search", "visit"])
    traces = hotpotqa_traces(rows, count=12, seed=3, search=search, visit=visit)
    assert len(traces) == 12 and traces == hotpotqa_traces(rows, count=12, seed=3, search=search, visit=visit)
    by_id = {row["id"]: row for row in rows}
    for trace in traces:
        row = by_id[trace.task["id"]]
        calls = [parse_tool_calls(turn) for turn in trace.turns[:-1]]
        assert all(len(turn) == 1 for turn in calls)
        names = [turn[0].name for turn in calls]
        assert calls[0][0].arguments == {"query": row["question"], "top_k": 3}
        visited = [turn[0].arguments["id"] for turn in calls if turn[0].name == "visit"]
        assert sorted(visited) == sorted(row["supporting_doc_ids"]) and names.count("search") == len(names) - 2
        for j, turn in enumerate(calls):  # each visited id was listed by an earlier result
            if turn[0].name == "visit":
                assert any(f"[{turn[0].arguments['id']}]" in seen for seen in trace.expected_observations[:j])
        assert trace.turns[-1].endswith(f"<answer>{row['answer']}</answer>")
    renderer = ChatRenderer(tokenizer)
    environment = ToolEnvironment([search, visit], system_prompt="Research the question.",
                                  tools_in_system_prompt=not renderer.supports_tools)  # fmt: skip
    config = HarnessConfig(max_steps=8, max_prompt_length=4096, max_response_length=4096, sampling={"max_tokens": 512})
    kept, stats = anyio.run(lambda: replay_traces(traces, renderer=renderer, environment=environment, config=config,
                                                  reward_fn=hotpotqa_f1_reward))  # fmt: skip
    assert stats.kept == len(kept) == len(traces), stats.reasons
    for trajectory, trace in zip(kept, traces, strict=True):
        assert trajectory.metrics["alignment_mismatches"] == 0 and trajectory.metrics["res_reward"] == 1.0
        sampled = [i for i, m in zip(trajectory.response_tokens.tolist(), trajectory.response_masks.tolist(),
                                     strict=True) if m]  # fmt: skip
        assert sampled == [i for turn in trace.turns for i in [*renderer.encode(turn), renderer.end_of_turn_id]]
    from agentic_rl.rollout.summary import summarize

    summary = summarize(kept, 1.0)
    assert summary["tool_call_rates"] == {"search": 1.0, "visit": 1.0} and summary["mean_task_reward"] == 1.0
    assert summary["mean_turns"] == sum(len(t.turns) for t in traces) / len(traces)


def test_a_hotpotqa_row_without_a_findable_document_or_an_answer_gives_no_trace():
    from agentic_rl.rollout.traces import hotpotqa_trace
    from agentic_rl.tools.registry import build_tools

    search, visit = build_tools(["search", "visit"])
    row = dict(_hotpotqa_rows()[300])
    assert hotpotqa_trace(row, 0, search=search, visit=visit) is not None
    missing = {**row, "context_doc_ids": ["hp99999"] * len(row["context"])}  # no search ever lists it
    assert hotpotqa_trace(missing, 0, search=search, visit=visit) is None
    first_title = row["supporting_facts"][0][0]
    malformed = [
        {**row, "answer": " "}, {**row, "answer": None}, {**row, "answer": ["a", "b"]}, {**row, "question": None},
        {k: v for k, v in row.items() if k != "context"}, {**row, "context_doc_ids": row["context_doc_ids"][:-1]},
        {**row, "context": [[title, " ".join(lines)] for title, lines in row["context"]]},  # sentences as one string
        {**row, "supporting_facts": [["Not In Context", 0], *row["supporting_facts"]]},
        {**row, "supporting_facts": "x"}, {**row, "supporting_facts": []}, {**row, "supporting_facts": [[first_title, True]]},
        [row["question"], row["answer"]],
    ]  # fmt: skip
    for bad in malformed:
        assert hotpotqa_trace(bad, 0, search=search, visit=visit) is None, bad if isinstance(bad, list) else set(bad)
    from agentic_rl.rollout.traces import hotpotqa_traces

    assert [t.task["id"] for t in hotpotqa_traces([*malformed, row], count=3, search=search, visit=visit)] == [
        row["id"]
    ]
    quoted = hotpotqa_trace({**row, "supporting_facts": [*row["supporting_facts"], row["supporting_facts"][0]]}, 0,
                            search=search, visit=visit)  # fmt: skip
    assert quoted is not None and quoted.turns[-1] == hotpotqa_trace(row, 0, search=search, visit=visit).turns[-1]
