"""How long README command 1 takes on a fresh clone with an empty model cache, and whether its model is good.

Clones this checkout's HEAD into a temporary folder, then runs, timed: `bash scripts/setup.sh` (the install; pip's
own download cache is left as it is) and `.venv/bin/agentic-rl rollout --limit 32 --model smollm2-135m-tools` with
`AGENTIC_RL_CACHE` pointing at an empty folder, so the base model is fetched and converted and the tool model is
fine-tuned as on a new machine. Reads the rollout's `summary.json`. Goals: everything within 4 minutes, and the tool
model as good as before (tool-call rate >= 0.95, mean turns >= 2, 0 token-alignment mismatches on the 32 questions).

    .venv/bin/python benchmarks/first_run.py [--keep DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from common import Goal, save, table, verdict

ROOT = Path(__file__).resolve().parent.parent
COMMAND = [".venv/bin/agentic-rl", "rollout", "--limit", "32", "--model", "smollm2-135m-tools", "--no-progress"]


def timed(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, str]:
    """Seconds `command` took and its combined output; raises `CalledProcessError` when it fails."""
    t0 = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
        print(proc.stdout[-3000:], proc.stderr[-3000:])
        raise subprocess.CalledProcessError(proc.returncode, command)
    return time.perf_counter() - t0, proc.stdout + proc.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", default=None, help="clone into this folder and keep it (default: a temporary one)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="first-run-"))
    if work.exists():
        shutil.rmtree(work)
    subprocess.run(["git", "clone", "-q", str(ROOT), str(work)], check=True)
    shared = work.parent / "shared"  # the commands read ../shared/data, as from the checkout
    if not shared.exists():
        shared.symlink_to(ROOT.parent / "shared")
    cache = Path(tempfile.mkdtemp(prefix="first-run-cache-"))
    env = {**os.environ, "AGENTIC_RL_CACHE": str(cache)}
    try:
        setup_s, _ = timed(["bash", "scripts/setup.sh"], work, env)
        run_s, log = timed(COMMAND, work, env)
        summary = json.loads(next((work / "runs").glob("rollout-*/summary.json")).read_text())
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    sft = re.search(r"SFT done in (\d+) s", log)
    results = {
        "setup_s": round(setup_s, 1), "rollout_command_s": round(run_s, 1), "total_s": round(setup_s + run_s, 1),
        "tool_model_sft_s": int(sft.group(1)) if sft else None, "rollout_wall_s": round(summary["wall_time_s"], 1),
        "summary": {k: summary[k] for k in ("tool_call_rate", "mean_turns", "alignment_mismatches", "accuracy", "failed")},
    }  # fmt: skip
    print(table(["set-up s", "command s", "of which SFT s", "rollout s", "total s"],
                [[results["setup_s"], results["rollout_command_s"], results["tool_model_sft_s"],
                  results["rollout_wall_s"], results["total_s"]]]))  # fmt: skip
    goals = [
        Goal("first run (fresh clone, empty model cache)", results["total_s"], "<=", 240.0, " s", digits=0),
        Goal("tool-call rate", summary["tool_call_rate"], ">=", 0.95),
        Goal("mean turns", summary["mean_turns"], ">=", 2.0, digits=2),
        Goal("alignment mismatches", summary["alignment_mismatches"], "<=", 0, digits=0),
    ]
    save("first_run", results, out=args.out, goal=verdict(*goals))


if __name__ == "__main__":
    main()
