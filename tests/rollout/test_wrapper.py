"""Unit tests of agentic_rl.rollout.wrapper without an engine: argument validation, task validation and the
concurrent `generate_agent_trajectories_async` of `BaseEngineWrapper`."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from agentic_rl.errors import ConfigError
from agentic_rl.rollout.harness import TerminationReason
from agentic_rl.rollout.tasks import validate_task
from agentic_rl.rollout.wrapper import BaseEngineWrapper
from agentic_rl.types import StepTrajectory, Trajectory

# --------------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A real fast tokenizer built in memory (WordLevel over a few words): no download. Named apart from the
    conftest's model-backed `tokenizer` fixture so that no model is resolved."""
    vocab = {"[UNK]": 0, "[PAD]": 1, "what": 2, "is": 3, "2": 4, "+": 5, "?": 6}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]")


class EchoWrapper(BaseEngineWrapper):
    """A minimal concrete wrapper: each task becomes a tiny trajectory; counts calls in flight."""

    def __init__(self, *args: Any, delay: float = 0.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.delay = delay
        self.initialized = False
        self.in_flight = 0
        self.max_in_flight = 0
        self.seen: list[tuple[int, dict[str, Any]]] = []

    def initialize(self) -> None:
        self.initialized = True

    async def generate_trajectory(self, task: dict[str, Any], idx: int) -> Trajectory:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            self.seen.append((idx, task))
            await anyio.sleep(self.delay)
            return Trajectory(
                prompt_tokens=[1, 2],
                response_tokens=[3],
                response_masks=[1],
                idx=idx,
                trajectory_reward=1.0,
                termination_reason=TerminationReason.ENV_DONE,
                chat_completions=[{"role": "user", "content": task["question"]}],
            )
        finally:
            self.in_flight -= 1


class ReverseDelayWrapper(EchoWrapper):
    """Earlier tasks sleep longer, so completion order is the reverse of input order."""

    async def generate_trajectory(self, task: dict[str, Any], idx: int) -> Trajectory:
        await anyio.sleep(0.01 * (10 - idx))
        return await super().generate_trajectory(task, idx)


def task(i: int, **overrides: Any) -> dict[str, Any]:
    t: dict[str, Any] = {"id": i, "question": f"what is {i} + {i}?", "ground_truth": str(2 * i)}
    t.update(overrides)
    return t


# --------------------------------------------------------------------------------------------------- defaults


def test_base_wrapper_is_abstract(tiny_tokenizer):
    with pytest.raises(TypeError):
        BaseEngineWrapper("agent", tiny_tokenizer)  # type: ignore[abstract]


def test_wrapper_defaults(tiny_tokenizer):
    w = EchoWrapper("agent", tiny_tokenizer)
    assert w.agent_name == "agent"
    assert w.tokenizer is tiny_tokenizer
    assert w.sampling_params == {}
    assert w.max_prompt_length == 128 * 1024
    assert w.max_response_length == 8 * 1024
    assert w.n_parallel_agents == 8
    assert w.max_steps == 5


def test_wrapper_stores_given_values(tiny_tokenizer):
    params = {"temperature": 0.7, "max_tokens": 384}
    w = EchoWrapper(
        "gsm8k_agent", tiny_tokenizer, sampling_params=params, max_prompt_length=2048, max_response_length=1024,
        n_parallel_agents=16, max_steps=3,
    )  # fmt: skip
    assert w.agent_name == "gsm8k_agent"
    assert w.sampling_params == params
    assert w.max_prompt_length == 2048
    assert w.max_response_length == 1024
    assert w.n_parallel_agents == 16
    assert w.max_steps == 3


def test_wrapper_copies_sampling_params(tiny_tokenizer):
    params = {"temperature": 1.0}
    w = EchoWrapper("agent", tiny_tokenizer, sampling_params=params)
    params["temperature"] = 0.0
    assert w.sampling_params == {"temperature": 1.0}


def test_wrapper_accepts_positional_arguments_in_documented_order(tiny_tokenizer):
    w = EchoWrapper("agent", tiny_tokenizer, {"top_p": 0.9}, 100, 200, 3, 2)
    assert (w.sampling_params, w.max_prompt_length, w.max_response_length, w.n_parallel_agents, w.max_steps) == (
        {"top_p": 0.9}, 100, 200, 3, 2,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------------- agent_name


@pytest.mark.parametrize("name", ["a", "_", "agent", "Agent_2", "_private", "gsm8k_agent", "A1_b2_C3"])
def test_wrapper_accepts_valid_agent_names(tiny_tokenizer, name):
    assert EchoWrapper(name, tiny_tokenizer).agent_name == name


@pytest.mark.parametrize(
    "name",
    ["", "1agent", "9", "my-agent", "-agent", "agent name", "agent.name", "agent!", "agent\n", "é"],
)
def test_wrapper_rejects_invalid_agent_names(tiny_tokenizer, name):
    with pytest.raises(ConfigError, match="agent_name"):
        EchoWrapper(name, tiny_tokenizer)


@pytest.mark.parametrize("name", [None, 123, b"agent", ["agent"], True])
def test_wrapper_rejects_non_string_agent_name(tiny_tokenizer, name):
    with pytest.raises(ConfigError, match="agent_name"):
        EchoWrapper(name, tiny_tokenizer)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------- tokenizer


@pytest.mark.parametrize("bad", [object(), None, "gpt2", {"vocab": {}}])
def test_wrapper_rejects_a_non_tokenizer(bad):
    with pytest.raises(ConfigError, match="tokenizer"):
        EchoWrapper("agent", bad)


def test_wrapper_rejects_a_raw_tokenizers_object(tiny_tokenizer):
    with pytest.raises(ConfigError, match="tokenizer"):
        EchoWrapper("agent", tiny_tokenizer.backend_tokenizer)


def test_wrapper_accepts_an_in_memory_fast_tokenizer(tiny_tokenizer):
    assert tiny_tokenizer("what is 2 + 2 ?")["input_ids"] == [2, 3, 4, 5, 4, 6]
    assert EchoWrapper("agent", tiny_tokenizer).tokenizer is tiny_tokenizer


# --------------------------------------------------------------------------------------------------- int ranges

RANGES = [
    ("max_prompt_length", 1, 131072),
    ("max_response_length", 1, 8192),
    ("n_parallel_agents", 1, 64),
    ("max_steps", 1, 10),
]


@pytest.mark.parametrize(("param", "low", "high"), RANGES)
def test_wrapper_accepts_both_ends_of_each_int_range(tiny_tokenizer, param, low, high):
    assert getattr(EchoWrapper("agent", tiny_tokenizer, **{param: low}), param) == low
    assert getattr(EchoWrapper("agent", tiny_tokenizer, **{param: high}), param) == high


@pytest.mark.parametrize(("param", "low", "high"), RANGES)
def test_wrapper_rejects_values_below_each_int_range(tiny_tokenizer, param, low, high):
    for value in (low - 1, -1, -(10**9)):
        with pytest.raises(ConfigError, match=param):
            EchoWrapper("agent", tiny_tokenizer, **{param: value})


@pytest.mark.parametrize(("param", "low", "high"), RANGES)
def test_wrapper_rejects_values_above_each_int_range(tiny_tokenizer, param, low, high):
    for value in (high + 1, high * 2, 10**12):
        with pytest.raises(ConfigError, match=param):
            EchoWrapper("agent", tiny_tokenizer, **{param: value})


@pytest.mark.parametrize(("param", "low", "high"), RANGES)
@pytest.mark.parametrize("value", [True, False])
def test_wrapper_rejects_booleans_for_ints(tiny_tokenizer, param, low, high, value):
    with pytest.raises(ConfigError, match=param):
        EchoWrapper("agent", tiny_tokenizer, **{param: value})


@pytest.mark.parametrize(("param", "low", "high"), RANGES)
@pytest.mark.parametrize("value", [2.0, 2.5, float("nan"), float("inf")])
def test_wrapper_rejects_floats_for_ints(tiny_tokenizer, param, low, high, value):
    with pytest.raises(ConfigError, match=param):
        EchoWrapper("agent", tiny_tokenizer, **{param: value})


@pytest.mark.parametrize(("param", "low", "high"), RANGES)
@pytest.mark.parametrize("value", ["4", None, [4]])
def test_wrapper_rejects_other_types_for_ints(tiny_tokenizer, param, low, high, value):
    with pytest.raises(ConfigError, match=param):
        EchoWrapper("agent", tiny_tokenizer, **{param: value})


def test_wrapper_error_message_names_parameter_value_and_range(tiny_tokenizer):
    with pytest.raises(ConfigError, match="n_parallel_agents") as info:
        EchoWrapper("agent", tiny_tokenizer, n_parallel_agents=65)
    message = str(info.value)
    assert "n_parallel_agents=65" in message
    assert "[1, 64]" in message


def test_wrapper_error_message_for_max_steps_names_range(tiny_tokenizer):
    with pytest.raises(ConfigError, match=r"max_steps=0 is invalid: expected an int in \[1, 10\]"):
        EchoWrapper("agent", tiny_tokenizer, max_steps=0)


def test_wrapper_config_error_is_a_value_error(tiny_tokenizer):
    with pytest.raises(ValueError):
        EchoWrapper("agent", tiny_tokenizer, max_steps=11)


@pytest.mark.parametrize("params", [[("temperature", 1.0)], "temperature=1", 1, ("a",)])
def test_wrapper_rejects_non_dict_sampling_params(tiny_tokenizer, params):
    with pytest.raises(ConfigError, match="sampling_params"):
        EchoWrapper("agent", tiny_tokenizer, sampling_params=params)


# --------------------------------------------------------------------------------------------------- validate_task


def test_validate_task_returns_a_plain_dict_with_extras():
    checked = validate_task({"id": 3, "question": "q?", "ground_truth": "7", "source": "gsm8k"})
    assert checked == {"id": 3, "question": "q?", "ground_truth": "7", "source": "gsm8k"}
    assert type(checked) is dict


@pytest.mark.parametrize("ground_truth", ["391", 391, 3.5])
def test_validate_task_accepts_string_int_or_float_ground_truth(ground_truth):
    assert validate_task({"id": "a", "question": "q", "ground_truth": ground_truth})["ground_truth"] == ground_truth


@pytest.mark.parametrize("missing", ["id", "question", "ground_truth"])
def test_validate_task_rejects_missing_field(missing):
    t = task(1)
    del t[missing]
    with pytest.raises(ConfigError, match=missing):
        validate_task(t)


@pytest.mark.parametrize("question", ["", "   ", "\n\t"])
def test_validate_task_rejects_empty_or_blank_question(question):
    with pytest.raises(ConfigError, match="question"):
        validate_task(task(1, question=question))


@pytest.mark.parametrize("ground_truth", [True, float("nan"), float("inf")])
def test_validate_task_rejects_boolean_or_non_finite_ground_truth(ground_truth):
    with pytest.raises(ConfigError, match="ground_truth"):
        validate_task(task(1, ground_truth=ground_truth))


@pytest.mark.parametrize("question", [None, 5, ["q"]])
def test_validate_task_rejects_non_string_question(question):
    with pytest.raises(ConfigError, match="question"):
        validate_task(task(1, question=question))


@pytest.mark.parametrize("task_id", [None, 1.5, ["1"], {"id": 1}])
def test_validate_task_rejects_malformed_id(task_id):
    with pytest.raises(ConfigError, match="id"):
        validate_task(task(1, id=task_id))


def test_validate_task_rejects_null_ground_truth():
    with pytest.raises(ConfigError, match="ground_truth"):
        validate_task(task(1, ground_truth=None))


@pytest.mark.parametrize("bad", [None, "task", 3, ["id", "question"], ({"id": 1},)])
def test_validate_task_rejects_non_dict(bad):
    with pytest.raises(ConfigError, match="must be a dict"):
        validate_task(bad)


# --------------------------------------------------------------------------------------------------- generation


async def test_generate_returns_one_trajectory_per_task_in_input_order(tiny_tokenizer):
    w = ReverseDelayWrapper("agent", tiny_tokenizer, n_parallel_agents=10)
    tasks = [task(i) for i in range(10)]
    finished: list[int] = []
    out = await w.generate_agent_trajectories_async(tasks, on_result=lambda t: finished.append(t.idx))
    assert [t.idx for t in out] == list(range(10))
    assert [t.chat_completions[0]["content"] for t in out] == [t["question"] for t in tasks]
    assert all(not t.failed for t in out)
    assert sorted(finished) == list(range(10))
    # completion order differed from input order, so the ordering above is not an accident
    assert finished != list(range(10))


async def test_generate_turns_malformed_task_into_failed_invalid_task_trajectory(tiny_tokenizer, caplog):
    w = EchoWrapper("agent", tiny_tokenizer, n_parallel_agents=2)
    tasks: list[Any] = [
        task(0),
        {"id": 1, "question": "", "ground_truth": "x"},
        task(2),
        "not a dict",
        {"question": "no id", "ground_truth": "1"},
        task(5),
    ]
    out = await w.generate_agent_trajectories_async(tasks)
    assert len(out) == 6
    assert [t.idx for t in out] == list(range(6))
    assert [t.failed for t in out] == [False, True, False, True, True, False]
    for i in (1, 3, 4):
        bad = out[i]
        assert isinstance(bad, StepTrajectory)
        assert bad.termination_reason == TerminationReason.INVALID_TASK == "invalid_task"
        assert bad.error
        assert bad.task == tasks[i]
        assert bad.prompt_tokens.numel() == 0
        assert bad.response_tokens.numel() == 0
        assert bad.trajectory_reward == 0.0
    assert "question" in out[1].error
    assert "dict" in out[3].error
    warnings = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert any(m.startswith("task 1 (sample 1) rejected") for m in warnings)  # the task's id, then its sample
    assert any(m.startswith("task without id (sample 3) rejected") for m in warnings)
    assert "id" in out[4].error
    for i in (0, 2, 5):
        assert out[i].termination_reason == TerminationReason.ENV_DONE
        assert out[i].trajectory_reward == 1.0
    # only the valid tasks reached generate_trajectory, already validated as plain dicts
    assert sorted(idx for idx, _ in w.seen) == [0, 2, 5]
    assert all(t == tasks[idx] for idx, t in w.seen)


async def test_generate_calls_on_result_for_failed_tasks_too(tiny_tokenizer):
    w = EchoWrapper("agent", tiny_tokenizer)
    results: list[Trajectory] = []
    out = await w.generate_agent_trajectories_async([task(0), {}], on_result=results.append)
    assert len(results) == 2
    assert {id(t) for t in results} == {id(t) for t in out}


async def test_generate_with_no_tasks_returns_empty_list(tiny_tokenizer):
    w = EchoWrapper("agent", tiny_tokenizer)
    assert await w.generate_agent_trajectories_async([]) == []
    assert w.seen == []


@pytest.mark.parametrize("n_parallel", [1, 3, 8])
async def test_generate_never_exceeds_n_parallel_agents(tiny_tokenizer, n_parallel):
    w = EchoWrapper("agent", tiny_tokenizer, n_parallel_agents=n_parallel, delay=0.01)
    out = await w.generate_agent_trajectories_async([task(i) for i in range(20)])
    assert len(out) == 20
    assert w.max_in_flight <= n_parallel
    # with 20 tasks that all sleep, the limit is actually reached
    assert w.max_in_flight == n_parallel
    assert w.in_flight == 0


async def test_generate_concurrency_limit_holds_with_invalid_tasks_mixed_in(tiny_tokenizer):
    w = EchoWrapper("agent", tiny_tokenizer, n_parallel_agents=2, delay=0.01)
    tasks: list[Any] = [task(i) if i % 3 else {"id": i} for i in range(12)]
    out = await w.generate_agent_trajectories_async(tasks)
    assert w.max_in_flight == 2
    assert [t.failed for t in out] == [i % 3 == 0 for i in range(12)]


class _RaisingAgent(BaseEngineWrapper):
    def initialize(self) -> None:
        pass

    async def generate_trajectory(self, task, idx):
        if idx == 1:
            raise RuntimeError("agent bug")
        if idx == 2:
            return {"idx": idx}  # not a Trajectory
        return Trajectory(prompt_tokens=[1], response_tokens=[2], response_masks=[1], idx=idx)


async def test_a_subclass_that_raises_or_returns_garbage_fails_only_that_task(tiny_tokenizer):
    agent = _RaisingAgent("agent", tiny_tokenizer, n_parallel_agents=4)
    out = await agent.generate_agent_trajectories_async([task(i) for i in range(4)])
    assert [t.idx for t in out] == [0, 1, 2, 3]
    assert [t.failed for t in out] == [False, True, True, False]
    assert "RuntimeError: agent bug" in out[1].error and out[1].termination_reason == "error"
    assert "expected a Trajectory" in out[2].error


async def test_tool_agent_wrapper_used_before_initialize_raises_one_config_error(tiny_tokenizer):
    from agentic_rl.rollout.wrapper import ToolAgentEngineWrapper

    wrapper = ToolAgentEngineWrapper("agent", tiny_tokenizer, model="unused")
    with pytest.raises(ConfigError, match="initialize"):
        await wrapper.generate_agent_trajectories_async([task(0), task(1)])


# --------------------------------------------------------------------------------------------------- the AgentSDK contract


class AgentSDKExampleWrapper(BaseEngineWrapper):
    """The AgentSDK's subclass example as its API documents it: `initialize` and a plain
    `generate_agent_trajectories_async(self, tasks)` that returns a list."""

    def initialize(self):
        self.ready = True

    def generate_agent_trajectories_async(self, tasks):
        trajectories = []
        for i, t in enumerate(tasks):
            trajectories.append(
                Trajectory(prompt_tokens=[1, 2], response_tokens=[3, 4], response_masks=[1, 1], idx=i,
                           trajectory_reward=1.0, chat_completions=[{"role": "user", "content": t["question"]}])
            )  # fmt: skip
        return trajectories


class AsyncBatchWrapper(BaseEngineWrapper):
    """The same contract with an `async def` override."""

    def initialize(self):
        pass

    async def generate_agent_trajectories_async(self, tasks):
        await anyio.sleep(0)
        return [Trajectory(prompt_tokens=[1], response_tokens=[2], response_masks=[1], idx=i) for i in range(len(tasks))]


def test_agentsdk_example_subclass_instantiates_and_runs_as_written(tiny_tokenizer):
    from agentic_rl.rollout.wrapper import collect_trajectories

    agent = AgentSDKExampleWrapper("mock_agent", tiny_tokenizer, sampling_params={"mock": "sampling_params"})
    assert agent.sampling_params == {"mock": "sampling_params"}  # free-form: the base class does not interpret it
    agent.initialize()
    tasks = [task(0), task(1), task(2)]
    out = agent.generate_agent_trajectories_async(tasks)
    assert [t.idx for t in out] == [0, 1, 2]
    assert [t.chat_completions[0]["content"] for t in out] == [t["question"] for t in tasks]
    assert [t.idx for t in anyio.run(collect_trajectories, agent, tasks)] == [0, 1, 2]


def test_async_batch_override_is_collected(tiny_tokenizer):
    from agentic_rl.rollout.wrapper import collect_trajectories

    agent = AsyncBatchWrapper("agent", tiny_tokenizer)
    agent.initialize()
    assert [t.idx for t in anyio.run(collect_trajectories, agent, [task(0), task(1)])] == [0, 1]


def test_per_task_override_is_collected_with_failure_isolation(tiny_tokenizer):
    from agentic_rl.rollout.wrapper import collect_trajectories

    out = anyio.run(collect_trajectories, EchoWrapper("agent", tiny_tokenizer), [task(0), {"id": 1}])
    assert not out[0].failed
    assert out[1].failed and out[1].termination_reason == TerminationReason.INVALID_TASK


def test_collect_refuses_a_result_that_is_not_a_list(tiny_tokenizer):
    from agentic_rl.rollout.wrapper import collect_trajectories

    class Returns(AgentSDKExampleWrapper):
        def generate_agent_trajectories_async(self, tasks):
            return None

    with pytest.raises(TypeError, match="returned NoneType, expected a list"):
        anyio.run(collect_trajectories, Returns("agent", tiny_tokenizer), [task(0)])


def test_a_class_that_defines_no_generation_method_names_both(tiny_tokenizer):
    class OnlyInitialize(BaseEngineWrapper):
        def initialize(self):
            pass

    with pytest.raises(TypeError, match=r"generate_agent_trajectories_async\(self, tasks\).*generate_trajectory"):
        OnlyInitialize("agent", tiny_tokenizer)


def test_a_class_without_initialize_stays_abstract(tiny_tokenizer):
    class NoInitialize(BaseEngineWrapper):
        def generate_agent_trajectories_async(self, tasks):
            return []

    with pytest.raises(TypeError, match="initialize"):
        NoInitialize("agent", tiny_tokenizer)


def test_set_sampling_replaces_the_options_with_a_copy(tiny_tokenizer):
    agent = AgentSDKExampleWrapper("agent", tiny_tokenizer, {"temperature": 1.0})
    options = {"temperature": 0.0, "seed": 7}
    agent.set_sampling(options)
    options["seed"] = 8
    assert agent.sampling_params == {"temperature": 0.0, "seed": 7}


@pytest.mark.parametrize(("params", "message"), [
    ({"max_token": 8}, r"sampling_params\.max_token is not a known field"),
    ({"temperature": -1}, r"sampling_params\.temperature=-1 is invalid"),
])  # fmt: skip
def test_tool_agent_wrapper_checks_its_engine_options(tiny_tokenizer, params, message):
    from agentic_rl.rollout.wrapper import ToolAgentEngineWrapper

    with pytest.raises(ConfigError, match=message):
        ToolAgentEngineWrapper("agent", tiny_tokenizer, params, model="unused")
    wrapper = ToolAgentEngineWrapper("agent", tiny_tokenizer, {"temperature": 0.5}, model="unused")
    with pytest.raises(ConfigError, match=message):
        wrapper.set_sampling(params)
    assert wrapper.sampling.temperature == 0.5  # a refused update changes nothing


def test_tool_agent_wrapper_set_sampling_reaches_its_harness(tiny_tokenizer):
    from agentic_rl.rollout.wrapper import ToolAgentEngineWrapper

    wrapper = ToolAgentEngineWrapper("agent", tiny_tokenizer, {"temperature": 0.5}, model="unused")
    wrapper.set_sampling({"temperature": 0.0, "seed": 3})
    assert wrapper.sampling_params == {"temperature": 0.0, "seed": 3}
    assert (wrapper.harness_config.sampling.temperature, wrapper.harness_config.sampling.seed) == (0.0, 3)


def test_tool_agent_wrapper_carries_every_harness_field_from_its_argument_of_that_name(tiny_tokenizer):
    from agentic_rl.engine.sampling import SamplingConfig
    from agentic_rl.rollout.spec import HarnessConfig
    from agentic_rl.rollout.wrapper import ToolAgentEngineWrapper

    defaults = ToolAgentEngineWrapper("agent", tiny_tokenizer, model="unused").harness_config
    values: dict[str, Any] = {}
    for name in HarnessConfig.model_fields.keys() - {"sampling"}:  # each a keyword argument of the wrapper
        value = getattr(defaults, name)
        if isinstance(value, bool):
            values[name] = not value
        elif isinstance(value, int):
            values[name] = value - 1 if value > 1 else value + 1  # inside the wrapper's ranges
        elif isinstance(value, str):  # a choice
            values[name] = {"new_run": "refuse"}[value]
        else:
            values[name] = value + 0.5
    sampling = {"temperature": 0.5, "seed": 7}
    wrapper = ToolAgentEngineWrapper("agent", tiny_tokenizer, sampling, model="unused", **values)
    harness = wrapper.harness_config
    assert {name: getattr(harness, name) for name in values} == values
    assert harness.sampling == SamplingConfig.of(sampling)
    assert all(getattr(HarnessConfig(), name) != value for name, value in values.items())  # none left at its default


def test_step_defaults_follow_the_agentsdk_api():
    from agentic_rl.types import Step

    step = Step()
    assert step.action is None
    assert step.observation is None
