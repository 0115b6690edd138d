"""Seeded arithmetic word problems: a task family a small model can learn to solve with a calculator.

Numbers are large enough (3-4 digit sums, 2-3 digit products) that a 135M model cannot do the arithmetic in its
head, while one calculator call per step gets it right. A problem takes 1 or 2 steps. Splits are separated by seed
range, so held-out problems are the same family and difficulty as the training ones but never the same problem.

Tasks are `{"id", "question", "ground_truth", "steps", "milestones"}` rows with an integer answer; any reward that
reads the last number of the final answer (e.g. `gsm8k_reward`) scores them. `milestones` are the values a solution
computes on its way to the answer: the intermediate result of a two-step problem, none for a one-step problem
(`rollout.milestone_weight` turns them into a process reward). The answer is not one: a milestone for it would pay a
call that computes it as much as stating it, and a policy learns to keep calling instead of answering.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

__all__ = ["SPLIT_SEEDS", "arithmetic_problem", "arithmetic_tasks", "parse_arithmetic_spec"]

#: First seed of each split; problem i of a split uses seed `SPLIT_SEEDS[split] + i`.
SPLIT_SEEDS = {"train": 0, "heldout": 10_000_000}

_ITEMS = ("pencils", "apples", "marbles", "stickers", "books", "bottles", "coins", "cards", "shells", "bricks")
_PLACES = ("store", "farm", "school", "library", "warehouse", "shop", "museum", "bakery")


def _one_step(rng: random.Random) -> tuple[str, int, list[int]]:
    item, place = rng.choice(_ITEMS), rng.choice(_PLACES)
    kind = rng.randrange(4)
    if kind == 0:
        a, b = rng.randint(1000, 9999), rng.randint(100, 999)
        return f"A {place} has {a} {item}. It gets {b} more. How many {item} does it have now?", a + b, []
    if kind == 1:
        a, b = rng.randint(1000, 9999), rng.randint(100, 999)
        return f"A {place} has {a} {item}. It gives away {b} of them. How many {item} are left?", a - b, []
    if kind == 2:
        a, b = rng.randint(12, 99), rng.randint(13, 99)
        return f"Each box at the {place} holds {a} {item}. How many {item} are in {b} boxes?", a * b, []
    q, b = rng.randint(12, 99), rng.randint(13, 49)
    return f"A {place} shares {q * b} {item} equally among {b} classes. How many {item} does each class get?", q, []


def _two_step(rng: random.Random) -> tuple[str, int, list[int]]:
    item, place = rng.choice(_ITEMS), rng.choice(_PLACES)
    kind = rng.randrange(3)
    if kind == 0:
        a, b, c = rng.randint(1000, 9999), rng.randint(12, 60), rng.randint(12, 60)
        text = f"A {place} has {a} {item}. It gets {b} boxes with {c} {item} in each. How many {item} does it have now?"
        return text, a + b * c, [b * c]
    if kind == 1:
        a, b, c = rng.randint(3000, 9999), rng.randint(100, 999), rng.randint(100, 999)
        text = f"A {place} has {a} {item}. It gives away {b} and then gets {c} more. How many {item} does it have now?"
        return text, a - b + c, [a - b]
    a, b, c = rng.randint(12, 60), rng.randint(12, 60), rng.randint(10, 99)
    text = f"A {place} has {a} crates with {b} {item} in each. It loses {c} {item}. How many {item} are left?"
    return text, a * b - c, [a * b]


_BUILDERS: dict[int, Callable[[random.Random], tuple[str, int, list[int]]]] = {1: _one_step, 2: _two_step}


def arithmetic_problem(seed: int, steps: int) -> dict[str, Any]:
    """Problem `seed` with `steps` (1 or 2) calculator steps.

    Raises:
        ValueError: for another number of steps.
    """
    if steps not in _BUILDERS:
        raise ValueError(f"steps must be 1 or 2, got {steps!r}")
    question, answer, intermediates = _BUILDERS[steps](random.Random(seed * 7 + steps))
    milestones = [str(v) for v in intermediates]
    return {
        "id": f"arith-{seed}-{steps}",
        "question": question,
        "ground_truth": str(answer),
        "steps": steps,
        "milestones": milestones,
    }


def arithmetic_tasks(split: str, count: int, *, steps: tuple[int, ...] = (1, 2)) -> list[dict[str, Any]]:
    """`count` problems of `split` (`train` or `heldout`), cycling through `steps`.

    Raises:
        ValueError: for an unknown split, a count < 1 or an unknown step count.
    """
    if split not in SPLIT_SEEDS:
        raise ValueError(f"split must be one of {sorted(SPLIT_SEEDS)}, got {split!r}")
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    base = SPLIT_SEEDS[split]
    return [arithmetic_problem(base + i, steps[i % len(steps)]) for i in range(count)]


def parse_arithmetic_spec(spec: str) -> list[dict[str, Any]] | None:
    """Tasks for a data spec `arithmetic:SPLIT:COUNT[:STEPS]` (e.g. `arithmetic:heldout:64:1`), else None.

    `STEPS` is `1`, `2` or `12` (both, alternating; the default).

    Raises:
        ValueError: for a malformed `arithmetic:` spec.
    """
    if not spec.startswith("arithmetic:"):
        return None
    parts = spec.split(":")
    if len(parts) not in (3, 4) or not parts[2].isdigit() or (len(parts) == 4 and parts[3] not in ("1", "2", "12")):
        raise ValueError(f"expected arithmetic:SPLIT:COUNT[:STEPS] with STEPS 1, 2 or 12, got {spec!r}")
    steps = tuple(int(c) for c in parts[3]) if len(parts) == 4 else (1, 2)
    return arithmetic_tasks(parts[1], int(parts[2]), steps=steps)
