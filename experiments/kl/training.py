"""The kl experiment's training: fresh sequences from a source, and training that stops at log-spaced
checkpoints to measure the model against the truth."""

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from experiments.kl.config import sample_seed
from experiments.kl.measure import (
    HeldOut,
    Source,
    measure,
)
from lab.model.transformer import HookedTransformer
from lab.train.batches import SequenceBatches
from lab.train.config import TrainConfig
from lab.train.loop import train


def log_spaced_steps(steps: int, n: int) -> list[int]:
    """n distinct steps, geometrically spaced from ≈ steps/200 to steps (fewer only if steps < n)."""
    first = max(1, steps // 200)
    points = np.unique(np.round(np.geomspace(first, steps, n)).astype(int))
    while len(points) < min(n, steps):  # rounding merged some: fill in from the start
        points = np.unique(np.r_[points, np.setdiff1d(np.arange(1, steps + 1), points)[0]])
    return [int(s) for s in points]


def train_with_checkpoints(
    model: HookedTransformer,
    cfg: TrainConfig,
    data: SequenceBatches,
    held_out: HeldOut,
    n_checkpoints: int,
    workdir: Path,
) -> list[dict[str, Any]]:
    """Train on cfg's schedule, stopping at log-spaced steps to measure (resuming from the checkpoint)."""
    rows = []
    for i, step in enumerate(log_spaced_steps(cfg.steps, n_checkpoints)):
        train(model, cfg, data, out_dir=workdir, resume=i > 0, progress=False, stop_after=step)
        rows.append({"step": step, "tokens_seen": step * cfg.batch_size * cfg.seq_len, **measure(model, held_out)})
    shutil.rmtree(workdir / "checkpoint", ignore_errors=True)  # optimizer state: the weights are saved apart
    return rows


def sequences(source: Source, cfg: TrainConfig, seed: int, purpose: str) -> SequenceBatches:
    """Fresh training sequences, one per batch row of the whole schedule, and a small validation draw."""
    train_tokens = source.sample(cfg.steps * cfg.batch_size, cfg.seq_len, seed=sample_seed(seed, f"{purpose}-train"))
    val_tokens = source.sample(64, cfg.seq_len, seed=sample_seed(seed, f"{purpose}-val"))
    return SequenceBatches(torch.from_numpy(train_tokens), torch.from_numpy(val_tokens))
