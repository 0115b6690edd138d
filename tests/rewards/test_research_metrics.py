"""The research diagnostics reported beside a deep-research reward (`rewards.research`), their names in
`reward_metrics`, and the sampled-token figures of a metrics row (`loop.metrics.sampled_figures`)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from agentic_rl.errors import ConfigError, RewardError
from agentic_rl.loop.metrics import sampled_figures
from agentic_rl.rewards import hotpotqa_f1_reward
from agentic_rl.rewards.registry import METRICS, REWARDS, resolve_metric
from agentic_rl.rewards.research import (
    QUOTE_WORDS,
    answer_words,
    found_support,
    quotes_passage,
    searches,
    visits,
)
from agentic_rl.types import Trajectory

TASK = {"question": "Who directed Ed Wood?", "ground_truth": "Tim Burton", "supporting_doc_ids": ["hp00000", "hp00004"]}
HIT = "1. [hp00000] Ed Wood (film)\n   Ed Wood is a 1994 American biographical period comedy-drama film directed by Tim Burton."


def _call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def _conversation(answer: str, *, tool_text: str = HIT, calls: tuple[str, ...] = ("search",)) -> list[dict]:
    messages = [{"role": "user", "content": TASK["question"]}]
    for name in calls:
        messages += [{"role": "assistant", "content": _call(name, query="Ed Wood director")},
                     {"role": "tool", "content": tool_text}]  # fmt: skip
    return [*messages, {"role": "assistant", "content": answer}]


def test_a_short_answer_is_counted_in_words_and_does_not_quote():
    messages = _conversation("The film says so. <answer>Tim Burton</answer>")
    assert answer_words(TASK, messages) == 2.0
    assert quotes_passage(TASK, messages) == 0.0
    assert hotpotqa_f1_reward(TASK, messages) == 1.0


def test_an_answer_copying_a_passage_quotes_it_and_scores_a_low_f1():
    copied = "Ed Wood is a 1994 American biographical period comedy-drama film directed by Tim Burton"
    messages = _conversation(f"<answer>{copied}.</answer>")
    assert answer_words(TASK, messages) == len(copied.split())
    assert quotes_passage(TASK, messages) == 1.0
    assert 0.0 < hotpotqa_f1_reward(TASK, messages) < 0.3  # the reference is in it: recall 1, precision low


def test_quoting_needs_that_many_consecutive_words_of_one_tool_result():
    # Every word of the answer is in the tool result, but never QUOTE_WORDS of them in a row.
    scattered = "film 1994 Wood directed American Burton comedy-drama"
    assert quotes_passage(TASK, _conversation(f"<answer>{scattered}</answer>")) == 0.0
    words = "1994 American biographical period comedy-drama".split()[:QUOTE_WORDS]  # normalized alike
    assert quotes_passage(TASK, _conversation(f"<answer>It {' '.join(words)} yes</answer>")) == 1.0
    # The same words in the assistant's own earlier text are not a tool result.
    own = [{"role": "assistant", "content": HIT}, {"role": "assistant", "content": "<answer>" + HIT + "</answer>"}]
    assert quotes_passage(TASK, own) == 0.0


def test_without_a_final_answer_the_answer_has_no_words():
    cut = _conversation(_call("visit", doc_id="hp00000"))  # the trajectory ended on a call
    assert answer_words(TASK, cut) == 0.0 and quotes_passage(TASK, cut) == 0.0


def test_searches_and_visits_count_the_calls_by_name():
    messages = _conversation("<answer>Tim Burton</answer>", calls=("search", "visit", "search", "visit", "visit"))
    assert searches(TASK, messages) == 2.0 and visits(TASK, messages) == 3.0
    several = [{"role": "assistant", "content": _call("search", query="a") + _call("search", query="b")}]
    assert searches(TASK, several) == 2.0 and visits(TASK, several) == 0.0
    broken = [{"role": "assistant", "content": "<tool_call>{not json</tool_call>"}]
    assert searches(TASK, broken) == 0.0


def test_support_is_found_when_a_tool_result_shows_a_supporting_document_as_a_whole_word():
    assert found_support(TASK, _conversation("<answer>x</answer>")) == 1.0
    other = "1. [hp00001] Scott Derrickson\n   An American director."
    assert found_support(TASK, _conversation("<answer>x</answer>", tool_text=other)) == 0.0
    longer = "1. [hp000001] Not it"  # hp00000 inside a longer id
    assert found_support(TASK, _conversation("<answer>x</answer>", tool_text=longer)) == 0.0
    asked = [{"role": "assistant", "content": _call("visit", doc_id="hp00004")}]  # named in a call, never shown
    assert found_support(TASK, asked) == 0.0
    with pytest.raises(RewardError, match="supporting_doc_ids"):
        found_support({"question": "q", "ground_truth": "a"}, asked)


def test_reward_metrics_name_every_reward_and_the_diagnostics_but_only_rewards_reward():
    assert set(METRICS) == set(REWARDS) | {"answer_words", "quotes_passage", "searches", "visits", "found_support"}
    assert resolve_metric("quotes_passage") is quotes_passage and resolve_metric("hotpotqa_f1") is hotpotqa_f1_reward
    with pytest.raises(ConfigError, match="found_support"):  # the unknown name's error lists the diagnostics
        resolve_metric("found_supports")


def _trajectory(mask, logprobs, chat, *, failed=False) -> Trajectory:
    n = len(mask)
    return Trajectory(prompt_tokens=torch.tensor([1, 2]), response_tokens=torch.arange(3, 3 + n),
                      response_masks=torch.tensor(mask), response_logprobs=torch.tensor(logprobs),
                      chat_completions=chat, failed=failed)  # fmt: skip


def test_sampled_figures_estimate_the_entropy_and_measure_the_final_answer():
    answered = _conversation("<answer>Tim Burton</answer>")
    cut = _conversation(_call("search", query="again"))
    trajectories = [
        # a call (2 tokens), an observation (2), the answer (3): the answer's turn is the trailing run
        _trajectory([1, 1, 0, 0, 1, 1, 1], [-0.5, -1.5, 0.0, 0.0, -1.0, -2.0, -3.0], answered),
        _trajectory([1, 1, 1, 1], [-1.0, -1.0, -1.0, -1.0], cut),  # cut on a call: no answer
        _trajectory([1, 1], [-50.0, -50.0], answered, failed=True),  # failed: left out of both
    ]
    figures = sampled_figures(trajectories)
    assert figures["entropy"] == pytest.approx((0.5 + 1.5 + 1.0 + 2.0 + 3.0 + 4 * 1.0) / 9)
    assert figures["answer_tokens"] == 3.0
    assert all(math.isnan(v) for v in sampled_figures(trajectories[2:]).values())


def test_short_f1_pays_only_a_tagged_answer_in_the_form_the_prompt_asks_for():
    from agentic_rl.rewards.qa import SHORT_ANSWER_WORDS, hotpotqa_short_f1_reward

    def said(text):
        return _conversation(text)

    assert hotpotqa_short_f1_reward(TASK, said("Found it. <answer>Tim Burton</answer>")) == 1.0
    assert hotpotqa_short_f1_reward(TASK, said("<answer>director Tim Burton</answer>")) == pytest.approx(0.8)
    assert hotpotqa_short_f1_reward(TASK, said("The answer is Tim Burton")) == 0.0  # untagged: plain F1 pays it
    assert hotpotqa_f1_reward(TASK, said("The answer is Tim Burton")) == 1.0
    long = " ".join(["Tim", "Burton"] + ["word"] * (SHORT_ANSWER_WORDS - 1))
    assert hotpotqa_short_f1_reward(TASK, said(f"<answer>{long}</answer>")) == 0.0  # a passage, not a name
    assert hotpotqa_f1_reward(TASK, said(f"<answer>{long}</answer>")) > 0.0
    wordy = {**TASK, "ground_truth": " ".join(["w"] * (SHORT_ANSWER_WORDS + 2))}  # a reference longer than the rule
    assert hotpotqa_short_f1_reward(wordy, said(f"<answer>{wordy['ground_truth']}</answer>")) == 1.0
    assert hotpotqa_short_f1_reward(TASK, _conversation(_call("search", query="Tim Burton"))) == 0.0  # no answer
    with pytest.raises(RewardError, match="ground_truth"):
        hotpotqa_short_f1_reward({"question": "q"}, said("<answer>x</answer>"))
    assert REWARDS["hotpotqa_short_f1"] is hotpotqa_short_f1_reward
