"""Rewards: how good a finished trajectory was.

The reward type (`RewardCallable`, `RewardWithMetrics`), the answer readers, the math, QA and LLM-judge rewards and
their registry (`REWARDS`, `resolve_reward`), the worker-process pool that bounds runaway scorers, and per-turn
credit (tool-call share, milestones, the unfinished penalty).
"""

from agentic_rl.rewards.base import RewardCallable, RewardWithMetrics
from agentic_rl.rewards.functions import (
    REWARDS,
    LLMJudgeReward,
    MetricsReward,
    ProcessReward,
    answer_f1,
    extract_gsm8k_answer,
    extract_number_answer,
    extract_short_answer,
    final_answer_text,
    gsm8k_reward,
    has_number_reward,
    hotpotqa_em_reward,
    hotpotqa_f1_reward,
    judge_verdict,
    marked_answer,
    math_reward,
    math_verify_reward,
    normalize_answer,
    resolve_reward,
)

__all__ = [
    "REWARDS",
    "LLMJudgeReward",
    "MetricsReward",
    "ProcessReward",
    "RewardCallable",
    "RewardWithMetrics",
    "answer_f1",
    "extract_gsm8k_answer",
    "extract_number_answer",
    "extract_short_answer",
    "final_answer_text",
    "gsm8k_reward",
    "has_number_reward",
    "hotpotqa_em_reward",
    "hotpotqa_f1_reward",
    "judge_verdict",
    "marked_answer",
    "math_reward",
    "math_verify_reward",
    "normalize_answer",
    "resolve_reward",
]
