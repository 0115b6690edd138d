"""The `agentic-rl rollout` command end to end, in a subprocess, on the real engine and real GSM8K rows."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from agentic_rl.data import load_tasks


@pytest.mark.slow
def test_rollout_command_writes_trajectories_and_summary(tmp_path, gsm8k_rows, model_dir):
    data = tmp_path / "tasks.jsonl"
    rows = [json.dumps(r) for r in gsm8k_rows[:3]] + [json.dumps({"answer": "#### 3"})]  # last row has no question
    data.write_text("\n".join(rows) + "\n")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "agentic_rl.cli", "rollout", "--model", str(model_dir), "--data", str(data),
           "--limit", "10", "--n-parallel", "4", "--max-tokens", "48", "--max-response-length", "256",
           "--kv-cache-gib", "0.25", "--output-dir", str(out), "--no-progress"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "token-alignment mismatches" in proc.stdout

    lines = (out / "trajectories.jsonl").read_text().splitlines()  # written in completion order
    records = sorted((json.loads(line) for line in lines), key=lambda r: r["idx"])
    assert [r["idx"] for r in records] == [0, 1, 2, 3]
    for r in records[:3]:
        assert not r["failed"], r["error"]
        assert len(r["response_ids"]) == len(r["response_mask"]) == len(r["response_logprobs"]) > 0
        assert r["prompt_ids"] and r["chat_completions"][-1]["role"] == "assistant"
        assert r["termination_reason"] in {"env_done", "truncated", "context_limit", "max_steps"}
        assert r["metrics"]["alignment_mismatches"] == 0
    assert records[3]["failed"] and records[3]["termination_reason"] == "invalid_task"
    assert "question" in records[3]["error"]

    summary = json.loads((out / "summary.json").read_text())
    assert summary["tasks"] == 4 and summary["failed"] == 1
    assert summary["alignment_mismatches"] == 0
    assert summary["generated_tokens"] == sum(sum(r["response_mask"]) for r in records)


def test_load_tasks_maps_gsm8k_rows_and_names_bad_lines(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"question": "q1", "answer": "x #### 5"}\n\n{"id": "a", "question": "q2", "ground_truth": "7"}\n')
    assert load_tasks(path) == [
        {"question": "q1", "answer": "x #### 5", "id": 0, "ground_truth": "x #### 5"},
        {"id": "a", "question": "q2", "ground_truth": "7"},
    ]
    assert len(load_tasks(path, limit=1)) == 1
    path.write_text('{"question": "q1"}\nnot json\n')
    with pytest.raises(ValueError, match=":2: not valid JSON"):
        load_tasks(path)


@pytest.mark.slow
def test_serve_command_answers_on_loopback_and_stops_on_sigterm(model_dir):
    import signal

    import httpx

    proc = subprocess.Popen(
        [sys.executable, "-m", "agentic_rl.cli", "serve", "--model", str(model_dir), "--name", "smol", "--port", "0",
         "--max-model-len", "1024", "--kv-cache-gib", "0.25"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()  # logs go to stderr: the first stdout line is the address
        assert line.startswith("serving smol on http://127.0.0.1:"), line
        url = line.split()[-1]
        r = httpx.post(f"{url}/chat/completions", json={"model": "smol", "messages": [{"role": "user", "content": "hi"}],
                                                        "max_tokens": 4}, timeout=120)  # fmt: skip
        assert r.status_code == 200 and r.json()["choices"][0]["token_ids"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=600) == 0  # a clean exit on SIGTERM; the bound only keeps a hang from blocking CI
    finally:
        proc.kill()


#: What vLLM printed at every engine start on the CPU that says nothing to a user (kept only with -v).
_START_NOISE = ("FutureWarning", "NUMA binding", "LD_PRELOAD", "Triton", "torch.set_num_threads", "Enforce eager",
                "global random seed", "chunked prefill", "Inductor compilation")  # fmt: skip


def _serve_stderr(tmp_path, *flags: str) -> str:
    """Start `agentic-rl serve` on the tiny model, answer one request, stop it; return what it wrote to stderr."""
    import signal

    import httpx

    err = tmp_path / f"stderr{''.join(flags)}.txt"
    with err.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentic_rl.cli", "serve", "--model", "tiny-random-smollm2", "--name", "tiny",
             "--port", "0", "--max-model-len", "256", "--kv-cache-gib", "0.1", *flags],
            stdout=subprocess.PIPE, stderr=stderr, text=True,
        )  # fmt: skip
        try:
            url = proc.stdout.readline().split()[-1]
            r = httpx.post(f"{url}/chat/completions", json={"model": "tiny", "max_tokens": 2,
                           "messages": [{"role": "user", "content": "hi"}]}, timeout=300)  # fmt: skip
            assert r.status_code == 200
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=600) == 0
        finally:
            proc.kill()
    return err.read_text()


@pytest.mark.slow
def test_engine_start_noise_is_kept_for_verbose_only(tmp_path):
    quiet = _serve_stderr(tmp_path)
    assert not [line for line in quiet.splitlines() if any(n in line for n in _START_NOISE)], quiet
    loud = _serve_stderr(tmp_path, "-v")
    assert [line for line in loud.splitlines() if any(n in line for n in _START_NOISE)], loud  # still there with -v
    assert "Passing raw prompts" not in loud, loud  # requests reach vLLM through its renderer, not its deprecated path
    assert "Loading safetensors checkpoint shards" not in quiet and "Loading safetensors checkpoint shards" in loud


@pytest.mark.slow
def test_openai_sdk_example_captures_exact_trajectories():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "examples/openai_agent/gsm8k_openai_agent.py", "--limit", "2"],
                          cwd=root, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("gsm8k-")]
    assert len(lines) == 2
    for line in lines:  # the first turn is forced to a calculator call; later sampled turns may call again or not
        assert "exact=True" in line and "continuous=True" in line
        assert int(re.search(r"tool_calls=(\d+)", line).group(1)) >= 1, line


@pytest.mark.slow
def test_openai_sdk_coding_agent_example_works_in_workspaces_and_captures_exact_trajectories(tmp_path):
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the workspaces' folders: nothing may be left there
    proc = subprocess.run([sys.executable, "examples/openai_agent/humaneval_openai_agent.py", "--limit", "2",
                           "--model", "tiny-random-smollm2", "--max-turns", "2"],
                          cwd=root, capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("HumanEval/")]
    assert [line.split(":")[0] for line in lines] == ["HumanEval/144", "HumanEval/145"]
    for line in lines:  # whatever the random model wrote: one exact run, graded by the hidden test
        assert "exact=True" in line and "runs=1" in line and re.search(r"passed=(True|False)", line), line
    assert list(tmp_path.glob("agentic-rl-workspaces-*"))  # the workspaces were made there,
    assert list(tmp_path.glob("agentic-rl-workspaces-*/*")) == [], "and none was left behind"


def test_out_of_range_options_are_rejected_before_anything_starts(capsys):
    from agentic_rl.cli import main

    for argv in (["--n-parallel", "0"], ["--temperature", "-1"], ["--max-tokens", "0"], ["--max-steps", "20"],
                 ["--max-response-length", "9000"], ["--dtype", "nonsense"]):  # fmt: skip
        with pytest.raises(SystemExit) as info:
            main(["rollout", *argv])
        assert info.value.code == 2
        assert argv[0] in capsys.readouterr().err


def test_the_rollout_options_set_every_harness_field_and_check_the_new_ones(capsys):
    from agentic_rl.cli import main
    from agentic_rl.cli.command import _parser
    from agentic_rl.cli.rollout import _harness_config
    from agentic_rl.rollout.spec import HarnessConfig

    defaults = _harness_config(_parser().parse_args(["rollout"]))
    argv, wanted = ["rollout", "--temperature", "0.5", "--seed", "7"], {}
    for name in HarnessConfig.model_fields.keys() - {"sampling"}:  # each set by the option of its name
        value, flag = getattr(defaults, name), "--" + name.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if not value else "--no-" + flag[2:])
            wanted[name] = not value
        elif isinstance(value, str):  # a choice
            wanted[name] = {"new_run": "refuse"}[value]
            argv += [flag, wanted[name]]
        else:
            wanted[name] = value - 1 if isinstance(value, int) else value + 0.5
            argv += [flag, str(wanted[name])]
    harness = _harness_config(_parser().parse_args(argv))
    assert {name: getattr(harness, name) for name in wanted} == wanted
    assert (harness.sampling.temperature, harness.sampling.seed) == (0.5, 7)
    assert defaults.model_dump(exclude={"sampling", "max_steps", "max_prompt_length", "max_response_length"}) == (
        HarnessConfig().model_dump(exclude={"sampling", "max_steps", "max_prompt_length", "max_response_length"})
    )
    for bad in (["--turn-timeout-s", "0"], ["--close-timeout-s", "-1"], ["--toolcall-weight", "-0.1"]):
        with pytest.raises(SystemExit) as info:
            main(["rollout", *bad])
        assert info.value.code == 2 and bad[0] in capsys.readouterr().err


def test_input_errors_are_one_line_messages_with_exit_code_2(tmp_path, capsys):
    from agentic_rl.cli import main

    assert main(["rollout", "--data", str(tmp_path / "missing.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "No such file" in err and "Traceback" not in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "#### 1"}\n{oops\n')
    assert main(["rollout", "--data", str(bad)]) == 2
    assert "bad.jsonl:2: not valid JSON" in capsys.readouterr().err
    assert main(["rollout", "--data", str(bad), "--tools", "nope"]) == 2


def test_rollout_usage_errors_go_to_stderr_name_their_option_and_leave_no_folder(tmp_path, capsys):
    from agentic_rl.cli import ROLLOUT_ARGS, main

    data = tmp_path / "tasks.jsonl"
    data.write_text('{"question": "q", "answer": "#### 1"}\n')
    out = tmp_path / "run"
    base = ["rollout", "--data", str(data), "--output-dir", str(out)]
    cases = [
        (["--tools", "calculator,nope"], "--tools: unknown tool(s) nope; available: calculator"),
        (["--reward", "nope"], "'llm_judge'"),
        (["--system-prompt-file", str(tmp_path / "none.txt")], "--system-prompt-file"),
        (["--system-prompt-file", str(tmp_path / "latin1.txt")], "not UTF-8 text"),
        # values only the harness config refuses: refused before the output folder is made
        (["--turn-timeout-s", "inf"], "turn_timeout_s"),
        (["--close-timeout-s", "nan"], "close_timeout_s"),
    ]
    (tmp_path / "latin1.txt").write_bytes("Réponds en français.".encode("latin-1"))
    for extra, message in cases:
        assert main([*base, *extra]) == 2
        captured = capsys.readouterr()
        assert message in captured.err and not captured.out, captured
        assert "default data path" not in captured.err  # that hint is for a missing default --data only
        assert not out.exists()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["rollout", "--data", str(empty), "--output-dir", str(out)]) == 2
    assert f"--data {empty}: no tasks" in capsys.readouterr().err
    # a folder that holds an earlier rollout is never written over
    out.mkdir()
    (out / "trajectories.jsonl").write_text('{"idx": 0}\n')
    assert main(base) == 2
    assert f"continue it with 'agentic-rl rollout --resume {out}'" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["trajectories.jsonl"] and not (out / ROLLOUT_ARGS).exists()


def test_rollout_data_options_read_parquet_and_name_missing_columns(tmp_path, capsys, verl_parquet):
    from agentic_rl.cli import main

    path = verl_parquet(tmp_path / "train.parquet", n=2)
    assert main(["rollout", "--data", str(path), "--data-columns", "question=problem"]) == 2
    err = capsys.readouterr().err
    assert "no column 'problem' for the task's 'question' (columns: data_source, ability, prompt," in err
    assert "Traceback" not in err
    assert main(["rollout", "--data", str(path), "--data-columns", "problem"]) == 2
    assert "FIELD=COLUMN" in capsys.readouterr().err


@pytest.mark.slow
def test_rollout_command_runs_verl_parquet_tasks_with_their_system_message(tmp_path, verl_parquet):
    path = verl_parquet(tmp_path / "train.parquet", n=2, system="Reply in one line.")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "agentic_rl.cli", "rollout", "--model", "tiny-random-smollm2", "--data", str(path),
           "--max-steps", "1", "--max-tokens", "8", "--max-response-length", "64", "--kv-cache-gib", "0.1",
           "--dtype", "float32", "--output-dir", str(out), "--no-progress"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    questions = {t["id"]: t["question"] for t in load_tasks(path)}
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert sorted(r["task_id"] for r in records) == [100, 101]  # extra_info.index
    for r in records:
        assert not r["failed"], r["error"]
        system, user = r["chat_completions"][:2]
        assert system["role"] == "system" and system["content"].startswith("Reply in one line.")
        assert "calculator" in system["content"]  # the tools are still described
        assert user == {"role": "user", "content": questions[r["task_id"]]}
    assert json.loads((out / "summary.json").read_text())["data"] == str(path)


@pytest.mark.slow
def test_rollout_killed_half_way_and_mid_line_resumes_with_one_record_per_task(tmp_path, gsm8k_rows):
    """kill -9 once half of the tasks have records (the rest are held in their reward, so the run cannot finish
    first), then leave a half-written line as a kill in the middle of a write would; `--resume` keeps the complete
    records as they are, drops the half line and appends exactly the missing tasks."""
    from support.processes import cli_command, complete_lines, kill9, run, start, wait_until

    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in gsm8k_rows[:8]))
    out, log = tmp_path / "run", tmp_path / "first.log"
    records = out / "trajectories.jsonl"
    proc = start(cli_command("rollout", "--model", "tiny-random-smollm2", "--data", str(data), "--limit", "8",
                             "--n-parallel", "2", "--max-steps", "1", "--max-tokens", "8", "--max-response-length", "32",
                             "--kv-cache-gib", "0.05", "--reward", "support.toy_rewards:e_share_held", "--output-dir", str(out),
                             "--no-progress"), log, TOY_REWARD_HOLD_AFTER="4")  # fmt: skip
    try:
        wait_until(proc, lambda: complete_lines(records) >= 4, what="4 finished trajectories", log=log, timeout_s=400)
        kill9(proc)
    finally:
        proc.kill()
    before = records.read_bytes()
    first = [json.loads(line) for line in before.splitlines()]
    assert len(first) == 4  # rewards 5..8 were held: the run stopped half way
    missing = sorted(set(range(8)) - {r["idx"] for r in first})
    cut = json.dumps({**first[0], "idx": missing[0]}).encode()
    records.write_bytes(before + cut[: len(cut) // 2])  # a record cut off mid-write, no newline

    proc = run(cli_command("rollout", "--resume", str(out), "--no-progress"))
    assert "4 trajectories from before" in proc.stdout
    after = records.read_bytes()
    assert after.startswith(before)  # the complete records are kept byte for byte, the rest appended
    rows = [json.loads(line) for line in after.splitlines()]
    assert sorted(r["idx"] for r in rows) == list(range(8))  # one per task: none lost, none twice
    assert {r["idx"]: r["task_id"] for r in rows} == {i: i for i in range(8)}  # GSM8K rows: id = line number
    assert sorted(r["idx"] for r in rows[4:]) == missing
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["tasks"], summary["resumed"]) == (8, 4)
    assert summary["generated_tokens"] == sum(sum(r["response_mask"]) for r in rows)
    finished = (out / "summary.json").read_bytes()
    run(cli_command("rollout", "--resume", str(out), "--no-progress"))  # nothing left to run
    assert records.read_bytes() == after and (out / "summary.json").read_bytes() == finished  # throughput kept


def test_rollout_resume_takes_the_recorded_arguments_and_rejects_others(tmp_path, capsys):
    from agentic_rl.cli import ROLLOUT_ARGS, main

    run_dir = tmp_path / "run"
    assert main(["rollout", "--resume", str(run_dir)]) == 2
    assert f"{ROLLOUT_ARGS} does not exist" in capsys.readouterr().err
    run_dir.mkdir()
    data = tmp_path / "tasks.jsonl"
    data.write_text('{"question": "q", "answer": "#### 1"}\n')
    (run_dir / ROLLOUT_ARGS).write_text(json.dumps({"command": "rollout", "args": {"data": str(data), "limit": 3}}))
    assert main(["rollout", "--resume", str(run_dir), "--limit", "32", "--temperature", "0.7"]) == 2
    err = capsys.readouterr().err
    assert "--limit 32 (recorded: 3)" in err and "--temperature" not in err  # equal to the recorded default: fine
    assert main(["rollout", "--resume", str(run_dir), "--output-dir", str(tmp_path / "elsewhere")]) == 2
    assert "--output-dir" in capsys.readouterr().err
    (run_dir / "trajectories.jsonl").write_text('{"idx": 0, "task_id": 7}\n')  # checked before any engine starts
    assert main(["rollout", "--resume", str(run_dir), "--limit", "3", "--output-dir", str(run_dir), "-v"]) == 2
    err = capsys.readouterr().err
    assert "task id 7" in err and "the tasks changed since the run started" in err


def test_sft_command_trains_research_and_calculator_traces_and_writes_the_manifest(tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Research the question; answer in <answer></answer>.\n")
    out = tmp_path / "sft"
    cmd = [sys.executable, "-m", "agentic_rl.cli", "sft", "--no-progress", "--set", "model=tiny-random-smollm2",
           "--set", "traces=2", "--set", "research_traces=2", "--set", f"research_system_prompt_file={prompt}",
           "--set", "steps=1", "--set", "batch_size=4", "--set", "micro_batch_size=2", "--set", f"output_dir={out}"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Loading weights" not in proc.stderr and "it/s]" not in proc.stderr  # --no-progress: no library bars
    logged = " ".join(proc.stderr.split())  # the log handler wraps long lines
    assert re.search(r"sft: step 1/1, loss \d+\.\d{3}, \d+:\d\d:\d\d spent, 0:00:00 left", logged), proc.stderr
    assert re.search(r"fine-tuned tiny-random-smollm2 for 1 step of 4 traces, drawn from 3 of the 4 traces built "
                     r"\(0 dropped", proc.stdout), proc.stdout  # fmt: skip
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["traces"]["kept"] == 2 and manifest["traces"]["research"]["kept"] == 2
    assert manifest["config"]["research_traces"] == 2 and (out / "config.json").is_file()
    assert manifest["trained_traces"] == 3 and manifest["held_out_traces"] == 1  # a third of 4 traces held out
    assert manifest["data"].endswith("gsm8k_train.jsonl") and len(manifest["research_data_sha256"]) == 64
    assert manifest["research_system_prompt_file"] == str(prompt)
    assert manifest["corpus"].endswith("corpus.jsonl") and len(manifest["corpus_sha256"]) == 64
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1


def test_sft_command_with_unusable_inputs_exits_2_and_writes_nothing(tmp_path, capsys):
    from agentic_rl.cli import main

    out = tmp_path / "sft"
    argv = ["sft", "--no-progress", "--set", "model=tiny-random-smollm2", "--set", "traces=0", "--set",
            "research_traces=2", "--set", f"research_system_prompt_file={tmp_path / 'missing.txt'}", "--set",
            f"output_dir={out}"]  # fmt: skip
    assert main(argv) == 2
    assert "research_system_prompt_file" in capsys.readouterr().err
    assert not out.exists()  # the output folder is made only once the inputs proved usable
    # a file, or a folder holding an earlier run, as output_dir: refused before any trace is built
    out.write_text("not a folder")
    assert main([*argv[:-1], f"output_dir={out}"]) == 2
    assert f"output_dir {out} is a file" in capsys.readouterr().err
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "manifest.json").write_text("{}")
    assert main([*argv[:-1], f"output_dir={earlier}"]) == 2
    assert "already holds an earlier run or model (manifest.json)" in capsys.readouterr().err
    assert [p.name for p in earlier.iterdir()] == ["manifest.json"]


def test_a_chat_template_the_rollout_cannot_follow_is_refused_before_the_output_folder_exists(tmp_path, capsys,
                                                                                             model_dir):  # fmt: skip
    """Refused (with the hint to follow it as several runs) before `args.json` is written, so the obvious retry with
    `--template-rewrites new_run` into the same folder works."""
    import shutil

    from agentic_rl.cli import main

    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (model_dir / name).exists():
            shutil.copy(model_dir / name, model)
    (model / "chat_template.jinja").write_text(
        '{%- for m in messages %}{%- set c = m.content %}{%- if m.role == "assistant" and not loop.last %}'
        '{%- set c = c.split("</think>")[-1] %}{%- endif %}{{- "<|im_start|>" + m.role + "\\n" + c + "<|im_end|>\\n" }}'
        '{%- endfor %}{%- if add_generation_prompt %}{{- "<|im_start|>assistant\\n" }}{%- endif %}'
    )
    data = tmp_path / "tasks.jsonl"
    data.write_text('{"question": "q", "answer": "#### 1"}\n')
    out = tmp_path / "run"
    argv = ["rollout", "--model", str(model), "--data", str(data), "--output-dir", str(out)]
    assert main([*argv, "--template-rewrites", "refuse"]) == 1  # a template error, not a usage error
    err = capsys.readouterr().err
    assert "<think> blocks of earlier assistant turns" in err and "template_rewrites new_run" in err
    assert not out.exists()


def test_help_shows_defaults_but_never_none(capsys):
    from agentic_rl.cli import main

    for command in ("rollout", "eval", "train", "sft", "serve", "plan", "merge", "view"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = capsys.readouterr().out
        assert "(default: None)" not in text, command
        assert command != "rollout" or "use the first N tasks (default: 32)" in text
