"""Reward functions: GSM8K and MATH with math-verify, HotpotQA EM/F1, resolution by name or import path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentic_rl.errors import ConfigError, RewardError
from agentic_rl.rewards import (
    answer_f1,
    extract_gsm8k_answer,
    extract_number_answer,
    extract_short_answer,
    final_answer_text,
    gsm8k_reward,
    hotpotqa_em_reward,
    hotpotqa_f1_reward,
    marked_answer,
    math_reward,
    normalize_answer,
    resolve_reward,
)


def _chat(answer: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": "q"}, {"role": "assistant", "content": answer}]


def test_gsm8k_reward_reads_the_number_after_the_marker_and_strips_commas():
    task = {"ground_truth": "She sells 9 * 2 = 18\n#### 1,600"}
    assert extract_gsm8k_answer(task["ground_truth"]) == "1600"
    assert gsm8k_reward(task, _chat("So the total is 1,600 dollars.")) == 1.0
    assert gsm8k_reward(task, _chat("<think>maybe 1600</think>The answer is 1500.")) == 0.0
    assert gsm8k_reward({"ground_truth": "18"}, _chat("\\boxed{18}")) == 1.0
    with pytest.raises(RewardError, match="ground_truth"):
        gsm8k_reward({}, _chat("1"))
    for answer in ("It is 300.", "I do not know."):  # with or without a number: every sample of the task fails alike
        with pytest.raises(RewardError, match="cannot parse the ground truth 'three hundred'"):
            gsm8k_reward({"ground_truth": "three hundred"}, _chat(answer))
    for gold in (".5", "#### $.50"):  # math-verify reads what the number reader does not
        assert gsm8k_reward({"ground_truth": gold}, _chat("It is 0.5")) == 1.0
        assert gsm8k_reward({"ground_truth": gold}, _chat("I do not know.")) == 0.0


def test_hotpotqa_normalization_and_f1_follow_the_official_rules():
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert answer_f1("the Eiffel tower", "Eiffel Tower") == (1.0, 1.0)
    em, f1 = answer_f1("Eiffel Tower in Paris", "Eiffel Tower")
    assert em == 0.0 and f1 == pytest.approx(2 * (2 / 4) * 1.0 / (2 / 4 + 1.0))
    assert answer_f1("yes", "no") == (0.0, 0.0)
    assert answer_f1("no", "no") == (1.0, 1.0)


def test_short_answer_extraction_prefers_tags_then_answer_is_then_last_line():
    assert extract_short_answer("blah <answer>Paris</answer> more") == "Paris"
    assert extract_short_answer("I searched.\nThe answer is Arthur's Magazine.\nDone") == "Arthur's Magazine."
    assert extract_short_answer("first\nlast line") == "last line"
    task = {"ground_truth": "Arthur's Magazine"}
    assert hotpotqa_em_reward(task, _chat("<answer>Arthur's Magazine</answer>")) == 1.0
    assert hotpotqa_f1_reward(task, _chat("Answer: the magazine")) == pytest.approx(2 / 3)  # P=1, R=1/2


def test_rewards_resolve_by_name_or_import_path():
    assert resolve_reward("gsm8k") is gsm8k_reward
    assert resolve_reward("agentic_rl.rewards.qa:hotpotqa_f1_reward") is hotpotqa_f1_reward
    with pytest.raises(ConfigError, match="unknown reward"):
        resolve_reward("nope")
    with pytest.raises(ConfigError, match="cannot import"):
        resolve_reward("no_such_module:fn")


def test_math_reward_reads_every_math500_answer_and_compares_symbolically():
    rows = [json.loads(line) for line in (Path(__file__).resolve().parents[2].parent / "shared" / "data" /
                                          "math500.jsonl").read_text().splitlines()]  # fmt: skip
    assert len(rows) == 500
    for row in rows:  # each LaTeX answer (fractions, intervals, `p - q`, `\\$32,\\!348`) matches itself, boxed
        assert math_reward({"ground_truth": row["answer"]}, _chat(f"So $\\boxed{{{row['answer']}}}$.")) == 1.0, row
    assert math_reward({"ground_truth": "\\frac{14}{3}"}, _chat("It is $\\frac{28}{6}$, or 14/3")) == 1.0
    assert math_reward({"ground_truth": "p - q"}, _chat("The answer is $-q + p$.")) == 1.0
    assert math_reward({"ground_truth": "p - q"}, _chat("The answer is $p + q$.")) == 0.0
    assert math_reward({"ground_truth": "p - q"}, _chat("I do not know.")) == 0.0
    with pytest.raises(RewardError, match="ground_truth"):
        math_reward({}, _chat("1"))
    assert resolve_reward("math") is math_reward
    with pytest.raises(ConfigError, match="'llm_judge'"):
        resolve_reward("nope", also=["llm_judge"])


EXPLANATION = " Check: 3 * 4 = 12 and 20 - 8 = 12, so 99 apples would be wrong." * 40  # ~2,600 more characters

GSM8K_ANSWERS = [  # (final message, ground truth, reward)
    ("+12", "12", 1.0),
    ("The answer is +12.", "12", 1.0),
    ("The answer is 12." + EXPLANATION, "12", 1.0),  # the marked answer, not the explanation's last number (99)
    ("\\boxed{12}" + EXPLANATION, "12", 1.0),
    ("#### 12" + EXPLANATION, "12", 1.0),
    ("<answer>12</answer>" + EXPLANATION, "12", 1.0),
    ("**Final answer:** 12" + EXPLANATION, "12", 1.0),
    ("The answer is:\n12\n" + EXPLANATION, "12", 1.0),
    ("The answer is 13." + EXPLANATION, "12", 0.0),
    ("12.", "12", 1.0),
    ("12.0", "12", 1.0),
    ("12.00", "12", 1.0),
    ("11.99", "12", 0.0),
    ("-12", "-12", 1.0),
    ("\u221212", "-12", 1.0),  # a Unicode minus
    ("12", "-12", 0.0),
    ("-12", "12", 0.0),
    ("The answer is -$5.", "-5", 1.0),
    ("$12", "12", 1.0),
    ("It costs \\$1,600 in all.", "#### 1,600", 1.0),
    ("So the total is 1,600 dollars.", "She sells 9 * 2 = 18\n#### 1,600", 1.0),
    ("The total is 1,600, not 1,500.", "1600", 0.0),  # no marker: the last number
    ("12%", "12", 1.0),
    ("12 apples", "12", 1.0),
    ("20 - 8", "12", 0.0),  # a minus between terms is no sign: the last number is 8
    ("20-8 = 12", "12", 1.0),
    ("\\boxed{+12}", "12", 1.0),
    ("\\boxed{\\frac{24}{2}}", "12", 1.0),  # a boxed answer is read by math-verify
    ("\\boxed{\\$1,600}", "1600", 1.0),
    ("\\boxed{12 \\text{ apples}}" + EXPLANATION, "12", 1.0),
    ("I do not know.", "12", 0.0),
    ("<think>It is 12.</think>I give up.", "12", 0.0),  # the thought is not the answer
]


@pytest.mark.parametrize(("text", "gold", "expected"), GSM8K_ANSWERS)
def test_gsm8k_reward_finds_the_final_answer_however_signed_and_wherever_it_stands(text, gold, expected):
    assert gsm8k_reward({"ground_truth": gold}, _chat(text)) == expected


def test_number_extraction_prefers_a_marked_answer_then_the_last_number():
    assert extract_number_answer("The answer is 12." + EXPLANATION) == "12"
    assert extract_number_answer("no marker, 3 then 4") == "4"
    assert extract_number_answer("The answer is below.\nIt is 7.") == "7"  # a marker without a number
    assert extract_number_answer("-$1,600.50") == "-1600.50"
    assert extract_number_answer("nothing") is None
    assert marked_answer("\\boxed{\\frac{1}{2}} then \\boxed{x^{2}}") == "x^{2}"
    assert marked_answer("no marker") is None
    assert len(final_answer_text(_chat("The answer is 12." + EXPLANATION))) > 2000  # the whole final message


MATH_ANSWERS = [  # (final message, ground truth, reward)
    ("The answer is +12.", "12", 1.0),
    ("So $\\boxed{\\frac{28}{6}}$." + EXPLANATION, "\\frac{14}{3}", 1.0),
    ("The answer is $-q + p$." + EXPLANATION, "p - q", 1.0),
    ("$\\boxed{\u22123}$", "-3", 1.0),
    ("\\boxed{3} or rather \\boxed{4}", "4", 1.0),  # the last boxed answer
    ("The answer is $p + q$.", "p - q", 0.0),
]


@pytest.mark.parametrize(("text", "gold", "expected"), MATH_ANSWERS)
def test_math_reward_finds_the_marked_answer_wherever_it_stands(text, gold, expected):
    assert math_reward({"ground_truth": gold}, _chat(text)) == expected


def test_short_answers_are_found_before_a_long_explanation():
    task = {"ground_truth": "Arthur's Magazine"}
    assert hotpotqa_em_reward(task, _chat("<answer>Arthur's Magazine</answer>" + EXPLANATION)) == 1.0


_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2304-2288"}}\n</tool_call>'
_SEARCH = '<tool_call>\n{"name": "search", "arguments": {"query": "Arthur\'s Magazine"}}\n</tool_call>'


@pytest.mark.parametrize(
    ("reward", "truth", "last_turn", "answer"),
    [
        (gsm8k_reward, "2288", _CALL, "The answer is 2288."),
        (math_reward, "2288", _CALL, "\\boxed{2288}"),
        (resolve_reward("has_number"), "2288", _CALL, "2288"),
        (hotpotqa_f1_reward, "Arthur's Magazine", _SEARCH, "Arthur's Magazine"),
        (hotpotqa_em_reward, "Arthur's Magazine", _SEARCH, "Arthur's Magazine"),
        (hotpotqa_f1_reward, "Arthur's Magazine", "Arthur's Magazine " + _SEARCH, "Arthur's Magazine"),
        (gsm8k_reward, "2288", "<tool_call>{broken 2288</tool_call>", "2288"),
        (gsm8k_reward, "2288", '{"name": "calculator", "parameters": {"expression": "2304-2288"}}', "2288"),  # Llama 3
        (gsm8k_reward, "2288", '<|python_tag|>{"name": "calculator", "parameters": {"expression": "2288"}}', "2288"),
        (gsm8k_reward, "2288", '[TOOL_CALLS][{"name": "calculator", "arguments": {"expression": "2288"}, '
                               '"id": "a1b2c3d4e"}]', "2288"),  # Mistral
    ],
)
def test_a_trajectory_cut_while_calling_a_tool_has_no_answer_to_grade(reward, truth, last_turn, answer):
    """A call's arguments are never graded as the answer: the same text earns the reward only as a final answer."""
    task = {"ground_truth": truth}
    cut = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _CALL},
           {"role": "tool", "content": "16"}, {"role": "assistant", "content": last_turn}]  # fmt: skip
    assert final_answer_text(cut) == ""
    assert reward(task, cut) == 0.0
    answered = [*cut, {"role": "tool", "content": "2288"}, {"role": "assistant", "content": answer}]
    assert final_answer_text(answered) == answer
    assert reward(task, answered) == 1.0


def test_an_openai_tool_call_message_is_not_an_answer():
    calls = [{"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "7"}'}}]
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "7", "tool_calls": calls}]
    assert final_answer_text(messages) == ""
    assert gsm8k_reward({"ground_truth": "7"}, messages) == 0.0
    assert final_answer_text([{"role": "user", "content": "q"}, {"role": "assistant", "content": None}]) == ""


def test_no_reasoning_block_is_graded_and_content_parts_are_joined():
    chat = _chat("<think>plan</think>I am not sure. <think>maybe 2288</think>")
    assert final_answer_text(chat) == "I am not sure." and gsm8k_reward({"ground_truth": "2288"}, chat) == 0.0
    assert final_answer_text(_chat("maybe 2288</think>So 12. <think>or 2288")) == "So 12."  # opened by the prompt
    assert final_answer_text(_chat("Total 12<think>x</think>34")) == "Total 12 34"  # no number fused across a block
    parts = [
        {
            "role": "assistant",
            "content": [
                {"type": "reasoning", "text": "maybe 7"},
                {"type": "text", "text": "Total:"},
                {"type": "text", "text": "12"},
                "3 apples",
                {"type": "text", "text": None},
            ],
        }
    ]
    assert final_answer_text(parts) == "Total:\n12\n3 apples" and gsm8k_reward({"ground_truth": "3"}, parts) == 1.0
    for content in ({"text": "42"}, 42):
        assert final_answer_text([{"role": "assistant", "content": content}]) == ""
    legacy = {
        "role": "assistant",
        "content": "I'll compute 42",
        "function_call": {"name": "calculator", "arguments": "{}"},
    }
    assert final_answer_text([legacy]) == ""


@pytest.mark.parametrize(
    ("reward", "text", "gold"),
    [
        (gsm8k_reward, "#### Step 1: add\n5 + 7 = 12\n#### Step 2: double\n12 * 2 = 24\n\nThe answer is 24.", "24"),
        (math_reward, "#### Final Answer\n$\\frac{14}{3}$", "\\frac{14}{3}"),
        (
            math_reward,
            "#### Step 2: simplify\n$\\frac{28}{6} = \\frac{14}{3}$\nThe answer is $\\frac{14}{3}$",
            "\\frac{14}{3}",
        ),
        (math_reward, "**Final Answer:**\n\n$$\n\\frac{14}{3}\n$$", "\\frac{14}{3}"),
        (math_reward, "The final answer is:\n\\[\n\\frac{14}{3}\n\\]", "\\frac{14}{3}"),
        (hotpotqa_em_reward, "The answer is:\nParis", "Paris"),
        (hotpotqa_em_reward, "The final answer is:\n\n**Paris**", "Paris"),
        (hotpotqa_em_reward, "Final answer: \\boxed{Paris}", "Paris"),
        (gsm8k_reward, "#### 2. Double it\n12 * 2 = 24\n\nThe answer is 24.", "24"),
        (gsm8k_reward, "####\n24\nCheck: 6 * 4", "24"),
        (gsm8k_reward, "#### **24**\nChecked with 3 cases.", "24"),
        (gsm8k_reward, "**Final Answer:**\n$$\n48 \\times 48 - 16 = 2288\n$$", "2288"),
        (gsm8k_reward, "The answer is 48/2 = 24.", "24"),
    ],
)
def test_markdown_headings_and_display_math_do_not_hide_the_answer(reward, text, gold):
    """A `####` heading is not GSM8K's answer marker; an answer marker may end its line before display math."""
    assert reward({"ground_truth": gold}, _chat(text)) == 1.0
