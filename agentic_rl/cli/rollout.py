"""The `agentic-rl rollout` command: check the arguments, start the built-in tool agent, run the tasks (each
trajectory written as it finishes), and write and print the summary; `--resume` continues a rollout's folder."""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ROLLOUT_ARGS", "dtype_option", "run_rollout", "run_tasks"]

#: The rollout's arguments, recorded in its output folder at start (what `rollout --resume` continues with).
ROLLOUT_ARGS = "args.json"
# Options that say how to run, not what: never recorded, free to differ on --resume.
_UNRECORDED = ("command", "resume", "no_progress", "verbose")
_PATH_OPTIONS = ("model", "data", "corpus", "system_prompt_file")  # recorded absolute where they name a file


def _recorded(options: dict[str, Any]) -> dict[str, Any]:
    """Rollout options as `args.json` records them: without `_UNRECORDED`, file paths made absolute."""
    out = {key: value for key, value in options.items() if key not in _UNRECORDED}
    for key in _PATH_OPTIONS:
        if isinstance(out.get(key), str) and os.path.exists(out[key]):
            out[key] = str(Path(out[key]).resolve())
    if out.get("output_dir") is not None:
        out["output_dir"] = str(Path(out["output_dir"]).resolve())
    return out


def _write_json(path: Path, value: Any) -> None:
    """Write JSON so that a kill leaves either the old file or the new one (temporary file, then rename)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _resumed_rollout_args(
    args: argparse.Namespace, typed: dict[str, Any], defaults: dict[str, Any]
) -> argparse.Namespace:
    """The arguments recorded in `args.resume`, with this invocation's `--no-progress` and `-v`.

    Raises:
        FileNotFoundError: if the folder has no `args.json`.
        ConfigError: if `args.json` is unreadable, or an option given now differs from the recorded one.
    """
    from agentic_rl.errors import ConfigError

    run_dir = Path(args.resume)
    path = run_dir / ROLLOUT_ARGS
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: --resume takes a folder written by 'agentic-rl rollout'")
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))["args"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path} is not a rollout's recorded arguments: {exc}") from None
    # the parser's defaults stand for options newer than the record; the folder may have moved
    wanted = {**_recorded(defaults), **recorded, "output_dir": str(run_dir.resolve())}
    conflicts = [
        f"--{key.replace('_', '-')} {value!r} (recorded: {wanted.get(key)!r})"
        for key, value in _recorded(typed).items()
        if wanted.get(key) != value
    ]
    if conflicts:
        raise ConfigError(
            f"--resume continues {run_dir} with its recorded arguments ({path}); these differ: "
            f"{', '.join(conflicts)}. Give --resume alone (plus --no-progress / -v)"
        )
    return argparse.Namespace(
        **{
            **wanted,
            "output_dir": str(run_dir),
            "resume": args.resume,
            "no_progress": args.no_progress,
            "verbose": args.verbose,
        }
    )


def _read_system_prompt(path: str | None) -> str | None:
    """The text of `--system-prompt-file` (None without one).

    Raises:
        FileNotFoundError / OSError: naming the option; ConfigError: for a file that is not UTF-8 text.
    """
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise type(exc)(f"--system-prompt-file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        from agentic_rl.errors import ConfigError

        raise ConfigError(f"--system-prompt-file {path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _check_fresh_rollout_dir(out_dir: Path) -> None:
    """A new rollout never writes over an earlier one (`--resume` continues that).

    Raises:
        ConfigError: if `out_dir` is a file or holds a rollout's `args.json` or `trajectories.jsonl`.
    """
    from agentic_rl.errors import ConfigError

    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--output-dir {out_dir} is a file, not a folder")
    earlier = [name for name in (ROLLOUT_ARGS, "trajectories.jsonl") if (out_dir / name).exists()]
    if earlier:
        raise ConfigError(
            f"--output-dir {out_dir} already holds a rollout ({', '.join(earlier)}): continue it with "
            f"'agentic-rl rollout --resume {out_dir}', or choose another --output-dir"
        )


@dataclass(frozen=True, slots=True)
class _RolloutPlan:
    """What `agentic-rl rollout` runs (`_plan_rollout`), checked before any engine starts."""

    args: argparse.Namespace  # resuming: the recorded arguments
    resuming: bool
    tasks: list[dict[str, Any]]
    done: dict[int, dict[str, Any]]  # resuming: the finished records, by task index
    todo: list[int]  # the indices of the tasks to run
    tool_names: list[str]
    reward_fn: Any
    judge: bool  # the llm_judge reward: it asks the run's own engine (`_start_agent`)
    system_prompt: str | None
    out_dir: Path
    harness: Any  # the turn loop's HarnessConfig (`_harness_config`)
    model_dir: Path
    renderer: Any  # the model's ChatRenderer: a template that cannot be followed is refused before the folder exists


def run_rollout(args: argparse.Namespace, typed: dict[str, Any], *, defaults: dict[str, Any]) -> int:
    """`agentic-rl rollout`: run the tasks (those without a record when resuming), append each trajectory to
    `trajectories.jsonl` as it finishes, write `summary.json` and print it.

    Returns:
        0, or 1 when every trajectory failed.
    """
    from rich.console import Console

    console = Console()
    plan = _plan_rollout(args, typed, defaults)
    spec, model_dir = _start_agent(plan, console)
    trajectories, wall = _generate(plan, spec, console)
    summary = _write_summary(plan, model_dir, trajectories, wall)
    _print_summary(console, plan, summary, wall)
    if summary["failed"] == summary["tasks"]:
        console.print("[red]every trajectory failed; see the errors in trajectories.jsonl")
        return 1
    return 0


def _plan_rollout(args: argparse.Namespace, typed: dict[str, Any], defaults: dict[str, Any]) -> _RolloutPlan:
    """Check everything a user can get wrong (tools, tasks, reward, system prompt, output folder), then make the
    output folder and record the arguments (a new rollout) or read its finished records (resuming).

    Raises:
        ConfigError, FileNotFoundError, OSError: naming the option.
    """
    from agentic_rl.data import load_tasks
    from agentic_rl.errors import ConfigError
    from agentic_rl.records import finished_records
    from agentic_rl.rewards.registry import resolve_reward

    resuming = args.resume is not None
    if resuming:
        args = _resumed_rollout_args(args, typed, defaults)
    tool_names = _tool_names(args)  # a malformed --mcp or --environment is refused here too
    tasks = load_tasks(args.data, args.limit, columns=args.data_columns)
    if not tasks:
        raise ConfigError(f"--data {args.data}: no tasks")
    judge = args.reward == "llm_judge"  # asks the run's own engine: set up after initialize()
    reward_fn = resolve_reward("hotpotqa_f1" if judge else args.reward, also=["llm_judge"])
    system_prompt = _read_system_prompt(args.system_prompt_file)
    harness = _harness_config(args)  # refused here, before the output folder exists
    model_dir, renderer = _model_renderer(args)  # so is a chat template that cannot be followed
    out_dir = Path(args.output_dir or f"runs/rollout-{time.strftime('%Y%m%d-%H%M%S')}")
    if not resuming:
        _check_fresh_rollout_dir(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    done = finished_records(out_dir / "trajectories.jsonl", tasks) if resuming else {}  # drops a half-written line
    if not resuming:
        _write_json(
            out_dir / ROLLOUT_ARGS,
            {"command": "rollout", "args": _recorded({**vars(args), "output_dir": str(out_dir)})},
        )
    return _RolloutPlan(
        args=args,
        resuming=resuming,
        tasks=tasks,
        done=done,
        todo=[i for i in range(len(tasks)) if i not in done],
        tool_names=tool_names,
        reward_fn=reward_fn,
        judge=judge,
        system_prompt=system_prompt,
        out_dir=out_dir,
        harness=harness,
        model_dir=model_dir,
        renderer=renderer,
    )


def run_tasks(
    args: argparse.Namespace, tasks: list[dict[str, Any]], out_dir: Path, console: Any
) -> tuple[list[Any], Path]:
    """Run one trajectory per entry of `tasks` (`Trajectory.idx` = its position, which offsets its seed) as
    `agentic-rl rollout` runs tasks: `args`'s model, tools, reward, system prompt, harness and sampling, the same
    engine start; each trajectory appended to `out_dir/trajectories.jsonl` as it finishes, the engine closed after
    (`agentic-rl eval` runs its K samples per task here).

    Returns:
        The trajectories (in the order they finished) and the model's folder.

    Raises:
        ConfigError, ModelError, TemplateError, FileNotFoundError, OSError: as `agentic-rl rollout`, before the
        engine starts.
    """
    from agentic_rl.rewards.registry import resolve_reward

    tool_names = _tool_names(args)  # a malformed --mcp or --environment is refused here too
    judge = args.reward == "llm_judge"
    reward_fn = resolve_reward("hotpotqa_f1" if judge else args.reward, also=["llm_judge"])
    system_prompt = _read_system_prompt(args.system_prompt_file)
    harness = _harness_config(args)
    model_dir, renderer = _model_renderer(args)
    out_dir.mkdir(parents=True, exist_ok=True)
    plan = _RolloutPlan(
        args=args,
        resuming=False,
        tasks=tasks,
        done={},
        todo=list(range(len(tasks))),
        tool_names=tool_names,
        reward_fn=reward_fn,
        judge=judge,
        system_prompt=system_prompt,
        out_dir=out_dir,
        harness=harness,
        model_dir=model_dir,
        renderer=renderer,
    )
    spec, _ = _start_agent(plan, console)
    trajectories, _ = _generate(plan, spec, console)
    return trajectories, model_dir


def _tool_names(args: argparse.Namespace) -> list[str]:
    """The tools `--tools` names (default: calculator; none with `--environment`), with `--mcp` and
    `--environment` checked too (the environment's class is loaded).

    Raises:
        ConfigError: naming the option: an unknown tool, a malformed MCP server, an environment that cannot be
            loaded.
    """
    from agentic_rl.environments.base import Environment
    from agentic_rl.errors import ConfigError
    from agentic_rl.tools.registry import TOOL_NAMES

    given = args.tools if args.tools is not None else ("" if args.environment else "calculator")
    tool_names = [n.strip() for n in given.split(",") if n.strip()]
    unknown = [n for n in tool_names if n not in TOOL_NAMES]
    if unknown:
        raise ConfigError(f"--tools: unknown tool(s) {', '.join(unknown)}; available: {', '.join(TOOL_NAMES)}")
    _mcp_entries(args)
    if args.environment is not None:
        _environment_ref(args).load(what="--environment", base=Environment)
    return tool_names


def _environment_ref(args: argparse.Namespace) -> Any:
    from agentic_rl.plugins import PluginRef

    return PluginRef.model_validate(args.environment)


def _harness_config(args: argparse.Namespace) -> Any:
    """The turn loop's configuration from the rollout's arguments: every `HarnessConfig` field from the option of
    that name (`--max-steps` is `max_steps`, ...), and the sampling options of every turn.

    Raises:
        ConfigError: for a bad combination the argument checks cannot see.
    """
    from agentic_rl.rollout.spec import HarnessConfig

    fields = {name: getattr(args, name) for name in HarnessConfig.model_fields if name != "sampling"}
    return HarnessConfig(**fields, sampling=_sampling_options(args))


def _sampling_options(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling options of every turn, from the rollout's arguments."""
    return {
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "max_tokens": args.max_tokens,
        "seed": args.seed,
    }


def _model_renderer(args: argparse.Namespace) -> tuple[Path, Any]:
    """The model's folder and its `ChatRenderer` (`--template-rewrites` says whether a template that rewrites history
    is followed as several exact runs).

    Raises:
        ModelError: for an unknown model. TemplateError: for a chat template that cannot be followed.
    """
    from transformers import AutoTokenizer

    from agentic_rl.chat import ChatRenderer
    from agentic_rl.models import resolve_model

    model_dir = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return model_dir, ChatRenderer(tokenizer, history_rewrites=args.template_rewrites == "new_run")


def _mcp_entries(args: argparse.Namespace) -> list[Any]:
    """The MCP servers `--mcp` names (`tools.mcp.parse_mcp_option`); ConfigError for a malformed one."""
    from agentic_rl.tools.mcp import parse_mcp_option

    return [parse_mcp_option(text) for text in getattr(args, "mcp", None) or []]


def _close_mcp(tools: list[Any]) -> None:
    """Stop the MCP servers among `tools` (the engine did not start)."""
    from agentic_rl.tools.mcp import MCPTool

    for tool in tools:
        if isinstance(tool, MCPTool):
            tool.connection.close()


def _start_agent(plan: _RolloutPlan, console: Any) -> tuple[Any, Path]:
    """The `RolloutSpec` of the built-in tool agent over an engine on the model, started unless no task is left to
    run (then None); with the llm_judge reward, judging with the run's own engine.

    Returns:
        The spec (or None) and the model's folder.
    """
    from agentic_rl.rollout.agent import start_engine, tool_agent_spec
    from agentic_rl.tools.registry import build_tools

    args, model_dir, renderer = plan.args, plan.model_dir, plan.renderer
    resumed = f" ({len(plan.done)} done before, resuming {plan.out_dir})" if plan.resuming else ""
    console.print(f"model {model_dir}, {len(plan.tasks)} tasks from {args.data}{resumed}; starting the engine...")
    if not plan.todo:
        return None, model_dir
    # built first: an MCP server that does not start fails the run before the engine does
    tools = build_tools([*plan.tool_names, *_mcp_entries(args)], corpus=args.corpus)
    environment = None
    if args.environment is not None:  # built before the engine: a class that refuses its tools fails first
        from agentic_rl.loop.sources import build_environment

        try:
            environment = build_environment(_environment_ref(args), tools, renderer, plan.system_prompt)
        except BaseException:
            _close_mcp(tools)
            raise
    options = {**dtype_option(args), "kv_cache_gib": args.kv_cache_gib, "seed": args.seed}
    try:
        engine = start_engine(
            model_dir, options, max_prompt_length=args.max_prompt_length, max_response_length=args.max_response_length
        )
    except BaseException:
        _close_mcp(tools)
        raise
    reward_fn = plan.reward_fn
    if plan.judge:
        from agentic_rl.rewards.judge import build_judge

        reward_fn = build_judge(engine=engine, renderer=renderer)
    if environment is None:
        spec = tool_agent_spec(
            renderer, engine, tools=tools, config=plan.harness, reward_fn=reward_fn, system_prompt=plan.system_prompt
        )
        return spec, model_dir
    from agentic_rl.rollout.spec import RolloutSpec

    return RolloutSpec(engine, environment, renderer, plan.harness, reward_fn=reward_fn), model_dir


def _generate(plan: _RolloutPlan, spec: Any, console: Any) -> tuple[list[Any], float]:
    """Run the tasks left under a progress bar, each trajectory appended to `trajectories.jsonl` as it finishes (an
    interrupted run keeps them); the engine and the tools are closed after.

    Returns:
        The trajectories of this run and its wall-clock seconds (none and 0.0 when no task was left).
    """
    import anyio

    from agentic_rl.progress import StepProgress
    from agentic_rl.records import trajectory_to_dict
    from agentic_rl.rollout.agent import close_tool_agent
    from agentic_rl.rollout.session import Rollout

    records = (plan.out_dir / "trajectories.jsonl").open("a" if plan.resuming else "w", encoding="utf-8")

    def finished(trajectory: Any) -> None:
        records.write(json.dumps(trajectory_to_dict(trajectory), ensure_ascii=False) + "\n")
        records.flush()
        count[0] += 1
        progress({"done": count[0]})

    async def rollout() -> tuple[list[Any], float]:
        t0 = time.perf_counter()
        try:
            result = await Rollout(spec, n_parallel_agents=plan.args.n_parallel).run(
                [plan.tasks[i] for i in plan.todo], on_result=finished, indices=plan.todo
            )
        finally:
            await close_tool_agent(spec, engine=spec.engine)
        return result.trajectories, time.perf_counter() - t0

    count = [len(plan.done)]
    progress = StepProgress(len(plan.tasks), "rollout", bar=not plan.args.no_progress, console=console, unit="task",
                            done=count[0], describe=None)  # fmt: skip
    with records, progress:  # a bar on a terminal, else a line with the time left every tenth of the tasks
        return anyio.run(rollout, backend_options=_backend_options()) if plan.todo else ([], 0.0)


def _backend_options() -> dict[str, Any]:
    """anyio's asyncio options: uvloop where it is installed."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return {}
    return {"use_uvloop": True}


def _write_summary(plan: _RolloutPlan, model_dir: Path, trajectories: list[Any], wall: float) -> dict[str, Any]:
    """The rollout's `summary.json` over this run's trajectories and the finished records from before, written; a
    finished run resumed keeps its summary (with its throughput)."""
    from agentic_rl.records import trajectory_from_dict
    from agentic_rl.rollout.summary import summarize

    summary_path = plan.out_dir / "summary.json"
    if not plan.todo and summary_path.is_file():
        return json.loads(summary_path.read_text())
    summary = summarize(trajectories, wall, earlier=[trajectory_from_dict(plan.done[i]) for i in sorted(plan.done)])
    summary.update(model=str(model_dir), data=str(plan.args.data), sampling=_sampling_options(plan.args))
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _print_summary(console: Any, plan: _RolloutPlan, summary: dict[str, Any], wall: float) -> None:
    """Print the rollout's summary as a table."""
    from rich.table import Table

    table = Table(title=f"rollout summary ({plan.out_dir})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    before = f" (this run; {len(plan.done)} trajectories from before)" if plan.resuming else ""
    rows = [
        ("tasks", summary["tasks"]),
        ("failed", summary["failed"]),
        ("failed/retried by kind", _by_kind(summary)),
        ("accuracy", f"{summary['accuracy']:.3f}"),
        ("mean reward", f"{summary['mean_reward']:.3f}"),
        ("tool-call rate", f"{summary['tool_call_rate']:.3f}"),
        ("mean turns", f"{summary['mean_turns']:.2f}"),
        ("generated tokens", summary["generated_tokens"]),
        ("generated tokens/s", f"{summary['generated_tokens_per_s']:.1f}"),
        ("llm / env time (s, summed)", f"{summary['llm_time_s']:.1f} / {summary['env_time_s']:.2f}"),
        ("token-alignment mismatches", summary["alignment_mismatches"]),
        ("re-tokenization drift avoided", summary["retokenize_drift"]),
        ("termination", ", ".join(f"{k}={v}" for k, v in sorted(summary["termination_reasons"].items()))),
        ("wall time (s)", f"{wall:.1f}{before}"),
    ]
    for name, value in rows:
        table.add_row(name, str(value))
    console.print(table)


def _by_kind(summary: dict[str, Any]) -> str:
    """`kind=failed/retried` for each failure kind that occurred (`rollout.retries.failure_counts`), or `none`."""
    from agentic_rl.types import FailureKind

    counts = [
        (kind, summary.get(f"failed_{kind}", 0), summary.get(f"retries_{kind}", 0)) for kind in sorted(FailureKind)
    ]
    shown = [f"{kind}={failed}/{retried}" for kind, failed, retried in counts if failed or retried]
    return ", ".join(shown) or "none"


def dtype_option(args: argparse.Namespace) -> dict[str, str]:
    """`{"dtype": ...}` when `--dtype` was given; else empty, and the engine takes its platform's default."""
    return {"dtype": args.dtype} if args.dtype else {}
