"""`agentic-rl` command line. The only module that configures logging and prints."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["load_tasks", "main"]

DEFAULT_DATA = "../shared/data/gsm8k_test.jsonl"
TOOLS = ("calculator",)


def load_tasks(path: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
    """Read tasks from JSONL: each row becomes `{"id", "question", "ground_truth", ...}`.

    `ground_truth` is taken from a `ground_truth` field, else from `answer` (GSM8K); `id` defaults to the row
    number. Rows are not validated here: a malformed row becomes a failed trajectory with a clear error.

    Raises:
        FileNotFoundError: if `path` does not exist.
        ValueError: naming the line, if a line is not JSON.
    """
    tasks: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and len(tasks) >= limit:
                break
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON: {exc.msg}") from exc
            if isinstance(row, dict):
                row = dict(row)
                row.setdefault("id", lineno - 1)
                if "ground_truth" not in row and "answer" in row:
                    row["ground_truth"] = row["answer"]
            tasks.append(row)
    return tasks


def _build_tools(names: list[str]) -> list[Any]:
    from agentic_rl.tools.calculator import CalculatorTool

    factories = {"calculator": CalculatorTool}
    return [factories[name]() for name in names]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentic-rl", description="Agentic RL rollouts on a colocated vLLM engine.")
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("rollout", help="run tool-using agents on a JSONL task file and save trajectories")
    r.add_argument("--model", default="smollm2-135m-instruct", help="registry name, local HF folder or hub id")
    r.add_argument("--data", default=DEFAULT_DATA, help="JSONL tasks (GSM8K rows work as they are)")
    r.add_argument("--limit", type=int, default=32, help="use the first N tasks")
    r.add_argument("--n-parallel", type=int, default=16, help="trajectories in flight (1-64)")
    r.add_argument("--max-steps", type=int, default=3, help="assistant turns per trajectory (1-10)")
    r.add_argument("--max-prompt-length", type=int, default=2048)
    r.add_argument("--max-response-length", type=int, default=1024, help="token budget after the prompt (1-8192)")
    r.add_argument("--max-tokens", type=int, default=384, help="cap of one turn in tokens")
    r.add_argument("--temperature", type=float, default=0.7)
    r.add_argument("--top-p", type=float, default=1.0)
    r.add_argument("--top-k", type=int, default=-1)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--tools", default="calculator", help=f"comma-separated, from: {', '.join(TOOLS)}")
    r.add_argument("--dtype", default="bfloat16")
    r.add_argument("--kv-cache-gib", type=float, default=1.0, help="KV cache on the CPU, GiB")
    r.add_argument("--output-dir", default=None, help="default: runs/rollout-<time>")
    r.add_argument("--no-progress", action="store_true")
    r.add_argument("-v", "--verbose", action="store_true")
    s = sub.add_parser("serve", help="serve a model over the OpenAI API on 127.0.0.1 (Ctrl-C to stop)")
    s.add_argument("--model", default="smollm2-135m-instruct", help="registry name, local HF folder or hub id")
    s.add_argument("--name", default=None, help="model name clients pass (default: the --model value)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    s.add_argument("--max-model-len", type=int, default=4096)
    s.add_argument("--dtype", default="bfloat16")
    s.add_argument("--kv-cache-gib", type=float, default=1.0)
    s.add_argument("-v", "--verbose", action="store_true")
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


def _run_rollout(args: argparse.Namespace) -> int:
    import anyio
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table
    from transformers import AutoTokenizer

    from agentic_rl.models import resolve_model
    from agentic_rl.rollout.summary import summarize, trajectory_to_dict
    from agentic_rl.rollout.wrapper import ToolAgentEngineWrapper

    console = Console()
    tool_names = [n.strip() for n in args.tools.split(",") if n.strip()]
    unknown = [n for n in tool_names if n not in TOOLS]
    if unknown:
        console.print(f"[red]unknown tool(s): {', '.join(unknown)}; available: {', '.join(TOOLS)}")
        return 2
    tasks = load_tasks(args.data, args.limit)
    if not tasks:
        console.print(f"[red]no tasks in {args.data}")
        return 2
    model_dir = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    sampling = {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
                "max_tokens": args.max_tokens, "seed": args.seed}  # fmt: skip
    wrapper = ToolAgentEngineWrapper(
        "cli_agent", tokenizer, sampling, args.max_prompt_length, args.max_response_length, args.n_parallel,
        args.max_steps, model=model_dir, tools=_build_tools(tool_names),
        engine_options={"dtype": args.dtype, "kv_cache_gib": args.kv_cache_gib, "seed": args.seed}, serve=False,
    )  # fmt: skip
    console.print(f"model {model_dir}, {len(tasks)} tasks from {args.data}; starting the engine...")
    wrapper.initialize()
    out_dir = Path(args.output_dir or f"runs/rollout-{time.strftime('%Y%m%d-%H%M%S')}")
    out_dir.mkdir(parents=True, exist_ok=True)

    async def rollout() -> tuple[list[Any], float]:
        columns = [TextColumn("rollout"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
        with Progress(*columns, console=console, disable=args.no_progress) as progress:
            bar = progress.add_task("rollout", total=len(tasks))
            t0 = time.perf_counter()
            try:
                trajectories = await wrapper.generate_agent_trajectories_async(
                    tasks, on_result=lambda _: progress.advance(bar)
                )
            finally:
                await wrapper.close()
            return trajectories, time.perf_counter() - t0

    try:
        import uvloop  # noqa: F401

        backend_options = {"use_uvloop": True}
    except ImportError:
        backend_options = {}
    trajectories, wall = anyio.run(rollout, backend_options=backend_options)
    with (out_dir / "trajectories.jsonl").open("w", encoding="utf-8") as f:
        for trajectory in trajectories:
            f.write(json.dumps(trajectory_to_dict(trajectory), ensure_ascii=False) + "\n")
    summary = summarize(trajectories, wall)
    summary.update(model=str(model_dir), data=str(args.data), sampling=sampling)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    table = Table(title=f"rollout summary ({out_dir})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("tasks", summary["tasks"]),
        ("failed", summary["failed"]),
        ("accuracy", f"{summary['accuracy']:.3f}"),
        ("tool-call rate", f"{summary['tool_call_rate']:.3f}"),
        ("mean turns", f"{summary['mean_turns']:.2f}"),
        ("generated tokens", summary["generated_tokens"]),
        ("generated tokens/s", f"{summary['generated_tokens_per_s']:.1f}"),
        ("llm / env time (s, summed)", f"{summary['llm_time_s']:.1f} / {summary['env_time_s']:.2f}"),
        ("token-alignment mismatches", summary["alignment_mismatches"]),
        ("re-tokenization drift avoided", summary["retokenize_drift"]),
        ("termination", ", ".join(f"{k}={v}" for k, v in sorted(summary["termination_reasons"].items()))),
        ("wall time (s)", f"{wall:.1f}"),
    ]
    for name, value in rows:
        table.add_row(name, str(value))
    console.print(table)
    return 0


def _run_serve(args: argparse.Namespace) -> int:
    import signal
    import threading

    import anyio
    from transformers import AutoTokenizer

    from agentic_rl.engine.vllm_engine import VLLMEngine, VLLMEngineConfig
    from agentic_rl.models import resolve_model
    from agentic_rl.server.app import create_app
    from agentic_rl.server.serving import OpenAIServing
    from agentic_rl.server.thread import ServerThread

    model_dir = resolve_model(args.model)
    engine = VLLMEngine(VLLMEngineConfig(model=model_dir, max_model_len=args.max_model_len, dtype=args.dtype,
                                         kv_cache_gib=args.kv_cache_gib))  # fmt: skip
    engine.start_sync()
    serving = OpenAIServing(engine, AutoTokenizer.from_pretrained(str(model_dir)), model_name=args.name or args.model)
    server = ServerThread(create_app(serving), host=args.host, port=args.port)
    server.start()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"serving {serving.model_name} on http://{server.address}/v1", flush=True)
    stop.wait()
    server.stop()
    anyio.run(engine.close)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `agentic-rl` command."""
    args = _parser().parse_args(argv)
    _configure_logging(args.verbose)
    if args.command == "rollout":
        return _run_rollout(args)
    if args.command == "serve":
        return _run_serve(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
