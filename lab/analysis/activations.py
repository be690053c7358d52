"""Stream hook activations over a dataset, keeping only the positions asked for.

`run_with_cache` holds every position of every cached hook for one batch. Over a dataset that does
not fit: 10,000 sequences × 128 tokens × d_model 192 of one layer is ~1 GB in float32, and most
analyses need a few positions per sequence (the last token, an answer slot). So each batch runs with
a hook on only the chosen activations (`names_filter`-style: nothing else is cached) that slices the
selected positions out *at capture time*; the full [batch, pos, ...] activation is dropped with the
forward pass. Once every chosen hook has fired the forward pass stops (nothing after the deepest
chosen layer is computed, not even the logits).

Positions are chosen per sequence by
    "last"                 the final position (the last non-padding one when `pad_id` is given)
    "all"                  every position
    [i, j, ...]            fixed indices (negative ones count from the end)
    predicate(tokens)      a function of the [batch, pos] token ids returning a bool mask, e.g.
                           `lambda t: t == sep_id`: every position where it is True

Results are rows: `acts[name]` is [rows, *shape] (shape is the activation's without batch and
position, e.g. [d_model] or [head, d_head]), with `seq[r]` (index of the row's sequence in the dataset)
and `pos[r]` (its position). Rows are ordered by sequence, then position.

    collect_activations(...) -> Activations          everything in memory
    save_activations(..., out_dir) -> ActivationStore   safetensors shards + index.json on disk;
                                                     memory held: one batch plus one shard buffer
    stream_activations(...)                          the generator both use: one Activations per batch

On disk, `out_dir/shard-00000.safetensors ...` hold each hook's rows plus `seq` and `pos`, and
`out_dir/index.json` (written last, so its presence means the set is complete) lists the shards,
each hook's per-row shape and dtype, and what was collected. Every shard is written atomically and
then recorded in `out_dir/progress.json` (also atomic), so a harvest that is killed or raises can be
rerun with the same arguments: it checks that the arguments and the token ids of the sequences already
done are the same, and continues after the last recorded shard — the finished set is bitwise the one
an uninterrupted harvest writes. A shard never recorded (or a temporary a kill left) is deleted, never
listed.
"""

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Int
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor
from tqdm.auto import tqdm

from lab.files import atomic_write, atomic_write_text, is_temporary
from lab.memory import release_freed_memory

__all__ = ["Activations", "ActivationStore", "Positions", "StoredRows", "collect_activations", "save_activations",
           "select_positions", "stream_activations"]

INDEX_FILE = "index.json"
PROGRESS_FILE = "progress.json"
INDEX_FORMAT = "forma-activations/1"
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


# --------------------------------------------------------------------------------------------
# Choosing positions
# --------------------------------------------------------------------------------------------
def select_positions(tokens: Int[Tensor, "batch pos"], positions: Positions = "last",
                     pad_id: int | None = None) -> tuple[Int[Tensor, " rows"], Int[Tensor, " rows"]]:
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
            raise ValueError(f"a position predicate must return a bool tensor of shape {(n, length)} "
                             f"(one entry per token), got {got}")
        b, p = mask.nonzero(as_tuple=True)
        return b.cpu(), p.cpu()
    index = torch.as_tensor(list(positions), dtype=torch.long)
    if index.ndim != 1 or index.numel() == 0:
        raise ValueError(f"positions as indices must be a non-empty list of integers, got {positions!r}")
    if bool(((index < -length) | (index >= length)).any()):
        raise ValueError(f"position indices {index.tolist()} out of range for sequences of {length} tokens")
    index = index % length
    return torch.arange(n).repeat_interleave(len(index)), index.repeat(n)


def _describe(positions: Positions) -> str:
    if isinstance(positions, str):
        return positions
    if callable(positions):
        return f"predicate {getattr(positions, '__name__', type(positions).__name__)}"
    return f"indices {list(positions)}"


def _pos_dim(name: str) -> int:
    return QUERY_POS_DIM.get(name.rsplit(".", 1)[-1], 1)


# --------------------------------------------------------------------------------------------
# Streaming
# --------------------------------------------------------------------------------------------
def _check_names(model: Any, names: Sequence[str]) -> None:
    if hasattr(model, "check_hook_names"):  # HookedTransformer: KeyError naming the closest hooks
        model.check_hook_names(names)
        return
    unknown = [name for name in names if name not in model.hook_dict]  # e.g. a TransformerBridge
    if unknown:
        raise KeyError(f"unknown hook name {unknown[0]!r} for {type(model).__name__}; see model.hook_dict")


def _batches(data: Any, batch_size: int) -> tuple[Iterable[Tensor], int | None]:
    """Batches of token ids, and the number of sequences when it is known up front."""
    if isinstance(data, _TokenDigest):  # save_activations' pass-through keeps the count for the progress bar
        return data, data.n_sequences
    if isinstance(data, Tensor):
        if data.ndim != 2:
            raise ValueError(f"a dataset tensor must be [n_sequences, pos] token ids, got shape {tuple(data.shape)}")
        return (data[i: i + batch_size] for i in range(0, data.shape[0], batch_size)), int(data.shape[0])
    if isinstance(data, (str, bytes, Mapping)):
        raise TypeError(f"data must be a [n, pos] LongTensor or an iterable of [batch, pos] tensors, "
                        f"got {type(data).__name__}")
    total = None
    if isinstance(data, (list, tuple)):  # a list of batches: count its sequences for the progress bar
        total = sum(int(b.shape[0]) if isinstance(b, Tensor) and b.ndim == 2 else 1 for b in data)
    return data, total


def _device_of(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def stream_activations(model: Any, data: Tensor | Iterable[Tensor], hooks: str | Sequence[str],
                       positions: Positions = "last", *, batch_size: int = 32, pad_id: int | None = None,
                       dtype: torch.dtype | None = None, progress: bool = True,
                       stop_early: bool = True, start: int = 0) -> Iterator[Activations]:
    """One `Activations` per batch: the chosen hooks at the chosen positions, on the CPU.

    data: a [n, pos] LongTensor (cut into batches of `batch_size`) or an iterable of [batch, pos]
    tensors. dtype: storage dtype (e.g. torch.float16), applied at capture time. stop_early: end each
    forward pass once every chosen hook has fired (turn off only for models whose hooks fire twice).
    start: the number of leading sequences to pass over (resuming): their batches are read but not
    run, and rows' `seq` still count them; it must fall on a batch boundary.
    """
    names = [hooks] if isinstance(hooks, str) else list(hooks)
    if not names or len(set(names)) != len(names):
        raise ValueError(f"hooks must be one or more distinct hook names, got {names!r}")
    _check_names(model, names)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if not isinstance(start, int) or start < 0:
        raise ValueError(f"start must be a non-negative integer, got {start!r}")
    batches, total = _batches(data, batch_size)
    device = _device_of(model)
    description = _describe(positions)
    bar = tqdm(total=total, unit="seq", desc="activations", disable=not progress)
    seen = 0
    try:
        for tokens in batches:
            if not isinstance(tokens, Tensor):
                raise TypeError(f"each batch must be a tensor of token ids, got {type(tokens).__name__}")
            tokens = tokens[None, :] if tokens.ndim == 1 else tokens
            if tokens.ndim != 2 or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
                raise ValueError(f"each batch must be a [batch, pos] integer tensor, got {tokens.dtype} "
                                 f"{tuple(tokens.shape)}")
            if seen < start:  # already done: read past it without a forward pass
                if seen + tokens.shape[0] > start:
                    raise ValueError(f"start = {start} falls inside the batch of sequences {seen}.."
                                     f"{seen + tokens.shape[0] - 1}: it must fall on a batch boundary")
                seen += tokens.shape[0]
                bar.update(tokens.shape[0])
                continue
            b_idx, p_idx = select_positions(tokens, positions, pad_id)
            captured = _run_batch(model, tokens.to(device), names, b_idx.to(device), p_idx.to(device), dtype,
                                  stop_early)
            release_freed_memory()  # stay near one batch's footprint over a long stream
            yield Activations(captured, b_idx + seen, p_idx,
                              {"positions": description, "batch_sequences": int(tokens.shape[0])})
            seen += tokens.shape[0]
            bar.update(tokens.shape[0])
    finally:
        bar.close()
    if seen < start:
        raise ValueError(f"start = {start}, but the data hold only {seen} sequences")


@torch.inference_mode()
def _run_batch(model: Any, tokens: Tensor, names: list[str], b_idx: Tensor, p_idx: Tensor,
               dtype: torch.dtype | None, stop_early: bool) -> dict[str, Tensor]:
    captured: dict[str, Tensor] = {}

    def make_hook(name: str) -> Callable[[Tensor, Any], None]:
        dim = _pos_dim(name)

        def capture(activation: Tensor, hook: Any) -> None:
            # Advanced indexing copies only the selected [rows, *shape] cells; the full activation is
            # left to the forward pass and freed with it.
            cells = activation.movedim(dim, 1)[b_idx, p_idx]
            captured[name] = cells.to(device="cpu", dtype=dtype or cells.dtype)
            if stop_early and len(captured) == len(names):
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


def collect_activations(model: Any, data: Tensor | Iterable[Tensor], hooks: str | Sequence[str],
                        positions: Positions = "last", *, batch_size: int = 32, pad_id: int | None = None,
                        dtype: torch.dtype | None = None, progress: bool = True,
                        stop_early: bool = True) -> Activations:
    """Every batch's selected activations, concatenated in memory (see `stream_activations`)."""
    parts = list(stream_activations(model, data, hooks, positions, batch_size=batch_size, pad_id=pad_id,
                                    dtype=dtype, progress=progress, stop_early=stop_early))
    return Activations.concat(parts)


# --------------------------------------------------------------------------------------------
# On disk
# --------------------------------------------------------------------------------------------
def save_activations(model: Any, data: Tensor | Iterable[Tensor], hooks: str | Sequence[str], out_dir: str | Path,
                     positions: Positions = "last", *, batch_size: int = 32, pad_id: int | None = None,
                     dtype: torch.dtype | None = None, shard_mb: float = 32.0, progress: bool = True,
                     stop_early: bool = True, overwrite: bool = False) -> "ActivationStore":
    """Stream the selected activations into safetensors shards of at most `shard_mb` MB, then index.json.

    Memory held at any time: one batch's forward pass plus one shard buffer (preallocated once and
    refilled, written from views without copying). A batch larger than a shard becomes a shard of its own.

    Resumable: every shard is written atomically and then recorded in progress.json. When `out_dir`
    holds an interrupted harvest (progress.json, no index.json), the same call continues after its last
    recorded shard; different arguments, or data whose leading sequences differ from the ones already
    done (compared by a SHA-256 of their token ids), are a ValueError. The model is compared by class
    and config, not by its weights. overwrite=True starts afresh in a folder holding a complete or an
    interrupted set.
    """
    out_dir = Path(out_dir)
    if not (isinstance(shard_mb, (int, float)) and shard_mb > 0 and math.isfinite(shard_mb)):
        raise ValueError(f"shard_mb must be a positive number, got {shard_mb!r}")
    names = [hooks] if isinstance(hooks, str) else list(hooks)
    arguments = json.loads(json.dumps({
        "hooks": names, "positions": _describe(positions), "batch_size": batch_size, "pad_id": pad_id,
        "dtype": None if dtype is None else str(dtype).removeprefix("torch."), "shard_bytes": int(shard_mb * 2**20),
        "stop_early": stop_early, "model": _model_summary(model)}))
    if (out_dir / INDEX_FILE).exists():
        if not overwrite:
            raise FileExistsError(f"{out_dir} already holds a complete activation set ({INDEX_FILE}); "
                                  "pass overwrite=True or choose another out_dir")
        (out_dir / INDEX_FILE).unlink()
    out_dir.mkdir(parents=True, exist_ok=True)
    done = [] if overwrite else _resumable_shards(out_dir, arguments)
    if not done:  # a fresh start: an earlier harvest's record goes with its shards
        (out_dir / PROGRESS_FILE).unlink(missing_ok=True)
    kept = {shard["file"] for shard in done}
    for stale in out_dir.iterdir():  # shards never recorded, and temporaries a killed write left behind
        if stale.is_file() and (stale.name.startswith("shard-") or is_temporary(stale)) and stale.name not in kept:
            stale.unlink()

    writer = _ShardWriter(out_dir, arguments, done)
    tap = _TokenDigest(data, batch_size, done[-1] if done else None)
    for part in stream_activations(model, tap, names, positions, batch_size=batch_size, pad_id=pad_id, dtype=dtype,
                                   progress=progress, stop_early=stop_early, start=writer.sequences):
        writer.add(part, tap.state)
    writer.flush()
    if not writer.shards:
        raise ValueError("no activations were collected: the dataset was empty or no position was selected")
    index = {"format": INDEX_FORMAT, "hooks": writer.spec, "positions": _describe(positions),
             "n_rows": sum(s["rows"] for s in writer.shards), "n_sequences": writer.sequences,
             "shards": writer.shards, "model": _model_summary(model)}
    atomic_write_text(out_dir / INDEX_FILE, json.dumps(index, indent=2) + "\n")
    (out_dir / PROGRESS_FILE).unlink(missing_ok=True)
    return ActivationStore(out_dir)


def _resumable_shards(out_dir: Path, arguments: dict[str, Any]) -> list[dict[str, Any]]:
    """The shards an interrupted harvest in `out_dir` recorded, if it ran with these arguments."""
    path = out_dir / PROGRESS_FILE
    if not path.is_file():
        return []
    try:
        progress = json.loads(path.read_text())
        recorded, shards = progress["arguments"], progress["shards"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"malformed {path} ({err}); pass overwrite=True to start afresh") from err
    differing = [key for key in sorted(set(recorded) | set(arguments)) if recorded.get(key) != arguments.get(key)]
    if differing:
        key = differing[0]
        raise ValueError(f"{out_dir} holds an interrupted harvest with other arguments ({key}: "
                         f"{recorded.get(key)!r} then, {arguments.get(key)!r} now); rerun it with the same "
                         "arguments to resume, or pass overwrite=True to start afresh")
    missing = [s["file"] for s in shards if not (out_dir / s["file"]).is_file()]
    if missing:
        raise FileNotFoundError(f"{out_dir}: {PROGRESS_FILE} records shards that are missing ({missing[:3]}); "
                                "pass overwrite=True to start afresh")
    return shards


class _TokenDigest:
    """The dataset's batches, passed through unchanged while a SHA-256 of their token ids runs along.

    `state` is (sequences done, digest) through the batch last read — while stream_activations yields a
    batch's part, that batch's: what a shard ending there records. When resuming after `resume` (the last recorded shard), the batches read must end exactly at
    its sequence count with its digest: otherwise these are not the data its shards came from.
    """

    def __init__(self, data: Tensor | Iterable[Tensor], batch_size: int, resume: dict[str, Any] | None):
        self.batches, self.n_sequences = _batches(data, batch_size)
        self.resume = resume
        self.hash = hashlib.sha256()
        self.seen, self.digest = 0, self.hash.hexdigest()

    def __iter__(self) -> Iterator[Tensor]:
        for tokens in self.batches:
            if isinstance(tokens, Tensor):  # stream_activations rejects anything else with a clear error
                rows = tokens[None, :] if tokens.ndim == 1 else tokens
                self.hash.update(rows.detach().to(device="cpu", dtype=torch.int64).contiguous().numpy().tobytes())
                self.seen += int(rows.shape[0])
                self.digest = self.hash.hexdigest()
                self._check()
            yield tokens
        if self.resume is not None and self.seen < self.resume["sequences"]:
            raise ValueError(f"the data hold {self.seen} sequences, but the interrupted harvest had already done "
                             f"{self.resume['sequences']}: these are not the same data")

    def _check(self) -> None:
        if self.resume is None or self.seen < self.resume["sequences"]:
            return
        expected, self.resume = self.resume, None
        if self.seen != expected["sequences"]:
            raise ValueError(f"the data's batches do not end at sequence {expected['sequences']}, where the "
                             "interrupted harvest's last shard ends: these are not the same data")
        if self.digest != expected["tokens_sha256"]:
            raise ValueError(f"the first {self.seen} sequences differ from those the interrupted harvest already "
                             "wrote (by the SHA-256 of their token ids); rerun it with the same data, or pass "
                             "overwrite=True to start afresh")

    @property
    def state(self) -> tuple[int, str]:
        return self.seen, self.digest


class _ShardWriter:
    """Rows accumulate in preallocated per-hook buffers of about `limit` bytes; a full buffer is written
    as one shard (its filled prefix is a contiguous view, so nothing is copied) and then refilled.

    After each shard, progress.json records every shard so far with the sequences done when it ends
    and the token digest there (both atomic writes: a shard on disk but not recorded is redone)."""

    def __init__(self, directory: Path, arguments: dict[str, Any], done: Sequence[dict[str, Any]] = ()):
        self.directory, self.arguments, self.limit = directory, arguments, int(arguments["shard_bytes"])
        self.shards: list[dict[str, Any]] = [dict(s) for s in done]
        self.spec: dict[str, dict[str, Any]] = {}
        self.buffers: dict[str, Tensor] = {}
        self.filled = 0
        # Sequences done and the token digest at the end of the last part added (buffered or written).
        self.sequences = int(done[-1]["sequences"]) if done else 0
        self.digest = done[-1]["tokens_sha256"] if done else hashlib.sha256().hexdigest()
        if done:
            with safe_open(str(directory / done[0]["file"]), framework="pt") as f:
                for name in arguments["hooks"]:  # in the order asked for, as a fresh harvest lists them
                    t = f.get_slice(name)
                    self.spec[name] = {"shape": list(t.get_shape()[1:]), "dtype": _dtype_name(t.get_dtype())}

    def add(self, part: Activations, end: tuple[int, str]) -> None:
        """Buffer `part`'s rows; `end` is (sequences done, token digest) once its batch is done."""
        for name, t in part.acts.items():
            shape, kind = list(t.shape[1:]), str(t.dtype).removeprefix("torch.")
            known = self.spec.setdefault(name, {"shape": shape, "dtype": kind})
            if known["shape"] != shape:
                raise ValueError(f"{name}: rows of shape {shape} after rows of shape {known['shape']}; batches of "
                                 "different lengths give attention patterns of different widths")
        rows = len(part)
        if rows:
            if not self.buffers:
                row_bytes = sum(t[0].numel() * t.element_size() for t in part.acts.values()) + 16  # + seq, pos
                capacity = max(1, self.limit // row_bytes)
                self.buffers = {name: torch.empty((capacity, *t.shape[1:]), dtype=t.dtype)
                                for name, t in part.acts.items()}
                self.buffers |= {"seq": torch.empty(capacity, dtype=torch.long),
                                 "pos": torch.empty(capacity, dtype=torch.long)}
            capacity = len(self.buffers["seq"])
            if self.filled + rows > capacity:
                self.flush()  # the buffer holds whole batches up to the previous part: a resumable boundary
            if rows > capacity:  # one batch bigger than a shard: write it as it is
                self.sequences, self.digest = end
                self._write(part.acts | {"seq": part.seq, "pos": part.pos}, rows)
                return
            for name, t in (part.acts | {"seq": part.seq, "pos": part.pos}).items():
                self.buffers[name][self.filled: self.filled + rows] = t
            self.filled += rows
        self.sequences, self.digest = end

    def flush(self) -> None:
        if self.filled:
            self._write({name: b[: self.filled] for name, b in self.buffers.items()}, self.filled)
            self.filled = 0

    def _write(self, tensors: dict[str, Tensor], rows: int) -> None:
        file = f"shard-{len(self.shards):05d}.safetensors"
        tensors = {name: t.contiguous() for name, t in tensors.items()}
        atomic_write(self.directory / file, lambda path: save_file(tensors, str(path), metadata={"format": INDEX_FORMAT}))
        self.shards.append({"file": file, "rows": rows, "sequences": self.sequences, "tokens_sha256": self.digest})
        atomic_write_text(self.directory / PROGRESS_FILE,
                          json.dumps({"format": INDEX_FORMAT, "arguments": self.arguments, "shards": self.shards},
                                     indent=2) + "\n")


def _dtype_name(safetensors_dtype: str) -> str:
    """safetensors' dtype codes (F32, F16, BF16, I64) as the torch names index.json uses."""
    return {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
            "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}[safetensors_dtype]


def _model_summary(model: Any) -> dict[str, Any]:
    cfg = getattr(model, "cfg", None)
    summary: dict[str, Any] = {"class": type(model).__name__}
    if hasattr(cfg, "to_dict"):
        summary["config"] = cfg.to_dict()
    return summary


class ActivationStore:
    """A set of activations written by `save_activations`: read all of it, some hooks, or shard by shard."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        path = self.directory / INDEX_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{self.directory} has no {INDEX_FILE}: not a complete activation set")
        try:
            self.index = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"malformed {path}: {err}") from err
        if not isinstance(self.index, dict) or self.index.get("format") != INDEX_FORMAT:
            raise ValueError(f"{path} is not a {INDEX_FORMAT} index")
        missing = [s["file"] for s in self.index["shards"] if not (self.directory / s["file"]).is_file()]
        if missing:
            raise FileNotFoundError(f"{self.directory} is missing shards {missing[:3]}")

    @property
    def names(self) -> list[str]:
        return list(self.index["hooks"])

    def __len__(self) -> int:
        return int(self.index["n_rows"])

    def __repr__(self) -> str:
        return (f"ActivationStore({str(self.directory)!r}, rows={len(self)}, shards={len(self.index['shards'])}, "
                f"hooks={self.names})")

    def _names(self, names: str | Sequence[str] | None) -> list[str]:
        names = self.names if names is None else [names] if isinstance(names, str) else list(names)
        unknown = [n for n in names if n not in self.index["hooks"]]
        if unknown:
            raise KeyError(f"{self.directory} holds no {unknown[0]!r}; it holds {self.names}")
        return names

    def shards(self, names: str | Sequence[str] | None = None) -> Iterator[Activations]:
        """One Activations per shard, reading only the hooks asked for."""
        names = self._names(names)
        for shard in self.index["shards"]:
            with safe_open(str(self.directory / shard["file"]), framework="pt") as f:
                yield Activations({n: f.get_tensor(n) for n in names}, f.get_tensor("seq"), f.get_tensor("pos"),
                                  {"positions": self.index["positions"]})

    def __iter__(self) -> Iterator[Activations]:
        return self.shards()

    def __getitem__(self, name: str) -> "StoredRows":
        """One hook's rows, left on disk: `fit_probe(store[name], y)` fits shard by shard."""
        return StoredRows(self, self._names(name)[0])

    def load(self, names: str | Sequence[str] | None = None) -> Activations:
        """Everything (or the named hooks) in memory, filled shard by shard into preallocated tensors."""
        names = self._names(names)
        n = len(self)
        acts = {name: torch.empty((n, *self.index["hooks"][name]["shape"]),
                                  dtype=getattr(torch, self.index["hooks"][name]["dtype"])) for name in names}
        seq, pos = torch.empty(n, dtype=torch.long), torch.empty(n, dtype=torch.long)
        start = 0
        for part in self.shards(names):
            stop = start + len(part)
            for name in names:
                acts[name][start:stop] = part.acts[name]
            seq[start:stop], pos[start:stop] = part.seq, part.pos
            start = stop
        return Activations(acts, seq, pos, {"positions": self.index["positions"]})


@dataclass(frozen=True)
class StoredRows:
    """One hook's rows in an ActivationStore, read a shard at a time (`store[name]`): what the linear probes
    of `lab.analysis.probes` fit out of core, holding one shard's rows at once."""

    store: ActivationStore
    name: str

    def __len__(self) -> int:
        return len(self.store)

    @property
    def shape(self) -> tuple[int, ...]:
        """[rows, *shape], as the loaded tensor would have."""
        return (len(self.store), *self.store.index["hooks"][self.name]["shape"])

    def chunks(self) -> Iterator[Tensor]:
        """The rows, one shard's [rows, *shape] tensor at a time, in row order."""
        for part in self.store.shards(self.name):
            yield part.acts[self.name]

    def load(self) -> Tensor:
        return self.store.load(self.name)[self.name]
