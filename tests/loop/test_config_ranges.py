"""Ranges at config time: every option the engine or a library limits is refused where the user wrote it, naming it."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentic_rl.config import Config
from agentic_rl.engine.sampling import SamplingConfig, derive_seed, fold_seed
from agentic_rl.engine.vllm_engine import VLLMEngineConfig
from agentic_rl.errors import ConfigError
from agentic_rl.loop import TrainConfig
from agentic_rl.loop.ranges import check_model_window, engine_window
from agentic_rl.memory import MemoryConfig
from agentic_rl.rollout.spec import HarnessConfig
from agentic_rl.train.lora import LoRAConfig
from agentic_rl.train.off_policy import OffPolicyConfig
from agentic_rl.train.trainer import GRPOConfig


def _train(**sections) -> TrainConfig:
    return TrainConfig.model_validate(sections)


def test_a_lora_rank_the_engine_cannot_serve_is_refused_naming_the_option_written():
    assert _train(optimizer={"lora": {"rank": 512}}).optimizer.lora.rank == 512
    with pytest.raises(ConfigError, match=r"optimizer\.lora\.rank=600 exceeds 512") as caught:
        _train(optimizer={"lora": {"rank": 600}})
    assert "max_lora_rank" not in str(caught.value).split("(")[0]  # named by the option the user wrote


def test_min_tokens_above_max_tokens_is_refused_by_every_config_that_holds_sampling():
    assert SamplingConfig(min_tokens=8, max_tokens=8).min_tokens == 8
    assert SamplingConfig(min_tokens=64).max_tokens is None  # no max: the rollout's room decides
    with pytest.raises(ConfigError, match=r"^SamplingConfig is invalid: min_tokens=9 exceeds max_tokens=8"):
        SamplingConfig(min_tokens=9, max_tokens=8)
    with pytest.raises(ConfigError, match=r"^HarnessConfig\.sampling is invalid: min_tokens=9 exceeds max_tokens=8"):
        HarnessConfig(sampling={"min_tokens": 9, "max_tokens": 8})
    with pytest.raises(ConfigError, match=r"^TrainConfig\.rollout\.sampling is invalid: min_tokens=300 exceeds"):
        _train(rollout={"sampling": {"temperature": 1.0, "min_tokens": 300, "max_tokens": 256}})
    with pytest.raises(
        ConfigError, match=r"rollout\.sampling\.min_tokens=600 exceeds rollout\.max_response_length=512"
    ):
        _train(rollout={"sampling": {"temperature": 1.0, "min_tokens": 600}})


def test_the_trajectory_budget_must_fit_the_engine_window():
    assert engine_window(_train()) == 1024 + 512  # no max_model_len: the engine gets the budget
    assert _train(engine={"max_model_len": 1536}).engine.max_model_len == 1536
    with pytest.raises(ConfigError, match=r"1024 \+ 512 = 1536 exceeds engine\.max_model_len=1024"):
        _train(engine={"max_model_len": 1024})
    assert engine_window(_train(engine={"max_model_len": 8192}, rollout={"max_prompt_length": 7680})) == 8192


def test_a_window_longer_than_the_model_was_trained_for_is_refused_once_the_model_is_known(tmp_path):
    from agentic_rl.models import resolve_model

    model = resolve_model("tiny-random-smollm2")  # max_position_embeddings 4096
    check_model_window(_train(rollout={"max_prompt_length": 3584, "max_response_length": 512}), model)
    check_model_window(_train(engine={"max_model_len": 4096}), model)
    with pytest.raises(ConfigError, match=r"rollout\.max_prompt_length \+ rollout\.max_response_length = 4097 exceeds "
                                          r"the window of model .* \(max_position_embeddings=4096"):  # fmt: skip
        check_model_window(_train(rollout={"max_prompt_length": 3585, "max_response_length": 512}), model)
    with pytest.raises(ConfigError, match=r"engine\.max_model_len=8192 exceeds the window of model"):
        check_model_window(_train(engine={"max_model_len": 8192}), model)


def test_top_logprobs_beyond_what_the_engine_reports_are_refused():
    assert _train(rollout={"sampling": {"temperature": 1.0, "logprobs": 20}}).rollout.sampling.logprobs == 20
    with pytest.raises(ConfigError, match=r"rollout\.sampling\.logprobs=21 exceeds 20"):
        _train(rollout={"sampling": {"temperature": 1.0, "logprobs": 21}})


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"engine": {"dtype": "fp32"}}, r"TrainConfig\.engine\.dtype='fp32' is invalid"),
        ({"seed": -1}, r"TrainConfig\.seed=-1 is invalid"),
        ({"seed": 2**32}, r"TrainConfig\.seed=4294967296 is invalid"),
        ({"device": "gpu0"}, r"TrainConfig\.device='gpu0' is invalid: not a training device"),
    ],
)
def test_single_options_with_a_library_range_are_refused(section, message):
    assert [_train(device=device).device for device in ("cpu", "cuda:1", "npu")] == ["cpu", "cuda:1", "npu"]
    with pytest.raises(ConfigError, match=message):
        _train(**section)


def _float_options(cls: type[Config]) -> list[str]:
    return [name for name, field in cls.model_fields.items() if field.annotation in (float, float | None)]


SETTINGS = [SamplingConfig(), HarnessConfig(), MemoryConfig(), GRPOConfig(), OffPolicyConfig(), LoRAConfig(),
            TrainConfig().engine, TrainConfig().judge, TrainConfig().rollout, VLLMEngineConfig(model="m")]  # fmt: skip


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: type(s).__name__)
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_no_float_option_of_any_settings_object_takes_infinity_or_nan(settings, value):
    names = _float_options(type(settings))
    assert names or type(settings) in (MemoryConfig,)
    for name in names:
        with pytest.raises(ConfigError, match=rf"{type(settings).__name__}\.{name}=.* is invalid"):
            setattr(settings, name, value)


@given(st.integers(min_value=-(2**200), max_value=2**200))
def test_any_integer_seed_is_folded_into_the_engine_range(seed):
    folded = SamplingConfig(seed=seed, temperature=1.0).seed
    assert folded == fold_seed(seed) and 0 <= folded <= 2**31 - 2
    assert SamplingConfig(seed=folded).seed == folded  # in range: unchanged
    assert 0 <= derive_seed(folded, trajectory=3, turn=2) <= 2**31 - 2
