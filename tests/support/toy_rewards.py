"""Dense toy rewards for training smoke tests on a random-weight model (`support.toy_rewards:e_share`; `e_share_held`
stops a run at a known point)."""

import os
import threading
import time


def e_share(task, messages):
    """Share of the letter 'e' in the final answer: varies across random samples, so groups carry signal."""
    text = messages[-1]["content"] if messages else ""
    return text.count("e") / max(len(text), 1)


_HELD = {"calls": 0}
_HELD_LOCK = threading.Lock()


def e_share_held(task, messages):
    """`e_share`, except that with `TOY_REWARD_HOLD_AFTER=N` set, every call after the N-th of this process blocks
    (at most 300 s, then fails its trajectory): a rollout or training run then stops at a known point, where a test
    can kill it, instead of racing it."""
    limit = os.environ.get("TOY_REWARD_HOLD_AFTER")
    with _HELD_LOCK:
        _HELD["calls"] += 1
        held = limit is not None and _HELD["calls"] > int(limit)
    if held:
        time.sleep(300)
        raise TimeoutError("held reward was never released: the test should have killed this process")
    return e_share(task, messages)


def e_share_or_constant(task, messages):
    """0.5 for every answer to a question of even length (its groups are constant: GRPO advantage 0), else
    `e_share`: about half the tasks of a run give constant groups, for dynamic sampling."""
    return 0.5 if len(task.get("question", "")) % 2 == 0 else e_share(task, messages)


def e_share_logged(task, messages):
    """`e_share`, and one line `pid<TAB>RANK` appended per call to the file `TOY_REWARD_LOG` names: who scored what."""
    with open(os.environ["TOY_REWARD_LOG"], "a") as f:
        f.write(f"{os.getpid()}\t{os.environ.get('RANK', '0')}\n")
    return e_share(task, messages)


def e_count_odd(task, messages):
    """1.0 when the final answer holds an odd number of the letter 'e', else 0.0: a right-or-wrong reward that
    varies across random samples of the same task, for pass@k."""
    text = messages[-1]["content"] if messages else ""
    return float(text.count("e") % 2)
