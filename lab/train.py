"""The training loop: one process or many under torchrun (DDP), resumable to the bit.

Reads top to bottom: `get_batch` (this rank's rows of a global batch that is a pure function of
(seed, split, step)), `estimate_loss` (mean held-out loss over fixed batches), `get_lr` (linear
warmup, then cosine to a floor), and `train`, one loop with evaluation, checkpointing and one log
line per eval interval. The loop serves both model classes: a `Batch` carries the decoder's tokens and,
for an encoder–decoder, the source it reads, and the loss is always `summed_loss(model(*batch.inputs),
batch.targets)`. Everything a resumed run needs lives in the checkpoint folder:

    out_dir/checkpoint/model.safetensors, config.json   the model (`HookedTransformer.save`)
                       optimizer.safetensors             AdamW moments and step counts
                       rng_state.safetensors             torch's RNG state(s) as uint8 tensors
                       train_state.json                  step, losses, TrainConfig, ModelConfig
    out_dir/metrics.jsonl                                one JSON line per step

A checkpoint is written into a temporary folder and renamed into place, so a crash leaves either
the previous checkpoint or the new one, never half of one. One is written every `checkpoint_interval`
steps and every `checkpoint_every_s` seconds of training, at the end, and when SIGINT or SIGTERM
arrives (the step in flight finishes, the checkpoint is written, then `TrainingInterrupted` is
raised). Because every batch is drawn from a generator seeded by (seed, split, step) and the
optimizer state is restored exactly, training 10 steps and resuming for 10 more gives the same
weights as 20 uninterrupted steps; when a checkpoint is taken does not change the trajectory.

Under torchrun each rank takes a contiguous slice of the same global batch and the loss is
normalised by the global number of scored targets, so the averaged DDP gradient equals the
single-process gradient on the whole batch: `batch_size` means the same thing at any world size.

    python -m lab.train --demo-markov --steps 200 --out runs/train-demo
    python -m torch.distributed.run --standalone --nproc_per_node=2 -m lab.train --demo-markov --out DIR
"""

import argparse
import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from jaxtyping import Float, Int
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from lab.model import HookedTransformer, ModelConfig
from lab.files import atomic_write, current_umask
from lab.progress import bar as progress_bar
from lab.model.transformer import CONFIG_FILE, WEIGHTS_FILE
from lab.configs import check_fields, from_dict_strict

__all__ = ["DEMO_MODEL", "DEMO_TRAIN", "Batch", "Batches", "SequenceBatches", "TokenStream", "TrainConfig",
           "TrainResult", "TrainState", "TrainingDiverged", "TrainingInterrupted", "batch_seed", "demo_markov",
           "estimate_loss", "find_checkpoint", "get_batch", "get_lr", "has_checkpoint", "init_distributed",
           "load_checkpoint", "make_optimizer", "PairBatches", "save_checkpoint", "summed_loss", "train",
           "train_seq2seq"]

logger = logging.getLogger(__name__)

SPLITS = ("train", "val")
IGNORE = -100  # target id that the loss skips (PyTorch's cross_entropy ignore_index convention)
EVAL_SEED = 0  # held-out batches do not depend on the training seed, so runs with different seeds compare
CHECKPOINT_DIR = "checkpoint"
METRICS_FILE = "metrics.jsonl"
OPTIMIZER_FILE = "optimizer.safetensors"
RNG_FILE = "rng_state.safetensors"
STATE_FILE = "train_state.json"
CHECKPOINT_FILES = (WEIGHTS_FILE, CONFIG_FILE, OPTIMIZER_FILE, RNG_FILE, STATE_FILE)
STATE_FORMAT = "forma-train-state/1"
# Fields that may change between a run and its resumption: where it runs and how often it saves.
# Every other field shapes the trajectory (or what the logged numbers mean), so a difference is an error.
RESUMABLE_CHANGES = ("device", "checkpoint_interval", "checkpoint_every_s")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


# --- configuration ------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainConfig:
    """How to train. Defaults follow GPT-3's recipe (Brown et al. 2020, App. B): AdamW with
    β = (0.9, 0.95), weight decay 0.1, gradient-norm clip 1.0, linear warmup then cosine decay to
    10% of the peak learning rate."""

    steps: int = 1000  # optimizer updates; the cosine schedule spans exactly these
    batch_size: int = 32  # global batch in sequences, split across DDP ranks
    seq_len: int = 64  # tokens per sequence (≤ the model's n_ctx); seq_len − 1 predictions each
    lr: float = 1e-3  # peak learning rate, reached at the end of warmup
    min_lr: float = 1e-4  # cosine floor
    warmup_steps: int = 100
    weight_decay: float = 0.1  # on ≥2-D weights only (not biases, norm gains)
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # max global gradient norm; 0 = no clipping
    eval_interval: int = 100  # steps between held-out evaluations (and log lines)
    eval_batches: int = 10  # held-out batches per evaluation
    checkpoint_interval: int = 0  # steps between checkpoints; 0 = none by count
    checkpoint_every_s: float = 30.0  # seconds of training between checkpoints; 0 = none by time
    seed: int = 0  # seeds the batch stream and torch's global RNG
    device: str = "cpu"

    def __post_init__(self) -> None:
        check_fields(self)  # types from the annotations; an int in a float field is stored as a float

        def need(ok: bool, name: str, message: str) -> None:
            if not ok:
                raise ValueError(f"TrainConfig.{name}: {message}, got {getattr(self, name)!r}")

        for name in ("steps", "batch_size", "seq_len", "eval_interval", "eval_batches"):
            need(getattr(self, name) > 0, name, "must be a positive integer")
        for name in ("warmup_steps", "checkpoint_interval", "seed"):
            need(getattr(self, name) >= 0, name, "must be a non-negative integer")
        need(self.seq_len >= 2, "seq_len", "must be at least 2 (one token to predict from, one to predict)")
        need(self.lr > 0, "lr", "must be positive")
        need(0 <= self.min_lr <= self.lr, "min_lr", f"must lie in [0, lr = {self.lr}]")
        need(self.warmup_steps <= self.steps, "warmup_steps", f"must be at most steps = {self.steps}")
        need(self.weight_decay >= 0, "weight_decay", "must be non-negative")
        need(0 <= self.beta1 < 1, "beta1", "must lie in [0, 1)")
        need(0 <= self.beta2 < 1, "beta2", "must lie in [0, 1)")
        need(self.grad_clip >= 0, "grad_clip", "must be non-negative (0 = no clipping)")
        need(self.checkpoint_every_s >= 0, "checkpoint_every_s", "must be non-negative (0 = none by time)")
        try:
            torch.device(self.device)
        except RuntimeError as err:
            raise ValueError(f"TrainConfig.device: not a torch device, got {self.device!r} ({err})") from err

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        return from_dict_strict(cls, data)

    def replace(self, **changes: Any) -> "TrainConfig":
        return dataclasses.replace(self, **changes)


# --- data ---------------------------------------------------------------------------------------
class Batch(NamedTuple):
    """Token windows and what each position must predict: targets[:, t] is tokens[:, t + 1], or
    IGNORE where that prediction is not scored. For an encoder–decoder, `tokens` is the target
    sequence the decoder reads under teacher forcing and `source` what the encoder reads."""

    tokens: Int[Tensor, "batch pos"]
    targets: Int[Tensor, "batch pos-1"]
    source: Int[Tensor, "batch src_pos"] | None = None

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        """The model's arguments: model(tokens) for a decoder-only model, model(source, tokens) for an
        encoder–decoder; either way the logits at position t predict tokens[:, t + 1]."""
        return (self.tokens,) if self.source is None else (self.source, self.tokens)


@runtime_checkable
class Batches(Protocol):
    """A data source for `train`. `get_batch` returns the whole *global* batch number `index` of
    `split` — `batch_size` rows of at most `seq_len` tokens — and must be a pure function of its
    arguments: that is what makes resumption exact and lets every DDP rank cut its own rows from
    the same batch."""

    def get_batch(self, split: str, index: int, batch_size: int, seq_len: int, seed: int) -> Batch: ...


def batch_seed(seed: int, split: str, index: int) -> int:
    """A 64-bit seed for batch `index` of `split`, decorrelated from every other (seed, split, index)
    by NumPy's SeedSequence hashing (nearby integer seeds would give correlated streams)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    state = np.random.SeedSequence([seed, SPLITS.index(split), index]).generate_state(1, np.uint64)
    return int(state[0])


class TokenStream:
    """Random windows of `seq_len` tokens. A 1-D tensor is one long stream; a 2-D tensor is a set of
    independent sequences (e.g. samples of a Markov source) and windows never cross a row."""

    def __init__(self, train_tokens: Any, val_tokens: Any) -> None:
        self.tokens = {"train": _token_tensor(train_tokens, "train_tokens"),
                       "val": _token_tensor(val_tokens, "val_tokens")}
        for split, tokens in self.tokens.items():
            if tokens.ndim == 1:
                self.tokens[split] = tokens[None, :]
            elif tokens.ndim != 2:
                raise ValueError(f"TokenStream: {split}_tokens must be 1-D or 2-D, got shape {tuple(tokens.shape)}")

    def get_batch(self, split: str, index: int, batch_size: int, seq_len: int, seed: int) -> Batch:
        generator = torch.Generator().manual_seed(batch_seed(seed, split, index))
        tokens = self.tokens[split]
        rows, length = tokens.shape
        starts_per_row = length - seq_len + 1
        if starts_per_row < 1:
            raise ValueError(f"TokenStream: {split} sequences have {length} tokens, fewer than seq_len = {seq_len}")
        flat = torch.randint(rows * starts_per_row, (batch_size,), generator=generator)
        row, start = flat // starts_per_row, flat % starts_per_row
        window = tokens[row[:, None], start[:, None] + torch.arange(seq_len)]
        return Batch(window, window[:, 1:])


class SequenceBatches:
    """Whole fixed-length documents, each seen once per epoch in an order shuffled per (seed, epoch).
    `mask[i, t]` (optional, bool) says whether predicting token t of document i counts in the loss —
    False for e.g. a prompt the model should condition on but not be trained to produce."""

    def __init__(self, sequences: Any, val_sequences: Any, mask: Any = None, val_mask: Any = None) -> None:
        self.sequences = {"train": _token_tensor(sequences, "sequences"),
                          "val": _token_tensor(val_sequences, "val_sequences")}
        self.masks = {"train": mask, "val": val_mask}
        for split, seqs in self.sequences.items():
            if seqs.ndim != 2:
                raise ValueError(f"SequenceBatches: {split} sequences must be 2-D [n, length], "
                                 f"got shape {tuple(seqs.shape)}")
            if self.masks[split] is not None:
                m = torch.as_tensor(self.masks[split])
                if m.dtype != torch.bool or m.shape != seqs.shape:
                    raise ValueError(f"SequenceBatches: {split} mask must be a bool tensor of shape "
                                     f"{tuple(seqs.shape)}, got {m.dtype} {tuple(m.shape)}")
                self.masks[split] = m

    def get_batch(self, split: str, index: int, batch_size: int, seq_len: int, seed: int) -> Batch:
        seqs = self.sequences[split]
        n, length = seqs.shape
        if seq_len != length:
            raise ValueError(f"SequenceBatches: {split} documents have length {length}, "
                             f"but TrainConfig.seq_len is {seq_len}; they must match")
        rows = []
        first = index * batch_size  # position of this batch's first document in the endless stream
        for k in range(first, first + batch_size):
            epoch, position = divmod(k, n)
            rows.append(int(_permutation(n, batch_seed(seed, split, epoch))[position]))
        tokens = seqs[rows]
        targets = tokens[:, 1:].clone()
        if self.masks[split] is not None:
            targets[~self.masks[split][rows, 1:]] = IGNORE
        return Batch(tokens, targets)


@functools.lru_cache(maxsize=4)
def _permutation(n: int, seed: int) -> Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


def _token_tensor(tokens: Any, name: str) -> Tensor:
    tokens = torch.as_tensor(tokens)
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer token ids, got dtype {tokens.dtype}")
    if tokens.numel() == 0:
        raise ValueError(f"{name} is empty")
    return tokens.long()


# --- the loop -----------------------------------------------------------------------------------
def get_batch(data: Batches, split: str, index: int, cfg: TrainConfig, rank: int, world: int,
              device: torch.device) -> tuple[Batch, int]:
    """This rank's contiguous rows of global batch `index`, on `device`, and the number of scored
    targets in the whole global batch (the loss's denominator on every rank)."""
    seed = cfg.seed if split == "train" else EVAL_SEED
    batch = data.get_batch(split, index, cfg.batch_size, cfg.seq_len, seed)
    rows, length = batch.tokens.shape if batch.tokens.ndim == 2 else (None, None)
    if (rows != cfg.batch_size or not 2 <= length <= cfg.seq_len
            or tuple(batch.targets.shape) != (cfg.batch_size, length - 1)):
        raise ValueError(f"{type(data).__name__}.get_batch gave tokens {tuple(batch.tokens.shape)} and targets "
                         f"{tuple(batch.targets.shape)}; expected ({cfg.batch_size}, L) and "
                         f"({cfg.batch_size}, L − 1) with 2 ≤ L ≤ seq_len = {cfg.seq_len}")
    if batch.source is not None and (batch.source.ndim != 2 or batch.source.shape[0] != cfg.batch_size
                                     or not 1 <= batch.source.shape[1] <= cfg.seq_len):
        raise ValueError(f"{type(data).__name__}.get_batch gave a source of shape {tuple(batch.source.shape)}; "
                         f"expected ({cfg.batch_size}, S) with 1 ≤ S ≤ seq_len = {cfg.seq_len}")
    n_scored = int((batch.targets != IGNORE).sum())
    if n_scored == 0:
        raise ValueError(f"{split} batch {index} has no scored targets: the mask hides every prediction")
    mine = slice(rank * cfg.batch_size // world, (rank + 1) * cfg.batch_size // world)
    return Batch(*(None if t is None else t[mine].to(device) for t in batch)), n_scored


def summed_loss(logits: Float[Tensor, "batch pos d_vocab"], targets: Int[Tensor, "batch pos-1"]) -> Float[Tensor, ""]:
    """Σ −log P_θ(x_{t+1} | x_≤t) over the scored targets, in nats (divide by their count for the mean)."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                           ignore_index=IGNORE, reduction="sum")


@torch.no_grad()
def estimate_loss(model: torch.nn.Module, data: Batches, cfg: TrainConfig, rank: int = 0, world: int = 1,
                  device: torch.device | str = "cpu") -> float:
    """Mean held-out loss in nats per scored token over the same `eval_batches` batches every time."""
    was_training = model.training
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)  # [Σ loss, number of scored targets]
    for index in range(cfg.eval_batches):
        batch, _ = get_batch(data, "val", index, cfg, rank, world, torch.device(device))
        total[0] += summed_loss(model(*batch.inputs), batch.targets).double()
        total[1] += (batch.targets != IGNORE).sum()
    if world > 1:
        dist.all_reduce(total)
    model.train(was_training)
    return (total[0] / total[1]).item()


def get_lr(step: int, cfg: TrainConfig) -> float:
    """Learning rate for update `step` (0-based): lr·(step+1)/warmup_steps during warmup, then
    min_lr + ½(lr − min_lr)(1 + cos(π·progress)) with progress = (step − warmup)/(steps − warmup),
    which reaches min_lr when the run ends (as in nanoGPT and Chinchilla's cosine schedule)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on the ≥2-D weights (matrices, embeddings) and none on biases and
    norm gains, which set scales rather than store features (the nanoGPT / GPT-2 convention)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


@dataclass
class TrainState:
    """The scalars a resumed run picks up (weights, optimizer moments and RNG live beside it)."""

    step: int = 0  # updates done
    train_loss_nats: float | None = None  # at the last update
    best_val_loss_nats: float | None = None
    elapsed_s: float = 0.0  # wall time spent training, summed over resumptions
    tokens_seen: int = 0  # decoder tokens read by the updates (an encoder–decoder's targets, not sources)


@dataclass(frozen=True)
class TrainResult:
    """Where a call to `train` ended: the step reached, the last and best losses, every metrics record."""

    step: int
    train_loss_nats: float | None
    best_val_loss_nats: float | None
    history: list[dict[str, Any]] = field(repr=False)  # the metrics.jsonl records, oldest first
    elapsed_s: float = 0.0  # wall time spent training, summed over resumptions


class TrainingInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped training at a step boundary, after a complete checkpoint (`checkpoint`,
    None when there was no out_dir). A KeyboardInterrupt, so that code which catches Exception lets it by."""

    def __init__(self, signum: int, step: int | None = None, steps: int | None = None,
                 checkpoint: Path | None = None) -> None:
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        where = "" if step is None else f" at step {step}/{steps}"
        saved = "" if checkpoint is None else f"; checkpoint saved in {checkpoint}"
        super().__init__(f"interrupted by {signal.Signals(signum).name}{where}{saved}")


class TrainingDiverged(FloatingPointError):
    """The training loss became NaN or infinite; the last checkpoint (from before) is left as it was."""


class _StopSignals:
    """While active, the first SIGINT or SIGTERM is only recorded (`signum`), so that the loop can
    finish its step and checkpoint; a second one raises KeyboardInterrupt at once. Outside the main
    thread, where Python cannot install handlers, it does nothing."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "_StopSignals":
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._record) for s in STOP_SIGNALS}
        return self

    def _record(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name} while stopping")
        self.signum = signum

    def __exit__(self, *exc: Any) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def train(model: torch.nn.Module, cfg: TrainConfig, data: Batches, out_dir: str | Path | None = None,
          resume: bool = False, progress: bool = True, stop_after: int | None = None) -> TrainResult:
    """Train `model` in place: a `HookedTransformer` (model(tokens)) or an `EncoderDecoder`
    (model(source, tokens)), whichever `data`'s batches are for. With `out_dir`, write metrics.jsonl
    and checkpoints there (rank 0 only); `resume=True` continues from out_dir/checkpoint, and
    `resume=False` starts over, replacing any earlier checkpoint and metrics in out_dir. `stop_after`
    ends this call after that step, with a checkpoint, as if interrupted: the schedule still spans
    cfg.steps. SIGINT or SIGTERM ends it the same way at the next step boundary and raises
    `TrainingInterrupted`; a NaN or infinite loss raises `TrainingDiverged` before anything of that
    step is saved. Inside an initialised torch.distributed group the model is wrapped in DDP and
    each rank trains on its slice. The model is left in eval mode; a fresh start seeds torch's
    global RNG with cfg.seed."""
    rank, world = _rank_world()
    device = _device(cfg.device)
    out_dir = None if out_dir is None else Path(out_dir)
    _check_run(model, cfg, data, world, out_dir, resume, stop_after)
    model.to(device)
    optimizer = make_optimizer(model, cfg)
    metrics_path = None if out_dir is None else out_dir / METRICS_FILE
    if resume:
        state = load_checkpoint(out_dir / CHECKPOINT_DIR, model, optimizer, cfg)
        history = [r for r in _read_metrics(metrics_path) if r["step"] <= state.step]
        if [r["step"] for r in history] != list(range(1, state.step + 1)):
            raise ValueError(f"resume: {metrics_path} does not hold one record for each of the checkpoint's "
                             f"{state.step} steps; train with resume=False to start afresh")
    else:
        torch.manual_seed(cfg.seed)
        state, history = TrainState(), []
    if rank == 0 and out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        _remove_checkpoints(out_dir / CHECKPOINT_DIR, keep=resume)
        atomic_write(metrics_path, lambda path: path.write_text("".join(json.dumps(r) + "\n" for r in history)))
    ddp = model if world == 1 else DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None,
        forward_sync_buffers=False)  # buffers (masks, rotary tables) are functions of the config

    end = cfg.steps if stop_after is None else stop_after
    saved_step = state.step if resume else None  # the step of the newest complete checkpoint
    bar = progress_bar(cfg.steps, "train", initial=state.step, show=progress and rank == 0)
    log = logger.info if bar.disable else bar.write
    started = time.perf_counter() - state.elapsed_s
    interval_start = (time.perf_counter(), state.tokens_seen)
    last_save = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)  # gradients the caller left behind must not leak into step 1
    model.train()
    with _StopSignals() if out_dir is not None else contextlib.nullcontext() as stop:
        for step in range(state.step, end):
            lr = get_lr(step, cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            batch, n_scored = get_batch(data, "train", step, cfg, rank, world, device)
            loss_sum = summed_loss(ddp(*batch.inputs), batch.targets)
            # DDP averages gradients over ranks, so scale by world / (global count): the averaged
            # gradient is then exactly that of the mean loss over the whole global batch.
            (loss_sum * (world / n_scored)).backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            train_loss = _all_ranks_sum(loss_sum.detach(), world) / n_scored
            if not math.isfinite(train_loss):
                kept = ("no checkpoint was written yet" if saved_step is None or out_dir is None
                        else f"the checkpoint of step {saved_step} is kept in {out_dir / CHECKPOINT_DIR}")
                raise TrainingDiverged(f"training diverged at step {step + 1}: train loss is {train_loss} "
                                       f"(lr {lr:.3g}); try a lower lr or a tighter grad_clip; {kept}")

            state.step = done = step + 1
            state.train_loss_nats = train_loss
            state.tokens_seen += cfg.batch_size * batch.tokens.shape[1]
            state.elapsed_s = time.perf_counter() - started
            record = {"step": done, "tokens_seen": state.tokens_seen, "lr": lr, "train_loss_nats": train_loss}
            # Evaluate on the schedule only: an interruption (stop_after, a signal) must not add a
            # held-out loss, or a resumed run's records and best loss would differ from an uninterrupted one's.
            if done % cfg.eval_interval == 0 or done == cfg.steps:
                val_loss = estimate_loss(model, data, cfg, rank, world, device)
                record["val_loss_nats"] = val_loss
                if state.best_val_loss_nats is None or val_loss < state.best_val_loss_nats:
                    state.best_val_loss_nats = val_loss
                seconds, tokens_before = time.perf_counter() - interval_start[0], interval_start[1]
                tokens_per_s = (state.tokens_seen - tokens_before) / max(seconds, 1e-9)
                log(f"step {done:>6}/{cfg.steps} | lr {lr:.2e} | train {train_loss:.4f} nats | "
                    f"val {val_loss:.4f} nats | {tokens_per_s:,.0f} tokens/s")
                interval_start = (time.perf_counter(), state.tokens_seen)
            record["elapsed_s"] = round(state.elapsed_s, 3)
            history.append(record)
            if rank == 0 and metrics_path is not None:
                with metrics_path.open("a") as f:
                    f.write(json.dumps(record) + "\n")
            stopping = _any_rank(stop is not None and stop.signum is not None, world, device)
            due = (done == end or stopping or (cfg.checkpoint_interval and done % cfg.checkpoint_interval == 0)
                   or (cfg.checkpoint_every_s and time.perf_counter() - last_save >= cfg.checkpoint_every_s))
            if out_dir is not None and due:
                if rank == 0:
                    save_checkpoint(out_dir / CHECKPOINT_DIR, model, optimizer, cfg, state)
                saved_step, last_save = done, time.perf_counter()
            bar.update(1)
            bar.set_postfix(loss=f"{train_loss:.4f}")
            if stopping:
                bar.close()
                model.eval()
                raise TrainingInterrupted(stop.signum or signal.SIGTERM, done, cfg.steps, out_dir / CHECKPOINT_DIR)
    bar.close()
    model.eval()
    if world > 1:
        dist.barrier()  # rank 0's last checkpoint is complete on every rank's return
    return TrainResult(state.step, state.train_loss_nats, state.best_val_loss_nats, history, state.elapsed_s)


def _check_run(model: HookedTransformer, cfg: TrainConfig, data: Any, world: int, out_dir: Path | None,
               resume: bool, stop_after: int | None) -> None:
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"train needs a TrainConfig, got {type(cfg).__name__}")
    if not isinstance(data, Batches):
        raise TypeError(f"data must have get_batch(split, index, batch_size, seq_len, seed), got {type(data).__name__}")
    if cfg.seq_len > model.cfg.n_ctx:
        raise ValueError(f"TrainConfig.seq_len = {cfg.seq_len} is longer than the model's n_ctx = {model.cfg.n_ctx}")
    if cfg.batch_size % world:
        raise ValueError(f"TrainConfig.batch_size = {cfg.batch_size} does not split evenly over {world} ranks")
    if resume and out_dir is None:
        raise ValueError("resume=True needs the out_dir that holds the checkpoint")
    if stop_after is not None and not 1 <= stop_after <= cfg.steps:
        raise ValueError(f"stop_after must lie in [1, steps = {cfg.steps}], got {stop_after}")


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _device(name: str) -> torch.device:
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"TrainConfig.device is {name!r} but CUDA is not available here")
        if device.index is None:  # under torchrun each rank owns the GPU of its local rank
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def _all_ranks_sum(value: Tensor, world: int) -> float:
    if world > 1:
        value = value.clone()
        dist.all_reduce(value)
    return value.item()


def _any_rank(flag: bool, world: int, device: torch.device) -> bool:
    """True on every rank when it is True on any (so that all ranks stop after the same step)."""
    if world == 1:
        return flag
    value = torch.tensor([float(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


# --- checkpoints --------------------------------------------------------------------------------
def save_checkpoint(directory: str | Path, model: HookedTransformer, optimizer: torch.optim.Optimizer,
                    cfg: TrainConfig, state: TrainState) -> Path:
    """Write a complete checkpoint into a temporary sibling folder, then rename it into place."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.tmp-"))
    try:
        tmp.chmod(0o777 & ~current_umask())  # mkdtemp makes it private; the checkpoint should not be
        model.save(tmp)
        save_file(_optimizer_tensors(optimizer), str(tmp / OPTIMIZER_FILE))
        save_file(_rng_tensors(), str(tmp / RNG_FILE))
        meta = {"format": STATE_FORMAT, **dataclasses.asdict(state), "world_size": _rank_world()[1],
                "train_config": cfg.to_dict(), "model_config": model.cfg.to_dict()}
        (tmp / STATE_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        # A directory cannot be renamed over a non-empty one: move the old one aside first. A crash
        # between the two renames leaves the old checkpoint complete at `.checkpoint.old`, which
        # `find_checkpoint` falls back to.
        old = _old_path(directory)
        if directory.exists():
            discard_tree(old)
            os.replace(directory, old)
        os.replace(tmp, directory)
        discard_tree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def has_checkpoint(directory: str | Path) -> bool:
    """Whether `directory` (a run's out_dir/checkpoint) holds a checkpoint to resume from."""
    try:
        find_checkpoint(directory)
    except FileNotFoundError:
        return False
    return True


def discard_tree(path: Path) -> None:
    """Remove a folder so that no one sees it half-removed under its name: it is renamed to a
    temporary name first (a crash leaves a `.tmp-` leftover, which the next clean-up removes)."""
    if not path.exists() and not path.is_symlink():
        return
    doomed = path.with_name(f"{path.name}.tmp-discarded-{os.getpid()}-{time.monotonic_ns()}")
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def find_checkpoint(directory: str | Path) -> Path:
    """The checkpoint folder, or the previous one left aside by a crash mid-swap."""
    directory = Path(directory)
    for candidate in (directory, _old_path(directory)):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"no checkpoint at {directory} to resume from; train with resume=False to start fresh")


def load_checkpoint(directory: str | Path, model: HookedTransformer, optimizer: torch.optim.Optimizer,
                    cfg: TrainConfig) -> TrainState:
    """Restore weights, optimizer state and RNG from a checkpoint made with the same configs."""
    directory = find_checkpoint(directory)
    missing = [name for name in CHECKPOINT_FILES if not (directory / name).is_file()]
    if missing:
        raise FileNotFoundError(f"checkpoint {directory} is incomplete: missing {', '.join(missing)}")
    meta = _read_state_file(directory / STATE_FILE)
    differences = []
    for what, saved, now, skip in (("config", meta["train_config"], cfg.to_dict(), RESUMABLE_CHANGES),
                                   ("model config", meta["model_config"], model.cfg.to_dict(), ("tokenizer",))):
        changed = _differences(saved, now, skip)
        if changed:
            differences.append(f"{what} differs in {', '.join(changed)}")
    if differences:
        raise ValueError("resume: " + "; ".join(differences))

    model.load_weights(_read_safetensors(directory / WEIGHTS_FILE), source=str(directory / WEIGHTS_FILE))
    _load_optimizer_tensors(optimizer, _read_safetensors(directory / OPTIMIZER_FILE), directory / OPTIMIZER_FILE)
    _set_rng_tensors(_read_safetensors(directory / RNG_FILE), directory / RNG_FILE)
    # Checkpoints from before tokens_seen was kept were all of fixed-length windows.
    tokens_seen = meta.get("tokens_seen", meta["step"] * cfg.batch_size * cfg.seq_len)
    return TrainState(step=meta["step"], train_loss_nats=meta["train_loss_nats"],
                      best_val_loss_nats=meta["best_val_loss_nats"], elapsed_s=meta["elapsed_s"],
                      tokens_seen=tokens_seen)


def _old_path(directory: Path) -> Path:
    return directory.with_name(f".{directory.name}.old")


def _remove_checkpoints(directory: Path, keep: bool = False) -> None:
    """Remove the checkpoint (unless `keep`) and what crashed saves left: their temporary folders."""
    if not keep:
        discard_tree(directory)
        discard_tree(_old_path(directory))
    for leftover in [*directory.parent.glob(f".{directory.name}.tmp-*"), *directory.parent.glob("*.tmp-discarded-*")]:
        shutil.rmtree(leftover, ignore_errors=True)


def _differences(saved: dict[str, Any], now: dict[str, Any], skip: tuple[str, ...]) -> list[str]:
    keys = [k for k in dict.fromkeys([*now, *saved]) if k not in skip]
    return [f"{k} (checkpoint {saved.get(k, '<absent>')!r}, now {now.get(k, '<absent>')!r})"
            for k in keys if saved.get(k, "<absent>") != now.get(k, "<absent>")]


def _read_state_file(path: Path) -> dict[str, Any]:
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"malformed checkpoint state {path}: {err}") from err
    need = {"format", "step", "train_loss_nats", "best_val_loss_nats", "elapsed_s", "train_config", "model_config"}
    if not isinstance(meta, dict) or need - set(meta):
        raise ValueError(f"malformed checkpoint state {path}: missing {sorted(need - set(meta or {}))}")
    if meta["format"] != STATE_FORMAT:
        raise ValueError(f"checkpoint state {path} has format {meta['format']!r}; this Forma reads {STATE_FORMAT!r}")
    return meta


def _read_safetensors(path: Path) -> dict[str, Tensor]:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"malformed or truncated checkpoint file {path}: {err}") from err


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> dict[str, Tensor]:
    """AdamW's per-parameter state flattened to '{param index}.{name}' → tensor (step is a tensor too)."""
    out = {}
    for index, slots in optimizer.state_dict()["state"].items():
        for name, value in slots.items():
            if not isinstance(value, Tensor):
                raise TypeError(f"optimizer state {index}.{name} is a {type(value).__name__}, not a tensor")
            out[f"{index}.{name}"] = value.detach().cpu().contiguous()
    return out


def _load_optimizer_tensors(optimizer: torch.optim.Optimizer, tensors: dict[str, Tensor], path: Path) -> None:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state: dict[int, dict[str, Tensor]] = {}
    for key, value in tensors.items():
        index, _, name = key.partition(".")
        if not index.isdigit() or int(index) >= len(params) or not name:
            raise ValueError(f"{path}: unexpected entry {key!r} for an optimizer over {len(params)} tensors")
        if name.startswith("exp_avg") and value.shape != params[int(index)].shape:
            raise ValueError(f"{path}: {key} has shape {tuple(value.shape)}, "
                             f"the parameter has {tuple(params[int(index)].shape)}")
        state.setdefault(int(index), {})[name] = value
    # The parameter groups (lr, betas, decay) follow from the TrainConfig, already checked equal.
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})


def _rng_tensors() -> dict[str, Tensor]:
    out = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["torch_cuda"] = torch.cuda.get_rng_state()
    return out


def _set_rng_tensors(tensors: dict[str, Tensor], path: Path) -> None:
    if "torch_cpu" not in tensors or tensors["torch_cpu"].dtype != torch.uint8:
        raise ValueError(f"{path}: no uint8 'torch_cpu' RNG state")
    torch.set_rng_state(tensors["torch_cpu"])
    if "torch_cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["torch_cuda"])


def _read_metrics(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl records; a torn last line (a crash mid-append) is dropped, any other bad line is an error."""
    if not path.is_file():
        return []
    lines = path.read_text().splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number}: malformed metrics line ({err})") from err
    return records


# --- encoder–decoder models ---------------------------------------------------------------------
class PairBatches:
    """(source, target) id pairs for an encoder–decoder model, grouped by (source length, target length)
    so that no batch needs padding or a padding mask. Batch `index` of a split draws one group with
    probability ∝ its size, then `batch_size` of its pairs with replacement, from a generator seeded by
    (seed, split, index): a pure function of its arguments, like every `Batches`. The batch's tokens
    are the targets (what the decoder reads under teacher forcing), its source the sources; `seq_len`
    bounds both lengths."""

    def __init__(self, train_pairs: list[tuple[list[int], list[int]]], val_pairs: list[tuple[list[int], list[int]]]):
        self.groups: dict[str, list[tuple[Tensor, Tensor]]] = {}
        for split, pairs in (("train", train_pairs), ("val", val_pairs)):
            if not pairs:
                raise ValueError(f"PairBatches: no {split} pairs")
            by_shape: dict[tuple[int, int], list[tuple[list[int], list[int]]]] = {}
            for src, tgt in pairs:
                if len(src) < 1 or len(tgt) < 2:
                    raise ValueError(f"PairBatches: a {split} pair has a source of {len(src)} and a target of "
                                     f"{len(tgt)} tokens; it needs ≥ 1 and ≥ 2 (one to read, one to predict)")
                by_shape.setdefault((len(src), len(tgt)), []).append((src, tgt))
            self.groups[split] = [(torch.tensor([s for s, _ in group]), torch.tensor([t for _, t in group]))
                                  for _, group in sorted(by_shape.items())]

    def get_batch(self, split: str, index: int, batch_size: int, seq_len: int, seed: int) -> Batch:
        generator = torch.Generator().manual_seed(batch_seed(seed, split, index))
        groups = self.groups[split]
        sizes = torch.tensor([len(src) for src, _ in groups], dtype=torch.float)
        src, tgt = groups[int(torch.multinomial(sizes, 1, generator=generator))]
        if max(src.shape[1], tgt.shape[1]) > seq_len:
            raise ValueError(f"PairBatches: {split} pairs of {src.shape[1]} source and {tgt.shape[1]} target tokens "
                             f"are longer than seq_len = {seq_len}")
        rows = torch.randint(len(src), (batch_size,), generator=generator)
        return Batch(tgt[rows], tgt[rows, 1:], source=src[rows])


def train_seq2seq(model: torch.nn.Module, cfg: TrainConfig, data: PairBatches, out_dir: str | Path | None = None,
                  progress: bool = True) -> TrainResult:
    """`train` on (source, target) pairs: the one loop serves encoder–decoders too (kept for callers of this name)."""
    return train(model, cfg, data, out_dir, progress=progress)


# --- torchrun entry point -----------------------------------------------------------------------
def init_distributed(device: str = "cpu") -> tuple[int, int]:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR, ...) when
    WORLD_SIZE > 1 — gloo on CPU, NCCL on CUDA — and return (rank, world size)."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError as err:
        raise ValueError(f"WORLD_SIZE must be an integer, got {os.environ['WORLD_SIZE']!r}") from err
    if world > 1 and not dist.is_initialized():
        if torch.device(device).type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group(backend="nccl")
        else:
            dist.init_process_group(backend="gloo")
    return _rank_world()


DEMO_MODEL = ModelConfig(d_vocab=16, d_model=32, n_layers=2, n_heads=2, n_ctx=64, tokenizer="markov-16")
DEMO_TRAIN = TrainConfig(steps=200, batch_size=16, seq_len=32, lr=3e-3, min_lr=3e-4, warmup_steps=20,
                         eval_interval=50, eval_batches=4)


def demo_markov(seed: int = 0) -> tuple[HookedTransformer, TokenStream]:
    """A tiny model and an order-1 Markov stream over 16 tokens (`MarkovSource(16, order=1, seed=0)`)."""
    from lab.data import MarkovSource

    source = MarkovSource(vocab_size=16, order=1, seed=0)
    data = TokenStream(torch.from_numpy(source.sample(256, 128, seed=1)),
                       torch.from_numpy(source.sample(32, 128, seed=2)))
    return HookedTransformer(DEMO_MODEL, seed=seed), data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo-markov", action="store_true",
                        help="train the demo model on an order-1 Markov stream (zoo models: `forma train NAME`)")
    parser.add_argument("--out", type=Path, required=True, help="run folder: checkpoint/, metrics.jsonl, the model")
    parser.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--save-rank-weights", action="store_true",
                        help="each rank also writes its final weights to OUT/rank{r}.safetensors (DDP checks)")
    for f in fields(TrainConfig):  # one flag per TrainConfig field, defaulting to the demo recipe
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default),
                            default=getattr(DEMO_TRAIN, f.name), help=f"TrainConfig.{f.name}")
    args = parser.parse_args(argv)
    if not args.demo_markov:
        parser.error("choose the data: --demo-markov (zoo models train with `forma train NAME`)")
    try:
        cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
    except ValueError as err:
        parser.error(str(err))

    rank, world = init_distributed(cfg.device)
    try:
        model, data = demo_markov()
        try:
            result = train(model, cfg, data, args.out, resume=args.resume, progress=not args.no_progress)
        except TrainingInterrupted as stop:
            if rank == 0:
                print(f"python -m lab.train: {stop}; continue with the same command and --resume", file=sys.stderr)
            return 128 + stop.signum
        except (ValueError, FileNotFoundError, FloatingPointError) as err:
            print(f"python -m lab.train: error: {err}", file=sys.stderr)
            return 1 if isinstance(err, FloatingPointError) else 2
        if rank == 0:
            model.save(args.out)
            print(json.dumps({"step": result.step, "train_loss_nats": result.train_loss_nats,
                              "best_val_loss_nats": result.best_val_loss_nats, "world_size": world}))
        if args.save_rank_weights:
            state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
            atomic_write(args.out / f"rank{rank}.safetensors", lambda path: save_file(state, str(path)))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
