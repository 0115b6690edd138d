"""Sharded training (FSDP2) against replicated, 2 gloo ranks on this CPU, measured side by side in one run.

Each part launches two rank processes (this script with `--worker`, torchrun's variables set, `OMP_NUM_THREADS=1`)
once with `GRPOConfig(sharding="replicate")` and once with `sharding="fsdp"`, SmolLM2-135M in float32, under each
allocator of `--allocators`: tcmalloc preloaded (as `agentic-rl train` runs, `cli.preload`) and glibc's malloc.

- `memory`: a `GRPOTrainer` (AdamW) takes `--steps` GRPO steps on synthetic trajectories (per rank `--groups`
  groups of 4, each `--prompt` prompt + `--response` sampled tokens, `--micro-batch-size` 4). Each rank records,
  after every phase (imports, model loaded, trainer built (sharded, when sharding), each step), its RSS, the highest
  RSS a 10 ms sampler saw during the phase, and `ru_maxrss` so far; the phase where `ru_maxrss` reached its final
  value is where the peak happened. Variants (`--variants`): `plain`, the trainer as it is, and `checkpointing`,
  the same model with transformers' activation checkpointing switched on before it is handed to the trainer.
  Goal: peak RSS sharded / replicated <= 0.6 (the larger rank of each).
- `sync`: each rank also runs a real in-process vLLM engine (float32, 0.25 GiB KV cache) and pushes
  `trainer.named_weights()` into it with `VLLMEngine.update_weights` (`--syncs` times, both ranks released together
  by a collective). Before the first sync the trainer takes one step at lr 1e-4, so that its weights differ from
  the engine's. Per sync: wall seconds, and the extra memory, measured: a thread reads RSS every 2 ms during the sync,
  extra = the highest reading - RSS just before. The "bucket" is the largest single parameter (a sharded sync
  gathers one parameter at a time). "read only" times reading `named_weights()` without an engine (a sharded
  trainer's all-gathers alone). Logprob parity: each rank's engine greedily samples 16 tokens for 4 prompts, and the
  trainer's logprobs of those tokens are computed (one forward, a collective when sharded) before the first sync and
  after the last. Goals: sync seconds sharded / replicated <= 1.5x (medians); extra memory <= 2x the bucket (syncs
  after the first: the first allocates the engine's re-packing scratch); parity after the sync <= 1e-4.

    .venv/bin/python benchmarks/sharding.py [--part memory|sync|all] [--quick] [--allocators tcmalloc,glibc]
        [--variants plain,checkpointing] [--steps N] [--syncs N] [--micro-batch-size N] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import Goal, PeakSampler, free_port_pair, peak_rss_bytes, rss_bytes, save, table, verdict

HERE = Path(__file__).resolve()
MB = 1 << 20
MODEL = "smollm2-135m-instruct"
MODES = ("replicate", "fsdp")
PAD = 2
PROMPTS = ["Write a sentence about the sea.", "What is 17 times 3?", "Name three colours.", "Tell me about Paris."]


# ------------------------------------------------------------------------------------------------------ the ranks


class Phases:
    """RSS readings after each phase of a rank's run."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def mark(self, phase: str, sampled_peak: int | None = None, **extra: Any) -> None:
        now = rss_bytes()
        self.rows.append({"phase": phase, "rss_mb": now / MB, "phase_peak_mb": max(sampled_peak or 0, now) / MB,
                          "maxrss_mb": peak_rss_bytes() / MB, **extra})  # fmt: skip
        print(f"[rank {os.environ.get('RANK')}] {phase}: rss {now / MB:.0f} MB, maxrss {peak_rss_bytes() / MB:.0f} MB",
              file=sys.stderr, flush=True)  # fmt: skip

    def run(self, phase: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        with PeakSampler(0.01) as sampler:
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            seconds = time.perf_counter() - t0
        self.mark(phase, sampler.peak, seconds=seconds)
        return out


def trajectory(idx: int, reward: float, task_id: str, prompt: int, response: int) -> Any:
    """One single-turn trajectory of `prompt` + `response` random token ids (seeded by `idx`)."""
    import torch

    from agentic_rl.types import RunRecorder, Step, StepTrajectory

    g = torch.Generator().manual_seed(idx)
    recorder = RunRecorder()
    recorder.start(torch.randint(100, 4000, (prompt,), generator=g).tolist())
    logprobs = (-torch.rand(response, generator=g) * 3).tolist()
    run, span = recorder.sample(torch.randint(100, 4000, (response,), generator=g).tolist(), logprobs, 0)
    return StepTrajectory.from_runs(recorder.runs, idx=idx, trajectory_reward=reward,
                                    steps=[Step(run=run, span=span, reward=reward)], task={"id": task_id},
                                    failed=False)  # fmt: skip


def rank_rows(rank: int, groups: int, prompt: int, response: int) -> list[Any]:
    """This rank's `groups` GRPO groups of 4 trajectories (rewards 1, 0, 0.5, 0: non-zero advantages)."""
    return [trajectory(1000 * rank + 10 * g + j, r, f"r{rank}g{g}", prompt, response)
            for g in range(groups) for j, r in enumerate((1.0, 0.0, 0.5, 0.0))]  # fmt: skip


def build_trainer(model_dir: Path, args: argparse.Namespace, ctx: Any, phases: Phases, lr: float) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    from agentic_rl.train.trainer import GRPOConfig, GRPOTrainer

    model = phases.run("model loaded", AutoModelForCausalLM.from_pretrained, str(model_dir), dtype=torch.float32)
    if args.checkpointing:  # recompute each decoder layer's activations in the backward (transformers' own switch)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    config = GRPOConfig(lr=lr, micro_batch_size=args.micro_batch_size, sharding=args.mode)
    trainer = phases.run("trainer built", GRPOTrainer, model, pad_token_id=PAD, config=config, dist=ctx)
    del model
    return trainer


def state_mb(trainer: Any) -> dict[str, float]:
    """This rank's bytes of parameters and of AdamW's moments (local shards when sharded), in MB."""
    import torch

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    params = sum(local(p).numel() * local(p).element_size() for p in trainer.module.parameters())
    moments = sum(local(v).numel() * local(v).element_size() for state in trainer.optimizer.state.values()
                  for v in state.values() if torch.is_tensor(v) and v.dim())  # fmt: skip
    return {"params_mb": params / MB, "adam_mb": moments / MB}


def memory_worker(args: argparse.Namespace, model_dir: Path, ctx: Any, phases: Phases) -> dict[str, Any]:
    import gc

    trainer = build_trainer(model_dir, args, ctx, phases, lr=1e-6)
    gc.collect()
    rows = rank_rows(ctx.rank, args.groups, args.prompt, args.response)
    losses = []
    for step in range(args.steps):
        stats = phases.run(f"step {step + 1}", trainer.train_step, rows)
        losses.append(stats.as_metrics()["loss"])
    return {"losses": losses, "sharded": trainer.sharded, **state_mb(trainer)}


def _prompt_ids(tokenizer: Any, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=False)  # fmt: skip
    return tokenizer.encode(rendered, add_special_tokens=False)


async def _greedy(engine: Any, prompts: list[list[int]]) -> list[Any]:
    return [await engine.generate(p, {"max_tokens": 16, "temperature": 0.0}) for p in prompts]


def parity(engine: Any, trainer: Any, prompts: list[list[int]]) -> dict[str, float]:
    """Mean and max |engine - trainer| logprob of the engine's greedy tokens. One forward of the whole batch, with
    neither shared-prefix cache nor length buckets (as the trainer's sharded path does), so that both ranks run the
    same number of forwards whatever each engine sampled."""
    import anyio
    import torch

    from agentic_rl.train.loss import response_logprobs
    from agentic_rl.train.packing import pack_trajectories
    from agentic_rl.types import Trajectory

    gens = anyio.run(_greedy, engine, prompts)
    trajs = [Trajectory(prompt_tokens=p, response_tokens=g.token_ids, response_masks=[1] * len(g.token_ids),
                        response_logprobs=g.logprobs, idx=i) for i, (p, g) in enumerate(zip(prompts, gens, strict=True))]  # fmt: skip
    batch = pack_trajectories(trajs, pad_token_id=PAD)
    with torch.no_grad():
        new = response_logprobs(trainer.module, batch, share_prefix=False, bucket=False)
    diff = (new - batch.old_logprobs).abs()[batch.response_mask.bool()]
    return {"mean_abs_diff": float(diff.mean()), "max_abs_diff": float(diff.max()), "tokens": int(diff.numel())}


def sync_worker(args: argparse.Namespace, model_dir: Path, ctx: Any, phases: Phases) -> dict[str, Any]:
    import anyio
    from transformers import AutoTokenizer

    from agentic_rl.engine.vllm_engine import VLLMEngine, VLLMEngineConfig

    engine = VLLMEngine(VLLMEngineConfig(model=model_dir, dtype="float32", max_model_len=1024, kv_cache_gib=0.25))
    phases.run("engine started", engine.start_sync)
    trainer = build_trainer(model_dir, args, ctx, phases, lr=1e-4)
    phases.run("step (lr 1e-4)", trainer.train_step, rank_rows(ctx.rank, 1, 64, 32))
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    prompts = [_prompt_ids(tokenizer, text) for text in PROMPTS]
    before = parity(engine, trainer, prompts)
    bucket = max(p.numel() * p.element_size() for p in trainer.module.parameters())  # DTensor: the global shape
    gather = []
    for _ in range(args.syncs):  # reading the weights alone: the all-gathers of a sharded trainer, nothing loaded
        ctx.allreduce_sum([0.0])
        t0 = time.perf_counter()
        for _name, _tensor in trainer.named_weights():
            pass
        gather.append(time.perf_counter() - t0)
    syncs = []
    for i in range(args.syncs):
        ctx.allreduce_sum([0.0])  # both ranks start the sync together
        start = rss_bytes()
        with PeakSampler(0.002) as sampler:
            t0 = time.perf_counter()
            load_s = anyio.run(engine.update_weights, trainer.named_weights())
            wall = time.perf_counter() - t0
        syncs.append({"wall_s": wall, "engine_load_s": load_s, "rss_before_mb": start / MB,
                      "extra_mb": (sampler.peak - start) / MB, "rss_after_mb": rss_bytes() / MB})  # fmt: skip
        phases.mark(f"sync {i + 1}", sampler.peak, seconds=wall)
    after = parity(engine, trainer, prompts)
    path = engine.last_weight_sync
    # Leave the training group first: closing an in-process engine runs vLLM's `destroy_distributed_environment`,
    # whose `destroy_process_group()` destroys every registered group, the training group included.
    ctx.close()
    anyio.run(engine.close)
    return {"syncs": syncs, "gather_s": gather, "bucket_mb": bucket / MB, "parity_before": before,
            "parity_after": after, "path": path, "sharded": trainer.sharded}  # fmt: skip


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    import transformers  # noqa: F401  (imported before the first reading, as the trainer's modules are)

    import agentic_rl.train.trainer  # noqa: F401
    from agentic_rl.models import resolve_model
    from agentic_rl.train.distributed import init_from_env

    phases = Phases()
    phases.mark("imports")
    ctx = init_from_env("cpu", timeout_s=900)
    model_dir = resolve_model(MODEL)
    run = memory_worker if args.worker == "memory" else sync_worker
    result = run(args, model_dir, ctx, phases)
    ctx.close()  # idempotent: the sync part left already
    final = phases.rows[-1]["maxrss_mb"]
    where = next(r["phase"] for r in phases.rows if r["maxrss_mb"] >= final - 1)
    result.update(rank=ctx.rank, mode=args.mode, phases=phases.rows, peak_mb=final, peak_phase=where)
    Path(args.result).write_text(json.dumps(result, indent=2))


# ------------------------------------------------------------------------------------------------- the launcher


def allocator_preload(name: str) -> str:
    """The `LD_PRELOAD` for an allocator of `--allocators`: tcmalloc as `agentic-rl train` preloads it (`cli.preload`), or ""."""
    if name == "glibc":
        return ""
    from agentic_rl.cli.preload import find_libraries

    found = find_libraries()
    if not found:
        raise SystemExit("tcmalloc (libtcmalloc_minimal.so.4) is not installed: use --allocators glibc")
    return ":".join(found)


def launch(part: str, mode: str, variant: str, preload: str, args: argparse.Namespace,
           folder: Path) -> list[dict[str, Any]]:  # fmt: skip
    """Run the two ranks of `part` with `mode` (and activation checkpointing for that variant), `preload` in
    `LD_PRELOAD`; each rank's result."""
    port = free_port_pair()
    options = ["--steps", str(args.steps), "--syncs", str(args.syncs), "--groups", str(args.groups),
               "--prompt", str(args.prompt), "--response", str(args.response),
               "--micro-batch-size", str(args.micro_batch_size),
               *(["--checkpointing"] if variant == "checkpointing" else [])]  # fmt: skip
    procs, outs = [], []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_LEVEL": "WARNING",
               "LD_PRELOAD": preload}  # fmt: skip
        env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        out = folder / f"{part}-{variant}-{mode}-{rank}-{len(preload)}.json"
        cmd = [sys.executable, str(HERE), "--worker", part, "--mode", mode, "--result", str(out), *options]
        procs.append(subprocess.Popen(cmd, env=env))
        outs.append(out)
    try:
        codes = [p.wait(timeout=args.timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(codes):
        raise SystemExit(f"{part} {variant} {mode} (LD_PRELOAD={preload!r}): rank exit codes {codes}")
    return [json.loads(o.read_text()) for o in outs]


def report_memory(label: str, runs: dict[str, list[dict[str, Any]]]) -> tuple[dict[str, Any], Goal]:
    rows = []
    for mode in MODES:
        for r in runs[mode]:
            at = {p["phase"]: p for p in r["phases"]}
            steps = [p for p in r["phases"] if p["phase"].startswith("step")]
            rows.append((mode, r["rank"], f"{at['imports']['rss_mb']:.0f}", f"{at['model loaded']['rss_mb']:.0f}",
                         f"{at['model loaded']['maxrss_mb']:.0f}", f"{at['trainer built']['rss_mb']:.0f}",
                         f"{r['params_mb'] + r['adam_mb']:.0f}", f"{steps[-1]['rss_mb']:.0f}", f"{r['peak_mb']:.0f}",
                         r["peak_phase"], f"{statistics.median(s['seconds'] for s in steps):.1f}"))  # fmt: skip
    print(f"RSS per rank, MB, {label} (maxrss: ru_maxrss so far; state: parameters + AdamW moments held)")
    print(table(["sharding", "rank", "imports", "model loaded", "maxrss", "trainer built", "state", "after steps",
                 "peak", "peak in", "step s"], rows))  # fmt: skip
    peak = {m: max(r["peak_mb"] for r in runs[m]) for m in MODES}
    after = {m: max(r["phases"][-1]["rss_mb"] for r in runs[m]) for m in MODES}
    load = {m: max(r["phases"][1]["maxrss_mb"] for r in runs[m]) for m in MODES}
    step_s = {m: statistics.median(p["seconds"] for r in runs[m] for p in r["phases"] if p["phase"].startswith("step"))
              for m in MODES}  # fmt: skip
    ratio = peak["fsdp"] / peak["replicate"]
    losses = {m: [loss for r in runs[m] for loss in r["losses"]] for m in MODES}
    loss_diff = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(losses["fsdp"], losses["replicate"], strict=True))
    print(f"{label}: every rank's loss of every step, sharded vs replicated: max relative difference {loss_diff:.1e}")
    print(f"{label}: peak RSS sharded / replicated {peak['fsdp']:.0f} / {peak['replicate']:.0f} MB = {ratio:.3f}; "
          f"after the last step {after['fsdp'] / after['replicate']:.3f}; model load peak {load['fsdp']:.0f} MB; "
          f"step seconds {step_s['fsdp'] / step_s['replicate']:.2f}x")  # fmt: skip
    result = {"runs": runs, "peak_mb": peak, "peak_ratio": ratio, "after_steps_mb": after,
              "after_steps_ratio": after["fsdp"] / after["replicate"], "load_peak_mb": load, "step_s": step_s,
              "loss_max_rel_diff": loss_diff}  # fmt: skip
    return result, Goal(f"peak RSS per rank sharded/replicated ({label})", ratio, "<=", 0.6)


def report_sync(label: str, runs: dict[str, list[dict[str, Any]]]) -> tuple[dict[str, Any], list[Goal]]:
    rows, summary = [], {}
    for mode in MODES:
        for r in runs[mode]:
            later = r["syncs"][1:] or r["syncs"]
            rows.append((mode, r["rank"], f"{statistics.median(s['wall_s'] for s in r['syncs']):.3f}",
                         f"{statistics.median(s['engine_load_s'] for s in r['syncs']):.3f}",
                         f"{statistics.median(r['gather_s']):.3f}",
                         f"{r['syncs'][0]['extra_mb']:.0f}", f"{max(s['extra_mb'] for s in later):.0f}",
                         f"{r['bucket_mb']:.0f}", f"{r['parity_before']['mean_abs_diff']:.2e}",
                         f"{r['parity_after']['mean_abs_diff']:.2e}", f"{r['parity_after']['max_abs_diff']:.2e}"))  # fmt: skip
        summary[mode] = {
            "sync_s": statistics.median(s["wall_s"] for r in runs[mode] for s in r["syncs"]),
            "read_only_s": statistics.median(t for r in runs[mode] for t in r["gather_s"]),
            "extra_first_mb": max(r["syncs"][0]["extra_mb"] for r in runs[mode]),
            "extra_mb": max(s["extra_mb"] for r in runs[mode] for s in (r["syncs"][1:] or r["syncs"])),
            "bucket_mb": runs[mode][0]["bucket_mb"],
            "parity_before": max(r["parity_before"]["mean_abs_diff"] for r in runs[mode]),
            "parity_after": max(r["parity_after"]["mean_abs_diff"] for r in runs[mode]),
        }
    print(f"weight sync per rank, {label} (medians; read only: the weights read, nothing loaded; extra = highest RSS "
          "during a sync - RSS just before it)")  # fmt: skip
    print(table(["sharding", "rank", "sync s", "engine load s", "read only s", "extra 1st MB", "extra later MB", "bucket MB",
                 "parity before", "parity after", "max after"], rows))  # fmt: skip
    for mode in MODES:
        print(f"{mode}: {runs[mode][0]['path']}")
    ratio = summary["fsdp"]["sync_s"] / summary["replicate"]["sync_s"]
    print(f"sync seconds sharded / replicated: {summary['fsdp']['sync_s']:.3f} / {summary['replicate']['sync_s']:.3f}"
          f" = {ratio:.2f}x")  # fmt: skip
    goals = [Goal(f"sync s sharded/replicated ({label})", ratio, "<=", 1.5, "x", 2)]
    for mode in MODES:
        s = summary[mode]
        goals.append(Goal(f"{mode} sync extra/bucket ({label})", s["extra_mb"] / s["bucket_mb"], "<=", 2.0, "x", 2))
        goals.append(Goal(f"{mode} logprob parity after sync ({label})", s["parity_after"], "<=", 1e-4, "", 6))
    return {"runs": runs, "summary": summary, "sync_ratio": ratio}, goals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", default="all", choices=["memory", "sync", "all"])
    parser.add_argument("--quick", action="store_true", help="1 group of 4 per rank, 2 steps, 3 syncs")
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps of the memory part (default 3)")
    parser.add_argument("--syncs", type=int, default=None, help="weight syncs of the sync part (default 5)")
    parser.add_argument("--groups", type=int, default=None, help="groups of 4 trajectories per rank (default 2)")
    parser.add_argument("--prompt", type=int, default=256, help="prompt tokens of each trajectory")
    parser.add_argument("--response", type=int, default=256, help="sampled tokens of each trajectory")
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument(
        "--variants",
        default="plain,checkpointing",
        help="memory part: plain, and/or checkpointing (transformers' activation checkpointing)",
    )
    parser.add_argument(
        "--allocators",
        default="tcmalloc,glibc",
        help="run each part under each: tcmalloc preloaded, as `agentic-rl train` runs, and glibc's malloc",
    )
    parser.add_argument("--timeout", type=float, default=3600, help="seconds for one launch of both ranks")
    parser.add_argument("--out", default=None)
    parser.add_argument("--worker", choices=["memory", "sync"], help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--checkpointing", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.steps = args.steps or (2 if args.quick else 3)
    args.syncs = args.syncs or (3 if args.quick else 5)
    args.groups = args.groups or (1 if args.quick else 2)
    if args.worker:
        worker(args)
        return

    allocators = [a for a in args.allocators.split(",") if a]
    preloads = {a: allocator_preload(a) for a in allocators}
    parts = ["memory", "sync"] if args.part == "all" else [args.part]
    results: dict[str, Any] = {"model": MODEL, "dtype": "float32", "ranks": 2, "allocators": allocators,
                               "steps": args.steps, "syncs": args.syncs, "rows_per_rank": 4 * args.groups,
                               "prompt": args.prompt, "response": args.response,
                               "micro_batch_size": args.micro_batch_size}  # fmt: skip
    goals: list[Goal] = []
    with tempfile.TemporaryDirectory() as tmp:
        for part in parts:
            variants = [v for v in args.variants.split(",") if v] if part == "memory" else ["plain"]
            for allocator in allocators:
                for variant in variants:
                    label = f"{allocator}, {variant}" if part == "memory" else allocator
                    runs = {}
                    for mode in MODES:
                        print(f"== {part}, {label}, {mode}", flush=True)
                        t0 = time.perf_counter()
                        runs[mode] = launch(part, mode, variant, preloads[allocator], args, Path(tmp))
                        print(f"   {time.perf_counter() - t0:.0f} s", flush=True)
                    report, part_goals = (report_memory if part == "memory" else report_sync)(label, runs)
                    results.setdefault(part, {})[label] = report
                    goals += [part_goals] if isinstance(part_goals, Goal) else part_goals
    name = "sharding" if args.part == "all" else f"sharding_{args.part}"
    save(name, results, args.out, args.quick, goal=verdict(*goals, note="2 ranks"))


if __name__ == "__main__":
    main()
