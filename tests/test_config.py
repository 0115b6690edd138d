"""`Config`, the one style of settings objects, and `SamplingConfig`: errors name the full path of the bad field."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import Field

from agentic_rl.config import Config
from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.engine.vllm_engine import VLLMEngineConfig
from agentic_rl.errors import ConfigError
from agentic_rl.loop import TrainConfig
from agentic_rl.memory import MemoryConfig
from agentic_rl.rollout.harness import HarnessConfig
from agentic_rl.train.trainer import GRPOConfig


class Inner(Config):
    size: int = Field(default=1, ge=1)


class Middle(Config):
    inner: Inner = Field(default_factory=Inner)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)


class Outer(Config):
    middle: Middle = Field(default_factory=Middle)
    name: str = "x"


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Outer(bogus=1), "Outer.bogus is not a known field"),
        (lambda: Outer(middle={"inner": {"size": 0}}), "Outer.middle.inner.size=0 is invalid"),
        (lambda: Outer(middle={"sampling": {"max_token": 3}}), "Outer.middle.sampling.max_token is not a known field"),
        (lambda: Outer.model_validate({"middle": {"inner": {"size": "big"}}}), "Outer.middle.inner.size='big'"),
        (lambda: Outer(middle=3), "Outer.middle=3 is invalid"),
    ],
)
def test_config_errors_name_the_full_path_of_the_bad_field(build, message):
    with pytest.raises(ConfigError) as info:
        build()
    assert str(info.value).startswith(message)


def test_assignment_is_checked_and_names_the_field():
    outer = Outer()
    outer.name = "y"
    with pytest.raises(ConfigError, match=r"^Outer\.name=3 is invalid"):
        outer.name = 3  # type: ignore[assignment]
    assert outer.name == "y"


def test_an_assignment_that_fails_a_check_across_fields_leaves_the_config_as_it_was():
    config = GRPOConfig(lr_schedule="cosine", lr_decay_steps=4)
    with pytest.raises(ConfigError, match="lr_warmup_steps=10 must be below lr_decay_steps=4"):
        config.lr_warmup_steps = 10
    with pytest.raises(ConfigError, match="lr_decay_steps=4 only shapes the cosine"):
        config.lr_schedule = "constant"
    assert (config.lr_warmup_steps, config.lr_schedule) == (0, "cosine")
    assert config.model_fields_set == {"lr_schedule", "lr_decay_steps"}
    assert config == GRPOConfig(lr_schedule="cosine", lr_decay_steps=4)


def test_checked_runs_the_checks_of_the_whole_config_that_an_assignment_inside_a_section_skips(tmp_path):
    from agentic_rl.loop import run_training

    config = TrainConfig.model_validate({"steps": 2, "output_dir": str(tmp_path / "run")})
    config.optimizer.lr_warmup_steps = 100  # the optimizer section alone has no steps to check it against
    assert config.optimizer.lr_warmup_steps == 100
    with pytest.raises(ConfigError, match="optimizer.lr_warmup_steps=100 must be below steps=2"):
        config.checked()
    with pytest.raises(ConfigError, match="optimizer.lr_warmup_steps=100 must be below steps=2"):
        run_training(config)  # refused before any engine or folder
    assert not (tmp_path / "run").exists()
    assert TrainConfig().checked() == TrainConfig()


@pytest.mark.parametrize(("build", "field"), [
    (lambda v: GRPOConfig(lr=v), "GRPOConfig.lr"),
    (lambda v: GRPOConfig(gamma=v), "GRPOConfig.gamma"),
    (lambda v: GRPOConfig(micro_batch_size=v), "GRPOConfig.micro_batch_size"),
    (lambda v: GRPOConfig(max_prompt_length=v), "GRPOConfig.max_prompt_length"),
    (lambda v: TrainConfig.model_validate({"rollout": {"milestone_weight": v}}), "TrainConfig.rollout.milestone_weight"),
    (lambda v: HarnessConfig(toolcall_weight=v), "HarnessConfig.toolcall_weight"),
    (lambda v: Outer(middle={"inner": {"size": v}}), "Outer.middle.inner.size"),
])  # fmt: skip
@pytest.mark.parametrize("value", [True, False])
def test_a_boolean_is_no_number_for_any_numeric_setting(build, field, value):
    with pytest.raises(ConfigError, match=rf"^{field}={value} is invalid: a number is expected, not the boolean"):
        build(value)


def test_a_list_of_numbers_refuses_booleans_in_it():
    from agentic_rl.loop.sft import SFTConfig

    assert SFTConfig(call_weights=[2, 1.5, 0]).call_weights == [2.0, 1.5, 0.0]
    with pytest.raises(ConfigError, match=r"SFTConfig\.call_weights=\[1.0, True, 1.0\] is invalid: numbers are expected"):
        SFTConfig(call_weights=[1.0, True, 1.0])


def test_numbers_in_yaml_scientific_notation_are_read_as_numbers(tmp_path):
    """YAML 1.1 reads `5e-2` (no dot) as a string; the optimizer's float settings still take it as the number."""
    path = tmp_path / "train.yaml"
    path.write_text("steps: 4\noptimizer:\n  lr: 3e-5\n  lr_schedule: cosine\n  min_lr_ratio: 5e-2\n")
    config = TrainConfig.from_yaml(path, ["optimizer.kl_coef=1e-3"])
    assert (config.optimizer.lr, config.optimizer.min_lr_ratio, config.optimizer.kl_coef) == (3e-5, 0.05, 1e-3)


def test_every_settings_object_is_a_config_and_rejects_unknown_fields():
    for cls, required in [(SamplingConfig, {}), (HarnessConfig, {}), (MemoryConfig, {}), (GRPOConfig, {}),
                          (TrainConfig, {}), (VLLMEngineConfig, {"model": "m"})]:  # fmt: skip
        assert issubclass(cls, Config)
        with pytest.raises(ConfigError, match=rf"^{cls.__name__}\.no_such_field is not a known field"):
            cls(**required, no_such_field=1)


def test_a_misspelled_sampling_option_fails_where_the_rollout_is_configured():
    with pytest.raises(ConfigError, match=r"HarnessConfig\.sampling\.max_token is not a known field"):
        HarnessConfig(sampling={"max_token": 8})
    with pytest.raises(ConfigError, match=r"TrainConfig\.rollout\.sampling\.temperature=-1"):
        TrainConfig.model_validate({"rollout": {"sampling": {"temperature": -1}}})


def test_sampling_config_values_and_vllm_arguments():
    sampling = SamplingConfig.of({"max_tokens": 5, "stop": "\n", "seed": 3})
    assert sampling.stop == ["\n"] and sampling.max_tokens == 5
    kwargs = sampling.vllm_kwargs()
    assert kwargs["max_tokens"] == 5 and kwargs["stop"] == ["\n"] and kwargs["seed"] == 3
    assert "logprobs" not in kwargs and "structured_outputs" not in kwargs  # unset options are left to vLLM
    assert SamplingConfig.of(sampling) is sampling and SamplingConfig.of(None) == SamplingConfig()
    for bad, field in [({"max_tokens": 0}, "max_tokens"), ({"max_tokens": True}, "max_tokens"),
                       ({"top_p": 0.0}, "top_p"), ({"top_k": -2}, "top_k"), ({"temperature": float("nan")}, "temperature"),
                       ({"stop_token_ids": [-1]}, "stop_token_ids")]:  # fmt: skip
        with pytest.raises(ConfigError, match=rf"SamplingConfig\.{field}"):
            SamplingConfig.of(bad)
    with pytest.raises(ConfigError, match="SamplingConfig or a dict"):
        SamplingConfig.of([("max_tokens", 3)])  # type: ignore[arg-type]


def test_from_yaml_applies_overrides_and_names_bad_ones(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: a\nmiddle:\n  inner:\n    size: 2\n")
    loaded = Outer.from_yaml(path, ["middle.inner.size=5", "middle.sampling.max_tokens=7"])
    assert (loaded.name, loaded.middle.inner.size, loaded.middle.sampling.max_tokens) == ("a", 5, 7)
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        Outer.from_yaml(path, ["name"])
    with pytest.raises(ConfigError, match="'name' is not a section"):
        Outer.from_yaml(path, ["name.x=1"])
    with pytest.raises(ConfigError, match=r"Outer\.middle\.inner\.size=0"):
        Outer.from_yaml(path, ["middle.inner.size=0"])
    path.write_text("- a list\n")
    with pytest.raises(ConfigError, match="YAML mapping"):
        Outer.from_yaml(path)


def test_a_training_run_sets_the_weight_of_the_tool_call_reward():
    assert TrainConfig().rollout.toolcall_weight == 0.1  # as the rollout wrapper's default
    assert TrainConfig.model_validate({"rollout": {"toolcall_weight": 0}}).rollout.toolcall_weight == 0.0
    for bad in (-0.1, float("inf")):
        with pytest.raises(ConfigError, match=r"TrainConfig\.rollout\.toolcall_weight"):
            TrainConfig.model_validate({"rollout": {"toolcall_weight": bad}})


def test_a_training_run_passes_the_unfinished_penalty_to_the_harness_and_refuses_a_negative_one():
    assert TrainConfig().rollout.unfinished_penalty == 0.0
    assert TrainConfig.model_validate({"rollout": {"unfinished_penalty": 0.5}}).rollout.unfinished_penalty == 0.5
    for bad in (-0.5, float("nan")):
        with pytest.raises(ConfigError, match=r"TrainConfig\.rollout\.unfinished_penalty"):
            TrainConfig.model_validate({"rollout": {"unfinished_penalty": bad}})
    with pytest.raises(ConfigError, match="unfinished_penalty and optimizer.overlong_filter"):
        TrainConfig.model_validate({"rollout": {"unfinished_penalty": 0.5}, "optimizer": {"overlong_filter": True}})


@pytest.mark.parametrize("field", ["toolcall_weight", "milestone_weight", "unfinished_penalty"])
def test_an_agent_of_your_own_refuses_the_built_in_reward_shaping_it_would_ignore(field):
    with pytest.raises(ConfigError, match=f"computes its own rewards: remove rollout.{field}"):
        TrainConfig.model_validate({"agent": "examples.custom_agent:ReflectingAgent", "rollout": {field: 0.5}})
    assert TrainConfig.model_validate({"agent": "examples.custom_agent:ReflectingAgent"}).rollout.toolcall_weight == 0.1


def test_a_run_with_an_agent_of_your_own_resumes_from_its_recorded_config(tmp_path):
    """The recorded config.json holds every field at its value: defaults written out are not settings to refuse."""
    from agentic_rl.loop.config import load_run_config

    given = {
        "agent": "examples.custom_agent:ReflectingAgent",
        "rollout": {"toolcall_weight": 0.1, "unfinished_penalty": 0},
    }
    config = TrainConfig.model_validate(given)  # the defaults, written out
    (tmp_path / "config.json").write_text(config.model_dump_json(), encoding="utf-8")
    resumed = load_run_config(tmp_path)
    assert resumed.agent == config.agent and resumed.rollout == config.rollout


@pytest.mark.parametrize(
    "name",
    ["train_arithmetic.yaml", "train_arithmetic_2step.yaml", "train_gsm8k.yaml", "train_humaneval.yaml", "sft_tools.yaml",
     "sft_research.yaml"],  # fmt: skip
)
def test_the_example_configs_load_and_name_files_that_exist(name, monkeypatch):
    from agentic_rl.data import SHARED_DATA
    from agentic_rl.loop.sft import SFTConfig

    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    root = Path(__file__).resolve().parent.parent
    monkeypatch.chdir(root)  # example paths are relative to the repository root, where their commands run
    config = (TrainConfig if name.startswith("train_") else SFTConfig).from_yaml(root / "examples" / name)
    for field in ("data", "eval_data", "research_system_prompt_file"):
        value = getattr(config, field, None)
        if value and ":" not in value:  # a file, not a generated family such as arithmetic:heldout:64
            assert Path(value).exists(), f"{name}: {field}={value} does not exist"


def test_evaluation_is_greedy_by_default_and_otherwise_sampled_with_the_same_seed_every_time():
    from types import SimpleNamespace

    from agentic_rl.loop.setup import step_sampling

    def _sampling(run, step):
        return step_sampling(run.config, run.dist.rank, step)

    def run(**overrides):
        return SimpleNamespace(config=TrainConfig(data="arithmetic:train:4", **overrides), dist=SimpleNamespace(rank=1))

    greedy = _sampling(run(), None)
    assert (greedy.temperature, greedy.seed) == (0.0, None)
    sampled = _sampling(run(eval_temperature=0.7, seed=3), None)
    assert sampled.temperature == 0.7 and sampled.seed is not None
    assert _sampling(run(eval_temperature=0.7, seed=3), None).seed == sampled.seed  # every evaluation draws alike
    assert _sampling(run(eval_temperature=0.7, seed=4), None).seed != sampled.seed
    assert sampled.seed not in {_sampling(run(eval_temperature=0.7, seed=3), step).seed for step in range(100)}
    with pytest.raises(ConfigError, match="eval_temperature"):
        TrainConfig(data="arithmetic:train:4", eval_temperature=-0.1)


def _other_value(name: str, value: object) -> object:
    """A valid value of the `HarnessConfig` field `name` other than `value` (its default somewhere)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1 if isinstance(value, int) else value + 0.5
    if isinstance(value, SamplingConfig):
        return value.model_copy(update={"temperature": 0.5, "top_p": 0.9, "seed": 7})
    if name == "template_rewrites":
        return {"new_run": "refuse", "refuse": "new_run"}[value]
    raise AssertionError(f"HarnessConfig.{name}: give the test a value for a field of type {type(value).__name__}")


def test_the_rollout_section_carries_every_harness_field_into_the_harness_config():
    section, harness_defaults = TrainConfig().rollout, HarnessConfig()
    values = {name: _other_value(name, getattr(section, name)) for name in HarnessConfig.model_fields}
    assert all(values[name] != getattr(harness_defaults, name) for name in values)  # a dropped field would show
    config = TrainConfig.model_validate({"rollout": values, "optimizer": {"advantage": "step"}})
    harness = config.rollout.harness_config()
    assert isinstance(harness, HarnessConfig)
    assert {name: getattr(harness, name) for name in values} == values
    assert TrainConfig().rollout.harness_config().model_dump(exclude={"sampling"}) == {
        **HarnessConfig().model_dump(exclude={"sampling"}),
        **TrainConfig().rollout.model_dump(include=set(HarnessConfig.model_fields) - {"sampling"}),
    }


def test_the_rollout_section_checks_the_timeouts():
    for field in ("turn_timeout_s", "close_timeout_s"):
        with pytest.raises(ConfigError, match=rf"TrainConfig\.rollout\.{field}"):
            TrainConfig.model_validate({"rollout": {field: 0}})
