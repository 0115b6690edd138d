"""Supervised fine-tuning on trajectories: masked negative log-likelihood of the tokens the policy produced.

The batch is packed by `pack_trajectories`, the same packing the GRPO step uses, and the loss covers exactly the
tokens with `response_mask == 1` (what the policy writes); prompts, tool observations and template glue are
context only. `SFTProgress` shows a run's steps to a person: a bar on a terminal, plain log lines elsewhere.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from types import TracebackType
from typing import Any

import torch

from agentic_rl.errors import ConfigError
from agentic_rl.train.loss import response_logprobs
from agentic_rl.train.optim import adamw
from agentic_rl.train.packing import pack_trajectories
from agentic_rl.types import Trajectory

__all__ = ["SFTProgress", "SFTTrainer", "masked_nll"]

logger = logging.getLogger(__name__)


def masked_nll(logprobs: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of -log p over masked tokens, and the number of masked tokens.

    Args:
        logprobs: (B, R) float, the model's log-probabilities of the response tokens (nats).
        response_mask: (B, R), 1 where the token is trained.

    Returns:
        `(nll_sum, tokens)`: scalar float tensors; the mean NLL is `nll_sum / tokens`.
    """
    mask = response_mask.to(logprobs.dtype)
    return -(logprobs * mask).sum(), mask.sum()


class SFTTrainer:
    """AdamW on the masked NLL of packed trajectories, accumulated over micro-batches.

    Args:
        model: a `transformers` causal LM (fp32 weights recommended; `bf16_autocast` computes in bfloat16).
        pad_token_id: padding id for packing.
        lr: AdamW learning rate (> 0).
        weight_decay: AdamW weight decay (>= 0).
        micro_batch_size: rows per forward/backward (>= 1).
        max_grad_norm: gradient clipping norm (> 0).
        bf16_autocast: run forward/backward under `torch.autocast(..., dtype=torch.bfloat16)`.

    Raises:
        ConfigError: for an out-of-range argument.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        pad_token_id: int,
        lr: float = 1e-4,
        weight_decay: float = 0.0,
        micro_batch_size: int = 4,
        max_grad_norm: float = 1.0,
        bf16_autocast: bool = False,
    ) -> None:
        if not (lr > 0 and weight_decay >= 0 and micro_batch_size >= 1 and max_grad_norm > 0):
            raise ConfigError(
                f"SFTTrainer needs lr > 0, weight_decay >= 0, micro_batch_size >= 1, max_grad_norm > 0; got lr={lr}, "
                f"weight_decay={weight_decay}, micro_batch_size={micro_batch_size}, max_grad_norm={max_grad_norm}"
            )
        self.model = model
        self.pad_token_id = pad_token_id
        self.micro_batch_size = micro_batch_size
        self.max_grad_norm = max_grad_norm
        self.bf16_autocast = bf16_autocast
        self.optimizer = adamw(model.parameters(), lr=lr, weight_decay=weight_decay)
        self.steps_done = 0

    def _autocast(self, device: torch.device) -> Any:
        return torch.autocast(device.type, dtype=torch.bfloat16) if self.bf16_autocast else nullcontext()

    def train_step(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """One optimizer step on the masked mean NLL over every trained token of `trajectories`.

        Failed trajectories are skipped (they have no exact record).

        Returns:
            `loss` (mean NLL per trained token, nats), `tokens` (trained tokens), `grad_norm`, `train_seconds`.

        Raises:
            ConfigError: if no trajectory has a trained token.
        """
        t0 = time.perf_counter()
        device = next(self.model.parameters()).device
        usable = [t for t in trajectories if not t.failed and t.num_generated_tokens > 0]
        if not usable:
            raise ConfigError("no trajectory with trained tokens (all failed or empty)")
        batch = pack_trajectories(usable, pad_token_id=self.pad_token_id, device=device)
        total = float(batch.response_mask.sum())
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        nll_total = 0.0
        for rows in torch.split(torch.arange(batch.input_ids.shape[0], device=device), self.micro_batch_size):
            micro = batch.select(rows, trim=True)
            with self._autocast(device):
                logprobs = response_logprobs(self.model, micro)
            nll, _ = masked_nll(logprobs, micro.response_mask)
            (nll / total).backward()
            nll_total += float(nll.detach())
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm))
        if math.isfinite(grad_norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps_done += 1
        return {
            "loss": nll_total / total,
            "tokens": total,
            "grad_norm": grad_norm,
            "train_seconds": time.perf_counter() - t0,
        }

    @torch.no_grad()
    def evaluate(self, trajectories: Sequence[Trajectory]) -> float:
        """Mean NLL per trained token (nats) of `trajectories` under the current model, without updating it."""
        device = next(self.model.parameters()).device
        batch = pack_trajectories(
            [t for t in trajectories if not t.failed], pad_token_id=self.pad_token_id, device=device
        )
        self.model.eval()
        nll_total, tokens = 0.0, 0.0
        for rows in torch.split(torch.arange(batch.input_ids.shape[0], device=device), self.micro_batch_size):
            micro = batch.select(rows, trim=True)
            with self._autocast(device):
                logprobs = response_logprobs(self.model, micro)
            nll, count = masked_nll(logprobs, micro.response_mask)
            nll_total, tokens = nll_total + float(nll), tokens + float(count)
        return nll_total / max(tokens, 1.0)


def _clock(seconds: float) -> str:
    """`seconds` as ``H:MM:SS``."""
    whole = max(0, round(seconds))
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


class SFTProgress:
    """Shows the steps of an SFT run: step, loss, time spent and time left.

    On a terminal (and with `bar`) a rich progress bar on `console`; otherwise, so that logs and pipes stay
    readable, one INFO line of this module's logger every `every` steps and at the last step. Lines too when
    another rich bar is already showing (a training run that builds the tool model): they print above it. Use as
    a context manager and pass it as the run's `on_step` callback (it reads the row's ``step`` and ``loss``).

    Args:
        total: steps of the run.
        label: what the run is, first on the bar and in every line (e.g. ``"fine-tuning for tool calls"``).
        bar: False never draws a bar (``--no-progress``): lines are logged instead.
        console: a `rich.console.Console` for the bar (default: one on stderr).
        every: steps between two lines (default: a tenth of `total`, at least 1).
    """

    def __init__(
        self, total: int, label: str = "sft", *, bar: bool = True, console: Any = None, every: int | None = None
    ) -> None:
        from rich.console import Console

        self.total, self.label = total, label
        self.console = console if console is not None else Console(stderr=True)
        self.every = every if every is not None else max(1, total // 10)
        self.lines: list[str] = []  # the lines logged so far
        self._bar: Any = None
        self._use_bar = bar and self.console.is_terminal
        self._start = time.monotonic()
        self._first: tuple[float, int] | None = None  # (time, step) of the first step reported

    def __enter__(self) -> SFTProgress:
        from rich import progress
        from rich.file_proxy import FileProxy

        self._start = time.monotonic()
        if self._use_bar and not isinstance(sys.stderr, FileProxy):  # no second bar inside another one (a run's)
            columns = [
                progress.TextColumn(self.label),
                progress.BarColumn(),
                progress.TextColumn("step"),
                progress.MofNCompleteColumn(),
                progress.TextColumn("loss {task.fields[loss]}"),
                progress.TimeElapsedColumn(),
                progress.TextColumn("left"),
                progress.TimeRemainingColumn(),
            ]
            self._bar = progress.Progress(*columns, console=self.console)
            self._bar.start()
            self._task = self._bar.add_task("", total=self.total, loss="-")
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.stop()

    def __call__(self, row: Mapping[str, Any]) -> None:
        """Report one finished step: `row` holds its 1-based ``step`` and its ``loss`` (nats per token)."""
        step, loss = int(row["step"]), float(row["loss"])
        if self._bar is not None:
            self._bar.update(self._task, completed=step, loss=f"{loss:.3f}")
            return
        if self._first is None:  # time per step is measured from the first step on, not from set-up
            self._first = (time.monotonic(), step)
        if step % self.every and step != self.total:
            return
        now = time.monotonic()
        since, first_step = self._first
        per_step = (now - since) / (step - first_step) if step > first_step else (now - self._start) / max(step, 1)
        spent, left = now - self._start, per_step * (self.total - step)
        line = f"{self.label}: step {step}/{self.total}, loss {loss:.3f}, {_clock(spent)} spent, {_clock(left)} left"
        self.lines.append(line)
        logger.info("%s", line)
