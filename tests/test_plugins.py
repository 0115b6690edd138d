"""Classes named by a dotted path in a config (`agentic_rl.plugins`), and the training config's `environment`,
`tools` and `agent` entries: every load-time error names the entry, the path and what is missing."""

from __future__ import annotations

import sys

import pytest

from agentic_rl.errors import ConfigError
from agentic_rl.loop.config import TrainConfig
from agentic_rl.loop.sources import load_classes
from agentic_rl.plugins import PluginRef, load_object
from agentic_rl.tools.base import Tool
from agentic_rl.tools.calculator import CalculatorTool
from agentic_rl.tools.registry import build_tools


def test_load_object_finds_a_class_and_a_nested_attribute():
    assert load_object("agentic_rl.tools.calculator:CalculatorTool", what="tool", base=Tool) is CalculatorTool
    assert load_object("agentic_rl.errors:ConfigError.__name__", what="x") == "ConfigError"


@pytest.mark.parametrize(("path", "message"), [
    ("no_colon_here", r"tools\[2\] 'no_colon_here' has no ':' between the module and the name"),
    (":Name", "is not a .package.module:Name. path"),
    ("pkg.mod:", "is not a .package.module:Name. path"),
    ("surely_missing_pkg.mod:Thing", r"tools\[2\] 'surely_missing_pkg.mod:Thing': cannot import module "
                                     r"'surely_missing_pkg.mod'.*No module named 'surely_missing_pkg'"),
    ("agentic_rl.tools.calculator:Nope", r"module 'agentic_rl.tools.calculator' has no attribute 'Nope'"),
    ("agentic_rl.tools.base:cap_text", r"must name a subclass of Tool, got function"),
    ("agentic_rl.errors:ConfigError", r"must name a subclass of Tool, got class ConfigError"),
])  # fmt: skip
def test_load_object_errors_name_the_entry_the_path_and_what_is_missing(path, message):
    with pytest.raises(ConfigError, match=message):
        load_object(path, what="tools[2]", base=Tool)


def test_a_module_that_raises_on_import_is_named(tmp_path, monkeypatch):
    (tmp_path / "broken_plugin_mod.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"importing module 'broken_plugin_mod' failed: RuntimeError: boom at import"):
        load_object("broken_plugin_mod:X", what="environment")


def test_a_module_of_the_current_directory_is_found(tmp_path, monkeypatch):
    """A config run from a project's root names the project's modules, as `python -m` would find them."""
    (tmp_path / "cwd_plugin_pkg").mkdir()
    (tmp_path / "cwd_plugin_pkg" / "tools.py").write_text(
        "from agentic_rl.tools.calculator import CalculatorTool\nclass MyCalc(CalculatorTool):\n    name = 'my_calc'\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    (tool,) = build_tools(["cwd_plugin_pkg.tools:MyCalc"])
    assert tool.name == "my_calc" and isinstance(tool, CalculatorTool)


def test_plugin_ref_takes_a_string_or_a_class_with_kwargs():
    assert PluginRef.model_validate("a.b:C") == PluginRef(path="a.b:C")
    ref = PluginRef.model_validate({"class": "a.b:C", "kwargs": {"n": 3}})
    assert (ref.path, ref.kwargs) == ("a.b:C", {"n": 3})
    assert ref.model_dump() == {"class": "a.b:C", "kwargs": {"n": 3}}  # written back the way it is read


def test_build_reports_a_constructor_that_raises():
    ref = PluginRef.model_validate({"class": "agentic_rl.tools.calculator:CalculatorTool", "kwargs": {"bogus": 1}})
    with pytest.raises(ConfigError, match=r"tools\[0\] 'agentic_rl.tools.calculator:CalculatorTool' could not be "
                                          r"built with kwargs \{'bogus': 1\}: TypeError"):  # fmt: skip
        build_tools([ref])


def test_tools_mix_built_in_names_and_classes():
    tools = build_tools(["calculator", "agentic_rl.tools.calculator:CalculatorTool"])
    assert [type(t) for t in tools] == [CalculatorTool, CalculatorTool]
    assert tools[0] is not tools[1]
    with pytest.raises(ConfigError, match=r"unknown tool\(s\): nope; available: calculator"):
        build_tools(["calculator", "nope"])


def test_train_config_reads_environment_tools_and_agent():
    config = TrainConfig.model_validate({
        "environment": {"class": "examples.guess_game:GuessEnvironment", "kwargs": {"low": 1}},
        "tools": ["calculator", {"class": "agentic_rl.tools.calculator:CalculatorTool"}],
    })  # fmt: skip
    assert config.environment == PluginRef(path="examples.guess_game:GuessEnvironment", kwargs={"low": 1})
    assert config.tools[1] == PluginRef(path="agentic_rl.tools.calculator:CalculatorTool")
    assert TrainConfig(environment="a.b:Env").tools == []  # an environment of your own gets tools only when named
    again = TrainConfig.model_validate_json(config.model_dump_json())  # as `--resume` reads config.json back
    assert again == config


@pytest.mark.parametrize(("fields", "message"), [
    ({"agent": "a.b:Agent", "tools": ["calculator", "search"]}, r"brings its own environment, tools and reward: remove tools"),
    ({"agent": "a.b:Agent", "environment": "a.b:Env"}, r"remove environment"),
    ({"agent": "a.b:Agent", "reward": "exact"}, r"remove reward"),
    ({"agent": "not-dotted"}, r"TrainConfig.agent='not-dotted' is invalid: .*has no ':' between the module and the name"),
    ({"environment": {"class": "a.b:Env", "args": {}}}, r"TrainConfig.environment.args is not a known field"),
])  # fmt: skip
def test_train_config_refuses_what_cannot_work(fields, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig.model_validate(fields)


def test_load_classes_checks_every_entry_before_anything_starts():
    load_classes(tools=["calculator"], environment=PluginRef(path="agentic_rl.environments.tool_env:ToolEnvironment"),
                 agent=None)  # fmt: skip
    with pytest.raises(ConfigError, match=r"unknown tool 'calc'"):
        load_classes(tools=["calc"], environment=None, agent=None)
    with pytest.raises(
        ConfigError, match=r"tools\[1\] 'agentic_rl.rollout.wrapper:BaseEngineWrapper' must name a subclass of Tool"
    ):
        load_classes(tools=["calculator", "agentic_rl.rollout.wrapper:BaseEngineWrapper"], environment=None, agent=None)
    with pytest.raises(
        ConfigError,
        match=r"environment 'agentic_rl.tools.calculator:CalculatorTool' must name a subclass of Environment",
    ):
        load_classes(tools=[], environment=PluginRef(path="agentic_rl.tools.calculator:CalculatorTool"), agent=None)
    with pytest.raises(
        ConfigError, match=r"agent 'agentic_rl.environments.base:Environment' must name a subclass of BaseEngineWrapper"
    ):
        load_classes(tools=[], environment=None, agent=PluginRef(path="agentic_rl.environments.base:Environment"))


def test_load_classes_refuses_unknown_kwargs_and_a_tools_clash_before_anything_starts():
    calc = PluginRef.model_validate({"class": "agentic_rl.tools.calculator:CalculatorTool", "kwargs": {"bogus": 1}})
    with pytest.raises(
        ConfigError, match=r"tools\[0\] 'agentic_rl.tools.calculator:CalculatorTool' takes no argument\(s\) bogus"
    ):
        load_classes(tools=[calc], environment=None, agent=None)
    env = PluginRef.model_validate({"class": "agentic_rl.environments.tool_env:ToolEnvironment",
                                    "kwargs": {"system_prompt": "x", "colour": 2}})  # fmt: skip
    with pytest.raises(ConfigError, match=r"takes no argument\(s\) colour \(it takes: tools, system_prompt"):
        load_classes(tools=[], environment=env, agent=None)
    no_tools = PluginRef(path="examples.guess_game:GuessEnvironment")
    with pytest.raises(ConfigError, match=r"takes no 'tools' argument, but tools were given"):
        load_classes(tools=["calculator"], environment=no_tools, agent=None)
    wrapper = PluginRef.model_validate({"class": "agentic_rl.rollout.wrapper:ToolAgentEngineWrapper",
                                        "kwargs": {"toolcall_weight": 0.2}})  # fmt: skip
    load_classes(tools=[], environment=None, agent=wrapper)  # a known keyword passes


def test_a_script_style_module_that_exits_at_import_is_a_config_error(tmp_path, monkeypatch):
    """A user's script named in a config: argparse's parse_args() and sys.exit() at its top level raise SystemExit,
    which becomes a ConfigError naming the entry, the path and the fix; the interpreter keeps running."""
    (tmp_path / "argparse_script_env.py").write_text(
        "import argparse\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--episodes', type=int, required=True)\n"
        "args = parser.parse_args(['--no-such-flag'])\n"
        "class Env: ...\n"
    )
    (tmp_path / "exiting_script_env.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"environment 'argparse_script_env:Env': importing module "
                                          r"'argparse_script_env' exited \(SystemExit: 2\): its top level runs a script "
                                          r".*put that code under `if __name__ == \"__main__\":`"):  # fmt: skip
        load_classes(tools=[], environment=PluginRef(path="argparse_script_env:Env"), agent=None)
    with pytest.raises(ConfigError, match=r"tools\[0\] 'exiting_script_env:Tool': .*exited \(SystemExit: 3\)"):
        build_tools(["exiting_script_env:Tool"])


def test_an_interrupt_while_importing_stays_an_interrupt(tmp_path, monkeypatch):
    (tmp_path / "interrupted_plugin_mod.py").write_text("raise KeyboardInterrupt\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        load_object("interrupted_plugin_mod:X", what="environment")
