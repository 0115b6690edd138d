"""Training curves as PNG files (matplotlib, no display needed)."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["plot_reward_curve"]


def plot_reward_curve(metrics_path: str | Path, png_path: str | Path) -> Path:
    """Plot reward mean (with a +-std band) and accuracy per step from a `metrics.jsonl`.

    Returns:
        `png_path`.

    Raises:
        FileNotFoundError: if `metrics_path` does not exist.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in Path(metrics_path).read_text().splitlines() if line.strip()]
    steps = [r["step"] for r in rows]
    mean = [r["reward_mean"] for r in rows]
    std = [r["reward_std"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot(steps, mean, marker="o", label="reward mean")
    ax.fill_between(steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], alpha=0.2)
    if rows and "accuracy" in rows[0]:
        ax.plot(steps, [r["accuracy"] for r in rows], marker="s", label="accuracy")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path)
    plt.close(fig)
    return Path(png_path)
