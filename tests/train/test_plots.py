"""PNG plots from a run folder's metrics.jsonl and trajectory files."""

from __future__ import annotations

import json

import pytest

from agentic_rl.errors import ConfigError
from agentic_rl.train.plots import (
    plot_metrics,
    plot_response_length_histogram,
    read_metrics,
    read_response_lengths,
    write_run_plots,
)


def _png_size(path):
    import matplotlib.image

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(path)
    return image.shape[1], image.shape[0]


def _metrics_rows(n=4):
    return [{"step": k, "reward_mean": 0.1 * k, "reward_std": 0.05, "accuracy": 0.05 * k, "loss": 0.5 / k,
             "pg_loss": 0.4 / k, "kl": 0.01 * k, "clip_fraction": 0.0, "grad_norm": 1.0 + k, "response_length": 30 + k,
             "logprob_diff": 1e-5} for k in range(1, n + 1)]  # fmt: skip


def _records(lengths, failed_at=()):
    return [{"idx": i, "response_ids": [5] * n, "response_mask": [1] * n + [0] * 3, "failed": i in failed_at}
            for i, n in enumerate(lengths)]  # fmt: skip


def _write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_train_run_folder_gets_curves_and_a_first_vs_last_step_histogram(tmp_path):
    _write(tmp_path / "metrics.jsonl", _metrics_rows())
    _write(tmp_path / "rollouts" / "step_1.jsonl", _records([10, 20, 30, 99], failed_at={3}))
    _write(tmp_path / "rollouts" / "step_2.jsonl", _records([50]))
    _write(tmp_path / "rollouts" / "step_10.jsonl", _records([40, 60]))
    written = write_run_plots(tmp_path)
    assert [p.name for p in written] == ["reward_curve.png", "metrics.png", "response_lengths.png"]
    assert _png_size(tmp_path / "reward_curve.png") == (600, 350)
    assert _png_size(tmp_path / "metrics.png") == (1100, 900)  # 6 panels in 3 rows of 2
    assert _png_size(tmp_path / "response_lengths.png") == (600, 350)
    assert read_response_lengths(tmp_path / "rollouts" / "step_1.jsonl") == [10, 20, 30]  # the failed one is skipped


def test_rollout_folder_gets_only_a_histogram(tmp_path):
    _write(tmp_path / "trajectories.jsonl", _records([3, 4, 5]))
    assert [p.name for p in write_run_plots(tmp_path)] == ["response_lengths.png"]
    assert write_run_plots(tmp_path / "nothing_here") == []


def test_metric_panels_skip_absent_keys_and_histograms_differ_with_data(tmp_path):
    rows = [{"step": k, "reward_mean": 0.5, "loss": 1.0} for k in (1, 2)]
    _write(tmp_path / "m.jsonl", rows)
    assert _png_size(plot_metrics(tmp_path / "m.jsonl", tmp_path / "m.png")) == (1100, 300)  # 2 panels
    a = plot_response_length_histogram({"a": [1, 2, 3]}, tmp_path / "a.png").read_bytes()
    b = plot_response_length_histogram({"a": [1, 2, 3], "b": [30, 40]}, tmp_path / "b.png").read_bytes()
    assert a != b


def test_bad_inputs_raise_config_errors_naming_the_line(tmp_path):
    _write(tmp_path / "m.jsonl", [{"step": 1}, {"reward_mean": 1.0}])
    with pytest.raises(ConfigError, match=r"m.jsonl:2: .*'step'"):
        read_metrics(tmp_path / "m.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ConfigError, match="no metrics rows"):
        read_metrics(tmp_path / "empty.jsonl")
    _write(tmp_path / "x.jsonl", [{"step": 1, "other": 2}])
    with pytest.raises(ConfigError, match="none of the metrics"):
        plot_metrics(tmp_path / "x.jsonl", tmp_path / "x.png")
    with pytest.raises(ConfigError, match="no response lengths"):
        plot_response_length_histogram({"a": []}, tmp_path / "h.png")
    _write(tmp_path / "t.jsonl", [{"idx": 0}])
    with pytest.raises(ConfigError, match="t.jsonl:1: .*response_mask"):
        read_response_lengths(tmp_path / "t.jsonl")
