"""The training loop, top to bottom: `get_batch` (this rank's rows of the global batch), `estimate_loss` (mean
held-out loss over fixed batches), `get_lr` (linear warmup, then cosine to a floor), and `train`, one loop for both
model classes with evaluation, checkpointing and one log line per eval interval."""

import contextlib
import json
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel

from lab.distributed import all_ranks_sum, any_rank, rank_world
from lab.files import atomic_write
from lab.model.transformer import HookedTransformer
from lab.progress import bar as progress_bar
from lab.thread_invariant import warn_unless_thread_invariant
from lab.train.batches import IGNORE, Batch, Batches
from lab.train.checkpoint import (
    CHECKPOINT_DIR,
    METRICS_FILE,
    TrainState,
    load_checkpoint,
    read_metrics,
    remove_checkpoints,
    save_checkpoint,
)
from lab.train.config import TrainConfig

logger = logging.getLogger("lab.train")  # the package's one logger
EVAL_SEED = 0  # held-out batches do not depend on the training seed, so runs with different seeds compare
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def get_batch(
    data: Batches, split: str, index: int, cfg: TrainConfig, rank: int, world: int, device: torch.device
) -> tuple[Batch, int]:
    """This rank's contiguous rows of global batch `index`, on `device`, and the number of scored
    targets in the whole global batch (the loss's denominator on every rank)."""
    seed = cfg.seed if split == "train" else EVAL_SEED
    batch = data.get_batch(split, index, cfg.batch_size, cfg.seq_len, seed)
    rows, length = batch.tokens.shape if batch.tokens.ndim == 2 else (None, None)
    if (
        rows != cfg.batch_size
        or not 2 <= length <= cfg.seq_len
        or tuple(batch.targets.shape) != (cfg.batch_size, length - 1)
    ):
        raise ValueError(
            f"{type(data).__name__}.get_batch gave tokens {tuple(batch.tokens.shape)} and targets "
            f"{tuple(batch.targets.shape)}; expected ({cfg.batch_size}, L) and "
            f"({cfg.batch_size}, L − 1) with 2 ≤ L ≤ seq_len = {cfg.seq_len}"
        )
    if batch.source is not None and (
        batch.source.ndim != 2
        or batch.source.shape[0] != cfg.batch_size
        or not 1 <= batch.source.shape[1] <= cfg.seq_len
    ):
        raise ValueError(
            f"{type(data).__name__}.get_batch gave a source of shape {tuple(batch.source.shape)}; "
            f"expected ({cfg.batch_size}, S) with 1 ≤ S ≤ seq_len = {cfg.seq_len}"
        )
    n_scored = int((batch.targets != IGNORE).sum())
    if n_scored == 0:
        raise ValueError(f"{split} batch {index} has no scored targets: the mask hides every prediction")
    mine = slice(rank * cfg.batch_size // world, (rank + 1) * cfg.batch_size // world)
    return Batch(*(None if t is None else t[mine].to(device) for t in batch)), n_scored


def summed_loss(logits: Float[Tensor, "batch pos d_vocab"], targets: Int[Tensor, "batch pos-1"]) -> Float[Tensor, ""]:
    """Σ −log P_θ(x_{t+1} | x_≤t) over the scored targets, in nats (divide by their count for the mean)."""
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=IGNORE, reduction="sum"
    )


@torch.no_grad()
def estimate_loss(
    model: torch.nn.Module,
    data: Batches,
    cfg: TrainConfig,
    rank: int = 0,
    world: int = 1,
    device: torch.device | str = "cpu",
) -> float:
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
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


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

    def __init__(
        self, signum: int, step: int | None = None, steps: int | None = None, checkpoint: Path | None = None
    ) -> None:
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


def train(
    model: torch.nn.Module,
    cfg: TrainConfig,
    data: Batches,
    out_dir: str | Path | None = None,
    resume: bool = False,
    progress: bool = True,
    stop_after: int | None = None,
) -> TrainResult:
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
    rank, world = rank_world()
    device = _device(cfg.device)
    out_dir = None if out_dir is None else Path(out_dir)
    _check_run(model, cfg, data, world, out_dir, resume, stop_after)
    if device.type == "cpu":
        warn_unless_thread_invariant()
    model.to(device)
    optimizer = make_optimizer(model, cfg)
    state, history = _start(model, optimizer, cfg, out_dir, resume, rank)
    ddp = _data_parallel(model, world, device)
    end = cfg.steps if stop_after is None else stop_after
    saved_step = state.step if resume else None  # the step of the newest complete checkpoint
    bar = progress_bar(cfg.steps, "train", initial=state.step, show=progress and rank == 0)
    started = time.perf_counter() - state.elapsed_s
    metrics_path = out_dir / METRICS_FILE if rank == 0 and out_dir is not None else None
    records = _Records(history, metrics_path, logger.info if bar.disable else bar.write, cfg.steps, state.tokens_seen)
    last_save = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)  # gradients the caller left behind must not leak into step 1
    model.train()
    with _StopSignals() if out_dir is not None else contextlib.nullcontext() as stop:
        for step in range(state.step, end):
            lr = get_lr(step, cfg)
            batch, n_scored = get_batch(data, "train", step, cfg, rank, world, device)
            train_loss = _update(ddp, optimizer, lr, batch, n_scored, cfg, world)
            _check_finite(train_loss, step, lr, saved_step, out_dir)
            done = _advance(state, train_loss, cfg.batch_size * batch.tokens.shape[1], started)
            records.add(state, lr, _held_out(model, data, cfg, rank, world, device, state))
            stopping = any_rank(stop is not None and stop.signum is not None, world, device)
            if out_dir is not None and (done == end or stopping or _checkpoint_due(cfg, done, last_save)):
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
    return TrainResult(state.step, state.train_loss_nats, state.best_val_loss_nats, records.history, state.elapsed_s)


def _start(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    cfg: TrainConfig,
    out_dir: Path | None,
    resume: bool,
    rank: int,
) -> tuple[TrainState, list[dict[str, Any]]]:
    """Where the run starts, and its metrics records so far: the checkpoint's state and the records up to its step
    (resume; ValueError when they do not match), or a fresh state with torch seeded by cfg.seed. Rank 0 readies
    out_dir: an earlier checkpoint removed unless resuming, metrics.jsonl rewritten with the kept records."""
    metrics_path = None if out_dir is None else out_dir / METRICS_FILE
    if resume:
        state = load_checkpoint(out_dir / CHECKPOINT_DIR, model, optimizer, cfg)
        history = [r for r in read_metrics(metrics_path) if r["step"] <= state.step]
        if [r["step"] for r in history] != list(range(1, state.step + 1)):
            raise ValueError(
                f"resume: {metrics_path} does not hold one record for each of the checkpoint's "
                f"{state.step} steps; train with resume=False to start afresh"
            )
    else:
        torch.manual_seed(cfg.seed)
        state, history = TrainState(), []
    if rank == 0 and out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        remove_checkpoints(out_dir / CHECKPOINT_DIR, keep=resume)
        atomic_write(metrics_path, lambda path: path.write_text("".join(json.dumps(r) + "\n" for r in history)))
    return state, history


def _advance(state: TrainState, train_loss: float, tokens: int, started: float) -> int:
    """Count a finished step into `state` (its train loss, its `tokens`, the wall time since `started`); its number."""
    state.step += 1
    state.train_loss_nats = train_loss
    state.tokens_seen += tokens
    state.elapsed_s = time.perf_counter() - started
    return state.step


def _held_out(
    model: torch.nn.Module,
    data: Batches,
    cfg: TrainConfig,
    rank: int,
    world: int,
    device: torch.device,
    state: TrainState,
) -> float | None:
    """The held-out loss after step state.step when the eval schedule calls for one (kept as the best when it is
    the lowest yet), else None. On the schedule only: an interruption (stop_after, a signal) must not add a
    held-out loss, or a resumed run's records and best loss would differ from an uninterrupted one's."""
    if state.step % cfg.eval_interval and state.step != cfg.steps:
        return None
    val_loss = estimate_loss(model, data, cfg, rank, world, device)
    if state.best_val_loss_nats is None or val_loss < state.best_val_loss_nats:
        state.best_val_loss_nats = val_loss
    return val_loss


def _data_parallel(model: torch.nn.Module, world: int, device: torch.device) -> torch.nn.Module:
    """The model as each step runs it: itself on one rank, wrapped in DDP on several."""
    if world == 1:
        return model
    return DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None, forward_sync_buffers=False
    )  # buffers (masks, rotary tables) are functions of the config


def _update(
    ddp: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    lr: float,
    batch: Batch,
    n_scored: int,
    cfg: TrainConfig,
    world: int,
) -> float:
    """One optimizer step at learning rate `lr` on this rank's rows of the global batch; the global batch's mean
    train loss."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss_sum = summed_loss(ddp(*batch.inputs), batch.targets)
    # DDP averages gradients over ranks, so scale by world / (global count): the averaged
    # gradient is then exactly that of the mean loss over the whole global batch.
    (loss_sum * (world / n_scored)).backward()
    if cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), cfg.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return all_ranks_sum(loss_sum.detach(), world) / n_scored


def _check_finite(train_loss: float, step: int, lr: float, saved_step: int | None, out_dir: Path | None) -> None:
    """TrainingDiverged for a NaN or infinite loss, saying which checkpoint is left."""
    if math.isfinite(train_loss):
        return
    kept = (
        "no checkpoint was written yet"
        if saved_step is None or out_dir is None
        else f"the checkpoint of step {saved_step} is kept in {out_dir / CHECKPOINT_DIR}"
    )
    raise TrainingDiverged(
        f"training diverged at step {step + 1}: train loss is {train_loss} "
        f"(lr {lr:.3g}); try a lower lr or a tighter grad_clip; {kept}"
    )


def _checkpoint_due(cfg: TrainConfig, done: int, last_save: float) -> bool:
    """Whether the checkpoint schedule calls for one after step `done`: every checkpoint_interval steps, or
    checkpoint_every_s seconds since the last."""
    return bool(
        (cfg.checkpoint_interval and done % cfg.checkpoint_interval == 0)
        or (cfg.checkpoint_every_s and time.perf_counter() - last_save >= cfg.checkpoint_every_s)
    )


class _Records:
    """The run's metrics records: kept (`history`), appended to metrics.jsonl (`path`, None on ranks > 0 and without
    an out_dir), and logged, with the tokens per second since the last line, at each held-out loss."""

    def __init__(
        self, history: list[dict[str, Any]], path: Path | None, log: Callable[[str], Any], steps: int, tokens_seen: int
    ) -> None:
        self.history, self.path, self.log, self.steps = history, path, log, steps
        self.interval_start = (time.perf_counter(), tokens_seen)

    def add(self, state: TrainState, lr: float, val_loss: float | None) -> None:
        """The record of the step `state` has just finished (val_loss: its held-out loss, on the eval schedule)."""
        done, train_loss = state.step, state.train_loss_nats
        record = {"step": done, "tokens_seen": state.tokens_seen, "lr": lr, "train_loss_nats": train_loss}
        if val_loss is not None:
            record["val_loss_nats"] = val_loss
            seconds, tokens_before = time.perf_counter() - self.interval_start[0], self.interval_start[1]
            tokens_per_s = (state.tokens_seen - tokens_before) / max(seconds, 1e-9)
            self.log(
                f"step {done:>6}/{self.steps} | lr {lr:.2e} | train {train_loss:.4f} nats | "
                f"val {val_loss:.4f} nats | {tokens_per_s:,.0f} tokens/s"
            )
            self.interval_start = (time.perf_counter(), state.tokens_seen)
        record["elapsed_s"] = round(state.elapsed_s, 3)
        self.history.append(record)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")


def _check_run(
    model: HookedTransformer,
    cfg: TrainConfig,
    data: Any,
    world: int,
    out_dir: Path | None,
    resume: bool,
    stop_after: int | None,
) -> None:
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


def _device(name: str) -> torch.device:
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"TrainConfig.device is {name!r} but CUDA is not available here")
        if device.index is None:  # under torchrun each rank owns the GPU of its local rank
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device
