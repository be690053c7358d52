"""Collecting activations: the chosen hooks at the chosen positions of every batch, sliced out at capture time
(`stream_activations`, one `Activations` per batch; `collect_activations`, all of them in memory), the forward
pass stopped once every chosen hook has fired. `select_positions` says which (sequence, position) cells a
choice of positions selects."""

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor
from tqdm.auto import tqdm

from lab.freed_memory import release_freed_memory

# Hooks whose position axis is not dim 1: attention scores and patterns are [batch, head, query_pos, key_pos];
# the query position is the one a row selects.
QUERY_POS_DIM = {"hook_attn_scores": 2, "hook_pattern": 2}

Positions = str | Sequence[int] | Callable[[Tensor], Tensor]


class _AllHooksFired(Exception):
    """Raised from the last hook needed, to end the forward pass early (never escapes this module)."""


@dataclass
class Activations:
    """Selected activations as rows: acts[name] is [rows, *shape]; seq and pos say where each row came from."""

    acts: dict[str, Tensor]
    seq: Int[Tensor, " rows"]  # index of the row's sequence in the dataset
    pos: Int[Tensor, " rows"]  # position of the row within its sequence
    meta: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Tensor:
        if name not in self.acts:
            raise KeyError(f"no activations for {name!r}; collected: {sorted(self.acts)}")
        return self.acts[name]

    def __len__(self) -> int:
        return int(self.seq.shape[0])

    @property
    def names(self) -> list[str]:
        return list(self.acts)

    def stack(self, names: Sequence[str] | None = None) -> Tensor:
        """[len(names), rows, *shape]: e.g. the residual stream of every layer, for per-layer probes."""
        return torch.stack([self[name] for name in (names or self.names)])

    @classmethod
    def concat(cls, parts: Sequence["Activations"], meta: dict[str, Any] | None = None) -> "Activations":
        if not parts:
            raise ValueError("no activations to concatenate (the dataset was empty)")
        names = parts[0].names
        acts = {name: torch.cat([p.acts[name] for p in parts]) for name in names}
        meta = dict(parts[0].meta if meta is None else meta)
        if "batch_sequences" in meta:  # per-batch bookkeeping from stream_activations becomes a total
            meta.pop("batch_sequences")
            meta["n_sequences"] = sum(p.meta.get("batch_sequences", 0) for p in parts)
        return cls(acts, torch.cat([p.seq for p in parts]), torch.cat([p.pos for p in parts]), meta)


class CountedBatches:
    """Batches of token ids that know how many sequences they hold (None when unknown): `stream_activations`
    reads them as they are and counts its progress bar with `n_sequences` (save_activations' pass-through)."""

    n_sequences: int | None


def select_positions(
    tokens: Int[Tensor, "batch pos"], positions: Positions = "last", pad_id: int | None = None
) -> tuple[Int[Tensor, " rows"], Int[Tensor, " rows"]]:
    """(batch index, position) of every selected cell, ordered by sequence then position."""
    n, length = tokens.shape
    if isinstance(positions, str):
        if positions == "last":
            if pad_id is None:
                return torch.arange(n), torch.full((n,), length - 1, dtype=torch.long)
            real = tokens != pad_id
            if not bool(real.any(dim=1).all()):
                raise ValueError(f"a sequence consists only of padding (pad_id = {pad_id}): it has no last token")
            # The last True of each row: flip, find the first True, count back from the end.
            last = length - 1 - real.flip(1).to(torch.int8).argmax(dim=1)
            return torch.arange(n), last.long().cpu()
        if positions == "all":
            return torch.arange(n).repeat_interleave(length), torch.arange(length).repeat(n)
        raise ValueError(f'positions must be "last", "all", a list of indices or a predicate; got {positions!r}')
    if callable(positions):
        mask = positions(tokens)
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != (n, length):
            got = f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, Tensor) else type(mask).__name__
            raise ValueError(
                f"a position predicate must return a bool tensor of shape {(n, length)} "
                f"(one entry per token), got {got}"
            )
        b, p = mask.nonzero(as_tuple=True)
        return b.cpu(), p.cpu()
    index = torch.as_tensor(list(positions), dtype=torch.long)
    if index.ndim != 1 or index.numel() == 0:
        raise ValueError(f"positions as indices must be a non-empty list of integers, got {positions!r}")
    if bool(((index < -length) | (index >= length)).any()):
        raise ValueError(f"position indices {index.tolist()} out of range for sequences of {length} tokens")
    index = index % length
    return torch.arange(n).repeat_interleave(len(index)), index.repeat(n)


def describe_positions(positions: Positions) -> str:
    if isinstance(positions, str):
        return positions
    if callable(positions):
        return f"predicate {getattr(positions, '__name__', type(positions).__name__)}"
    return f"indices {list(positions)}"


def _pos_dim(name: str) -> int:
    return QUERY_POS_DIM.get(name.rsplit(".", 1)[-1], 1)


def check_names(model: Any, names: Sequence[str]) -> None:
    """KeyError for a hook name `model` does not have, naming the closest (checked before anything is written)."""
    if hasattr(model, "check_hook_names"):  # HookedTransformer: KeyError naming the closest hooks
        model.check_hook_names(names)
        return
    unknown = [name for name in names if name not in model.hook_dict]  # e.g. a TransformerBridge
    if unknown:
        raise KeyError(f"unknown hook name {unknown[0]!r} for {type(model).__name__}; see model.hook_dict")


def token_batches(data: Any, batch_size: int) -> tuple[Iterable[Tensor], int | None]:
    """Batches of token ids, and the number of sequences when it is known up front."""
    if isinstance(data, CountedBatches):  # save_activations' pass-through keeps the count for the progress bar
        return data, data.n_sequences
    if isinstance(data, Tensor):
        if data.ndim != 2:
            raise ValueError(f"a dataset tensor must be [n_sequences, pos] token ids, got shape {tuple(data.shape)}")
        return (data[i : i + batch_size] for i in range(0, data.shape[0], batch_size)), int(data.shape[0])
    if isinstance(data, (str, bytes, Mapping)):
        raise TypeError(
            f"data must be a [n, pos] LongTensor or an iterable of [batch, pos] tensors, got {type(data).__name__}"
        )
    total = None
    if isinstance(data, (list, tuple)):  # a list of batches: count its sequences for the progress bar
        total = sum(int(b.shape[0]) if isinstance(b, Tensor) and b.ndim == 2 else 1 for b in data)
    return data, total


def _device_of(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def stream_activations(
    model: Any,
    data: Tensor | Iterable[Tensor],
    hooks: str | Sequence[str],
    positions: Positions = "last",
    *,
    batch_size: int = 32,
    pad_id: int | None = None,
    dtype: torch.dtype | None = None,
    progress: bool = True,
    stop_early: bool = True,
    start: int = 0,
    release_memory: bool = True,
) -> Iterator[Activations]:
    """One `Activations` per batch: the chosen hooks at the chosen positions, on the CPU.

    data: a [n, pos] LongTensor (cut into batches of `batch_size`) or an iterable of [batch, pos]
    tensors. dtype: storage dtype (e.g. torch.float16), applied at capture time. stop_early: end each
    forward pass once every chosen hook has fired (turn off only for models whose hooks fire twice).
    start: the number of leading sequences to pass over (resuming): their batches are read but not
    run, and rows' `seq` still count them; it must fall on a batch boundary. release_memory: after every
    batch, hand the memory its forward pass freed back to the OS (`lab.freed_memory.release_freed_memory`), so that
    a long stream stays near one batch's footprint; the next batch then page-faults that memory in afresh.
    `save_activations` turns it off and hands memory back once per shard instead.
    """
    names = [hooks] if isinstance(hooks, str) else list(hooks)
    _check_arguments(model, names, batch_size, start)
    batches, total = token_batches(data, batch_size)
    device = _device_of(model)
    description = describe_positions(positions)
    every = positions == "all"
    bar = tqdm(total=total, unit="seq", desc="activations", disable=not progress)
    seen = 0
    try:
        for batch in batches:
            tokens = _batch_tokens(batch)
            if seen < start:  # already done: read past it without a forward pass
                if seen + tokens.shape[0] > start:
                    raise ValueError(
                        f"start = {start} falls inside the batch of sequences {seen}.."
                        f"{seen + tokens.shape[0] - 1}: it must fall on a batch boundary"
                    )
                seen += tokens.shape[0]
                bar.update(tokens.shape[0])
                continue
            b_idx, p_idx = select_positions(tokens, positions, pad_id)
            captured = _run_batch(
                model, tokens.to(device), names, b_idx.to(device), p_idx.to(device), dtype, stop_early, every
            )
            if release_memory:
                release_freed_memory()  # stay near one batch's footprint over a long stream
            yield Activations(
                captured, b_idx + seen, p_idx, {"positions": description, "batch_sequences": int(tokens.shape[0])}
            )
            seen += tokens.shape[0]
            bar.update(tokens.shape[0])
    finally:
        bar.close()
    if seen < start:
        raise ValueError(f"start = {start}, but the data hold only {seen} sequences")


def _check_arguments(model: Any, names: list[str], batch_size: Any, start: Any) -> None:
    """ValueError for hooks that are not one or more distinct names of the model's, or a batch size or start that
    is not a count."""
    if not names or len(set(names)) != len(names):
        raise ValueError(f"hooks must be one or more distinct hook names, got {names!r}")
    check_names(model, names)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if not isinstance(start, int) or start < 0:
        raise ValueError(f"start must be a non-negative integer, got {start!r}")


def _batch_tokens(batch: Any) -> Tensor:
    """One batch of the data as [batch, pos] token ids (a 1-D tensor is one sequence); TypeError or ValueError
    for anything else."""
    if not isinstance(batch, Tensor):
        raise TypeError(f"each batch must be a tensor of token ids, got {type(batch).__name__}")
    tokens = batch[None, :] if batch.ndim == 1 else batch
    if tokens.ndim != 2 or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise ValueError(f"each batch must be a [batch, pos] integer tensor, got {tokens.dtype} {tuple(tokens.shape)}")
    return tokens


def _whole(activation: Tensor, dim: int) -> bool:
    """True when every cell of `activation`, in (sequence, position) order, is a view of it that holds all of its
    storage: the position axis is dim 1 and the tensor is contiguous and owns its memory alone (not a slice of a
    larger one, e.g. hook_q of the fused q, k, v product, whose rows as a view would keep all three alive)."""
    return (
        dim == 1
        and activation.is_contiguous()
        and activation.untyped_storage().nbytes() == activation.numel() * activation.element_size()
    )


@torch.inference_mode()
def _run_batch(
    model: Any,
    tokens: Tensor,
    names: list[str],
    b_idx: Tensor,
    p_idx: Tensor,
    dtype: torch.dtype | None,
    stop_early: bool,
    every: bool = False,
) -> dict[str, Tensor]:
    """The hooks' selected cells of one batch, on the CPU. every: the selection is every position (b_idx, p_idx
    enumerate all cells in order)."""
    captured: dict[str, Tensor] = {}

    def make_hook(name: str) -> Callable[[Tensor, Any], None]:
        dim = _pos_dim(name)

        def capture(activation: Tensor, hook: Any) -> None:
            ends = stop_early and len(captured.keys() | {name}) == len(names)  # this hook is the last one asked for
            if every and _whole(activation, dim):  # every cell: the activation itself, [batch · pos, *shape]
                cells = activation.flatten(0, 1)
            else:
                # Advanced indexing copies only the selected [rows, *shape] cells; the full activation is
                # left to the forward pass and freed with it.
                cells = activation.movedim(dim, 1)[b_idx, p_idx]
            rows = cells.to(device="cpu", dtype=dtype or cells.dtype)
            if not ends and rows.untyped_storage().data_ptr() == activation.untyped_storage().data_ptr():
                # The pass goes on and may still write into its activation (an in-place op, a later hook):
                # keep a copy. The hook that ends the pass hands its activation over as it is — the only copy
                # of it a harvest then makes is into the shard buffer.
                rows = rows.clone()
            captured[name] = rows
            if ends:
                raise _AllHooksFired

        return capture

    try:
        with model.hooks(fwd_hooks=[(name, make_hook(name)) for name in names]):
            model(tokens)
    except _AllHooksFired:
        pass
    missing = [name for name in names if name not in captured]
    if missing:
        raise RuntimeError(f"hooks {missing} never fired during the forward pass")
    return {name: captured[name] for name in names}


def collect_activations(
    model: Any,
    data: Tensor | Iterable[Tensor],
    hooks: str | Sequence[str],
    positions: Positions = "last",
    *,
    batch_size: int = 32,
    pad_id: int | None = None,
    dtype: torch.dtype | None = None,
    progress: bool = True,
    stop_early: bool = True,
) -> Activations:
    """Every batch's selected activations, concatenated in memory (see `stream_activations`)."""
    parts = list(
        stream_activations(
            model,
            data,
            hooks,
            positions,
            batch_size=batch_size,
            pad_id=pad_id,
            dtype=dtype,
            progress=progress,
            stop_early=stop_early,
        )
    )
    return Activations.concat(parts)
