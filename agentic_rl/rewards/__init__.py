"""Rewards: how good a finished trajectory was.

The reward type (`base`: `RewardCallable`, sync or async, `RewardWithMetrics`, `call_reward`), the answer readers
(`answers`), the math (`math`), QA (`qa`) and LLM-judge (`judge`) rewards and their registry (`registry`: `REWARDS`,
`resolve_reward`, `MetricsReward`), the worker-process pool that bounds runaway scorers (`pool`, `ProcessReward`),
per-turn credit (`turns`: milestones, the environment's own turn reward) and the shaping that weighs it all into a
trajectory's and its turns' rewards (`shaping`).
"""

from agentic_rl.rewards.answers import (
    extract_gsm8k_answer,
    extract_number_answer,
    extract_short_answer,
    final_answer_text,
    marked_answer,
)
from agentic_rl.rewards.base import RewardCallable, RewardWithMetrics, call_reward, is_async_reward
from agentic_rl.rewards.judge import LLMJudgeReward, build_judge, judge_verdict
from agentic_rl.rewards.math import gsm8k_reward, has_number_reward, math_reward, math_verify_reward
from agentic_rl.rewards.pool import ProcessReward
from agentic_rl.rewards.qa import answer_f1, hotpotqa_em_reward, hotpotqa_f1_reward, normalize_answer
from agentic_rl.rewards.registry import REWARDS, MetricsReward, resolve_reward
from agentic_rl.rewards.shaping import Shaping

__all__ = [
    "REWARDS",
    "LLMJudgeReward",
    "MetricsReward",
    "ProcessReward",
    "RewardCallable",
    "RewardWithMetrics",
    "Shaping",
    "answer_f1",
    "build_judge",
    "call_reward",
    "extract_gsm8k_answer",
    "extract_number_answer",
    "extract_short_answer",
    "final_answer_text",
    "gsm8k_reward",
    "has_number_reward",
    "hotpotqa_em_reward",
    "hotpotqa_f1_reward",
    "is_async_reward",
    "judge_verdict",
    "marked_answer",
    "math_reward",
    "math_verify_reward",
    "normalize_answer",
    "resolve_reward",
]
