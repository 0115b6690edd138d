"""`WorkspaceEnvironment` and the ``workspace_tests`` reward: a coding task in its own workspace, tests as the reward.

Real sandboxes and real test runs (pytest inside the workspace's sandbox); the harness tests drive the real harness,
chat template and tokenizer with `ScriptedEngine` (a fixed tool call, then a final answer) and with the real engine
on SmolLM2-135M (its first turn constrained to the same call, which it would not write by itself).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.engines import ScriptedEngine, SteeredEngine

from agentic_rl.chat import ChatRenderer
from agentic_rl.environments.base import Environment
from agentic_rl.environments.workspace import WorkspaceEnvironment
from agentic_rl.errors import ConfigError, EnvStepError, RewardError
from agentic_rl.plugins import PluginRef
from agentic_rl.rewards.registry import REWARDS, resolve_reward
from agentic_rl.rollout.harness import run_trajectory
from agentic_rl.rollout.spec import HarnessConfig, RolloutSpec

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox needs Linux")

BUGGY = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
TESTS = ("from calc import add, mul\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
         "def test_mul():\n    assert mul(2, 3) == 6\n")  # fmt: skip
FIX = {"name": "str_replace", "arguments": {"path": "calc.py", "old_str": "return a - b", "new_str": "return a + b"}}


@pytest.fixture(scope="module")
def codebase(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("calc")
    (root / "calc.py").write_text(BUGGY)
    root.chmod(0o755)
    (root / "calc.py").chmod(0o644)
    return root


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("workspaces")


@pytest.fixture
async def env(root) -> AsyncIterator[WorkspaceEnvironment]:
    environment = WorkspaceEnvironment(workspace={"root": str(root)})
    yield environment
    await environment.aclose()
    assert os.listdir(root) == []  # every run folder removed


def _task(codebase: Path, **tests: Any) -> dict[str, Any]:
    return {"id": "t", "question": "Fix add in calc.py.", "workspace": str(codebase), "trajectory_id": os.urandom(4).hex(),
            "test_files": {"test_calc.py": TESTS}, **tests}  # fmt: skip


async def _act(env: WorkspaceEnvironment, sample: Any, call: dict[str, Any]) -> str:
    """One assistant turn that makes `call`; returns the tool's observation."""
    sample.messages.append({"role": "assistant", "content": f"<tool_call>\n{json.dumps(call)}\n</tool_call>"})
    result = await env.step(sample)
    sample.messages.extend(result.observation)
    return result.observation[0]["content"]


async def _reward(sample: Any) -> Any:
    return await anyio.to_thread.run_sync(REWARDS["workspace_tests"], sample.task, sample.messages)


async def test_fixing_the_bug_passes_the_hidden_tests_and_close_removes_the_workspace(env, codebase):
    sample = await env.reset(_task(codebase, test_command="python -m pytest -q"))
    assert [t["function"]["name"] for t in sample.tools] == ["bash", "view", "create", "str_replace", "insert"]
    assert "No such file" in await _act(env, sample, {"name": "bash", "arguments": {"command": "ls test_calc.py"}})
    assert (await _act(env, sample, FIX)).startswith("Edited calc.py")
    info = env.workspaces.info(sample.id)
    reward = await _reward(sample)
    assert reward == 1.0
    assert reward.metrics == {"tests_passed_share": 1.0, "tests_run": 2.0, "tests_exit_status": 0.0,
                              "workspace_overlay": float(info.overlay)}  # fmt: skip
    await env.close(sample)
    assert env.workspaces.info(sample.id) is None and not os.path.exists(os.path.dirname(info.path))
    assert (codebase / "calc.py").read_text() == BUGGY


async def test_an_unfixed_workspace_fails_and_a_partial_fix_fails_its_listed_tests(env, codebase):
    listed = {"fail_to_pass": ["test_calc.py::test_add"], "pass_to_pass": json.dumps(["test_calc.py::test_mul"])}
    untouched = await env.reset(_task(codebase, **listed))  # the model never called a tool
    reward = await _reward(untouched)
    assert reward == 0.0 and reward.metrics["tests_passed_share"] == 0.5 and reward.metrics["tests_run"] == 2.0
    await env.close(untouched)
    broken = await env.reset(_task(codebase, **listed))
    await _act(env, broken, FIX)
    await _act(env, broken, {"name": "bash", "arguments": {"command": "sed -i 's/a \\* b/a ** b/' calc.py"}})
    reward = await _reward(broken)  # test_add passes now, test_mul broke
    assert reward == 0.0 and reward.metrics["tests_passed_share"] == 0.5
    await env.close(broken)


async def test_a_test_run_past_its_time_limit_is_an_infrastructure_failure(env, codebase):
    sample = await env.reset(_task(codebase, test_command="sleep 300", test_timeout_s=1))
    with pytest.raises(RewardError, match="passed its time limit and was killed"):
        await _reward(sample)
    await env.close(sample)


async def test_a_plain_test_command_out_of_memory_is_an_infrastructure_failure(env, codebase):
    sample = await env.reset(_task(codebase, test_command="python -c 'bytearray(64 * 1024**3)'"))  # past the limit
    with pytest.raises(RewardError, match="MemoryError"):
        await _reward(sample)
    await env.close(sample)


async def test_a_test_run_killed_by_a_signal_is_an_infrastructure_failure(env, codebase):
    sample = await env.reset(_task(codebase, test_command="python -c 'import os; os.kill(os.getpid(), 9)'"))
    with pytest.raises(RewardError, match="killed by SIGKILL"):
        await _reward(sample)
    await env.close(sample)


async def test_reset_refuses_a_task_without_a_usable_workspace_or_with_malformed_tests(env, codebase, tmp_path):
    with pytest.raises(EnvStepError, match="a workspace task needs 'workspace'"):
        await env.reset({"id": 1, "question": "q"})
    with pytest.raises(EnvStepError, match="cannot be read"):
        await env.reset({"id": 1, "question": "q", "workspace": str(tmp_path / "missing"), "test_command": "true"})
    with pytest.raises(EnvStepError, match="'fail_to_pass' must be a list of pytest node ids"):
        await env.reset(_task(codebase, fail_to_pass="test_calc.py::test_add"))
    with pytest.raises(EnvStepError, match="'test_timeout_s' must be a positive number"):
        await env.reset(_task(codebase, test_command="true", test_timeout_s=0))
    # What the reward would only find after the episode (and retry as an infrastructure failure) is refused here.
    no_tests = {k: v for k, v in _task(codebase).items() if k not in ("test_command", "fail_to_pass", "pass_to_pass")}
    with pytest.raises(EnvStepError, match="needs its tests"):
        await env.reset(no_tests)
    for escaping in ("../evil.py", "/tmp/evil.py", "tests/../../evil.py"):
        with pytest.raises(EnvStepError, match="give a path inside the workspace"):
            await env.reset(_task(codebase, test_command="true", test_files={escaping: "x = 1\n"}))


def test_a_coding_task_needs_no_ground_truth_but_every_other_task_does(codebase):
    from agentic_rl.rollout.tasks import validate_task

    task = {"id": "c", "question": "Fix add().", "workspace": str(codebase), "test_command": "python -m pytest -q"}
    assert validate_task(task) == task  # its tests judge it
    with pytest.raises(ConfigError, match="invalid task field 'ground_truth'"):
        validate_task({"id": "q", "question": "What is 2 + 2?"})


async def test_the_reward_refuses_a_task_without_a_live_workspace(codebase):
    with pytest.raises(RewardError, match="no 'workspace_session'"):
        await anyio.to_thread.run_sync(REWARDS["workspace_tests"], {"question": "q"}, [])
    with pytest.raises(RewardError, match="no live workspace"):
        await anyio.to_thread.run_sync(REWARDS["workspace_tests"], {"workspace_session": "gone/0"}, [])


async def test_a_closed_or_foreign_sample_gets_no_new_workspace_and_a_reused_id_is_named(env, codebase, root):
    task = _task(codebase, test_command="true")
    sample = await env.reset(task)
    with pytest.raises(EnvStepError, match="trajectory_id"):  # n samples of one task need an id each
        await env.reset(task)
    assert (await env.call_tool(sample, "bash", '{"command": "echo hi"}')).content == "hi\n[exit code: 0]"
    await env.close(sample)
    for gone in (sample, type(sample)(id="never-reset", task={}, messages=[], tools=[])):
        with pytest.raises(EnvStepError, match="has no workspace: it was closed, or the sample did not come"):
            await env.call_tool(gone, "bash", '{"command": "ls"}')
        with pytest.raises(EnvStepError, match="has no workspace"):
            await _act(env, gone, {"name": "bash", "arguments": {"command": "ls"}})
    with pytest.raises(RewardError, match="it was closed already"):
        await anyio.to_thread.run_sync(REWARDS["workspace_tests"], sample.task, [])
    assert [p for p in root.rglob("ws-*")] == []  # no workspace was started for them


async def test_a_tool_result_the_environment_would_cut_short_is_refused_when_it_is_built(root):
    with pytest.raises(ConfigError, match="raise max_observation_chars to 20192 or more"):
        WorkspaceEnvironment(workspace={"root": str(root), "max_output_bytes": 20000})
    env = WorkspaceEnvironment(workspace={"root": str(root), "max_output_bytes": 20000}, max_observation_chars=20192)
    await env.aclose()
    assert os.listdir(root) == []


def test_a_config_names_the_environment_by_its_short_name_and_the_reward_by_name(root):
    from agentic_rl.loop.config import TrainConfig
    from agentic_rl.loop.sources import load_classes

    config = TrainConfig(environment={"class": "workspace", "kwargs": {"workspace": {"copy_mode": "copy"}}},
                         reward="workspace_tests", data="arithmetic:train:4")  # fmt: skip
    assert config.tools == []  # the environment brings its own
    assert config.environment.load(what="environment", base=Environment) is WorkspaceEnvironment
    load_classes(tools=config.tools, environment=config.environment, agent=None)
    assert resolve_reward("workspace_tests") is REWARDS["workspace_tests"]
    assert PluginRef.model_validate("workspace").path == "workspace"
    with pytest.raises(ConfigError, match="workspace_tools"):
        WorkspaceEnvironment(workspace={"root": str(root)}, workspace_tools=["bash", "python"])


def _script(question: str, turn: int) -> str:
    return f"<tool_call>\n{json.dumps(FIX)}\n</tool_call>" if turn == 0 else "I fixed add."


async def test_a_rollout_through_the_harness_fixes_the_code_and_is_rewarded_by_its_tests(env, codebase, tokenizer):
    spec = RolloutSpec(ScriptedEngine(tokenizer, _script), env, ChatRenderer(tokenizer),
                       HarnessConfig(max_steps=3, max_prompt_length=2048, max_response_length=1024, reward_timeout_s=120),
                       reward_fn=resolve_reward("workspace_tests"))  # fmt: skip
    task = {"id": "fix", "question": "Fix add in calc.py.", "workspace": str(codebase), "test_command": "python -m pytest -q",
            "test_files": {"test_calc.py": TESTS}}  # fmt: skip
    trajectory = await run_trajectory(task, 0, spec)
    assert not trajectory.failed, trajectory.error
    assert trajectory.termination_reason == "env_done" and trajectory.metrics["tool_calls"] == 1
    assert trajectory.metrics["tests_passed_share"] == 1.0 and trajectory.metrics["tests_run"] == 2.0
    assert trajectory.steps[0].info["workspace_overlay"] == trajectory.metrics["workspace_overlay"]
    assert trajectory.task["workspace_session"].endswith("/fix-0")
    assert trajectory.trajectory_reward >= 1.0 and trajectory.metrics["alignment_mismatches"] == 0
    assert env.workspaces.info("fix-0") is None  # closed with the trajectory


async def test_the_real_engine_rolls_out_a_workspace_task_through_the_harness(engine, tokenizer, env, codebase):
    call = f"<tool_call>\n{json.dumps(FIX)}\n</tool_call>"
    forced = re.sub(r"([.^$*+?{}\[\]\\|()])", r"\\\1", call)  # the call, and nothing else, as a regex
    steered = SteeredEngine(engine, tokenizer, lambda turn: {"regex": forced} if turn == 0 else {"max_tokens": 16})
    spec = RolloutSpec(steered, env, ChatRenderer(tokenizer),
                       HarnessConfig(max_steps=2, max_prompt_length=2048, max_response_length=512, reward_timeout_s=120),
                       reward_fn=resolve_reward("workspace_tests"))  # fmt: skip
    task = {"id": "real", "question": "Fix add in calc.py.", "workspace": str(codebase),
            "test_files": {"test_calc.py": TESTS}, "fail_to_pass": ["test_calc.py::test_add"]}  # fmt: skip
    trajectory = await run_trajectory(task, 0, spec)
    assert not trajectory.failed, trajectory.error
    assert trajectory.chat_completions[2]["content"] == call  # sampled by the engine, token by token
    assert trajectory.chat_completions[3]["content"].startswith("Edited calc.py")
    assert trajectory.metrics["tests_passed_share"] == 1.0 and trajectory.metrics["alignment_mismatches"] == 0
    assert env.workspaces.info("real-0") is None
