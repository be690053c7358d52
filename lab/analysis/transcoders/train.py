"""Training transcoders out of core, from a harvest's shards (`lab.analysis.activations.save_activations` of
`TranscoderConfig.hooks()` at every position), in three separate parts so that a distributed trainer can reuse each:

    DataOrder        which rows make batch `step`: a function of (seed, step) alone. An epoch visits the shards in
                     a permuted order and each shard's rows in a permuted order; memory is one shard and one batch.
                     A rank of a data-parallel run would take its slice of each batch; a rank that trains one hook
                     site reads only its layer's hooks.
    train_step       one update on one batch: the loss (per-layer fraction of variance unexplained, summed, plus the
                     sparsity penalty: λ Σ a_i ‖d_i‖ for ReLU, λ L0 for JumpReLU, none for top-k), backward, AdamW.
    checkpoint       the resumable state: transcoders, optimizer moments, step and scalars, as safetensors + JSON in
                     a folder swapped in atomically (`lab.train.checkpoint`'s discipline). No RNG state is needed: the
                     data order and the initialisation follow from the seeds, so a resumed run is bitwise the one that
                     never stopped.

`train_transcoders(store, cfg, training, out_dir)` runs them: out_dir/checkpoint/ while training, out_dir/
{config.json, transcoders.safetensors, training.json} when done.
"""

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file
from torch import Tensor

from lab.analysis.activations import ActivationStore
from lab.analysis.transcoders.model import TranscoderConfig, Transcoders
from lab.configs import Record, check_fields, need
from lab.files import atomic_write_text, current_umask
from lab.train.checkpoint import discard_tree, load_optimizer_tensors, optimizer_tensors, read_safetensors

STATE_FORMAT = "forma-transcoder-train/1"
CHECKPOINT_DIR = "checkpoint"
TRAINING_FILE = "training.json"


@dataclass(frozen=True)
class TranscoderTraining(Record):
    """How transcoders are trained: every field shapes the trajectory but checkpoint_interval."""

    steps: int
    batch_size: int = 1024
    lr: float = 1e-3
    sparsity: float = 0.0  # λ: of the decoder-norm-weighted L1 (ReLU) or of the L0 (JumpReLU); top-k needs none
    sparsity_warmup: float = 0.2  # λ ramps up linearly over this share of the steps
    decay_from: float = 0.8  # the learning rate decays linearly to 0 from this share of the steps on
    seed: int = 0  # the data order
    checkpoint_interval: int = 0  # steps between checkpoints; 0: none before the end

    def __post_init__(self) -> None:
        check_fields(self)
        need(self, self.steps > 0, "must be a positive integer", "steps")
        need(self, self.batch_size > 0, "must be a positive integer", "batch_size")
        need(self, self.lr > 0, "must be positive", "lr")
        need(self, self.sparsity >= 0, "must be non-negative", "sparsity")
        need(self, 0 <= self.sparsity_warmup <= 1 and 0 <= self.decay_from <= 1, "shares of the steps lie in [0, 1]")
        need(self, self.checkpoint_interval >= 0, "must be a non-negative integer", "checkpoint_interval")


def rows(store: ActivationStore, shard: int, cfg: TranscoderConfig) -> tuple[Tensor, Tensor]:
    """One shard's (inputs, outputs), each [rows, n_layers, d_model] in float32."""
    part = store.shard(shard, cfg.hooks())
    x = torch.stack([part[cfg.hook("input", layer)].float() for layer in range(cfg.n_layers)], dim=1)
    y = torch.stack([part[cfg.hook("output", layer)].float() for layer in range(cfg.n_layers)], dim=1)
    return x, y


class DataOrder:
    """Batch `step` is rows [step·B, (step+1)·B) of the endless sequence epoch 0, epoch 1, …, where epoch e visits
    the shards in the order permutation(seed, e) and shard s's rows in the order permutation(seed, e, s)."""

    def __init__(self, store: ActivationStore, cfg: TranscoderConfig, batch_size: int, seed: int):
        missing = [name for name in cfg.hooks() if name not in store.names]
        if missing:
            raise ValueError(f"{store.directory} holds no {missing[0]!r}: harvest TranscoderConfig.hooks() "
                             f"({len(cfg.hooks())} hooks) at every position first")
        self.store, self.cfg, self.batch_size, self.seed = store, cfg, batch_size, seed
        self.counts = [int(s["rows"]) for s in store.index["shards"]]
        self.n_rows = sum(self.counts)

    def shard_order(self, epoch: int) -> list[int]:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.counts)).tolist()

    def row_order(self, epoch: int, shard: int) -> Tensor:
        return torch.from_numpy(np.random.default_rng([self.seed, epoch, shard]).permutation(self.counts[shard]))

    def batches(self, start: int = 0) -> Iterator[tuple[int, Tensor, Tensor]]:
        """(step, x, y) from batch `start` on, forever."""
        first = start * self.batch_size
        epoch, offset = divmod(first, self.n_rows)
        step, held_x, held_y = start, [], []
        while True:
            done = 0
            for shard in self.shard_order(epoch):
                if done + self.counts[shard] <= offset:  # wholly before the resume point: not read
                    done += self.counts[shard]
                    continue
                x, y = rows(self.store, shard, self.cfg)
                order = self.row_order(epoch, shard)[max(0, offset - done):]
                done += self.counts[shard]
                x, y = x[order], y[order]
                while len(x):
                    need_rows = self.batch_size - sum(len(t) for t in held_x)
                    held_x.append(x[:need_rows])
                    held_y.append(y[:need_rows])
                    x, y = x[need_rows:], y[need_rows:]
                    if sum(len(t) for t in held_x) == self.batch_size:
                        yield step, torch.cat(held_x), torch.cat(held_y)
                        step, held_x, held_y = step + 1, [], []
            epoch, offset = epoch + 1, 0


def output_scale(store: ActivationStore, cfg: TranscoderConfig) -> Tensor:
    """Σ_d Var(y_d) of each layer's output over the first shard: the loss's per-layer denominator, so that the
    reconstruction term is a fraction of variance unexplained and every layer weighs alike."""
    _, y = rows(store, 0, cfg)
    return y.var(dim=0).sum(-1).clamp_min(1e-12)


def sparsity_weight(step: int, training: TranscoderTraining) -> float:
    ramp = training.sparsity_warmup * training.steps
    return training.sparsity * (1.0 if ramp <= 0 else min(1.0, (step + 1) / ramp))


def learning_rate(step: int, training: TranscoderTraining) -> float:
    start = training.decay_from * training.steps
    if step < start:
        return training.lr
    return training.lr * max(0.0, (training.steps - step) / max(1.0, training.steps - start))


def train_step(model: Transcoders, optimizer: torch.optim.Optimizer, x: Tensor, y: Tensor, scale: Tensor,
               sparsity: float, lr: float) -> dict[str, float]:
    """One update on (x, y) [batch, L, d_model]; returns the batch's loss terms, FVU and L0 (before the update)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    pre = model.encode(x)
    acts = model.activate(pre)
    error = (model.decode(acts) - y).pow(2).sum(-1).mean(0)  # [L]
    fvu = error / scale
    reconstruction = fvu.sum()
    kind = model.cfg.activation
    if kind == "relu":
        penalty = (acts * model.decoder_norms()).sum(-1).mean(0).sum()
    elif kind == "jumprelu":
        penalty = model.l0_penalty(pre)
    else:
        penalty = torch.zeros(())
    loss = reconstruction + sparsity * penalty
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return {"loss": float(loss.detach()), "fvu": float(fvu.detach().mean()),
            "l0": float((acts > 0).sum(-1).float().mean()), "penalty": float(penalty.detach())}


def make_optimizer(model: Transcoders, training: TranscoderTraining) -> torch.optim.Adam:
    return torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=training.lr, betas=(0.9, 0.999))


@dataclass
class TrainerState:
    """The scalars a resumed run picks up (weights and optimizer moments live beside it)."""

    step: int = 0
    history: list[dict[str, float]] | None = None  # one record per logged step


def _fingerprint(store: ActivationStore) -> dict[str, Any]:
    return {"n_rows": len(store), "shards": [[s["file"], s["rows"]] for s in store.index["shards"]],
            "model": store.index.get("model")}


def save_checkpoint(directory: Path, model: Transcoders, optimizer: torch.optim.Optimizer,
                    training: TranscoderTraining, state: TrainerState, store: ActivationStore) -> None:
    """Written into a temporary sibling, then swapped in: a crash leaves the old checkpoint or the new one."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.tmp-"))
    try:
        tmp.chmod(0o777 & ~current_umask())
        model.save(tmp)
        save_file(optimizer_tensors(optimizer), str(tmp / "optimizer.safetensors"))
        meta = {"format": STATE_FORMAT, **asdict(state), "training": training.to_dict(),
                "transcoders": model.cfg.to_dict(), "store": _fingerprint(store)}
        (tmp / "state.json").write_text(json.dumps(meta, indent=2) + "\n")
        old = directory.with_name(f".{directory.name}.old")
        if directory.exists():
            discard_tree(old)
            os.replace(directory, old)
        os.replace(tmp, directory)
        discard_tree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_checkpoint(directory: Path, model: Transcoders, optimizer: torch.optim.Optimizer,
                    training: TranscoderTraining, store: ActivationStore) -> TrainerState:
    path = directory / "state.json"
    try:
        meta = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"malformed transcoder checkpoint {path}: {err}") from err
    if meta.get("format") != STATE_FORMAT:
        raise ValueError(f"{path} is not a {STATE_FORMAT} checkpoint")
    saved = {k: v for k, v in meta["training"].items() if k != "checkpoint_interval"}
    now = {k: v for k, v in training.to_dict().items() if k != "checkpoint_interval"}
    for what, then, current in (("training", saved, now), ("transcoder config", meta["transcoders"],
                                                            model.cfg.to_dict()),
                                ("activation store", meta["store"], _fingerprint(store))):
        if then != current:
            changed = sorted(k for k in set(then) | set(current) if then.get(k) != current.get(k))
            raise ValueError(f"resume: the {what} differs from the checkpoint's in {', '.join(changed)}; train "
                             "afresh (resume=False) or with the same settings")
    model.load_state_tensors(read_safetensors(directory / "transcoders.safetensors"), str(directory))
    load_optimizer_tensors(optimizer, read_safetensors(directory / "optimizer.safetensors"),
                           directory / "optimizer.safetensors")
    return TrainerState(step=int(meta["step"]), history=meta["history"])


def train_transcoders(store: ActivationStore | str | Path, cfg: TranscoderConfig, training: TranscoderTraining,
                      out_dir: str | Path, *, resume: bool = False, stop_after: int | None = None,
                      log_every: int = 50) -> Transcoders:
    """Train transcoders on the store's rows; resume=True continues from out_dir/checkpoint. stop_after: stop (with
    a checkpoint) once that many steps are done, as an interruption would — for tests of resumption."""
    store = store if isinstance(store, ActivationStore) else ActivationStore(store)
    out_dir = Path(out_dir)
    checkpoint = out_dir / CHECKPOINT_DIR
    order = DataOrder(store, cfg, training.batch_size, training.seed)
    model = Transcoders(cfg).train()
    optimizer = make_optimizer(model, training)
    state = TrainerState(history=[])
    if resume:
        if not checkpoint.is_dir():
            raise FileNotFoundError(f"no transcoder checkpoint at {checkpoint} to resume from")
        state = load_checkpoint(checkpoint, model, optimizer, training, store)
    scale = output_scale(store, cfg)
    if state.step < training.steps:
        for step, x, y in order.batches(state.step):
            record = train_step(model, optimizer, x, y, scale, sparsity_weight(step, training),
                                learning_rate(step, training))
            state.step = step + 1
            if step % log_every == 0 or state.step == training.steps:
                state.history.append({"step": step, **record})
            done = state.step == training.steps
            interval = training.checkpoint_interval
            if not done and ((interval and state.step % interval == 0) or state.step == stop_after):
                save_checkpoint(checkpoint, model, optimizer, training, state, store)
            if done or state.step == stop_after:
                break
    if state.step < training.steps:
        return model.eval()
    model.save(out_dir)
    atomic_write_text(out_dir / TRAINING_FILE, json.dumps({"training": training.to_dict(), "steps": state.step,
                                                           "history": state.history}, indent=2) + "\n")
    discard_tree(checkpoint)
    return model.eval()

