"""A training run whose tools come from an MCP server (stdio, `tests/support/mcp_server.py`): the server's tools
are checked before the engine starts and offered in every prompt, and the run trains its steps on the tiny model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from support.processes import cli_command, run
from support.train_runs import write_train_config

SERVER = str(Path(__file__).parents[1] / "support" / "mcp_server.py")


@pytest.mark.slow
def test_a_run_with_an_mcp_servers_tools_trains_two_steps(tmp_path):
    mcp = {"mcp": {"command": [sys.executable, SERVER, "stdio"], "tools": ["add", "count"]}}
    path = write_train_config(tmp_path, steps=2, tools=["calculator", mcp])
    run(cli_command("train", "--config", str(path), "--no-progress"))
    rows = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["trajectories"] == 6 for r in rows)
    assert all(r["logprob_diff"] < 1e-3 for r in rows), rows
    from transformers import AutoTokenizer

    from agentic_rl.models import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model("tiny-random-smollm2")))
    record = json.loads((tmp_path / "run/rollouts/step_1.jsonl").read_text().splitlines()[0])
    prompt = tokenizer.decode(record["prompt_ids"])
    for name in ("calculator", "add", "count"):  # each tool's schema reached the model through the template
        assert f'"name": "{name}"' in prompt, prompt
