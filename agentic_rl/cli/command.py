"""`agentic-rl`: the parser, logging, and the `train`, `sft`, `merge`, `serve` and `view` commands (the `rollout`
command is in `agentic_rl.cli.rollout`, `eval` in `agentic_rl.cli.eval`, `plan` in `agentic_rl.cli.plan`)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from typing import Any

from agentic_rl.cli.help import DefaultsHelp
from agentic_rl.cli.plan import add_plan_parser, run_plan
from agentic_rl.cli.rollout import ROLLOUT_ARGS, dtype_option

__all__ = ["main"]

DEFAULT_DATA = "../shared/data/gsm8k_test.jsonl"
DEFAULT_CORPUS = "../shared/data/corpus.jsonl"
_DTYPE_HELP = "default: bfloat16 on GPUs/NPUs and on CPUs with native bf16 instructions, else float32"


def _bounded(kind: type, low: float | None = None, high: float | None = None, *, above: bool = False) -> Any:
    """An argparse type that converts with `kind` and enforces [low, high] (with `above`, (low, high])."""

    def convert(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        too_low = low is not None and (value <= low if above else value < low)
        if too_low or (high is not None and value > high):
            lo = "-inf" if low is None else low
            hi = "inf" if high is None else high
            raise argparse.ArgumentTypeError(f"{text} is outside {'(' if above else '['}{lo}, {hi}]")
        return value

    return convert


def _config_command(
    sub: Any,
    name: str,
    help_text: str,
    config: str,
    example: str,
    overrides: str,
    *,
    required: bool,
    resume: str | None = None,
) -> None:
    """A subcommand run from a YAML config (`--config`) with `--set KEY=VALUE` overrides; with `resume` (its help),
    also `--resume RUN_DIR`, which stands instead of `--config` (checked by the command)."""
    p = sub.add_parser(name, help=help_text, formatter_class=DefaultsHelp)
    p.add_argument(
        "--config",
        required=required and resume is None,
        default=None,
        help=f"YAML file with {config} fields (see {example})",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a field, e.g. {overrides} (repeatable)",
    )
    if resume is not None:
        p.add_argument("--resume", default=None, metavar="RUN_DIR", help=resume)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("-v", "--verbose", action="store_true")


def _serve_parser(sub: Any) -> None:
    """The `serve` subcommand's options."""
    s = sub.add_parser(
        "serve",
        help="serve a model over the OpenAI API on 127.0.0.1 (Ctrl-C to stop)",
        formatter_class=DefaultsHelp,
    )
    s.add_argument("--model", default="smollm2-135m-instruct", help="registry name, local HF folder or hub id")
    s.add_argument("--name", default=None, help="model name clients pass (default: the --model value)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=_bounded(int, 0, 65535), default=8000, help="0 picks a free port")
    s.add_argument("--max-model-len", type=_bounded(int, 16), default=4096)
    s.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32", "auto"], help=_DTYPE_HELP)
    s.add_argument("--kv-cache-gib", type=_bounded(float, 0.01), default=1.0)
    s.add_argument(
        "--default",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="defaults",
        help="the server's default for a request field clients leave out, VALUE as JSON (repeatable), e.g. "
        'max_tokens=1024, temperature=1.0, top_k=0 or chat_template_kwargs=\'{"enable_thinking": '
        "false}'; left out: max_tokens 128, temperature 0.2, top_k 50 (a reply lists the defaults it "
        "took)",
    )
    s.add_argument(
        "--max-body-mib",
        type=_bounded(float, 0.001),
        default=8.0,
        help="the largest request body accepted, in MiB (a larger one gets 413)",
    )
    s.add_argument("-v", "--verbose", action="store_true")


def _task_options(add: Any) -> None:
    """The rollout's model, tasks, tools and reward."""
    add("--model", default="smollm2-135m-instruct", help="registry name, local HF folder or hub id")
    add(
        "--data",
        default=DEFAULT_DATA,
        help="tasks: JSON Lines (GSM8K rows work as they are), parquet (verl's layout works as it is), a datasets "
        "save_to_disk folder, json:FILES / csv:FILES / parquet:FILES (datasets' loaders), or "
        "arithmetic:SPLIT:COUNT[:STEPS] or humaneval (coding-workspace tasks); any of them with a row range [START:END]",
    )
    add(
        "--data-columns",
        default=None,
        metavar="FIELD=COLUMN,...",
        help="which column holds each task field (question, answer or ground_truth, id, system_prompt), e.g. "
        "question=problem,answer=solution; default: GSM8K and verl column names",
    )
    add("--limit", type=_bounded(int, 1), default=32, help="use the first N tasks")
    add(
        "--tools",
        default=None,
        help="comma-separated, from: calculator, search, visit, web_search, web_visit; '' = none (default: "
        "calculator; none with --environment, whose tools come with it)",
    )
    add(
        "--environment",
        default=None,
        help="an environment run under the harness instead of the built-in tool agent's: workspace (a private "
        "copy of each task's code base with bash and file tools; use --reward workspace_tests) or "
        "package.module:Class",
    )
    add(
        "--reward",
        default="gsm8k",
        help="gsm8k (last number), math (LaTeX answers, e.g. MATH-500), hotpotqa_f1, hotpotqa_em, "
        "hotpotqa_short_f1, has_number, workspace_tests (a coding task's tests, with --environment workspace), "
        "llm_judge (asks the run's own model) or module:function",
    )
    add("--system-prompt-file", default=None, help="a text file with the system prompt")
    add("--corpus", default=DEFAULT_CORPUS, help="JSONL corpus {id, title, text} of the local search/visit tools")
    add(
        "--mcp",
        action="append",
        default=None,
        metavar="SERVER",
        help="also offer an MCP server's tools (repeatable): a command line ('python server.py', over stdio), a URL "
        "(streamable HTTP), or a JSON object {command|url, tools, timeout_s, start_timeout_s, session, env, cwd}",
    )


def _turn_options(add: Any) -> None:
    """The rollout's limits and sampling options (`HarnessConfig.max_*` and `sampling`)."""
    from agentic_rl.limits import MaxPromptLength, MaxResponseLength, MaxSteps, NParallelAgents, bounds

    add("--n-parallel", type=_bounded(int, *bounds(NParallelAgents)), default=16, help="trajectories in flight")
    add("--max-steps", type=_bounded(int, *bounds(MaxSteps)), default=3, help="assistant turns per trajectory")
    add("--max-prompt-length", type=_bounded(int, *bounds(MaxPromptLength)), default=2048)
    add(
        "--max-response-length",
        type=_bounded(int, *bounds(MaxResponseLength)),
        default=1024,
        help="token budget after the prompt",
    )
    add("--max-tokens", type=_bounded(int, 1), default=384, help="cap of one turn in tokens")
    add("--temperature", type=_bounded(float, 0.0, 2.0), default=0.7)
    add("--top-p", type=_bounded(float, 1e-8, 1.0), default=1.0)
    add("--top-k", type=_bounded(int, -1), default=-1, help="-1 or 0 = off")
    add("--seed", type=int, default=0)


def _harness_options(add: Any) -> None:
    """The rest of `HarnessConfig`, one option per field of the same name (defaults: the harness's own)."""
    from agentic_rl.rollout.spec import HarnessConfig

    harness = HarnessConfig()
    weight = _bounded(float, 0.0)
    seconds = _bounded(float, 0.0, above=True)
    add("--toolcall-weight", type=weight, default=harness.toolcall_weight, help="reward per share of well-formed calls")
    add(
        "--milestone-weight",
        type=weight,
        default=harness.milestone_weight,
        help="step reward for the milestones a task lists, shared among them (0: off)",
    )
    add(
        "--unfinished-penalty",
        type=weight,
        default=harness.unfinished_penalty,
        help="subtracted from the reward of a trajectory a limit cut (0: off)",
    )
    add(
        "--check-alignment",
        action=argparse.BooleanOptionalAction,
        default=harness.check_alignment,
        help="compare each trajectory's ids with a full chat-template re-render",
    )
    add(
        "--template-rewrites",
        choices=("new_run", "refuse"),
        default=harness.template_rewrites,
        help="where the chat template rewrites earlier turns (QwQ, R1 distills): start a new exact run, or refuse",
    )
    add("--turn-timeout-s", type=seconds, default=harness.turn_timeout_s, help="most seconds of one engine request")
    add(
        "--env-timeout-s",
        type=seconds,
        default=harness.env_timeout_s,
        help="most seconds of one environment reset or step",
    )
    add("--close-timeout-s", type=seconds, default=harness.close_timeout_s, help="most seconds of environment.close")
    add("--reward-timeout-s", type=seconds, default=harness.reward_timeout_s, help="most seconds of one reward call")
    add(
        "--max-retries",
        type=_bounded(int, 0),
        default=harness.max_retries,
        help="most times a trajectory that failed outside the policy (engine, a tool's service, an environment call "
        "past its bound, the reward) is rolled out again with a fresh seed",
    )


def _rollout_parser(sub: Any, *, typed_only: bool) -> None:
    """The `rollout` subcommand's options; with `typed_only`, those left out of the command line stay unset."""
    r = sub.add_parser(
        "rollout",
        help="run tool-using agents on a task file or dataset and save trajectories",
        formatter_class=DefaultsHelp,
    )
    options: list[argparse.Action] = []

    def add(*names: str, **settings: Any) -> None:
        options.append(r.add_argument(*names, **settings))

    _task_options(add)
    _turn_options(add)
    _harness_options(add)
    add("--dtype", default=None, choices=["bfloat16", "float16", "float32", "auto"], help=_DTYPE_HELP)
    add("--kv-cache-gib", type=_bounded(float, 0.01), default=1.0, help="KV cache on the CPU, GiB")
    add("--output-dir", default=None, help="default: runs/rollout-<time>")
    add(
        "--resume",
        default=None,
        metavar="RUN_DIR",
        help=f"continue an interrupted rollout in RUN_DIR with the arguments it recorded ({ROLLOUT_ARGS}): the tasks "
        "without a record in its trajectories.jsonl run, the summary covers all; other options must equal the "
        "recorded ones (--no-progress and -v may differ)",
    )
    add("--no-progress", action="store_true")
    add("-v", "--verbose", action="store_true")
    if typed_only:
        for action in options:
            action.default = argparse.SUPPRESS


def _eval_parser(sub: Any) -> None:
    """The `eval` subcommand's options: the rollout's, with `-k/--samples`, `--compare` and `--bootstrap`."""
    e = sub.add_parser(
        "eval",
        help="evaluate a model on tasks: pass@k, avg@K, maj@K over K samples per task (and --compare OTHER)",
        formatter_class=DefaultsHelp,
    )
    add = e.add_argument
    _task_options(add)
    _turn_options(add)
    _harness_options(add)
    add("-k", "--samples", type=_bounded(int, 1), default=4, help="samples per task (K); seeds derived from --seed")
    add("--compare", default=None, metavar="OTHER", help="a second model evaluated on the same tasks and seeds")
    add("--bootstrap", type=_bounded(int, 1), default=1000, help="bootstrap resamples of the paired difference")
    add("--dtype", default=None, choices=["bfloat16", "float16", "float32", "auto"], help=_DTYPE_HELP)
    add("--kv-cache-gib", type=_bounded(float, 0.01), default=1.0, help="KV cache on the CPU, GiB")
    add("--output-dir", default=None, help="default: runs/eval")
    add("--no-progress", action="store_true")
    add("-v", "--verbose", action="store_true")


def _merge_parser(sub: Any) -> None:
    """The `merge` subcommand's options."""
    m = sub.add_parser(
        "merge",
        help="write a plain model folder: a LoRA adapter folded into its base, or a training checkpoint's model",
        formatter_class=DefaultsHelp,
    )
    source = m.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--adapter",
        metavar="DIR",
        help="adapter folder (adapter_config.json + adapter_model.safetensors): a LoRA training "
        "checkpoint, an SFT run's adapter/, or a trainer's save_adapter",
    )
    source.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="a training checkpoint (RUN/checkpoints/step_K or final): sharded (optimizer.sharding fsdp), "
        "replicated, or LoRA (its adapter folded into the base)",
    )
    m.add_argument("--out", required=True, metavar="DIR", help="the model folder to write")
    m.add_argument(
        "--base", default=None, help="with --adapter: base model (default: the adapter's base_model_name_or_path)"
    )
    m.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="saved weights' dtype (auto: the base model's for an adapter, the checkpoint's own (float32) for a "
        "whole model)",
    )
    m.add_argument("-v", "--verbose", action="store_true")


def _view_parser(sub: Any) -> None:
    """The `view` subcommand's options."""
    v = sub.add_parser(
        "view",
        help="write a self-contained HTML page to browse a run's trajectories",
        formatter_class=DefaultsHelp,
    )
    v.add_argument("run_dir", help="a folder written by 'agentic-rl rollout' or 'agentic-rl train'")
    v.add_argument("--output", default=None, help="the HTML file (default: RUN_DIR/view.html)")
    v.add_argument("--model", default=None, help="tokenizer to decode tokens with (default: the run's model)")
    v.add_argument("--page-size", type=_bounded(int, 1, 10_000), default=100, help="trajectories per list page")
    v.add_argument("-v", "--verbose", action="store_true")


def _parser(*, typed_only: bool = False) -> argparse.ArgumentParser:
    """The `agentic-rl` parser; with `typed_only`, `rollout` options left out of the command line stay unset (to
    tell which options were given)."""
    parser = argparse.ArgumentParser(prog="agentic-rl", description="Agentic RL rollouts on a colocated vLLM engine.")
    sub = parser.add_subparsers(dest="command", required=True)
    _rollout_parser(sub, typed_only=typed_only)
    _config_command(
        sub,
        "train",
        "GRPO training: rollout -> train -> weight sync, from a YAML config",
        "TrainConfig",
        "examples/train_gsm8k.yaml",
        "--set steps=2 --set rollout.group_size=4",
        required=True,
        resume="continue an interrupted run in RUN_DIR from its newest complete checkpoint, "
        "with the config it recorded (config.json); instead of --config, and without --set",
    )
    _config_command(
        sub,
        "sft",
        "supervised fine-tuning for tool use on synthesized traces, from a YAML config",
        "SFTConfig",
        "examples/sft_tools.yaml",
        "--set steps=10 --set traces=64",
        required=False,
    )
    _eval_parser(sub)
    _merge_parser(sub)
    add_plan_parser(sub)
    _serve_parser(sub)
    _view_parser(sub)
    return parser


def _configure_logging(verbose: bool) -> None:
    from rich.console import Console
    from rich.logging import RichHandler

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO" if verbose else "WARNING")
    if verbose:  # vLLM's start-up warnings too (dropped otherwise)
        from agentic_rl.engine.load_log import VERBOSE_ENV

        os.environ[VERBOSE_ENV] = "1"
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries results only
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(name)s: %(message)s",
        handlers=[RichHandler(console=Console(stderr=True), show_path=False, rich_tracebacks=True)],
    )
    logging.getLogger("agentic_rl").setLevel(logging.INFO)
    for noisy in ("bm25s", "httpx"):
        logging.getLogger(noisy).setLevel(logging.INFO if verbose else logging.WARNING)


def _step_said(row: dict[str, Any]) -> str:
    """What a training step's progress shows of its metrics row."""
    return f"reward {row['reward_mean']:.3f} loss {row['loss']:.4f}"


def _run_train(args: argparse.Namespace) -> int:
    from agentic_rl.errors import ConfigError
    from agentic_rl.loop import load_run_config, load_train_config, resume_point, run_training
    from agentic_rl.progress import StepProgress

    if (args.config is None) == (args.resume is None):
        raise ConfigError("give --config FILE for a new run, or --resume RUN_DIR to continue one (not both)")
    if args.resume is not None and args.set:
        raise ConfigError(f"--resume continues {args.resume} with its recorded config; --set cannot change it")
    config = load_run_config(args.resume) if args.resume is not None else load_train_config(args.config, args.set)
    start = resume_point(config) if args.resume is not None else None
    done = start.step if start is not None else 0
    main_rank = os.environ.get("RANK", "0") == "0"  # under torchrun, rank 0 speaks for the run
    progress = StepProgress(config.steps, "train", bar=not args.no_progress, done=done, describe=_step_said)
    with progress if main_rank else contextlib.nullcontext():  # a bar on a terminal, else a line with the time left
        history = run_training(config, on_step=progress if main_rank else None, resume=args.resume is not None)
    if not main_rank:
        return 0
    last = history[-1]
    before = start.step if start is not None else 0
    ran = f"trained {_count(len(history) - before, 'step')}" + (f" after {before} done before" if before else "")
    print(
        f"{ran} into {config.output_dir} ({_count(len(history), 'step')} in all): reward {last['reward_mean']:.3f}, "
        f"weight version {last['weight_version']}, logprob gap {_gap(last['logprob_diff'])}"
    )
    return 0


def _gap(value: float | None) -> str:
    return (
        "not measured (no row was computed: every advantage 0, or nothing trained)" if value is None else f"{value:.2e}"
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _run_sft(args: argparse.Namespace) -> int:
    from agentic_rl.loop.sft import SFTConfig, run_sft
    from agentic_rl.progress import StepProgress as SFTProgress

    config = SFTConfig.from_yaml(args.config, args.set)
    with SFTProgress(config.steps, "sft", bar=not args.no_progress) as progress:  # log lines when no bar
        manifest = run_sft(config, on_step=progress)
    families = [manifest["traces"], manifest["traces"].get("research", {})]  # calculator counts, research counts
    kept, dropped = (sum(f.get(key, 0) for f in families) for key in ("kept", "dropped_observation_mismatch"))
    print(
        f"fine-tuned {config.model} for {_count(config.steps, 'step')} of {config.batch_size} traces, drawn from "
        f"{manifest['trained_traces']} of the {kept} traces built ({dropped} dropped: a tool result disagreed) into "
        f"{config.output_dir}: loss {manifest['first_loss']:.3f} -> {manifest['last_loss']:.3f}, "
        f"{_held_out_text(manifest)} in {manifest['seconds']:.0f} s"
    )
    return 0


def _held_out_text(manifest: dict[str, Any]) -> str:
    if not manifest["held_out_traces"]:
        return "no held-out NLL (fewer than 3 traces)"
    return (
        f"held-out NLL {manifest['held_out_nll_before']:.3f} -> {manifest['held_out_nll_after']:.3f} "
        f"({manifest['held_out_traces']} traces)"
    )


def _run_merge(args: argparse.Namespace) -> int:
    from agentic_rl.errors import ConfigError

    if args.checkpoint is not None:
        if args.base is not None:
            raise ConfigError("--base goes with --adapter: a checkpoint names its own model")
        from agentic_rl.train.sharded_checkpoints import merge_checkpoint

        print(f"merged model written to {merge_checkpoint(args.checkpoint, args.out, dtype=args.dtype)}")
        return 0
    from agentic_rl.train.lora import merge_adapter

    print(f"merged model written to {merge_adapter(args.adapter, args.out, base=args.base, dtype=args.dtype)}")
    return 0


def _serve_defaults(pairs: list[str]) -> dict[str, Any]:
    """`--default KEY=VALUE` options as a dict: VALUE read as JSON, else kept as a string.

    Raises:
        ConfigError: for an item without `=`, or a key or value a server default cannot take.
    """
    import json

    from agentic_rl.errors import ConfigError
    from agentic_rl.server.protocol import check_defaults

    defaults: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--default expects KEY=VALUE, got {pair!r}")
        try:
            defaults[key.strip()] = json.loads(text)
        except json.JSONDecodeError:
            defaults[key.strip()] = text
    return check_defaults(defaults)


def _run_serve(args: argparse.Namespace) -> int:
    import threading

    import anyio
    from transformers import AutoTokenizer

    from agentic_rl.engine.vllm_engine import VLLMEngine, VLLMEngineConfig
    from agentic_rl.models import resolve_model
    from agentic_rl.server.group import EngineServers

    defaults = _serve_defaults(args.defaults)
    model_dir = resolve_model(args.model)
    engine = VLLMEngine(
        VLLMEngineConfig(
            model=model_dir, max_model_len=args.max_model_len, **dtype_option(args), kv_cache_gib=args.kv_cache_gib
        )
    )
    engine.start_sync()
    name = args.name or args.model
    servers = EngineServers([engine], AutoTokenizer.from_pretrained(str(model_dir)), model_name=name)
    for serving in servers.servings:
        serving.defaults = defaults
        serving.max_body_bytes = int(args.max_body_mib * 2**20)
    (address,) = servers.start(host=args.host, ports=[args.port])
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"serving {name} on http://{address}/v1", flush=True)
    stop.wait()
    servers.stop()
    anyio.run(engine.close)
    return 0


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


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
    from agentic_rl.loop.sft import register_derived_models

    register_derived_models()  # every command may name smollm2-135m-tools or -research (a model or a merge base)
    if getattr(args, "no_progress", False) or not args.verbose:  # the libraries' bars (loading, saving weights)
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # transformers reads it when it is imported
        if "transformers" in sys.modules:  # imported already: tell it (importing it here would slow `plan`)
            from transformers.utils import logging as transformers_logging

            transformers_logging.disable_progress_bar()
    # SIGTERM (a scheduler's stop, `kill`) ends a command as Ctrl-C does: what it started is closed on the way out
    # (engines, tools, sandboxes and workspaces), where the default would end the process on the spot.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        if args.command == "rollout":
            from agentic_rl.cli.rollout import run_rollout

            typed = vars(_parser(typed_only=True).parse_args(argv)) if args.resume else {}
            return run_rollout(args, typed, defaults=vars(_parser().parse_args(["rollout"])))
        if args.command == "eval":
            from agentic_rl.cli.eval import run_eval

            return run_eval(args)
        if args.command == "serve":
            return _run_serve(args)
        if args.command == "train":
            return _run_train(args)
        if args.command == "sft":
            return _run_sft(args)
        if args.command == "merge":
            return _run_merge(args)
        if args.command == "plan":
            return run_plan(args)
        if args.command == "view":
            from agentic_rl.viewer import build_view

            print(build_view(args.run_dir, output=args.output, model=args.model, page_size=args.page_size))
            return 0
    except (AgenticRLError, OSError, ValueError) as exc:
        hint = ""
        missing = getattr(exc, "filename", None)
        if (
            isinstance(exc, FileNotFoundError)
            and missing is not None
            and str(missing) == DEFAULT_DATA
            and getattr(args, "data", None) == DEFAULT_DATA
            and not getattr(args, "resume", None)
        ):
            hint = " (the default data path is relative: run from the repository root, or pass --data)"
        print(f"agentic-rl {args.command}: error: {exc}{hint}", file=sys.stderr)
        return 2 if isinstance(exc, usage_errors) else 1
    except KeyboardInterrupt:
        print(f"agentic-rl {args.command}: interrupted", file=sys.stderr)
        return 130
    return 2
