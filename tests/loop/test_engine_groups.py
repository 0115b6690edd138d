"""The parts of tensor-parallel training that need no engine: who is in which group, what a T that cannot be is
told, how a leader's step is cut into shares."""

import re

import pytest

from agentic_rl.engine.tensor_parallel import EngineGroup
from agentic_rl.errors import ConfigError
from agentic_rl.loop import TrainConfig
from agentic_rl.loop.engine_groups import engine_group, rollout_context, split_shares
from agentic_rl.train.distributed import DistContext


def test_groups_are_consecutive_ranks_led_by_the_first(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    groups = [EngineGroup.of(2, rank=r, world_size=4, store=None) for r in range(4)]
    assert [(g.index, g.rank, g.leader, g.is_leader) for g in groups] == [
        (0, 0, 0, True), (0, 1, 0, False), (1, 0, 2, True), (1, 1, 2, False)]  # fmt: skip
    assert [g.global_rank(g.rank) for g in groups] == [0, 1, 2, 3]
    contexts = [rollout_context(DistContext(rank=r, world_size=4), g) for r, g in enumerate(groups)]
    assert [(c.rank, c.world_size) for c in contexts] == [(0, 2), (0, 2), (1, 2), (1, 2)]


@pytest.mark.parametrize(("size", "world", "per_node", "named"), [(3, 4, 4, "ranks (4)"), (4, 8, 2, "node (2)")])
def test_a_t_that_does_not_divide_the_ranks_or_a_node_is_refused(monkeypatch, size, world, per_node, named):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(per_node))
    with pytest.raises(ConfigError, match=rf"tensor_parallel_size={size} must divide the .*{re.escape(named)}"):
        EngineGroup.of(size, rank=0, world_size=world, store=None)


def test_t_above_one_on_one_process_asks_for_torchrun():
    config = TrainConfig.model_validate({"engine": {"tensor_parallel_size": 2}})
    with pytest.raises(ConfigError, match="launch with torchrun --nproc_per_node=2"):
        engine_group(config, DistContext())
    assert engine_group(TrainConfig(), DistContext()) is None  # T = 1: no group


def test_t_below_one_is_refused_by_the_config():
    with pytest.raises(ConfigError):
        TrainConfig.model_validate({"engine": {"tensor_parallel_size": 0}}).checked()


def test_a_leaders_step_is_cut_into_consecutive_shares():
    assert split_shares(list("abcdef"), 2, 3) == [list("abc"), list("def")]
    assert split_shares(list("abcde"), 2, 3) == [list("abc"), list("de")]  # the run's last step may be short
    assert split_shares(list("ab"), 3, 2) == [list("ab"), [], []]
