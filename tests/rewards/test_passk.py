"""`agentic_rl.rewards.passk`: pass@k against the exact expectation over k-subsets, maj@K with ties, the bootstrap
interval against a direct resampling loop, and the answer a sample votes for."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentic_rl.rewards.passk import bootstrap_interval, majority_vote, pass_at_k, vote_answer


def _exact_pass_at_k(correct: list[bool], k: int) -> float:
    """The share of the k-subsets of the samples that hold at least one correct sample."""
    subsets = list(itertools.combinations(range(len(correct)), k))
    return sum(any(correct[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_equals_the_share_of_k_subsets_with_a_correct_sample(n):
    for c in range(n + 1):
        correct = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(_exact_pass_at_k(correct, k), abs=1e-12), (n, c, k)
            assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_pass_at_k_is_stable_for_large_n_and_rejects_bad_counts():
    assert pass_at_k(1000, 1, 1) == pytest.approx(0.001)
    assert pass_at_k(1000, 0, 500) == 0.0 and pass_at_k(1000, 600, 500) == 1.0
    assert pass_at_k(1000, 3, 10) == pytest.approx(1 - math.comb(997, 10) / math.comb(1000, 10), rel=1e-12)
    for n, c, k in [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


@given(st.integers(1, 60).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))))
def test_pass_at_k_is_c_over_n_at_1_and_grows_with_k(nc):
    n, c = nc
    assert pass_at_k(n, c, 1) == pytest.approx(c / n, abs=1e-12)
    values = [pass_at_k(n, c, k) for k in range(1, n + 1)]
    assert all(a <= b + 1e-12 for a, b in itertools.pairwise(values))
    assert values[-1] == (1.0 if c else 0.0)


def test_majority_vote_ties_go_to_the_answer_given_first_and_no_answer_does_not_vote():
    assert majority_vote(["3", "4", "4", "3", None], [True, False, False, True, False]) == ("3", True)
    assert majority_vote(["4", "3", "4", "3"], [False, True, False, True]) == ("4", False)
    assert majority_vote([None, None, "7", None], [False, False, True, False]) == ("7", True)
    assert majority_vote(["1", "2", "2"], [True, False, False]) == ("2", False)
    assert majority_vote([None, None], [True, False]) == (None, False)
    assert majority_vote([], []) == (None, False)


def test_bootstrap_interval_equals_a_direct_resampling_loop_with_the_same_seed():
    values = [0.5, -0.25, 0.0, 1.0, -1.0, 0.75, 0.25]
    rng = random.Random(11)
    means = []
    for _ in range(500):
        draw = [values[rng.randrange(len(values))] for _ in values]
        means.append(sum(draw) / len(draw))
    means.sort()
    assert bootstrap_interval(values, resamples=500, seed=11) == (means[12], means[487])
    assert bootstrap_interval([0.0, 0.0, 0.0], resamples=100, seed=3) == (0.0, 0.0)
    low, high = bootstrap_interval(values, resamples=500, seed=11, level=0.5)
    assert means[12] <= low <= high <= means[487]
    with pytest.raises(ValueError):
        bootstrap_interval([], resamples=10)


def _said(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": "q"}, {"role": "assistant", "content": text}]


def test_vote_answer_reads_the_answer_as_the_reward_does():
    assert vote_answer("gsm8k", _said("so 3 + 4 = 7. The answer is 12.0")) == "12"
    assert vote_answer("gsm8k", _said("\\boxed{1,200}")) == "1200"
    assert vote_answer("gsm8k", _said("no number here")) is None
    assert vote_answer("gsm8k", _said('<tool_call>{"name": "calculator"}</tool_call>')) is None  # a call is no answer
    assert vote_answer("math", _said("so \\boxed{\\frac{1}{2}}")) == "\\frac{1}{2}"
    assert vote_answer("hotpotqa_f1", _said("The answer is:  Paris  France")) == "paris france"
    assert vote_answer("gsm8k", [{"role": "user", "content": "q"}]) is None
