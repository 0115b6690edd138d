"""Tasks from JSON Lines, parquet (verl's layout) and Hugging Face `datasets`, with column mappings."""

from __future__ import annotations

import json

import anyio
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agentic_rl.data import DataColumns, load_tasks
from agentic_rl.environments.tool_env import ToolEnvironment
from agentic_rl.errors import ConfigError
from agentic_rl.rollout.tasks import validate_task
from agentic_rl.tools.calculator import CalculatorTool


def _math_rows(n: int = 3) -> list[dict]:
    """Rows in MATH's layout (`problem`, `solution`): no default column holds the question or the answer."""
    return [{"problem": f"What is {i} + {i}?", "solution": f"{i} + {i} = {2 * i}", "level": i} for i in range(n)]


def test_verl_parquet_rows_become_tasks_with_the_prompt_messages_split(tmp_path, verl_parquet, gsm8k_rows):
    path = verl_parquet(tmp_path / "train.parquet", n=5)
    tasks = load_tasks(path)
    assert [t["id"] for t in tasks] == [100, 101, 102, 103, 104]  # extra_info.index
    first = tasks[0]
    assert first["question"] == gsm8k_rows[0]["question"]  # the user message
    assert first["system_prompt"] == "Answer with a number."  # the system message
    assert first["ground_truth"] == gsm8k_rows[0]["answer"].split("####")[-1].strip()
    assert first["data_source"] == "openai/gsm8k" and first["reward_model"]["style"] == "rule"  # columns kept
    assert validate_task(first)["system_prompt"] == "Answer with a number."
    assert len(load_tasks(path, limit=2)) == 2
    without_system = load_tasks(verl_parquet(tmp_path / "plain.parquet", n=2, system=None))
    assert "system_prompt" not in without_system[0] and "system_prompt" not in validate_task(without_system[0])


def test_the_tasks_system_prompt_replaces_the_environments_and_keeps_the_tool_descriptions(tmp_path, verl_parquet):
    (task,) = load_tasks(verl_parquet(tmp_path / "t.parquet", n=1))
    env = ToolEnvironment([CalculatorTool()], system_prompt="the environment's own prompt")
    sample = anyio.run(env.reset, task)
    system, user = sample.messages
    assert system["role"] == "system" and system["content"].startswith("Answer with a number.")
    assert "calculator" in system["content"] and "environment's own" not in system["content"]
    assert user == {"role": "user", "content": task["question"]}
    plain = anyio.run(env.reset, {k: v for k, v in task.items() if k != "system_prompt"})
    assert plain.messages[0]["content"].startswith("the environment's own prompt")


def test_a_prompt_with_earlier_turns_is_refused_naming_the_row_and_roles(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": "q0"}], "answer": "1"},
            {"prompt": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
                        {"role": "user", "content": "q1"}], "answer": "2"}]  # fmt: skip
    path = tmp_path / "fewshot.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(ConfigError, match=r"fewshot.parquet row 1: .*\['user', 'assistant', 'user'\]"):
        load_tasks(path)


def test_save_to_disk_folders_load_and_a_dataset_dict_asks_for_a_split(tmp_path, gsm8k_rows):
    import datasets

    datasets.Dataset.from_list(gsm8k_rows[:4]).save_to_disk(str(tmp_path / "one"))
    tasks = load_tasks(tmp_path / "one")
    assert [t["id"] for t in tasks] == [0, 1, 2, 3]
    assert tasks[2]["question"] == gsm8k_rows[2]["question"] and tasks[2]["ground_truth"] == gsm8k_rows[2]["answer"]
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_list(gsm8k_rows[:3]),
                                   "test": datasets.Dataset.from_list(_math_rows())})  # fmt: skip
    splits.save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(ConfigError, match="splits train, test: pass one of them"):
        load_tasks(tmp_path / "dict")
    assert len(load_tasks(tmp_path / "dict" / "train")) == 3
    test = load_tasks(tmp_path / "dict" / "test", columns="question=problem,answer=solution")
    assert test[1]["question"] == "What is 1 + 1?" and test[1]["ground_truth"] == "1 + 1 = 2"
    (tmp_path / "plain").mkdir()
    with pytest.raises(ConfigError, match="save_to_disk"):
        load_tasks(tmp_path / "plain")


def test_local_files_through_the_datasets_loaders(tmp_path, gsm8k_rows):
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in gsm8k_rows[:3]))
    by_line = load_tasks(jsonl)  # the project's own JSON Lines reader
    assert load_tasks(f"json:{jsonl}") == by_line  # the same rows through datasets' json builder
    array = tmp_path / "rows.json"  # a JSON array: datasets' json builder reads it by its suffix
    array.write_text(json.dumps(gsm8k_rows[:3]))
    assert load_tasks(array) == by_line
    pq.write_table(pa.Table.from_pylist(_math_rows(4)), tmp_path / "part-0.parquet")
    pq.write_table(pa.Table.from_pylist(_math_rows(6)[4:]), tmp_path / "part-1.parquet")
    both = load_tasks(f"parquet:{tmp_path}/part-*.parquet", columns={"question": "problem", "answer": "solution"})
    assert [t["question"] for t in both] == [f"What is {i} + {i}?" for i in range(6)]
    assert [t["id"] for t in both] == list(range(6)) and both[5]["level"] == 5
    csv = tmp_path / "rows.csv"
    csv.write_text("id,question,ground_truth\nq-a,What is 2 + 3?,5\nq-b,What is 7 * 6?,42\n")
    assert [(t["id"], t["question"], t["ground_truth"]) for t in load_tasks(csv)] == [
        ("q-a", "What is 2 + 3?", 5), ("q-b", "What is 7 * 6?", 42)]  # fmt: skip
    assert load_tasks(f"csv:{csv}", limit=1) == load_tasks(csv)[:1]
    with pytest.raises(FileNotFoundError):
        load_tasks(f"json:{tmp_path}/nothing-*.json")


def test_a_mapping_reads_other_layouts_from_every_format(tmp_path):
    rows = _math_rows()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "math.parquet")
    jsonl = tmp_path / "math.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    as_text = "question=problem, answer=solution"
    as_dict = {"question": "problem", "ground_truth": "solution", "id": "level"}
    for path in (tmp_path / "math.parquet", jsonl):
        tasks = load_tasks(path, columns=as_text)
        assert [(t["question"], t["ground_truth"]) for t in tasks] == [(r["problem"], r["solution"]) for r in rows]
        assert [t["id"] for t in load_tasks(path, columns=as_dict)] == [0, 1, 2]
        assert all(validate_task(t) for t in tasks)
    struct = tmp_path / "nested.parquet"
    pq.write_table(pa.Table.from_pylist([{"q": {"text": "What is 1 + 2?"}, "meta": {"gold": "3", "uid": "u7"}}]), struct)
    (task,) = load_tasks(struct, columns="question=q.text,answer=meta.gold,id=meta.uid")
    assert (task["id"], task["question"], task["ground_truth"]) == ("u7", "What is 1 + 2?", "3")


def test_a_mapping_is_checked_as_config(tmp_path):
    assert DataColumns.model_validate("answer=solution").ground_truth == "solution"
    assert DataColumns.model_validate({"answer": "solution"}) == DataColumns(ground_truth="solution")
    with pytest.raises(ConfigError, match="not a known field"):
        DataColumns.model_validate("question=problem,solution=answer")
    with pytest.raises(ConfigError, match="FIELD=COLUMN"):
        DataColumns.model_validate("question")
    with pytest.raises(ConfigError, match="same field"):
        DataColumns.model_validate({"answer": "a", "ground_truth": "b"})
    with pytest.raises(ConfigError, match="mapped twice"):
        DataColumns.model_validate("question=a,question=b")


def test_missing_columns_are_named_with_the_columns_present(tmp_path, verl_parquet):
    pq.write_table(pa.Table.from_pylist(_math_rows()), tmp_path / "math.parquet")
    with pytest.raises(ConfigError) as info:  # no default column holds the question
        load_tasks(tmp_path / "math.parquet")
    message = str(info.value)
    assert "no column 'question' or 'prompt' for the task's 'question'" in message
    assert "(columns: problem, solution, level)" in message and "question=COLUMN" in message
    with pytest.raises(ConfigError, match="no column 'ground_truth', 'answer' or 'reward_model.ground_truth' for the task's 'ground_truth'"):
        load_tasks(tmp_path / "math.parquet", columns="question=problem")
    with pytest.raises(ConfigError, match=r"no column 'query' for the task's 'question' \(columns: data_source, "
                                          r"ability, prompt, reward_model, reward_model.style"):  # fmt: skip
        load_tasks(verl_parquet(tmp_path / "verl.parquet", n=2), columns="question=query")
    with pytest.raises(ConfigError, match="no column 'extra_info.uid' for the task's 'id'"):
        load_tasks(tmp_path / "verl.parquet", columns="id=extra_info.uid")
    jsonl = tmp_path / "math.jsonl"
    jsonl.write_text(json.dumps(_math_rows()[0]) + "\n" + json.dumps({"problem": "p"}) + "\n")
    with pytest.raises(ConfigError, match=r"math.jsonl:2: no column 'solution' for the task's 'ground_truth' "
                                          r"\(columns: problem\)"):  # fmt: skip
        load_tasks(jsonl, columns="question=problem,answer=solution")
    with pytest.raises(FileNotFoundError):
        load_tasks(tmp_path / "missing.parquet")
    (tmp_path / "broken.parquet").write_text("not parquet")
    with pytest.raises(ConfigError, match="broken.parquet: cannot be read as parquet"):
        load_tasks(tmp_path / "broken.parquet")


def test_train_config_takes_a_column_mapping_from_yaml_and_overrides(tmp_path):
    from agentic_rl.loop import TrainConfig

    path = tmp_path / "train.yaml"
    path.write_text("data: math.parquet\ndata_columns: {question: problem, answer: solution}\n")
    config = TrainConfig.from_yaml(path)
    assert config.data_columns == DataColumns(question="problem", ground_truth="solution")
    assert TrainConfig.from_yaml(path, ["data_columns.id=level"]).data_columns.id == "level"
    assert TrainConfig.from_yaml(None, ["data_columns=question=q,answer=a"]).data_columns == DataColumns(
        question="q", ground_truth="a")  # fmt: skip
    assert TrainConfig().data_columns == DataColumns()
    with pytest.raises(ConfigError, match="TrainConfig.data_columns.bogus is not a known field"):
        TrainConfig.from_yaml(path, ["data_columns.bogus=x"])


def test_a_milestones_column_becomes_the_tasks_milestones_that_a_real_search_can_reach():
    from agentic_rl.data import SHARED_DATA
    from agentic_rl.rewards.turns import milestone_reward, task_milestones
    from agentic_rl.tools.search import LocalSearchTool

    data = SHARED_DATA / "hotpotqa_dev_distractor_500.jsonl"
    if not data.is_file():
        pytest.skip(f"shared data not found at {data}")
    plain = load_tasks(f"{data}[:8]")
    assert all("milestones" not in t for t in plain)  # nothing is invented without the mapping
    tasks = load_tasks(f"{data}[:8]", columns=DataColumns.model_validate("milestones=supporting_doc_ids"))
    assert [t["milestones"] for t in tasks] == [t["supporting_doc_ids"] for t in plain]
    assert all(task_milestones(t) for t in tasks)
    search = LocalSearchTool(top_k=3, max_chars=1500)
    rewards = []
    for task in tasks:  # the local search of the question itself shows a supporting document for some questions
        result = search.execute({"query": task["question"]})
        reached: set[str] = set()
        rewards.append(milestone_reward(task_milestones(task), reached, [str(result)], 1.0))
        assert reached <= set(task["milestones"]) and rewards[-1] == len(reached) / len(task["milestones"])
        assert not {m for m in task["milestones"] if m not in str(result)} & reached  # only ids the results show
    assert any(r > 0 for r in rewards)


def test_a_training_config_refuses_milestones_it_would_not_use_or_could_not_read(tmp_path):
    from agentic_rl.loop import TrainConfig
    from agentic_rl.loop.config import config_tasks

    rows = [{"question": "q1", "answer": "1", "docs": ["a", "b"]}, {"question": "q2", "answer": "2", "docs": [3, 4]}]
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError, match="data_columns.milestones='docs'.*milestone_weight"):
        TrainConfig(data=str(data), data_columns={"milestones": "docs"})  # mapped, but nothing would reward them
    config = TrainConfig(data=str(data), data_columns={"milestones": "docs"},
                         rollout={"milestone_weight": 0.5}, optimizer={"advantage": "step"})  # fmt: skip
    with pytest.raises(ConfigError, match=r"TrainConfig.data=.*task 1: .*'milestones' must be a list of non-empty"):
        config_tasks(config, "data")  # the numbers of row 1 are refused before any engine starts
    data.write_text(json.dumps(rows[0]) + "\n")
    assert config_tasks(config, "data")[0]["milestones"] == ["a", "b"]
