"""The `agentic-rl plan` command: whether a model trains on a node, per card, from its `config.json` alone.

It reads a training config (`--config`, else the defaults) with `--set` overrides, then the lever flags, which win;
the model is `--model` (a `config.json`, a folder holding one, or a registry name), else the config's. It prints a
table of the plan (`loop.memory_plan.plan_memory`; the engine's rows per card at `--tensor-parallel-size`, and the
smallest tensor parallelism that holds every agent's whole window where it differs) or, with `--json`, the plan as
JSON.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from agentic_rl.cli.help import DefaultsHelp

__all__ = ["add_plan_parser", "run_plan"]


def add_plan_parser(sub: Any) -> None:
    """The `plan` subcommand's options."""
    p = sub.add_parser(
        "plan",
        help="per-card memory plan of a training run (trainer + engine) from a model's config.json, no weights",
        formatter_class=DefaultsHelp,
    )
    p.add_argument(
        "--model", default=None, help="config.json, a model folder or a registry name (default: the config's)"
    )
    p.add_argument("--gpus", type=int, required=True, help="cards (ranks) the run spreads over")
    p.add_argument("--gpu-memory-gib", type=float, required=True, help="memory of one card in GiB (80, 141, ...)")
    p.add_argument("--platform", choices=["cuda", "npu", "cpu"], default="cuda", help="the cards' kind")
    p.add_argument("--lora", type=int, default=None, metavar="R", help="train a LoRA adapter of rank R")
    p.add_argument("--sharding", choices=["replicate", "fsdp"], default=None)
    p.add_argument("--precision", choices=["fp32", "bf16"], default=None)
    p.add_argument("--activation-checkpointing", action="store_true", default=None)
    p.add_argument("--cpu-offload", action="store_true", default=None, help="brings --sharding fsdp unless given")
    p.add_argument("--max-model-len", type=int, default=None, help="the engine window in tokens")
    p.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=None,
        metavar="T",
        help="cards per engine: groups of T consecutive ranks run one tensor-parallel vLLM engine (default: the "
        "config's engine.tensor_parallel_size)",
    )
    p.add_argument("--config", default=None, help="YAML file with TrainConfig fields (default: the defaults)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field, e.g. optimizer.micro_batch_size=2 or rollout.n_parallel_agents=64",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("-v", "--verbose", action="store_true")


def _overrides(args: argparse.Namespace) -> list[str]:
    """`--set` items, then the lever flags as `--set` items (the flags win)."""
    items = list(args.set)
    if args.lora is not None:
        items.append(f"optimizer.lora.rank={args.lora}")
    if args.cpu_offload:
        items.append("optimizer.cpu_offload=true")
        items.append(f"optimizer.sharding={args.sharding or 'fsdp'}")
    elif args.sharding is not None:
        items.append(f"optimizer.sharding={args.sharding}")
    if args.precision is not None:
        items.append(f"optimizer.precision={args.precision}")
    if args.activation_checkpointing:
        items.append("optimizer.activation_checkpointing=true")
    if args.max_model_len is not None:
        items.append(f"engine.max_model_len={args.max_model_len}")
    if args.tensor_parallel_size is not None:
        items.append(f"engine.tensor_parallel_size={args.tensor_parallel_size}")
    return items


def run_plan(args: argparse.Namespace) -> int:
    """Print the plan; 0 whether it fits or not (the verdict is in the output).

    Raises:
        ConfigError: for a bad config value, flag or model config (one line, exit status 2).
        FileNotFoundError: for a `--config` or `--model` path that does not exist.
        ModelError: for a model name the registry does not know.
    """
    from agentic_rl.loop.config import TrainConfig
    from agentic_rl.loop.memory_plan import ModelShape, plan_for_config

    config = TrainConfig.from_yaml(args.config, _overrides(args))
    shape = ModelShape.load(args.model or config.model)
    plan = plan_for_config(config, shape, gpus=args.gpus, gpu_memory_gib=args.gpu_memory_gib, platform=args.platform)
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        _print_table(plan)
    return 0


_LABELS = {
    "weights": "weights (fp32 master)",
    "optimizer": "AdamW moments",
    "reference": "KL reference",
    "overhead": "framework overhead",
    "gradients": "gradients (fp32)",
    "bf16 weight copies": "bf16 weight copies",
    "activations": "activations",
    "logits": "logits (responses)",
    "fsdp gathered": "FSDP gathered units",
    "gradient all-reduce": "all-reduce buffer",
}


def _print_table(plan: Any) -> None:
    """The plan as a rich table of parts (card and host GiB), then the verdict and the levers."""
    from rich.console import Console
    from rich.table import Table

    t, e = plan.trainer, plan.engine
    console = Console()
    if not console.is_terminal:
        console = Console(width=120)
    levers = ", ".join(plan.levers.on) or "none"
    table = Table(
        title=f"{plan.model}: {plan.parameters / 1e9:.2f} B parameters, {plan.gpus} x {plan.platform} of "
        f"{plan.gpu_memory_gib:g} GiB, levers: {levers}, engine tensor parallel {e.tensor_parallel_size}",
        title_justify="left",
    )
    for column in ("phase", "part", "card GiB", "host GiB", "note"):
        table.add_column(column, justify="right" if "GiB" in column else "left")
    phases = (("trainer, resident", t.resident), ("trainer, step", t.step), ("trainer, fwd/bwd", t.backward))
    for phase, parts in (*phases, ("trainer, after bwd", t.after_backward)):
        for name, gib in parts.items():
            table.add_row(phase, _LABELS.get(name, name), f"{gib:.2f}", _host(t.host.get(name)), _note(plan, name))
    over = t.peak_gib - plan.trainer_budget_gib
    budget = f"budget {plan.trainer_budget_gib:.2f}" + (f", over by {over:.2f}" if over > 0 else "")
    peak = (f"[bold]{t.peak_gib:.2f}", f"{t.host_gib:.2f}", budget)
    table.add_row("[bold]trainer", "[bold]peak", *peak, end_section=True)
    tp = e.tensor_parallel_size
    split = "whole model" if tp == 1 else f"1/{tp} of the model: {tp} cards per engine"
    table.add_row("engine", f"weights ({e.dtype})", f"{e.weights:.2f}", _host(e.host or None), split)
    table.add_row("engine", "activations", f"{e.activations:.2f}", "", "one batch of tokens, the sampler")
    kv = (
        f"what the share leaves: {e.kv_tokens} KV tokens, {e.agents_at_max_model_len} agents at {e.max_model_len} "
        f"({e.n_parallel_agents} set)"
    )
    table.add_row("engine", "KV cache", f"{e.kv_cache:.2f}", "", kv)
    table.add_row("[bold]engine", "[bold]share", f"[bold]{e.share:.2f}", "", f"{e.asleep:.2f} kept in the train step")
    peak = (f"[bold]{plan.card_peak_gib:.2f}", f"{plan.host_gib:.2f}", "train step or rollout, the larger")
    table.add_row("[bold]card", "[bold]peak", *peak, end_section=True)
    console.print(table)
    for line in _verdict(plan):
        console.print(line, highlight=False)


def _host(gib: float | None) -> str:
    return "" if gib is None else f"{gib:.2f}"


def _note(plan: Any, name: str) -> str:
    t = plan.trainer
    if name == "activations":
        return f"full {t.activations_full:.2f}, checkpointed {t.activations_checkpointed:.2f}"
    if name == "reference" and not t.resident["reference"] and not t.host.get("reference"):
        return "none: kl_coef 0 (no track_kl) or LoRA"
    if name == "gradient all-reduce":
        return "instead of the fwd/bwd parts"
    return ""


def _verdict(plan: Any) -> list[str]:
    """The lines under the table: the verdict, the levers, the engine's room and the start-up."""
    e = plan.engine
    lines = [f"verdict: {'fits' if plan.fits else 'does NOT fit'} ({plan.rows} rows x {plan.tokens_per_row} tokens)"]
    if not plan.trainer_fits:
        adding = ", ".join(plan.adding) or "none"
        lines.append(f"  one more lever that makes the trainer fit: {adding}")
    smallest = plan.smallest_fitting
    best = next((o for o in plan.options if o.levers == smallest), None)
    if best is None:
        lines.append("  no set of levers makes the trainer fit: more cards, or shorter rows / micro-batches")
    else:
        lines.append(
            f"  smallest set that fits: {', '.join(best.levers) or 'none'} (trainer {best.trainer_gib:.2f} GiB)"
        )
    if not e.holds_window:
        lines.append(
            f"  the engine's share ({e.share:.2f} GiB) leaves no KV cache for one {e.max_model_len}-token window "
            f"beside its weights ({e.weights:.2f}): raise engine.gpu_memory_utilization or "
            "engine.tensor_parallel_size, or use more card memory"
        )
    elif not e.holds_agents:
        lines.append(f"  {e.n_parallel_agents} agents at {e.max_model_len} tokens exceed the KV cache: vLLM preempts")
    advice = plan.tensor_parallel_advice()
    if advice:
        lines.append(f"  {advice}")
    start = "fits" if plan.startup_fits else "does NOT fit"
    lines.append(f"  start-up (whole fp32 model on each card before sharding): {plan.startup_gib:.2f} GiB, {start}")
    return lines
