"""Training curves and response-length histograms as PNG files (matplotlib's Agg backend, no display needed).

Inputs are the files a run writes: `metrics.jsonl` (one row per training step) and trajectory JSONL files
(`rollouts/step_K.jsonl`, or `trajectories.jsonl` of `agentic-rl rollout`), whose records hold `response_mask`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentic_rl.errors import ConfigError

__all__ = [
    "METRIC_PANELS",
    "plot_metrics",
    "plot_response_length_histogram",
    "plot_reward_curve",
    "read_metrics",
    "read_response_lengths",
    "write_run_plots",
]

# (panel title, metrics.jsonl keys drawn in it)
METRIC_PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward and accuracy", ("reward_mean", "accuracy", "hotpotqa_f1")),
    ("held-out accuracy (greedy)", ("heldout_accuracy", "heldout_hotpotqa_f1")),
    ("LLM judge calls and failures", ("judge_calls", "judge_failures")),
    ("response length (sampled tokens, mean)", ("response_length",)),
    ("loss", ("loss", "pg_loss")),
    ("KL and clip fractions", ("kl", "clip_fraction", "dual_clip_fraction")),
    ("sampled tokens: trained and excluded", ("tokens_trained", "tokens_excluded")),
    ("grad norm", ("grad_norm",)),
    ("engine vs trainer logprob gap (nats)", ("logprob_diff",)),
    ("policy entropy (nats per sampled token)", ("entropy",)),
    ("final answer length (tokens)", ("answer_tokens",)),
    ("importance ratios", ("is_weight_mean", "is_weight_max")),
    ("groups drawn and kept (dynamic sampling)", ("groups_drawn", "groups_kept")),
    ("answers: exact match, quoting a passage, support found", ("hotpotqa_em", "quotes_passage", "found_support")),
    ("tool calls and answer words per trajectory", ("searches", "visits", "answer_words")),
    (
        "held-out answers",
        ("heldout_hotpotqa_em", "heldout_quotes_passage", "heldout_found_support", "heldout_accuracy_stderr"),
    ),
    ("held-out tool calls and answer words", ("heldout_searches", "heldout_visits", "heldout_answer_words")),
)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def read_metrics(metrics_path: str | Path) -> list[dict[str, Any]]:
    """The rows of a `metrics.jsonl`, in file order.

    Raises:
        FileNotFoundError: if the file does not exist.
        ConfigError: naming the line, for a line that is not JSON or a row without `step`; or if there are no rows.
    """
    from agentic_rl.data import iter_jsonl

    rows: list[dict[str, Any]] = []
    for lineno, row in iter_jsonl(metrics_path):
        if not isinstance(row, dict) or "step" not in row:
            raise ConfigError(f"{metrics_path}:{lineno}: a metrics row needs a 'step' field")
        rows.append(row)
    if not rows:
        raise ConfigError(f"{metrics_path} has no metrics rows")
    return rows


def plot_reward_curve(metrics_path: str | Path, png_path: str | Path) -> Path:
    """Plot reward mean (with a +-std band) and accuracy per step from a `metrics.jsonl`.

    Returns:
        `png_path`.

    Raises:
        FileNotFoundError: if `metrics_path` does not exist.
        ConfigError: if it holds no rows, or a malformed one.
    """
    plt = _pyplot()
    rows = [r for r in read_metrics(metrics_path) if "reward_mean" in r]  # evaluation-only rows have no reward
    if not rows:
        raise ConfigError(f"{metrics_path}: no row has a reward_mean")
    steps = [r["step"] for r in rows]
    mean = [r["reward_mean"] for r in rows]
    std = [r.get("reward_std", 0.0) for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot(steps, mean, marker="o", label="reward mean")
    ax.fill_between(
        steps,
        [m - s for m, s in zip(mean, std, strict=True)],
        [m + s for m, s in zip(mean, std, strict=True)],
        alpha=0.2,
    )
    if "accuracy" in rows[0]:
        ax.plot(steps, [r["accuracy"] for r in rows], marker="s", label="accuracy")
    ax.set_xlabel("step")
    _integer_steps(ax)
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path)
    plt.close(fig)
    return Path(png_path)


def _integer_steps(ax) -> None:  # noqa: ANN001
    """Steps are whole numbers: no tick at step 1.2."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def plot_metrics(
    metrics_path: str | Path,
    png_path: str | Path,
    *,
    panels: Sequence[tuple[str, Sequence[str]]] = METRIC_PANELS,
) -> Path:
    """A grid of per-step curves from a `metrics.jsonl`, one panel per `(title, keys)`; absent keys are skipped.

    Returns:
        `png_path`.

    Raises:
        FileNotFoundError: if `metrics_path` does not exist.
        ConfigError: if it holds no rows, or no panel has a key present in the rows.
    """
    rows = read_metrics(metrics_path)
    present = [(title, [k for k in keys if any(k in r for r in rows)]) for title, keys in panels]
    present = [(title, keys) for title, keys in present if keys]
    if not present:
        wanted = sorted({k for _, keys in panels for k in keys})
        raise ConfigError(f"{metrics_path}: none of the metrics {wanted} is present")
    plt = _pyplot()
    cols = 2 if len(present) > 1 else 1
    nrows = (len(present) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(5.5 * cols, 3 * nrows), dpi=100, squeeze=False)
    for ax, (title, keys) in zip(axes.flat, present, strict=False):
        for key in keys:
            points = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, label=key)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        _integer_steps(ax)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(present) :]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(png_path)
    plt.close(fig)
    return Path(png_path)


def read_response_lengths(trajectories_path: str | Path) -> list[int]:
    """Sampled tokens per trajectory (`sum(response_mask)`) of a trajectory JSONL file; failed ones are skipped.

    Raises:
        FileNotFoundError: if the file does not exist.
        ConfigError: naming the line, for a line that is not JSON or a record without `response_mask`.
    """
    from agentic_rl.data import iter_jsonl

    lengths: list[int] = []
    for lineno, row in iter_jsonl(trajectories_path):
        if not isinstance(row, dict) or not isinstance(row.get("response_mask"), list):
            raise ConfigError(f"{trajectories_path}:{lineno}: a trajectory record needs a 'response_mask' list")
        if not row.get("failed"):
            lengths.append(int(sum(row["response_mask"])))
    return lengths


def plot_response_length_histogram(
    lengths: Mapping[str, Sequence[int]], png_path: str | Path, *, bins: int = 30
) -> Path:
    """Overlaid histograms of response lengths (sampled tokens per trajectory), one per label.

    Args:
        lengths: label (e.g. `step 1`) -> lengths in tokens.
        png_path: the PNG to write.
        bins: number of bins over the common range of all lengths.

    Returns:
        `png_path`.

    Raises:
        ConfigError: if there are no lengths at all, or `bins` < 1.
    """
    if bins < 1:
        raise ConfigError(f"bins must be >= 1, got {bins}")
    values = [v for seq in lengths.values() for v in seq]
    if not values:
        raise ConfigError("no response lengths to plot")
    plt = _pyplot()
    low, high = min(values), max(values)
    edges = [low + (high - low + 1) * i / bins for i in range(bins + 1)]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    for label, seq in lengths.items():
        if seq:
            mean = sum(seq) / len(seq)
            ax.hist(list(seq), bins=edges, alpha=0.5, label=f"{label} (n={len(seq)}, mean {mean:.0f})")
    ax.set_xlabel("response length (sampled tokens)")
    ax.set_ylabel("trajectories")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png_path)
    plt.close(fig)
    return Path(png_path)


def write_run_plots(run_dir: str | Path) -> list[Path]:
    """Write every plot a run folder has data for, next to that data.

    - `metrics.jsonl` -> `reward_curve.png` and `metrics.png` (see `METRIC_PANELS`);
    - `rollouts/step_K.jsonl` -> `response_lengths.png`, the first and last step overlaid;
      or `trajectories.jsonl` (a rollout) -> `response_lengths.png`.

    Returns:
        The written files (empty if the folder holds none of those inputs).
    """
    run = Path(run_dir)
    written: list[Path] = []
    if (run / "metrics.jsonl").is_file():
        written.append(plot_reward_curve(run / "metrics.jsonl", run / "reward_curve.png"))
        written.append(plot_metrics(run / "metrics.jsonl", run / "metrics.png"))
    step_files = sorted(
        (
            (int(m.group(1)), p)
            for p in (run / "rollouts").glob("step_*.jsonl")
            if (m := re.fullmatch(r"step_(\d+)\.jsonl", p.name))
        ),
    )
    sources = [step_files[0], step_files[-1]] if len(step_files) > 1 else step_files
    lengths = {f"step {k}": read_response_lengths(p) for k, p in sources}
    if not lengths and (run / "trajectories.jsonl").is_file():
        lengths = {"rollout": read_response_lengths(run / "trajectories.jsonl")}
    if any(lengths.values()):
        written.append(plot_response_length_histogram(lengths, run / "response_lengths.png"))
    return written
