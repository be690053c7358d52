"""Training transcoders (and SAEs: transcoders whose input and output hook are one) out of core, from a harvest's
shards (`lab.analysis.activations.harvest` or `save_activations` of `TranscoderConfig.hooks()` at every position), in
one process or on the ranks of a torch.distributed group (torchrun: gloo on CPU), in four parts:

    DataOrder        which rows make batch `step`: a function of (seed, step) alone. An epoch visits the shards in
                     a permuted order and each shard's rows in a permuted order; memory is one shard and one batch.
                     A data-parallel rank reads only its contiguous slice of each batch (only the shards it lies
                     in); a module-parallel rank reads only its layers' hooks.
    Objective        a batch's loss (per-layer fraction of variance unexplained, summed, plus the sparsity penalty:
                     λ Σ a_i ‖d_i‖ for ReLU, λ L0 for JumpReLU, none for top-k) as sums over rows divided by the
                     whole batch's rows, so that the ranks' slices add up to it; per-layer transcoders one layer at
                     a time, so that a layer's gradient does not depend on which layers are computed beside it.
    train_step       one update: the objective (wrapped in DistributedDataParallel when data-parallel), backward,
                     Adam.
    checkpoint       the resumable state: transcoders, optimizer moments, step and scalars, as safetensors + JSON in
                     a folder swapped in atomically (`lab.train.checkpoint`'s discipline), written by rank 0 with
                     each layer's tensors gathered from the rank that trains it (`gathered_state`), so that it is the
                     same at any world size. No RNG state is needed: the data order and the initialisation follow
                     from the seeds, so a resumed run is bitwise the one that never stopped.

Where a harvest would not fit on disk, a RowStream (lab.analysis.transcoders.stream) stands in for the store: each
batch made by the model from windows drawn with (seed, step), equally resumable.

`train_transcoders(store, cfg, training, out_dir, parallel=...)` runs them: out_dir/checkpoint/ while training,
out_dir/{config.json, transcoders.safetensors, training.json} when done. docs/distributed.md shows it under torchrun.
"""

import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from lab.analysis.activations.collect import Activations
from lab.analysis.activations.store import ActivationStore
from lab.analysis.transcoders.model import CONFIG_FILE, WEIGHTS_FILE, TranscoderConfig, Transcoders, built_from
from lab.configs import Record, check_fields, need
from lab.distributed import all_gather_rows, barrier, rank_world, share
from lab.files import atomic_write_text
from lab.outside_files import InputError, read_json
from lab.progress import bar
from lab.train.checkpoint import (
    check_like,
    find_checkpoint,
    load_optimizer_tensors,
    optimizer_tensors,
    read_safetensors,
    remove_checkpoints,
    swap_in,
)

STATE_FORMAT = "forma-transcoder-train/1"
CHECKPOINT_DIR = "checkpoint"
TRAINING_FILE = "training.json"
PARALLEL = ("data", "modules")  # how the ranks of a torch.distributed group share the training (train_transcoders)


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


def layer_hooks(cfg: TranscoderConfig, layers: Sequence[int]) -> list[str]:
    """The hooks `layers`' inputs and outputs are harvested at (once each)."""
    return list(dict.fromkeys(cfg.hook(which, layer) for layer in layers for which in ("input", "output")))


def stacked(
    part: Activations, cfg: TranscoderConfig, layers: Sequence[int], index: Tensor | slice = slice(None)
) -> tuple[Tensor, Tensor]:
    """Rows `index` of a shard's (inputs, outputs) of `layers`, each [rows, len(layers), d_model] in float32."""
    x = torch.stack([part[cfg.hook("input", layer)][index].float() for layer in layers], dim=1)
    y = torch.stack([part[cfg.hook("output", layer)][index].float() for layer in layers], dim=1)
    return x, y


def rows(
    store: ActivationStore, shard: int, cfg: TranscoderConfig, layers: Sequence[int] | None = None
) -> tuple[Tensor, Tensor]:
    """One shard's (inputs, outputs), each [rows, len(layers), d_model] in float32: of `layers` (default every
    layer), and only their hooks are read."""
    layers = range(cfg.n_layers) if layers is None else layers
    return stacked(store.shard(shard, layer_hooks(cfg, layers)), cfg, layers)


class DataOrder:
    """Batch `step` is rows [step·B, (step+1)·B) of the endless sequence epoch 0, epoch 1, …, where epoch e visits
    the shards in the order permutation(seed, e) and shard s's rows in the order permutation(seed, e, s). A reader
    takes rows `part` of every batch (a data-parallel rank: its contiguous slice) and reads only the shards those
    rows lie in, each once per visit, keeping only those rows; a reader of some layers alone (module-parallel) reads
    only their hooks (`layers`). Either way the rows are the same as a whole batch's."""

    def __init__(
        self,
        store: ActivationStore,
        cfg: TranscoderConfig,
        batch_size: int,
        seed: int,
        layers: Sequence[int] | None = None,
        part: slice = slice(None),
    ):
        missing = [name for name in cfg.hooks() if name not in store.names]
        if missing:
            raise ValueError(
                f"{store.directory} holds no {missing[0]!r}: harvest TranscoderConfig.hooks() "
                f"({len(cfg.hooks())} hooks) at every position first"
            )
        self.store, self.cfg, self.batch_size, self.seed = store, cfg, batch_size, seed
        self.layers = list(range(cfg.n_layers)) if layers is None else list(layers)
        self.first, self.stop, _ = part.indices(batch_size)
        self.counts = [int(s["rows"]) for s in store.index["shards"]]
        self.n_rows = sum(self.counts)
        self._epoch: tuple[int, list[int], np.ndarray] | None = None  # the last epoch's shard order and its starts

    def shard_order(self, epoch: int) -> list[int]:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.counts)).tolist()

    def row_order(self, epoch: int, shard: int) -> Tensor:
        return torch.from_numpy(np.random.default_rng([self.seed, epoch, shard]).permutation(self.counts[shard]))

    def pieces(self, begin: int, end: int) -> Iterator[tuple[int, int, int, int]]:
        """(epoch, shard, a, b) for rows [begin, end) of the endless sequence, in order: places a … b − 1 of that
        shard's row order in that epoch."""
        while begin < end:
            epoch, offset = divmod(begin, self.n_rows)
            if self._epoch is None or self._epoch[0] != epoch:
                order = self.shard_order(epoch)
                self._epoch = (epoch, order, np.cumsum([0] + [self.counts[s] for s in order]))
            _, order, starts = self._epoch
            i = int(np.searchsorted(starts, offset, side="right")) - 1  # (an empty shard is never a row's)
            a = offset - int(starts[i])
            b = min(self.counts[order[i]], a + end - begin)
            yield epoch, order[i], a, b
            begin += b - a

    def batches(self, start: int = 0) -> Iterator[tuple[int, Tensor, Tensor]]:
        """(step, x, y) from batch `start` on, forever: rows `part` of each batch."""
        hooks = layer_hooks(self.cfg, self.layers)
        held: tuple[int, int, Activations, Tensor] | None = None  # the shard last read: its rows follow on
        step = start
        while True:
            xs, ys = [], []
            base = step * self.batch_size
            for epoch, shard, a, b in self.pieces(base + self.first, base + self.stop):
                if held is None or held[:2] != (epoch, shard):
                    held = (epoch, shard, self.store.shard(shard, hooks), self.row_order(epoch, shard))
                x, y = stacked(held[2], self.cfg, self.layers, held[3][a:b])
                xs.append(x)
                ys.append(y)
            yield step, torch.cat(xs), torch.cat(ys)
            step += 1


class RowStream(Protocol):
    """What training reads in place of a harvest: rows made on the fly (lab.analysis.transcoders.stream's
    ActivationStream), each batch a function of (seed, step) alone."""

    def fingerprint(self) -> dict[str, Any]: ...

    def verify_shared(self) -> None: ...

    def order(
        self, cfg: TranscoderConfig, batch_size: int, seed: int, layers: Sequence[int], part: slice
    ) -> Any: ...  # an object whose batches(start) yields (step, x, y) as DataOrder's does

    def output_scale(self, cfg: TranscoderConfig, batch_size: int, seed: int) -> Tensor: ...


def output_scale(store: ActivationStore, cfg: TranscoderConfig) -> Tensor:
    """Σ_d Var(y_d) of each layer's output over the first shard: the loss's per-layer denominator, so that the
    reconstruction term is a fraction of variance unexplained and every layer weighs alike. Computed a layer at a
    time; across the ranks of a group each rank reads and computes a share of the layers, and the shares are summed
    (each layer from one rank, zeros elsewhere: the bits of one process)."""
    rank, world = rank_world()
    mine = list(share(range(cfg.n_layers), rank, world))
    scale = torch.zeros(cfg.n_layers)
    if mine:  # (a rank of more ranks than layers has none)
        _, y = rows(store, 0, cfg, mine)
        for i, layer in enumerate(mine):
            scale[layer] = y[:, i].var(dim=0).sum()
    if world > 1:
        dist.all_reduce(scale)
    return scale.clamp_min(1e-12)


def sparsity_weight(step: int, training: TranscoderTraining) -> float:
    ramp = training.sparsity_warmup * training.steps
    return training.sparsity * (1.0 if ramp <= 0 else min(1.0, (step + 1) / ramp))


def learning_rate(step: int, training: TranscoderTraining) -> float:
    start = training.decay_from * training.steps
    if step < start:
        return training.lr
    return training.lr * max(0.0, (training.steps - step) / max(1.0, training.steps - start))


class Objective(nn.Module):
    """The loss of a batch's rows (or of a rank's slice of them) on the layers in `layers`, as sums over the rows
    divided by `total`, the rows of the whole batch: per layer the fraction of variance unexplained, summed over
    layers, plus λ times the sparsity penalty (λ Σ a_i ‖d_i‖ for ReLU, λ L0 for JumpReLU, none for top-k). Per-layer
    transcoders are computed one layer at a time, each from its own layer's rows and weights alone, so that a layer's
    gradient is the same bits whichever other layers are computed beside it (module-parallel); a cross-layer
    transcoder is computed whole. forward returns (loss, stats) with stats [3, L]: each layer's squared error,
    active features and penalty, summed over the rows (zeros for the layers not computed)."""

    def __init__(self, model: Transcoders, layers: Sequence[int]):
        super().__init__()
        self.model, self.layers = model, list(layers)

    def forward(self, x: Tensor, y: Tensor, scale: Tensor, sparsity: float, total: int) -> tuple[Tensor, Tensor]:
        model, cfg = self.model, self.model.cfg
        kind = cfg.activation
        stats = torch.zeros(3, cfg.n_layers, dtype=torch.float64)
        if cfg.cross_layer:  # every layer, together: its features write into every later layer's output
            pre = model.encode(x)
            acts = model.activate(pre)
            error = (model.decode(acts) - y).pow(2).sum(-1).sum(0)  # [L]
            penalty = (
                (acts * model.decoder_norms()).sum(-1).sum(0)
                if kind == "relu"
                else model.l0(pre).sum(0)
                if kind == "jumprelu"
                else torch.zeros(cfg.n_layers)
            )
            stats[0], stats[1], stats[2] = error.detach(), (acts > 0).sum(dim=(0, 2)), penalty.detach()
            loss = (error / total / scale).sum() + sparsity * (penalty.sum() / total)
            return loss, stats
        loss = torch.zeros(())
        for i, layer in enumerate(self.layers):
            pre = model.encode(x[:, i], layer)
            acts = model.activate(pre, layer)
            # Each row's sum, then the rows' (few enough for one thread): the same bits at any thread count,
            # where one sum over every element is split among the threads
            error = (acts @ model.W_dec[layer][:, 0] + model.b_dec[layer] - y[:, i]).pow(2).sum(-1).sum()
            if kind == "relu":
                penalty = (acts * model.W_dec[layer].pow(2).sum(dim=(1, 2)).sqrt()).sum(-1).sum()
            elif kind == "jumprelu":
                penalty = model.l0(pre, layer).sum()
            else:
                penalty = torch.zeros(())
            stats[:, layer] = torch.stack(
                [error.detach().double(), (acts > 0).sum().double(), penalty.detach().double()]
            )
            loss = loss + (error / total / scale[layer] + sparsity * (penalty / total))
        return loss, stats


def train_step(
    objective: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: Tensor,
    y: Tensor,
    scale: Tensor,
    sparsity: float,
    lr: float,
    total: int,
    world: int = 1,
) -> Tensor:
    """One update on (x, y) [rows, layers, d_model] (this rank's rows of a batch of `total`); returns the batch's
    stats (Objective's). Wrapped in DistributedDataParallel, which averages the ranks' gradients, the loss is
    scaled by `world`: the averaged gradient is then the gradient of the whole batch's loss."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss, stats = objective(x, y, scale, sparsity, total)
    optimizer.zero_grad(set_to_none=True)
    (loss * world).backward()
    optimizer.step()
    return stats


def step_record(stats: Tensor, scale: Tensor, sparsity: float, total: int) -> dict[str, float]:
    """The logged loss terms of a batch from its stats summed over every rank: loss, mean FVU, L0, penalty (before
    the update)."""
    fvu = stats[0] / total / scale.double()
    penalty = float(stats[2].sum() / total)
    return {
        "loss": float(fvu.sum()) + sparsity * penalty,
        "fvu": float(fvu.mean()),
        "l0": float(stats[1].mean() / total),
        "penalty": penalty,
    }


def make_optimizer(model: Transcoders, training: TranscoderTraining) -> torch.optim.Adam:
    return torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=training.lr, betas=(0.9, 0.999))


@dataclass
class TrainerState:
    """The scalars a resumed run picks up (weights and optimizer moments live beside it)."""

    step: int = 0
    history: list[dict[str, float]] | None = None  # one record per logged step


def _fingerprint(store: "ActivationStore | RowStream") -> dict[str, Any]:
    if not isinstance(store, ActivationStore):
        return store.fingerprint()
    return {
        "n_rows": len(store),
        "shards": [[s["file"], s["rows"]] for s in store.index["shards"]],
        "model": store.index.get("model"),
    }


def gathered_state(
    model: Transcoders, optimizer: torch.optim.Optimizer, layers: Sequence[int]
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """The whole set's weights and Adam moments (`Transcoders.state_tensors`, `optimizer_tensors`), on every rank.
    Every rank holds every layer's weights, but a module-parallel rank trains only `layers` (a contiguous share,
    `lab.distributed.share`): each layer's tensors are then taken from the rank that trains it (all_gather_rows:
    the bytes as they are). In one process, or data-parallel (every rank trains every layer), this rank's own."""
    weights, moments = model.state_tensors(), optimizer_tensors(optimizer)
    _, world = rank_world()
    if world == 1 or len(layers) == model.cfg.n_layers:
        return weights, moments
    mine = slice(layers[0], layers[-1] + 1)
    index = {name: i for i, name in enumerate(name for name, p in model.named_parameters() if p.requires_grad)}
    for name in ("W_enc", "b_enc", "b_dec", "log_threshold"):  # [L, ...]: a layer a row
        weights[name] = all_gather_rows(weights[name][mine])
        if name in index:  # (log_threshold is trained by JumpReLU alone)
            for slot in ("exp_avg", "exp_avg_sq"):
                key = f"{index[name]}.{slot}"
                moments[key] = all_gather_rows(moments[key][mine])
    decoders = all_gather_rows(torch.stack([weights[f"W_dec.{layer}"] for layer in layers]))
    weights |= {f"W_dec.{layer}": decoders[layer] for layer in range(model.cfg.n_layers)}
    for slot in ("exp_avg", "exp_avg_sq", "step"):  # a decoder's moments live only on the rank that trains it
        own = all_gather_rows(torch.stack([moments[f"{index[f'W_dec.{layer}']}.{slot}"] for layer in layers]))
        moments |= {f"{index[f'W_dec.{layer}']}.{slot}": own[layer] for layer in range(model.cfg.n_layers)}
    return weights, moments


def save_checkpoint(
    directory: Path,
    weights: dict[str, Tensor],
    moments: dict[str, Tensor],
    cfg: TranscoderConfig,
    training: TranscoderTraining,
    state: TrainerState,
    store: "ActivationStore | RowStream",
) -> None:
    """Written into a temporary sibling, then swapped in (`lab.train.checkpoint.swap_in`): a crash leaves the old
    checkpoint complete."""

    def write(tmp: Path) -> None:
        save_file(weights, str(tmp / WEIGHTS_FILE))
        (tmp / CONFIG_FILE).write_text(cfg.to_json() + "\n")
        save_file(moments, str(tmp / "optimizer.safetensors"))
        meta = {
            "format": STATE_FORMAT,
            **asdict(state),
            "training": training.to_dict(),
            "transcoders": cfg.to_dict(),
            "store": _fingerprint(store),
        }
        (tmp / "state.json").write_text(json.dumps(meta, indent=2) + "\n")

    swap_in(directory, write)


def load_checkpoint(
    directory: Path,
    model: Transcoders,
    optimizer: torch.optim.Optimizer,
    training: TranscoderTraining,
    store: "ActivationStore | RowStream",
) -> TrainerState:
    directory = find_checkpoint(directory)
    path = directory / "state.json"
    meta = read_json(path, directory, what="transcoder checkpoint state")
    if not isinstance(meta, dict) or meta.get("format") != STATE_FORMAT:
        raise InputError(f"{path} is not a {STATE_FORMAT} checkpoint")
    parts = {key: meta.get(key) for key in ("training", "transcoders", "store")}
    if not all(isinstance(v, dict) for v in parts.values()):
        raise InputError(f"{path}: its training, transcoders and store must be objects")
    saved = {k: v for k, v in parts["training"].items() if k != "checkpoint_interval"}
    now = {k: v for k, v in training.to_dict().items() if k != "checkpoint_interval"}
    for what, then, current in (
        ("training", saved, now),
        ("transcoder config", parts["transcoders"], _as_json(model.cfg.to_dict())),
        ("activation store", parts["store"], _fingerprint(store)),
    ):
        if then != current:
            changed = sorted(k for k in set(then) | set(current) if then.get(k) != current.get(k))
            raise ValueError(
                f"resume: the {what} differs from the checkpoint's in {', '.join(changed)} ({directory}); train "
                "afresh (resume=False) or with the same settings"
            )
    step, history = meta.get("step"), meta.get("history")
    if (
        type(step) is not int
        or not 0 <= step <= training.steps
        or not isinstance(history, list)
        or not all(isinstance(r, dict) for r in history)
    ):
        raise InputError(
            f"{path}: its step {step!r} is not one of the training's 0 … {training.steps} steps (or its history is "
            "not a list of records), so no weights can be written from it; train afresh (--overwrite)"
        )
    weights = read_safetensors(directory / WEIGHTS_FILE)
    check_like(weights, model.state_tensors(), directory / WEIGHTS_FILE)
    moments = read_safetensors(directory / "optimizer.safetensors")
    model.load_state_tensors(weights, str(directory))
    load_optimizer_tensors(optimizer, moments, directory / "optimizer.safetensors")
    return TrainerState(step=step, history=history)


def _as_json(record: dict[str, Any]) -> dict[str, Any]:
    """A record's values as JSON reads them back: tuples as lists."""
    return {key: list(value) if isinstance(value, tuple) else value for key, value in record.items()}


def has_checkpoint(out_dir: str | Path) -> bool:
    """Whether out_dir holds a transcoder checkpoint to resume from."""
    try:
        find_checkpoint(Path(out_dir) / CHECKPOINT_DIR)
    except FileNotFoundError:
        return False
    return True


def train_transcoders(
    store: "ActivationStore | RowStream | str | Path",
    cfg: TranscoderConfig,
    training: TranscoderTraining,
    out_dir: str | Path,
    *,
    resume: bool = False,
    stop_after: int | None = None,
    log_every: int = 50,
    parallel: str = "data",
    progress: bool = False,
    fingerprint: dict[str, Any] | None = None,
) -> Transcoders:
    """Train transcoders on the store's rows (a harvest, or a RowStream's rows made on the fly where a harvest would
    not fit on disk); resume=True continues from out_dir/checkpoint. stop_after: stop (with
    a checkpoint) once that many steps are done, as an interruption would — for tests of resumption.

    In one process, or on every rank of a torch.distributed group (torchrun), each rank calling it alike:

        parallel="data"      every rank trains every layer on a contiguous slice of each batch (reading only the
                             shards it lies in), the gradients averaged by DistributedDataParallel: the whole batch's
                             gradient, up to the order of floating-point sums (a cross-layer transcoder trains this
                             way only)
        parallel="modules"   each rank trains a contiguous share of the layers (`lab.distributed.share`) on whole
                             batches, reading only their hooks: each layer's weights are the bits one process gives

    Rank 0 writes the checkpoints and the result (each layer's tensors gathered from the rank that trains it); every
    rank returns the whole trained set. A checkpoint is the same at any world size and either way of sharing, so a
    run may resume on another number of ranks. progress: rank 0 counts the steps on lab.progress's bar.
    fingerprint: the model's (`model_fingerprint`), kept with the result in source.json with the last step."""
    rank, world, layers = _layout(cfg, training, parallel)
    store = ActivationStore(store) if isinstance(store, (str, Path)) else store
    out_dir = Path(out_dir)
    model, optimizer, state = _start(cfg, training, store, out_dir / CHECKPOINT_DIR, resume, rank)
    order, objective, sharing = _rank_share(model, store, training, layers, parallel == "data" and world > 1)
    store.verify_shared()  # each rank hashes a share of the shards, not every shard it reads
    scale = (
        output_scale(store, cfg)
        if isinstance(store, ActivationStore)
        else store.output_scale(cfg, training.batch_size, training.seed)
    )
    batches = order.batches(state.step) if state.step < training.steps else iter(())
    counting = bar(training.steps, "transcoders: train", initial=state.step, show=progress and rank == 0)
    with counting:
        for step, x, y in batches:
            sparsity = sparsity_weight(step, training)
            lr, total = learning_rate(step, training), training.batch_size
            stats = train_step(objective, optimizer, x, y, scale, sparsity, lr, total, sharing)
            state.step = step + 1
            counting.update(1)
            if step % log_every == 0 or state.step == training.steps:
                if world > 1:
                    dist.all_reduce(stats)  # the slices' sums (data), or each layer from its rank (modules)
                state.history.append({"step": step, **step_record(stats, scale, sparsity, training.batch_size)})
            if state.step == training.steps:
                break
            if state.step == stop_after or (
                training.checkpoint_interval and state.step % training.checkpoint_interval == 0
            ):
                weights, moments = gathered_state(model, optimizer, layers)
                if rank == 0:
                    save_checkpoint(out_dir / CHECKPOINT_DIR, weights, moments, cfg, training, state, store)
            if state.step == stop_after:
                break
    weights, _ = gathered_state(model, optimizer, layers)
    model.load_state_tensors(weights, "the ranks' layers")
    if rank == 0 and state.step == training.steps:
        _write_result(model, out_dir, training, state, fingerprint)
    barrier()  # every rank returns once rank 0's files are in place
    return model.eval()


def _rank_share(
    model: Transcoders,
    store: "ActivationStore | RowStream",
    training: TranscoderTraining,
    layers: list[int],
    data_parallel: bool,
) -> tuple[Any, nn.Module, int]:
    """This rank's share of the work: the rows it reads (data-parallel: its contiguous slice of each batch; else
    whole batches of its layers' hooks), the objective it minimises (wrapped in DistributedDataParallel when
    data-parallel) and the number of ranks a batch is shared among."""
    rank, world = rank_world() if data_parallel else (0, 1)
    mine = slice(rank * training.batch_size // world, (rank + 1) * training.batch_size // world)
    order = (
        DataOrder(store, model.cfg, training.batch_size, training.seed, layers, mine)
        if isinstance(store, ActivationStore)
        else store.order(model.cfg, training.batch_size, training.seed, layers, mine)
    )
    objective = Objective(model, layers)
    # init_sync=False: every rank starts from the same weights already (the seeded initialisation, or the
    # checkpoint every rank loads), so DistributedDataParallel need not broadcast rank 0's.
    return order, DistributedDataParallel(objective, init_sync=False) if data_parallel else objective, world


def _start(
    cfg: TranscoderConfig,
    training: TranscoderTraining,
    store: "ActivationStore | RowStream",
    checkpoint: Path,
    resume: bool,
    rank: int,
) -> tuple[Transcoders, torch.optim.Adam, TrainerState]:
    """The set, its optimizer and the trainer's state: fresh (rank 0 removing an earlier run's checkpoint, which a
    later resume must not find), or as the checkpoint left them."""
    model = Transcoders(cfg).train()
    optimizer = make_optimizer(model, training)
    if resume:
        if not has_checkpoint(checkpoint.parent):
            raise FileNotFoundError(f"no transcoder checkpoint at {checkpoint} to resume from")
        return model, optimizer, load_checkpoint(checkpoint, model, optimizer, training, store)
    if rank == 0:
        remove_checkpoints(checkpoint)
    return model, optimizer, TrainerState(history=[])


def _layout(cfg: TranscoderConfig, training: TranscoderTraining, parallel: str) -> tuple[int, int, list[int]]:
    """(rank, world size, the layers this rank trains) of a parallel layout, refused where it cannot work."""
    if parallel not in PARALLEL:
        raise ValueError(f"parallel must be one of {', '.join(PARALLEL)}, got {parallel!r}")
    if parallel == "modules" and cfg.cross_layer:
        raise ValueError(
            "a cross-layer transcoder cannot be trained module-parallel (its layers write into each "
            "other's outputs); train it data-parallel"
        )
    rank, world = rank_world()
    layers = list(range(cfg.n_layers))
    if parallel == "modules" and world > 1:
        if world > cfg.n_layers:
            raise ValueError(
                f"module-parallel training gives each rank at least one of the {cfg.n_layers} layers; "
                f"start at most {cfg.n_layers} ranks, not {world}"
            )
        layers = list(share(layers, rank, world))
    if parallel == "data" and world > training.batch_size:
        raise ValueError(
            f"data-parallel training needs a batch of at least one row a rank: batch_size "
            f"{training.batch_size} over {world} ranks"
        )
    return rank, world, layers


def _write_result(
    model: Transcoders,
    out_dir: Path,
    training: TranscoderTraining,
    state: TrainerState,
    fingerprint: dict[str, Any] | None,
) -> None:
    """The trained set (with what it was built from, where the model's fingerprint is known) and its training
    record, written by rank 0; the checkpoint, no longer needed, removed."""
    model.save(out_dir, None if fingerprint is None else built_from(fingerprint, state.step))
    atomic_write_text(
        out_dir / TRAINING_FILE,
        json.dumps({"training": training.to_dict(), "steps": state.step, "history": state.history}, indent=2) + "\n",
    )
    remove_checkpoints(out_dir / CHECKPOINT_DIR)  # and what killed saves left
