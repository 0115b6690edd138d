"""`agentic-rl` command line. The only module that configures logging and prints."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["main"]

DEFAULT_DATA = "../shared/data/gsm8k_test.jsonl"
DEFAULT_CORPUS = "../shared/data/corpus.jsonl"
_DTYPE_HELP = "default: bfloat16 on GPUs/NPUs and on CPUs with native bf16 instructions, else float32"
#: The rollout's arguments, recorded in its output folder at start (what `rollout --resume` continues with).
ROLLOUT_ARGS = "args.json"
# Options that say how to run, not what: never recorded, free to differ on --resume.
_UNRECORDED = ("command", "resume", "no_progress", "verbose")
_PATH_OPTIONS = ("model", "data", "corpus", "system_prompt_file")  # recorded absolute where they name a file


def _bounded(kind: type, low: float | None = None, high: float | None = None) -> Any:
    """An argparse type that converts with `kind` and enforces [low, high]."""

    def convert(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if (low is not None and value < low) or (high is not None and value > high):
            lo = "-inf" if low is None else low
            hi = "inf" if high is None else high
            raise argparse.ArgumentTypeError(f"{text} is outside [{lo}, {hi}]")
        return value

    return convert


def _config_command(sub: Any, name: str, help_text: str, config: str, example: str, overrides: str, *,
                    required: bool, resume: str | None = None) -> None:  # fmt: skip
    """A subcommand run from a YAML config (`--config`) with `--set KEY=VALUE` overrides; with `resume` (its help),
    also `--resume RUN_DIR`, which stands instead of `--config` (checked by the command)."""
    p = sub.add_parser(name, help=help_text, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--config", required=required and resume is None, default=None,
                   help=f"YAML file with {config} fields (see {example})")  # fmt: skip
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help=f"override a field, e.g. {overrides} (repeatable)")  # fmt: skip
    if resume is not None:
        p.add_argument("--resume", default=None, metavar="RUN_DIR", help=resume)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("-v", "--verbose", action="store_true")


def _parser(*, typed_only: bool = False) -> argparse.ArgumentParser:
    """The `agentic-rl` parser; with `typed_only`, `rollout` options left out of the command line stay unset (to
    tell which options were given)."""
    from agentic_rl.limits import MaxPromptLength, MaxResponseLength, MaxSteps, NParallelAgents, bounds

    parser = argparse.ArgumentParser(prog="agentic-rl", description="Agentic RL rollouts on a colocated vLLM engine.")
    sub = parser.add_subparsers(dest="command", required=True)
    fmt = argparse.ArgumentDefaultsHelpFormatter
    r = sub.add_parser("rollout", help="run tool-using agents on a task file or dataset and save trajectories",
                       formatter_class=fmt)  # fmt: skip
    options: list[argparse.Action] = []

    def add(*names: str, **settings: Any) -> None:
        options.append(r.add_argument(*names, **settings))

    add("--model", default="smollm2-135m-instruct", help="registry name, local HF folder or hub id")
    add("--data", default=DEFAULT_DATA,
        help="tasks: JSON Lines (GSM8K rows work as they are), parquet (verl's layout works as it is), a datasets "
             "save_to_disk folder, json:FILES / csv:FILES / parquet:FILES (datasets' loaders), or "
             "arithmetic:SPLIT:COUNT[:STEPS]")  # fmt: skip
    add("--data-columns", default=None, metavar="FIELD=COLUMN,...",
        help="which column holds each task field (question, answer or ground_truth, id, system_prompt), e.g. "
             "question=problem,answer=solution; default: GSM8K and verl column names")  # fmt: skip
    add("--limit", type=_bounded(int, 1), default=32, help="use the first N tasks")
    add("--n-parallel", type=_bounded(int, *bounds(NParallelAgents)), default=16, help="trajectories in flight")
    add("--max-steps", type=_bounded(int, *bounds(MaxSteps)), default=3, help="assistant turns per trajectory")
    add("--max-prompt-length", type=_bounded(int, *bounds(MaxPromptLength)), default=2048)
    add("--max-response-length", type=_bounded(int, *bounds(MaxResponseLength)), default=1024,
        help="token budget after the prompt")
    add("--max-tokens", type=_bounded(int, 1), default=384, help="cap of one turn in tokens")
    add("--temperature", type=_bounded(float, 0.0, 2.0), default=0.7)
    add("--top-p", type=_bounded(float, 1e-8, 1.0), default=1.0)
    add("--top-k", type=_bounded(int, -1), default=-1, help="-1 or 0 = off")
    add("--seed", type=int, default=0)
    add("--tools", default="calculator",
        help="comma-separated, from: calculator, search, visit, web_search, web_visit; '' = none")  # fmt: skip
    add("--reward", default="gsm8k",
        help="gsm8k (last number), math (LaTeX answers, e.g. MATH-500), hotpotqa_f1, hotpotqa_em, has_number, "
             "llm_judge (asks the run's own model) or module:function")  # fmt: skip
    add("--system-prompt-file", default=None, help="a text file with the system prompt")
    add("--corpus", default=DEFAULT_CORPUS, help="JSONL corpus {id, title, text} of the local search/visit tools")
    add("--dtype", default=None, choices=["bfloat16", "float16", "float32", "auto"], help=_DTYPE_HELP)
    add("--kv-cache-gib", type=_bounded(float, 0.01), default=1.0, help="KV cache on the CPU, GiB")
    add("--output-dir", default=None, help="default: runs/rollout-<time>")
    add("--resume", default=None, metavar="RUN_DIR",
        help=f"continue an interrupted rollout in RUN_DIR with the arguments it recorded ({ROLLOUT_ARGS}): the tasks "
             "without a record in its trajectories.jsonl run, the summary covers all; other options must equal the "
             "recorded ones (--no-progress and -v may differ)")  # fmt: skip
    add("--no-progress", action="store_true")
    add("-v", "--verbose", action="store_true")
    if typed_only:
        for action in options:
            action.default = argparse.SUPPRESS
    _config_command(sub, "train", "GRPO training: rollout -> train -> weight sync, from a YAML config",
                    "TrainConfig", "examples/train_gsm8k.yaml", "--set steps=2 --set rollout.group_size=4",
                    required=True, resume="continue an interrupted run in RUN_DIR from its newest complete checkpoint, "
                    "with the config it recorded (config.json); instead of --config, and without --set")  # fmt: skip
    _config_command(sub, "sft", "supervised fine-tuning for tool use on synthesized traces, from a YAML config",
                    "SFTConfig", "examples/sft_tools.yaml", "--set steps=10 --set traces=64", required=False)  # fmt: skip
    s = sub.add_parser("serve", help="serve a model over the OpenAI API on 127.0.0.1 (Ctrl-C to stop)",
                       formatter_class=fmt)  # fmt: skip
    s.add_argument("--model", default="smollm2-135m-instruct", help="registry name, local HF folder or hub id")
    s.add_argument("--name", default=None, help="model name clients pass (default: the --model value)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=_bounded(int, 0, 65535), default=8000, help="0 picks a free port")
    s.add_argument("--max-model-len", type=_bounded(int, 16), default=4096)
    s.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32", "auto"], help=_DTYPE_HELP)
    s.add_argument("--kv-cache-gib", type=_bounded(float, 0.01), default=1.0)
    s.add_argument("-v", "--verbose", action="store_true")
    v = sub.add_parser("view", help="write a self-contained HTML page to browse a run's trajectories",
                       formatter_class=fmt)  # fmt: skip
    v.add_argument("run_dir", help="a folder written by 'agentic-rl rollout' or 'agentic-rl train'")
    v.add_argument("--output", default=None, help="the HTML file (default: RUN_DIR/view.html)")
    v.add_argument("--model", default=None, help="tokenizer to decode tokens with (default: the run's model)")
    v.add_argument("--page-size", type=_bounded(int, 1, 10_000), default=100, help="trajectories per list page")
    v.add_argument("-v", "--verbose", action="store_true")
    return parser


def _configure_logging(verbose: bool) -> None:
    from rich.console import Console
    from rich.logging import RichHandler

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO" if verbose else "WARNING")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries results only
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(name)s: %(message)s",
        handlers=[RichHandler(console=Console(stderr=True), show_path=False, rich_tracebacks=True)],
    )
    logging.getLogger("agentic_rl").setLevel(logging.INFO)
    for noisy in ("bm25s", "httpx"):
        logging.getLogger(noisy).setLevel(logging.INFO if verbose else logging.WARNING)


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


def _resumed_rollout_args(args: argparse.Namespace, typed: dict[str, Any]) -> argparse.Namespace:
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
    defaults = vars(_parser().parse_args(["rollout"]))  # for options newer than the record
    wanted = {**_recorded(defaults), **recorded, "output_dir": str(run_dir.resolve())}  # the folder may have moved
    conflicts = [f"--{key.replace('_', '-')} {value!r} (recorded: {wanted.get(key)!r})"
                 for key, value in _recorded(typed).items() if wanted.get(key) != value]  # fmt: skip
    if conflicts:
        raise ConfigError(f"--resume continues {run_dir} with its recorded arguments ({path}); these differ: "
                          f"{', '.join(conflicts)}. Give --resume alone (plus --no-progress / -v)")  # fmt: skip
    return argparse.Namespace(**{**wanted, "output_dir": str(run_dir), "resume": args.resume,
                                 "no_progress": args.no_progress, "verbose": args.verbose})  # fmt: skip


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
        raise ConfigError(f"--output-dir {out_dir} already holds a rollout ({', '.join(earlier)}): continue it with "
                          f"'agentic-rl rollout --resume {out_dir}', or choose another --output-dir")  # fmt: skip


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


def _run_rollout(args: argparse.Namespace, typed: dict[str, Any]) -> int:
    """`agentic-rl rollout`: run the tasks (those without a record when resuming), append each trajectory to
    `trajectories.jsonl` as it finishes, write `summary.json` and print it.

    Returns:
        0, or 1 when every trajectory failed.
    """
    from rich.console import Console

    console = Console()
    plan = _plan_rollout(args, typed)
    spec, model_dir = _start_agent(plan, console)
    trajectories, wall = _generate(plan, spec, console)
    summary = _write_summary(plan, model_dir, trajectories, wall)
    _print_summary(console, plan, summary, wall)
    if summary["failed"] == summary["tasks"]:
        console.print("[red]every trajectory failed; see the errors in trajectories.jsonl")
        return 1
    return 0


def _plan_rollout(args: argparse.Namespace, typed: dict[str, Any]) -> _RolloutPlan:
    """Check everything a user can get wrong (tools, tasks, reward, system prompt, output folder), then make the
    output folder and record the arguments (a new rollout) or read its finished records (resuming).

    Raises:
        ConfigError, FileNotFoundError, OSError: naming the option.
    """
    from agentic_rl.data import load_tasks
    from agentic_rl.errors import ConfigError
    from agentic_rl.rollout.records import finished_records
    from agentic_rl.rollout.rewards import resolve_reward
    from agentic_rl.tools.registry import TOOL_NAMES

    resuming = args.resume is not None
    if resuming:
        args = _resumed_rollout_args(args, typed)
    tool_names = [n.strip() for n in args.tools.split(",") if n.strip()]
    unknown = [n for n in tool_names if n not in TOOL_NAMES]
    if unknown:
        raise ConfigError(f"--tools: unknown tool(s) {', '.join(unknown)}; available: {', '.join(TOOL_NAMES)}")
    tasks = load_tasks(args.data, args.limit, columns=args.data_columns)
    if not tasks:
        raise ConfigError(f"--data {args.data}: no tasks")
    judge = args.reward == "llm_judge"  # asks the run's own engine: set up after initialize()
    reward_fn = resolve_reward("hotpotqa_f1" if judge else args.reward, also=["llm_judge"])
    system_prompt = _read_system_prompt(args.system_prompt_file)
    out_dir = Path(args.output_dir or f"runs/rollout-{time.strftime('%Y%m%d-%H%M%S')}")
    if not resuming:
        _check_fresh_rollout_dir(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    done = finished_records(out_dir / "trajectories.jsonl", tasks) if resuming else {}  # drops a half-written line
    if not resuming:
        _write_json(out_dir / ROLLOUT_ARGS, {"command": "rollout", "args": _recorded({**vars(args),
                                                                                     "output_dir": str(out_dir)})})  # fmt: skip
    return _RolloutPlan(args=args, resuming=resuming, tasks=tasks, done=done,
                        todo=[i for i in range(len(tasks)) if i not in done], tool_names=tool_names,
                        reward_fn=reward_fn, judge=judge, system_prompt=system_prompt, out_dir=out_dir)  # fmt: skip


def _harness_config(args: argparse.Namespace) -> Any:
    """The limits and the typed sampling options of every turn, from the rollout's arguments.

    Raises:
        ConfigError: for a bad combination the argument checks cannot see.
    """
    from agentic_rl.rollout.spec import HarnessConfig

    return HarnessConfig(max_steps=args.max_steps, max_prompt_length=args.max_prompt_length,
                         max_response_length=args.max_response_length, sampling=_sampling_options(args))  # fmt: skip


def _sampling_options(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling options of every turn, from the rollout's arguments."""
    return {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k, "max_tokens": args.max_tokens,
            "seed": args.seed}  # fmt: skip


def _start_agent(plan: _RolloutPlan, console: Any) -> tuple[Any, Path]:
    """The `RolloutSpec` of the built-in tool agent over an engine on the model, started unless no task is left to
    run (then None); with the llm_judge reward, judging with the run's own engine.

    Returns:
        The spec (or None) and the model's folder.
    """
    from transformers import AutoTokenizer

    from agentic_rl.chat import ChatRenderer
    from agentic_rl.models import resolve_model
    from agentic_rl.rollout.agent import start_engine, tool_agent_spec
    from agentic_rl.tools.registry import build_tools

    args = plan.args
    config = _harness_config(args)
    model_dir = resolve_model(args.model)
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(str(model_dir)))
    resumed = f" ({len(plan.done)} done before, resuming {plan.out_dir})" if plan.resuming else ""
    console.print(f"model {model_dir}, {len(plan.tasks)} tasks from {args.data}{resumed}; starting the engine...")
    if not plan.todo:
        return None, model_dir
    options = {**_dtype_option(args), "kv_cache_gib": args.kv_cache_gib, "seed": args.seed}
    engine = start_engine(model_dir, options, max_prompt_length=args.max_prompt_length,
                          max_response_length=args.max_response_length)  # fmt: skip
    reward_fn = plan.reward_fn
    if plan.judge:
        from agentic_rl.engine.chat_client import EngineChatClient
        from agentic_rl.rollout.rewards import LLMJudgeReward

        reward_fn = LLMJudgeReward(client=EngineChatClient(engine, renderer))
    spec = tool_agent_spec(renderer, engine, tools=build_tools(plan.tool_names, corpus=args.corpus), config=config,
                           reward_fn=reward_fn, system_prompt=plan.system_prompt)  # fmt: skip
    return spec, model_dir


def _generate(plan: _RolloutPlan, spec: Any, console: Any) -> tuple[list[Any], float]:
    """Run the tasks left under a progress bar, each trajectory appended to `trajectories.jsonl` as it finishes (an
    interrupted run keeps them); the engine and the tools are closed after.

    Returns:
        The trajectories of this run and its wall-clock seconds (none and 0.0 when no task was left).
    """
    import anyio
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from agentic_rl.rollout.agent import close_tool_agent
    from agentic_rl.rollout.session import Rollout
    from agentic_rl.types import trajectory_to_dict

    records = (plan.out_dir / "trajectories.jsonl").open("a" if plan.resuming else "w", encoding="utf-8")

    def finished(trajectory: Any) -> None:
        records.write(json.dumps(trajectory_to_dict(trajectory), ensure_ascii=False) + "\n")
        records.flush()
        progress.advance(bar)

    async def rollout() -> tuple[list[Any], float]:
        t0 = time.perf_counter()
        try:
            result = await Rollout(spec, n_parallel_agents=plan.args.n_parallel).run(
                [plan.tasks[i] for i in plan.todo], on_result=finished, indices=plan.todo)  # fmt: skip
        finally:
            await close_tool_agent(spec, engine=spec.engine)
        return result.trajectories, time.perf_counter() - t0

    columns = [TextColumn("rollout"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with records, Progress(*columns, console=console, disable=plan.args.no_progress) as progress:
        bar = progress.add_task("rollout", total=len(plan.tasks), completed=len(plan.done))
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
    from agentic_rl.rollout.summary import summarize
    from agentic_rl.types import trajectory_from_dict

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


def _run_train(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from agentic_rl.errors import ConfigError
    from agentic_rl.loop import load_run_config, load_train_config, resume_point, run_training

    if (args.config is None) == (args.resume is None):
        raise ConfigError("give --config FILE for a new run, or --resume RUN_DIR to continue one (not both)")
    if args.resume is not None and args.set:
        raise ConfigError(f"--resume continues {args.resume} with its recorded config; --set cannot change it")
    config = load_run_config(args.resume) if args.resume is not None else load_train_config(args.config, args.set)
    start = resume_point(config) if args.resume is not None else None
    console = Console(stderr=True)
    columns = [
        TextColumn("train"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
    ]
    with Progress(*columns, console=console, disable=args.no_progress) as progress:
        bar = progress.add_task("", total=config.steps, completed=start.step if start is not None else 0)

        def on_step(row: dict[str, Any]) -> None:
            progress.update(bar, advance=1, description=f"reward {row['reward_mean']:.3f} loss {row['loss']:.4f}")

        history = run_training(config, on_step=on_step, resume=args.resume is not None)
    last = history[-1]
    before = start.step if start is not None else 0
    ran = f"trained {_count(len(history) - before, 'step')}" + (f" after {before} done before" if before else "")
    print(f"{ran} into {config.output_dir} ({_count(len(history), 'step')} in all): reward {last['reward_mean']:.3f}, "
          f"weight version {last['weight_version']}, logprob gap {_gap(last['logprob_diff'])}")  # fmt: skip
    return 0


def _gap(value: float | None) -> str:
    return "not measured (no row was trained)" if value is None else f"{value:.2e}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _run_sft(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from agentic_rl.sft import SFTConfig, run_sft

    config = SFTConfig.from_yaml(args.config, args.set)
    columns = [TextColumn("sft"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.description}")]  # fmt: skip
    with Progress(*columns, console=Console(stderr=True), disable=args.no_progress) as progress:
        bar = progress.add_task("synthesizing traces", total=config.steps)

        def on_step(row: dict[str, Any]) -> None:
            progress.update(bar, advance=1, description=f"loss {row['loss']:.3f}")

        manifest = run_sft(config, on_step=on_step)
    families = [manifest["traces"], manifest["traces"].get("research", {})]  # calculator counts, research counts
    kept, dropped = (sum(f.get(key, 0) for f in families) for key in ("kept", "dropped_observation_mismatch"))
    print(f"fine-tuned {config.model} for {_count(config.steps, 'step')} of {config.batch_size} traces, drawn from "
          f"{manifest['trained_traces']} of the {kept} traces built ({dropped} dropped: a tool result disagreed) into "
          f"{config.output_dir}: loss {manifest['first_loss']:.3f} -> {manifest['last_loss']:.3f}, "
          f"{_held_out_text(manifest)} in {manifest['seconds']:.0f} s")  # fmt: skip
    return 0


def _held_out_text(manifest: dict[str, Any]) -> str:
    if not manifest["held_out_traces"]:
        return "no held-out NLL (fewer than 3 traces)"
    return (f"held-out NLL {manifest['held_out_nll_before']:.3f} -> {manifest['held_out_nll_after']:.3f} "
            f"({manifest['held_out_traces']} traces)")  # fmt: skip


def _run_serve(args: argparse.Namespace) -> int:
    import signal
    import threading

    import anyio
    from transformers import AutoTokenizer

    from agentic_rl.engine.vllm_engine import VLLMEngine, VLLMEngineConfig
    from agentic_rl.models import resolve_model
    from agentic_rl.server.group import EngineServers

    model_dir = resolve_model(args.model)
    engine = VLLMEngine(VLLMEngineConfig(model=model_dir, max_model_len=args.max_model_len, **_dtype_option(args),
                                         kv_cache_gib=args.kv_cache_gib))  # fmt: skip
    engine.start_sync()
    name = args.name or args.model
    servers = EngineServers([engine], AutoTokenizer.from_pretrained(str(model_dir)), model_name=name)
    (address,) = servers.start(host=args.host, ports=[args.port])
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"serving {name} on http://{address}/v1", flush=True)
    stop.wait()
    servers.stop()
    anyio.run(engine.close)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `agentic-rl` command.

    Returns:
        0 on success; 2 for a usage error: a bad argument, config value or task file, an unknown model, a missing
        input path (`ConfigError`, `ModelError`, `FileNotFoundError`), one line on stderr; 1 for a failure while
        running (engine, template, I/O, or every trajectory failed); 130 when interrupted.
    """
    from agentic_rl.errors import AgenticRLError, ConfigError, ModelError

    usage_errors = (ConfigError, ModelError, FileNotFoundError, NotADirectoryError, IsADirectoryError)

    args = _parser().parse_args(argv)
    _configure_logging(args.verbose)
    if getattr(args, "no_progress", False):  # the libraries' own bars too (loading and saving weights)
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    try:
        if args.command == "rollout":
            typed = vars(_parser(typed_only=True).parse_args(argv)) if args.resume else {}
            return _run_rollout(args, typed)
        if args.command == "serve":
            return _run_serve(args)
        if args.command == "train":
            return _run_train(args)
        if args.command == "sft":
            return _run_sft(args)
        if args.command == "view":
            from agentic_rl.viewer import build_view

            print(build_view(args.run_dir, output=args.output, model=args.model, page_size=args.page_size))
            return 0
    except (AgenticRLError, OSError, ValueError) as exc:
        hint = ""
        missing = getattr(exc, "filename", None)
        if isinstance(exc, FileNotFoundError) and missing is not None and str(missing) == DEFAULT_DATA \
                and getattr(args, "data", None) == DEFAULT_DATA and not getattr(args, "resume", None):
            hint = " (the default data path is relative: run from the repository root, or pass --data)"
        print(f"agentic-rl {args.command}: error: {exc}{hint}", file=sys.stderr)
        return 2 if isinstance(exc, usage_errors) else 1
    except KeyboardInterrupt:
        print(f"agentic-rl {args.command}: interrupted", file=sys.stderr)
        return 130
    return 2


def _dtype_option(args: argparse.Namespace) -> dict[str, str]:
    """`{"dtype": ...}` when `--dtype` was given; else empty, and the engine takes its platform's default."""
    return {"dtype": args.dtype} if args.dtype else {}


if __name__ == "__main__":
    sys.exit(main())
