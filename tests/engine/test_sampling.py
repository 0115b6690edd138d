"""`derive_seed` (the one seed-offset rule) and the engine's sampling defaults."""

from __future__ import annotations

from agentic_rl.engine.sampling import SamplingConfig, derive_seed

M = 2**31 - 1


def test_each_coordinate_moves_the_seed_by_its_own_stride():
    assert derive_seed(3) == 3 and derive_seed(-5) == -5  # the origin keeps the run's own seed
    assert derive_seed(3, trajectory=2, turn=1) == 3 + 2 * 1_000_003 + 7_919
    assert derive_seed(3, rank=1, step=2) == 3 + 1000 + 2 * 7_368_787
    assert derive_seed(-5, choice=1) == (-4) % M
    assert derive_seed(M - 1, choice=1) == 0  # wrapped into [0, 2**31 - 2]
    # a step's seed offset again per trajectory and turn equals the whole offset at once
    step_seed = derive_seed(11, rank=1, step=3)
    assert derive_seed(step_seed, trajectory=4, turn=2) == derive_seed(11, rank=1, step=3, trajectory=4, turn=2)
    seeds = {derive_seed(0, trajectory=i, turn=t) for i in range(64) for t in range(10)}
    assert len(seeds) == 640  # the samples of a group and the turns of a trajectory all differ


def test_derived_leaves_an_unseeded_config_alone():
    unseeded = SamplingConfig(temperature=0.5)
    assert unseeded.derived(trajectory=3) is unseeded
    assert SamplingConfig(seed=1).derived(turn=1).seed == 1 + 7_919


def test_engine_defaults_are_decided_in_one_place():
    assert SamplingConfig().engine_kwargs()["detokenize"] is False
    assert SamplingConfig(stop=["\n"]).engine_kwargs()["detokenize"] is True
    assert SamplingConfig(stop=["\n"], detokenize=False).engine_kwargs()["detokenize"] is False
    assert SamplingConfig().engine_kwargs()["logprobs"] == 0 and SamplingConfig(logprobs=3).engine_kwargs()["logprobs"] == 3
    assert "logprobs" not in SamplingConfig().vllm_kwargs()  # the plain options leave the defaults to vLLM
