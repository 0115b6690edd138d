"""Bounded-staleness training vs lockstep: trained samples per second for k = 0, 1, 2, side by side in one run.

`ContinuousRollout` admits rollout batch s once `steps_done >= s - k` and hands step t its due groups (batches <=
t), then finished groups of later batches; k = 0 is lockstep (roll out the whole batch, train, sync, repeat).
Every case of a part rolls out the same tasks with the same seeds, and every latency is a function of (seed, task,
sample, turn) only, so all k wait the same tool latencies. Tool latency is lognormal, `median * exp(sigma * z)`
with `sigma = ln(p99 / median) / z_0.99` (z_0.99 = 2.326): "slow" median 2 s, p99 20 s (sandboxes, web search);
"fast" median 0.05 s, p99 0.5 s.

**Part A, simulated engine and trainer at scale** (256 agents, 32 tasks x 8 samples per step). A trajectory has 2
to 4 turns of 50 to 250 tokens, with a tool call after every turn but the last. The engine times a turn like
`harness_overhead.SimulatedEngine`: n tokens submitted with c requests in flight take `n * (15 ms + 0.05 ms * c)`
of engine time (continuous batching that slows as the batch grows; 28 ms per token at 256 in flight). A train
step takes 0.15 ms per sampled token of its trajectories plus a 3 s weight sync. With placement `overlap` the
engine keeps generating during the train step and sync (a trainer on its own devices); with `pause` engine time
stands still from the step's start to the end of its sync (in-flight turns resume after it), while tool calls run
on. Every duration is multiplied by a time factor (1/30; 1/60 with `--quick`) so that the run takes minutes.

**Part B, the real engine and trainer on this CPU**: `agentic_rl.loop.run_training` on the small tool model of
`examples/train_arithmetic.yaml` (smollm2-135m-tools, `arithmetic:train:4096:1`, calculator, 2 turns, its sampling
and optimizer), each case in its own process, through `LatencyEnvironment` (below): the calculator environment plus
a tool latency on every step that runs a tool call. 4 tasks x 8 samples per step, 8 steps (`--quick`: 2 x 4, 4
steps, latencies x 1/4); n_parallel_agents = a step's samples, as in part A. The figures come from metrics.jsonl.

Figures, per case: trained samples per second = trajectories trained / total wall of the steps (sum of
`step_seconds`: from the end of one step to the end of the next, the first from the loop's start), and its ratio to
k = 0. Per step: R = time waited for the step's groups (`rollout_seconds`), T = train + sync seconds.

- Part A bound: lockstep takes L = R0 + T0 per step (means at k = 0). With agent slots always busy, a batch needs
  at least R_eff = (agent-seconds of the trajectories trained) / (steps * n_parallel_agents) of rollout wall, so no
  overlap does better than max(R_eff, T) per step: bound = L / max(R_eff, T), R_eff and T from the case's own
  steps (how close the scheduler came, given the trajectories as they ran). Bounded staleness adds a limit of its
  own: batch t is admitted when step t - k - 1 ends and step t trains only once batch t's last group is in (slow
  groups are waited for, never dropped), so k + 1 steps take at least one batch's rollout wall plus one train step:
  `k bound` = L / max(R_eff, T, L / (k + 1)) (optimistic: overlap's fuller batches make each token slower than
  in lockstep).
- Part B bound: on this CPU the engine and the trainer share the cores, so the overlap can only fill cores that
  lockstep leaves unused: while every trajectory in flight waits on a tool (W, measured by `LatencyEnvironment`:
  the engine has nothing to do), and while a step's few last requests or the trainer leave a core idle. A lockstep
  step does C0 CPU-seconds of work (the run's process, all threads: `time.process_time` per step from the end of
  step 1 on; the reward workers' small share is left out), which takes at least C0 / cores on this machine's
  cores, and the loop trains step by step, so a step lasts at least T0: bound = L0 / max(T0, C0 / cores), with
  L0 (mean step seconds), T0 and C0 from the k = 0 run. It is optimistic where the overlap's train step is slower
  for sharing the cores, pessimistic where threads spinning while they wait count CPU time that did no work.

Goals: part A, k = 2 (overlap) >= 2x lockstep with slow tools; part B, k = 1 (overlap) >= 1.5x lockstep with slow
tools and >= 0.8 of the bound at both tool latencies. Part B trains a real model: run it alone, e.g.

    flock /tmp/heavy.lock .venv/bin/python benchmarks/async_training.py [--quick] [--part a|b|ab] [--seed S]
        [--placements overlap,pause] [--runs-dir DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist, mean
from typing import Any

import anyio
from common import Goal, save, table, verdict

from agentic_rl.engine.sampling import SamplingConfig
from agentic_rl.environments.tool_env import ToolEnvironment
from agentic_rl.loop.scheduler import ContinuousRollout

Z99 = NormalDist().inv_cdf(0.99)
TOOLS = {"slow": (2.0, 20.0), "fast": (0.05, 0.5)}  # median and p99 seconds
MODEL = "smollm2-135m-tools"
CORES = os.cpu_count() or 1
CASES = [(0, "overlap"), (1, "overlap"), (2, "overlap"), (1, "pause"), (2, "pause")]

# Part A: the simulated engine, trainer and workload (seconds before the time factor).
AGENTS, TASKS_PER_STEP, GROUP_SIZE = 256, 32, 8
BASE_S, PER_REQUEST_S = 0.015, 0.00005
MIN_TURNS, MAX_TURNS, MIN_TOKENS, MAX_TOKENS = 2, 4, 50, 250
TRAIN_S_PER_TOKEN, SYNC_S = 0.00015, 3.0


@dataclass(frozen=True)
class ToolLatency:
    """Lognormal tool latency in seconds, a function of (seed, key) only: `median_s * exp(sigma * z)`, z ~ N(0, 1)
    seeded by `f"{seed}/{key}"`, sigma = ln(p99_s / median_s) / z_0.99 (p99_s = median_s: always the median)."""

    median_s: float
    p99_s: float
    seed: int = 0

    @property
    def sigma(self) -> float:
        return math.log(self.p99_s / self.median_s) / Z99

    def draw(self, key: str) -> float:
        return self.median_s * math.exp(self.sigma * random.Random(f"tool/{self.seed}/{key}").gauss(0.0, 1.0))


# ---- part B: the environment the real runs use ---------------------------------------------------------------------


class LatencyEnvironment(ToolEnvironment):
    """The tool environment (calculator) with a tool latency: every step that runs a tool call then sleeps
    `ToolLatency(median_s, p99_s, seed).draw(f"{sample.id}/{turn}")` seconds (sample ids are `"{task id}-{index}"`,
    the same for every k; turn = assistant turns so far).

    It also measures the engine's idle time: seconds during which at least one trajectory was open (reset, not
    closed) and every open one was sleeping in a tool call. `aclose` writes `{"idle_s", "tool_s", "tool_calls"}`
    as JSON to `log_path` (None: nowhere).
    """

    def __init__(self, tools: list[Any], *, median_s: float, p99_s: float, seed: int = 0, log_path: str | None = None,
                 tools_in_system_prompt: bool = True) -> None:  # fmt: skip
        super().__init__(tools, tools_in_system_prompt=tools_in_system_prompt)
        self.latency = ToolLatency(median_s, p99_s, seed)
        self.log_path = log_path
        self._open: set[str] = set()
        self._waiting = 0
        self._since = time.perf_counter()
        self.idle_s = self.tool_s = 0.0
        self.tool_calls = 0

    def _mark(self) -> None:
        """Account the time since the last change of the open/waiting counts."""
        now = time.perf_counter()
        if self._open and self._waiting == len(self._open):
            self.idle_s += now - self._since
        self._since = now

    async def reset(self, request: dict[str, Any]) -> Any:
        sample = await super().reset(request)
        self._mark()
        self._open.add(sample.id)
        return sample

    async def step(self, sample: Any) -> Any:
        result = await super().step(sample)
        if result.info.get("tool_calls"):
            turn = sum(m["role"] == "assistant" for m in sample.messages)
            seconds = self.latency.draw(f"{sample.id}/{turn}")
            self._mark()
            self._waiting += 1
            try:
                await anyio.sleep(seconds)
            finally:
                self._mark()
                self._waiting -= 1
            self.tool_s += seconds
            self.tool_calls += 1
        return result

    async def close(self, sample: Any) -> None:
        await super().close(sample)
        if sample.id in self._open:
            self._mark()
            self._open.discard(sample.id)

    async def aclose(self) -> None:
        await super().aclose()
        if self.log_path:
            Path(self.log_path).write_text(json.dumps({"idle_s": self.idle_s, "tool_s": self.tool_s,
                                                       "tool_calls": self.tool_calls}))  # fmt: skip


# ---- part A: simulated engine, trainer and rollout -----------------------------------------------------------------


class PausableEngine:
    """The timing of `harness_overhead.SimulatedEngine` on a clock that stands still while paused: a turn of n
    tokens submitted with c requests in flight (itself included) ends after `n * (base_s + per_request_s * c)`
    seconds of engine time; engine time = wall time minus the time spent paused."""

    def __init__(self, base_s: float, per_request_s: float) -> None:
        self.base_s, self.per_request_s = base_s, per_request_s
        self.in_flight = 0
        self._paused_at: float | None = None
        self._paused_s = 0.0
        self._resumed = anyio.Event()

    def token_latency(self, concurrency: int) -> float:
        return self.base_s + self.per_request_s * concurrency

    def _engine_time(self) -> float:
        now = anyio.current_time()
        return now - self._paused_s - (now - self._paused_at if self._paused_at is not None else 0.0)

    async def decode(self, n_tokens: int) -> None:
        """Generate one turn of `n_tokens` tokens (returns when its engine time has passed)."""
        self.in_flight += 1
        try:
            done_at = self._engine_time() + n_tokens * self.token_latency(self.in_flight)
            while (left := done_at - self._engine_time()) > 0:
                if self._paused_at is not None:
                    await self._resumed.wait()
                else:
                    await anyio.sleep(left)
        finally:
            self.in_flight -= 1

    def pause(self) -> None:
        self._paused_at = anyio.current_time()
        self._resumed = anyio.Event()

    def resume(self) -> None:
        assert self._paused_at is not None
        self._paused_s += anyio.current_time() - self._paused_at
        self._paused_at = None
        self._resumed.set()


@dataclass(slots=True)
class SimTrajectory:
    """A simulated trajectory: sampled tokens, the weight version (steps done) it started at, seconds it held an
    agent slot."""

    tokens: int
    version: int
    seconds: float
    failed: bool = False


@dataclass
class SimulatedRollout:
    """`ContinuousRollout`'s `run`: one trajectory of task `id`, sample j (its index mod the group size). Turns and
    tokens per turn are drawn from (seed, task, sample), tool latencies from (seed, task, sample, turn)."""

    engine: PausableEngine
    tools: ToolLatency
    scale: float
    seed: int
    feed: ContinuousRollout | None = field(default=None, init=False)

    async def run(
        self, tasks: list[dict[str, Any]], sampling: SamplingConfig, indices: list[int]
    ) -> list[SimTrajectory]:
        assert self.feed is not None and len(tasks) == 1
        key = f"{tasks[0]['id']}/{indices[0] % GROUP_SIZE}"
        draws = random.Random(f"trajectory/{self.seed}/{key}")
        turns = draws.randint(MIN_TURNS, MAX_TURNS)
        version, t0, tokens = self.feed.steps_done, anyio.current_time(), 0
        for turn in range(turns):
            n = draws.randint(MIN_TOKENS, MAX_TOKENS)
            await self.engine.decode(n)
            tokens += n
            if turn + 1 < turns:
                await anyio.sleep(self.tools.draw(f"{key}/{turn}") * self.scale)
        return [SimTrajectory(tokens, version, anyio.current_time() - t0)]


async def simulate(tools: str, k: int, placement: str, steps: int, scale: float, seed: int) -> list[dict[str, Any]]:
    """One simulated training run: `steps` steps under staleness bound k; one row per step (seconds unscaled)."""
    engine = PausableEngine(BASE_S * scale, PER_REQUEST_S * scale)
    sim = SimulatedRollout(engine, ToolLatency(*TOOLS[tools], seed), scale, seed)
    ids = iter(range(1 << 30))
    sim.feed = feed = ContinuousRollout(
        run=sim.run, next_batch=lambda: [{"id": next(ids)} for _ in range(TASKS_PER_STEP)],
        sampling=lambda batch: SamplingConfig(seed=batch), group_size=GROUP_SIZE, groups_per_step=TASKS_PER_STEP,
        max_staleness=k, n_parallel_agents=AGENTS, last_step=steps,
    )  # fmt: skip
    rows = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(feed.serve)
        mark = anyio.current_time()
        for step in range(steps):
            t0 = anyio.current_time()
            trajectories = [t for g in await feed.next_step(step) for t in g.trajectories]
            t1 = anyio.current_time()
            tokens = sum(t.tokens for t in trajectories)
            if placement == "pause":
                engine.pause()
            await anyio.sleep(tokens * TRAIN_S_PER_TOKEN * scale)
            t2 = anyio.current_time()
            await anyio.sleep(SYNC_S * scale)
            if placement == "pause":
                engine.resume()
            feed.step_done()
            t3 = anyio.current_time()
            lags = [step - t.version for t in trajectories]
            assert 0 <= min(lags) and max(lags) <= k, (step, lags)
            rows.append({"rollout_s": (t1 - t0) / scale, "train_s": (t2 - t1) / scale, "sync_s": (t3 - t2) / scale,
                         "step_s": (t3 - mark) / scale, "trajectories": len(trajectories), "tokens": tokens,
                         "agent_s": sum(t.seconds for t in trajectories) / scale, "max_lag": max(lags),
                         "mean_lag": mean(lags)})  # fmt: skip
            mark = t3
        tg.cancel_scope.cancel()
    return rows


def summarize(rows: list[dict[str, Any]], agents: float | None = None) -> dict[str, Any]:
    """Samples per second and mean phase times of one case's step rows (`rollout_s`, `train_s`, `sync_s`,
    `step_s`, `trajectories`; `agent_s` too when `agents` is given: R_eff)."""
    wall = sum(r["step_s"] for r in rows)
    out = {"steps": len(rows), "trajectories": sum(r["trajectories"] for r in rows), "wall_s": wall,
           "rollout_s": mean(r["rollout_s"] for r in rows), "train_s": mean(r["train_s"] for r in rows),
           "sync_s": mean(r["sync_s"] for r in rows), "step_s": wall / len(rows)}  # fmt: skip
    out["samples_per_s"] = out["trajectories"] / wall
    out["train_sync_s"] = out["train_s"] + out["sync_s"]
    if agents:
        out["r_eff_s"] = sum(r["agent_s"] for r in rows) / (len(rows) * agents)
        out["max_lag"] = max(r["max_lag"] for r in rows)
    return out


def part_a(quick: bool, seed: int) -> list[dict[str, Any]]:
    """Every (tools, k, placement) case of part A, with its ratio to k = 0 and its bound (module docstring)."""
    steps, scale = (6, 1 / 60) if quick else (12, 1 / 30)
    results = []
    for tools in TOOLS:
        for k, placement in CASES:
            t0 = time.perf_counter()
            rows = anyio.run(simulate, tools, k, placement, steps, scale, seed, backend_options={"use_uvloop": True})
            case = {
                "part": "A",
                "tools": tools,
                "k": k,
                "placement": placement,
                **summarize(rows, AGENTS),
                "rows": rows,
            }
            lock = next(r for r in results if r["tools"] == tools and r["k"] == 0) if k else case
            lockstep_step = lock["rollout_s"] + lock["train_sync_s"]
            case["ratio"] = case["samples_per_s"] / lock["samples_per_s"]
            case["bound"] = lockstep_step / max(case["r_eff_s"], case["train_sync_s"])
            case["k_bound"] = lockstep_step / max(case["r_eff_s"], case["train_sync_s"], lockstep_step / (k + 1))
            case["of_bound"] = case["ratio"] / case["bound"]
            results.append(case)
            print(f"A {tools} tools k={k} {placement}: {case['samples_per_s']:.2f} samples/s, {case['ratio']:.2f}x, "
                  f"bound {case['bound']:.2f}x ({time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
    return results


# ---- part B: real runs ---------------------------------------------------------------------------------------------


def train_config(tools: str, k: int, placement: str, quick: bool, seed: int, out_dir: Path) -> dict[str, Any]:
    """The `TrainConfig` fields of one part B case: `examples/train_arithmetic.yaml`'s model, data and optimizer,
    `LatencyEnvironment` over the calculator (latency x 1/4 with `quick`), n_parallel_agents = a step's samples."""
    median_s, p99_s = (x * (0.25 if quick else 1.0) for x in TOOLS[tools])
    tasks_per_step, group_size, steps = (2, 4, 4) if quick else (4, 8, 8)
    latency = {"median_s": median_s, "p99_s": p99_s, "seed": seed, "log_path": str(out_dir / "latency.json")}
    return {
        "model": MODEL, "data": "arithmetic:train:4096:1", "tools": ["calculator"], "reward": "gsm8k",
        "environment": {"class": "benchmarks.async_training:LatencyEnvironment", "kwargs": latency},
        "output_dir": str(out_dir), "steps": steps, "seed": seed, "loggers": ["jsonl"],
        "rollout": {"tasks_per_step": tasks_per_step, "group_size": group_size,
                    "n_parallel_agents": tasks_per_step * group_size, "max_steps": 2, "max_prompt_length": 1024,
                    "max_response_length": 512, "sampling": {"temperature": 0.7, "max_tokens": 160},
                    "toolcall_weight": 0.0, "max_staleness": k, "placement": placement},
        "engine": {"dtype": "float32", "kv_cache_gib": 0.5},
        "optimizer": {"lr": 2.0e-5, "clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.0, "loss_agg_mode": "token-mean",
                      "micro_batch_size": 8},
    }  # fmt: skip


def train_case(config_path: str) -> None:
    """Run one part B case (in its own process): `run_training` on the config JSON at `config_path`, then write
    `clock.json` into its output folder: after each step, wall seconds (`time.perf_counter`) and the CPU seconds
    of this process, every thread counted (`time.process_time`: the in-process engine, the trainer, the harness)."""
    from agentic_rl.loop import TrainConfig, run_training

    config = TrainConfig.model_validate(json.loads(Path(config_path).read_text()))
    marks: list[dict[str, float]] = []
    run_training(config, on_step=lambda row: marks.append({"wall": time.perf_counter(), "cpu": time.process_time()}))
    (Path(config.output_dir) / "clock.json").write_text(json.dumps(marks))


def read_run(out_dir: Path) -> dict[str, Any]:
    """A finished part B run's figures (`summarize` of its metrics.jsonl), the engine's idle seconds per step
    (`LatencyEnvironment`), its CPU seconds per step (`clock.json`) and the trained tokens by weight-version lag."""
    metrics = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    metrics = [m for m in metrics if "step_seconds" in m]
    rows = [{"rollout_s": m["rollout_seconds"], "train_s": m["train_seconds"], "sync_s": m["sync_seconds"],
             "step_s": m["step_seconds"], "trajectories": m["trajectories"]} for m in metrics]  # fmt: skip
    latency = json.loads((out_dir / "latency.json").read_text())
    clock = json.loads((out_dir / "clock.json").read_text())  # CPU per step from the end of step 1 on
    cpu_s = (clock[-1]["cpu"] - clock[0]["cpu"]) / max(len(clock) - 1, 1)
    lags: dict[str, int] = {}
    for m in metrics:
        for key, value in m.items():
            if key.startswith("tokens_lag_"):
                lags[key.removeprefix("tokens_")] = lags.get(key.removeprefix("tokens_"), 0) + int(value or 0)
    return {**summarize(rows), "idle_s": latency["idle_s"] / len(rows), "cpu_s": cpu_s,
            "tool_calls": latency["tool_calls"], "tool_s": latency["tool_s"], "tokens_by": lags, "rows": metrics}  # fmt: skip


def part_b(quick: bool, seed: int, placements: list[str], runs_dir: Path) -> list[dict[str, Any]]:
    """Every (tools, k, placement) case of part B, each `run_training` in its own process, with its ratio to
    k = 0 and the bound of the module docstring."""
    from agentic_rl.models import resolve_model

    resolve_model(MODEL)  # built once, before any case's clock starts (a derived model is fine-tuned on first use)
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH")])
    )
    results = []
    for tools in TOOLS:
        for k, placement in [c for c in CASES if c[0] == 0 or c[1] in placements]:
            out_dir = runs_dir / f"{tools}-k{k}-{placement}"
            out_dir.mkdir(parents=True)
            config = out_dir.parent / f"{out_dir.name}.json"
            config.write_text(json.dumps(train_config(tools, k, placement, quick, seed, out_dir)))
            t0 = time.perf_counter()
            subprocess.run([sys.executable, __file__, "--train-config", str(config)], check=True, env=env,
                           cwd=Path(__file__).resolve().parent.parent)  # fmt: skip
            case = {"part": "B", "tools": tools, "k": k, "placement": placement, **read_run(out_dir),
                    "process_s": time.perf_counter() - t0}  # fmt: skip
            lock = next(r for r in results if r["tools"] == tools and r["k"] == 0) if k else case
            case["ratio"] = case["samples_per_s"] / lock["samples_per_s"]
            case["bound"] = lock["step_s"] / max(lock["train_sync_s"], lock["cpu_s"] / CORES)
            case["of_bound"] = case["ratio"] / case["bound"]
            results.append(case)
            print(f"B {tools} tools k={k} {placement}: {case['samples_per_s']:.3f} samples/s, {case['ratio']:.2f}x, "
                  f"bound {case['bound']:.2f}x ({case['process_s']:.0f} s)", flush=True)  # fmt: skip
    return results


# ---- the report ----------------------------------------------------------------------------------------------------


def report(cases: list[dict[str, Any]]) -> str:
    """The table of every case (seconds per step: R rollout wait, T train + sync, R_eff (A) or idle W (B))."""
    headers = ["part", "tools", "k", "placement", "steps", "samples", "samples/s", "vs k=0", "R s", "T s",
               "R_eff|W s", "CPU s", "step s", "bound", "of bound", "k bound"]  # fmt: skip
    rows = [(c["part"], c["tools"], c["k"], c["placement"], c["steps"], c["trajectories"], f"{c['samples_per_s']:.3f}",
             f"{c['ratio']:.2f}x", f"{c['rollout_s']:.2f}", f"{c['train_sync_s']:.2f}",
             f"{c.get('r_eff_s', c.get('idle_s', math.nan)):.2f}", f"{c['cpu_s']:.1f}" if "cpu_s" in c else "-",
             f"{c['step_s']:.2f}", f"{c['bound']:.2f}x",
             f"{c['of_bound']:.2f}" if c["k"] else "-", f"{c['k_bound']:.2f}x" if "k_bound" in c else "-")
            for c in cases]  # fmt: skip
    return table(headers, rows)


def goals(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[Goal]:
    """Part A: k = 2 (overlap) >= 2x lockstep with slow tools. Part B: k = 1 (overlap) >= 1.5x lockstep with slow
    tools, and >= 0.8 of the bound at every tool latency."""

    def case(cases: list[dict[str, Any]], tools: str, k: int) -> dict[str, Any]:
        return next(c for c in cases if c["tools"] == tools and c["k"] == k and c["placement"] == "overlap")

    out = []
    if a:
        out.append(Goal("A: k=2 / k=0 samples/s, slow tools", case(a, "slow", 2)["ratio"], ">=", 2.0, "x", 2))
    if b:
        out.append(Goal("B: k=1 / k=0 samples/s, slow tools", case(b, "slow", 1)["ratio"], ">=", 1.5, "x", 2))
        out += [
            Goal(f"B: k=1 of bound, {tools} tools", case(b, tools, 1)["of_bound"], ">=", 0.8, "", 2) for tools in TOOLS
        ]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps, smaller batches, latency scaled down")
    parser.add_argument("--part", choices=["a", "b", "ab"], default="ab")
    parser.add_argument(
        "--placements",
        default=None,
        help="part B placements of k >= 1, comma-separated (default overlap,pause; --quick: overlap)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs-dir", default=None, help="part B run folders (default: a temporary folder)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--train-config", default=None, help=argparse.SUPPRESS)  # one part B case, in its own process
    args = parser.parse_args()
    if args.train_config:
        return train_case(args.train_config)
    a = part_a(args.quick, args.seed) if "a" in args.part else []
    b = []
    if "b" in args.part:
        with tempfile.TemporaryDirectory(prefix="async-training-") as tmp:
            placements = (args.placements or ("overlap" if args.quick else "overlap,pause")).split(",")
            b = part_b(args.quick, args.seed, placements, Path(args.runs_dir or tmp))
    print(f"bounded-staleness training vs lockstep, seed {args.seed}: A = simulated, {AGENTS} agents, "
          f"{TASKS_PER_STEP} x {GROUP_SIZE} samples per step; B = run_training on this machine")  # fmt: skip
    print(report(a + b))
    goal = verdict(*goals(a, b), note="" if b else "part B not run")
    save(
        "async_training", {"seed": args.seed, "tools": TOOLS, "part_a": a, "part_b": b}, args.out, args.quick, goal=goal
    )


if __name__ == "__main__":
    main()
