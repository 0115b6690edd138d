"""Run folder -> viewer data and page, on records tokenized by the real SmolLM2 tokenizer."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from agentic_rl.errors import ConfigError
from agentic_rl.viewer import build_view, find_trajectory_files, load_trajectories, run_model, view_records


def _embedded(page: str) -> dict:
    match = re.search(r'<script type="application/json" id="run-data">(.*?)</script>', page, re.DOTALL)
    assert match is not None
    return json.loads(match.group(1))


def test_turns_split_sampled_and_inserted_tokens_and_decode_to_the_chat_text(make_record, tokenizer):
    record = make_record()
    data = view_records([record], tokenizer)
    (traj,) = data["trajectories"]
    pieces = data["pieces"]
    assert traj["n_turns"] == 2 and traj["reason"] == "env_done" and not traj["truncated"]
    first, second = traj["turns"]
    text = lambda idx: "".join(pieces[i] for i in idx)  # noqa: E731
    assert text(first["tok"]) == record["chat_completions"][1]["content"] + "<|im_end|>"
    assert text(first["env"]) == "\n<|im_start|>tool\n391<|im_end|>\n<|im_start|>assistant\n"
    assert text(second["tok"]) == "The answer is 391.<|im_end|>" and second["env"] == []
    n1 = len(first["tok"])
    assert first["lp"] == pytest.approx(record["response_logprobs"][:n1])
    assert first["calls"] == [{"name": "calculator", "arguments": {"expression": "17 * 23"}}]
    assert first["results"] == [{"role": "tool", "content": "391"}]
    assert first["info"]["llm_time_s"] == 0.25 and second["reward"] == 1.0
    assert traj["generated"] == sum(record["response_mask"])
    assert traj["prompt"].startswith("<|im_start|>user\nWhat is 17 * 23?")


def test_a_character_split_over_byte_tokens_shows_on_the_token_that_completes_it(make_record, tokenizer):
    record = make_record(answer="日本語 is 391.")
    data = view_records([record], tokenizer)
    second = data["trajectories"][0]["turns"][1]
    pieces = [data["pieces"][i] for i in second["tok"]]
    assert "".join(pieces) == "日本語 is 391.<|im_end|>"
    assert len(pieces) == len(tokenizer.encode("日本語 is 391.", add_special_tokens=False)) + 1
    assert "" in pieces  # byte tokens of an unfinished character add no text of their own


def test_page_embeds_every_trajectory_of_a_train_run_by_step_and_escapes_markup(make_record, tokenizer, write_run, tmp_path, model_dir):
    run = tmp_path / "train"
    write_run(run, [make_record(0), make_record(1)], name="rollouts/step_2.jsonl")
    write_run(run, [make_record(2, answer="</script><b>x</b> & done")], name="rollouts/step_10.jsonl")
    write_run(run, [make_record(3)], name="rollouts/step_1.jsonl")
    (run / "config.json").write_text(json.dumps({"model": str(model_dir), "steps": 10}))
    assert [f.source for f in find_trajectory_files(run)] == ["step 1", "step 2", "step 10"]
    assert run_model(run) == str(model_dir)

    page_path = build_view(run, page_size=50)
    assert page_path == run / "view.html"
    page = page_path.read_text()
    assert page.count("</script>") == 2  # the data cannot close its own script element
    data = _embedded(page)
    assert [(t["source"], t["idx"]) for t in data["trajectories"]] == [("step 1", 3), ("step 2", 0), ("step 2", 1),
                                                                       ("step 10", 2)]  # fmt: skip
    assert data["page_size"] == 50 and data["model"] == str(model_dir)
    assert data["trajectories"][3]["turns"][1]["text"] == "</script><b>x</b> & done"
    assert "https://" not in page and "http://" not in page  # nothing to fetch: opens offline


def test_failed_and_truncated_flags_come_from_the_record(make_record, tokenizer):
    failed = make_record(0, failed=True, reason="error", reward=0.0)
    cut = make_record(1, reason="truncated")
    data = view_records([failed, cut], tokenizer)["trajectories"]
    assert (data[0]["failed"], data[0]["error"], data[0]["truncated"]) == (True, "EngineError: boom", False)
    assert (data[1]["failed"], data[1]["truncated"]) == (False, True)


def test_bad_run_folders_raise_config_errors_naming_the_problem(make_record, tokenizer, write_run, tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        build_view(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no trajectories in"):
        build_view(tmp_path / "empty")
    write_run(tmp_path / "blank", [])
    with pytest.raises(ConfigError, match="are empty"):
        load_trajectories(tmp_path / "blank")
    write_run(tmp_path / "nomodel", [make_record()])
    with pytest.raises(ConfigError, match="records no model"):
        build_view(tmp_path / "nomodel")
    (tmp_path / "notjson").mkdir()
    (tmp_path / "notjson" / "trajectories.jsonl").write_text('{"response_ids": []}\n{oops\n')
    with pytest.raises(ConfigError, match=":2: not valid JSON"):
        load_trajectories(tmp_path / "notjson")
    bad = make_record()
    bad["response_mask"] = bad["response_mask"][:-1]
    with pytest.raises(ConfigError, match="response_mask"):
        view_records([bad], tokenizer)
    with pytest.raises(ConfigError, match="page_size"):
        build_view(tmp_path / "nomodel", tokenizer=tokenizer, page_size=0)


def test_view_command_writes_the_page_and_reports_a_missing_folder(make_record, write_run, tmp_path, model_dir):
    run = write_run(tmp_path / "run", [make_record(0), make_record(1)], model=str(model_dir))
    out = tmp_path / "page" / "v.html"
    proc = subprocess.run([sys.executable, "-m", "agentic_rl.cli", "view", str(run), "--output", str(out)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert str(out) in proc.stdout and len(_embedded(out.read_text())["trajectories"]) == 2
    proc = subprocess.run([sys.executable, "-m", "agentic_rl.cli", "view", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_a_turn_sampled_across_a_weight_update_marks_where_the_version_changes(make_record, tokenizer):
    record = make_record()
    mask = record["response_mask"]
    turn1 = mask.index(0)
    turn2 = len(mask) - mask[::-1].index(0)  # the second turn starts after the last inserted token
    record["weight_versions"] = [0] * turn1 + [-1] * (turn2 - turn1) + [0, 0] + [1] * (len(mask) - turn2 - 2)
    first, second = view_records([record], tokenizer)["trajectories"][0]["turns"]
    assert first["wv"] == [[0, 0]]  # one version: nothing to mark
    assert second["wv"] == [[0, 0], [2, 1]]  # tokens 2.. of the turn were sampled with version 1
    del record["weight_versions"]
    assert view_records([record], tokenizer)["trajectories"][0]["turns"][0]["wv"] is None
