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


def test_a_t_the_models_heads_refuse_is_refused_before_the_trainer_loads(tmp_path):
    from transformers import LlamaConfig

    from agentic_rl.loop.engine_groups import check_tensor_parallel

    LlamaConfig(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, num_hidden_layers=2,
                intermediate_size=1536, vocab_size=49152).to_json_file(tmp_path / "config.json")  # SmolLM2-135M's heads
    config = TrainConfig.model_validate({"engine": {"tensor_parallel_size": 2}})
    with pytest.raises(ConfigError) as info:
        check_tensor_parallel(config, tmp_path, world_size=2)
    assert "engine.tensor_parallel_size=2 does not divide the model's num_attention_heads=9" in str(info.value)
    assert str(info.value).endswith("with 2 ranks this model allows engine.tensor_parallel_size 1")
    three = TrainConfig.model_validate({"engine": {"tensor_parallel_size": 3}})
    check_tensor_parallel(three, tmp_path, world_size=3)  # 9 heads, 3 key/value heads: 3 cards take 3 and 1 each


def test_the_segments_of_a_killed_groups_leader_are_removed_and_no_others(tmp_path):
    import os
    import subprocess
    import sys

    from agentic_rl.engine.tensor_parallel import remove_orphaned_segments

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(gone.stdout)  # that process has ended and been reaped
    names = [f"agentic_rl_engine_0-{dead}-17-tp:0-[0-1]-cpushm_0", f"agentic_rl_engine_0-{dead}-17-tp:0-[0-1]-cpushm_1",
             f"agentic_rl_engine_1-{os.getpid()}-18-tp:0-[0-1]-cpushm_0", "someone_elses_segment"]  # fmt: skip
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    assert sorted(remove_orphaned_segments(str(tmp_path))) == sorted(names[:2])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[2:])


@pytest.mark.parametrize("key", ["tensor_parallel_size", "distributed_executor_backend", "pipeline_parallel_size",
                                 "data_parallel_size"])  # fmt: skip
def test_parallelism_inside_the_engine_is_not_an_engine_kwarg(key):
    from agentic_rl.engine.vllm_config import VLLMEngineConfig

    with pytest.raises(ConfigError, match=key):
        VLLMEngineConfig(model="m", engine_kwargs={key: 2})


def test_the_group_timeout_reaches_the_engine_group(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    config = TrainConfig.model_validate({"engine": {"tensor_parallel_size": 2, "group_timeout_s": 30}})
    group = engine_group(config, DistContext(rank=1, world_size=2, store=object()))
    assert (group.timeout_s, group.rank, group.leader) == (30.0, 1, 0)
