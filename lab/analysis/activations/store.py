"""Activations on disk: `save_activations` streams the selected rows into safetensors shards plus index.json
(memory held: one batch and one shard buffer), resumably; `ActivationStore` reads a finished set whole, by
hook or shard by shard, and `StoredRows` is one hook's rows left on disk, for probes fitted out of core;
`merge_stores` makes complete sets in subfolders one set (a harvest's parts, across ranks).

On disk, `out_dir/shard-00000.safetensors ...` hold each hook's rows plus `seq` and `pos`, and
`out_dir/index.json` (written last, so its presence means the set is complete) lists the shards — each with its
row count, the sequences done where it ends and the SHA-256 of its bytes, taken when it was written —, each hook's
per-row shape and dtype, and what was collected; `out_dir/progress.json` records each shard of a harvest in
progress.

A store trusts nothing of its folder it has not checked (through `lab.outside_files`): the index is a regular file of
bounded size and nesting whose fields have their types; every shard it names is a regular file inside the folder
(no `../`), whose header holds the rows the index says, of the shapes and dtypes it says, in the order of the
sequences; and a shard's bytes match their checksum before any row of it is read. Each failure is an InputError
naming the file that is wrong."""

import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from lab.analysis.activations.collect import (
    Activations,
    CountedBatches,
    Positions,
    describe_positions,
    stream_activations,
    token_batches,
)
from lab.analysis.activations.verify import (
    check_header,
    checked_shards,
    dtype_name,
    file_sha256,
    is_row_spec,
    verify_checksum,
)
from lab.distributed import all_gather_json, rank_world, share
from lab.files import atomic_write, atomic_write_text, remove_temporary, tensors_bytes
from lab.freed_memory import release_freed_memory
from lab.outside_files import InputError, read_json_object, regular_file

INDEX_FILE = "index.json"
PROGRESS_FILE = "progress.json"
INDEX_FORMAT = "forma-activations/2"  # /2: every shard carries the SHA-256 of its bytes


def save_activations(
    model: Any,
    data: Tensor | Iterable[Tensor],
    hooks: str | Sequence[str],
    out_dir: str | Path,
    positions: Positions = "last",
    *,
    batch_size: int = 32,
    pad_id: int | None = None,
    dtype: torch.dtype | None = None,
    shard_mb: float = 32.0,
    progress: bool = True,
    stop_early: bool = True,
    overwrite: bool = False,
    first_sequence: int = 0,
) -> "ActivationStore":
    """Stream the selected activations into safetensors shards of at most `shard_mb` MB, then index.json.

    Memory held at any time: one batch's forward pass plus one shard buffer (preallocated once and
    refilled, written from views without copying). A batch larger than a shard becomes a shard of its own.
    The memory a forward pass frees is kept for the next batch to reuse and handed back to the OS once per
    shard: handed back after every batch, each batch would page-fault it in afresh, a cost that dominates a
    small model's harvest (benchmarks/harvest.py's corpus run).

    Resumable: every shard is written atomically and then recorded in progress.json. When `out_dir`
    holds an interrupted harvest (progress.json, no index.json), the same call continues after its last
    recorded shard; different arguments, or data whose leading sequences differ from the ones already
    done (compared by a SHA-256 of their token ids), are a ValueError. The model is compared by class
    and config, not by its weights. overwrite=True starts afresh in a folder holding a complete or an
    interrupted set. first_sequence: the index in a larger corpus of `data`'s first sequence, from which rows'
    `seq` count (a part of a corpus harvested across ranks: `lab.analysis.activations.harvest`).
    """
    out_dir = Path(out_dir)
    names = [hooks] if isinstance(hooks, str) else list(hooks)
    arguments = _arguments(model, names, positions, batch_size, pad_id, dtype, shard_mb, stop_early, first_sequence)
    done = _ready_folder(out_dir, arguments, overwrite)
    writer = _ShardWriter(out_dir, arguments, done)
    tap = _TokenDigest(data, batch_size, done[-1] if done else None)
    for part in stream_activations(
        model,
        tap,
        names,
        positions,
        batch_size=batch_size,
        pad_id=pad_id,
        dtype=dtype,
        progress=progress,
        stop_early=stop_early,
        start=writer.sequences,
        release_memory=False,
    ):  # the writer does, once per shard
        part.seq += first_sequence
        writer.add(part, tap.state)
    _finish(out_dir, writer, positions, model)
    return ActivationStore(out_dir)


MAX_SHARD_MB = 4096.0  # a shard's buffer is held in memory while it fills, and a reader maps a shard whole


def check_shard_mb(shard_mb: Any) -> None:
    """ValueError for a shard size that is not a positive number of at most MAX_SHARD_MB megabytes."""
    if not (isinstance(shard_mb, (int, float)) and 0 < shard_mb <= MAX_SHARD_MB):
        raise ValueError(
            f"the shard size must be a number of MB > 0 and at most {MAX_SHARD_MB:,.0f} (a shard is held in memory "
            f"while it fills), got {shard_mb!r}"
        )


def _arguments(
    model: Any,
    names: list[str],
    positions: Positions,
    batch_size: int,
    pad_id: int | None,
    dtype: torch.dtype | None,
    shard_mb: float,
    stop_early: bool,
    first_sequence: int,
) -> dict[str, Any]:
    """The harvest's arguments as progress.json records them (a resumed harvest must have the same); ValueError
    for a shard size that is not a positive number."""
    check_shard_mb(shard_mb)
    return json.loads(
        json.dumps(
            {
                "hooks": names,
                "positions": describe_positions(positions),
                "batch_size": batch_size,
                "pad_id": pad_id,
                "dtype": None if dtype is None else str(dtype).removeprefix("torch."),
                "shard_bytes": int(shard_mb * 2**20),
                "stop_early": stop_early,
                "model": model_summary(model),
            }
            | ({"first_sequence": first_sequence} if first_sequence else {})
        )
    )


def _ready_folder(out_dir: Path, arguments: dict[str, Any], overwrite: bool) -> list[dict[str, Any]]:
    """The shards a harvest into out_dir keeps (an interrupted one's, with these arguments, unless overwriting),
    with everything else of an earlier harvest removed: its index (FileExistsError unless overwriting), its record
    on a fresh start, shards never recorded, and temporaries a killed write left behind."""
    if (out_dir / INDEX_FILE).exists():
        if not overwrite:
            raise FileExistsError(
                f"{out_dir} already holds a complete activation set ({INDEX_FILE}); "
                "pass overwrite=True or choose another out_dir"
            )
        (out_dir / INDEX_FILE).unlink()
    out_dir.mkdir(parents=True, exist_ok=True)
    done = [] if overwrite else _resumable_shards(out_dir, arguments)
    if not done:  # a fresh start: an earlier harvest's record goes with its shards
        (out_dir / PROGRESS_FILE).unlink(missing_ok=True)
    kept = {shard["file"] for shard in done}
    for stale in out_dir.iterdir():  # shards never recorded, and temporaries a killed write left behind
        if stale.name in kept or remove_temporary(stale):
            continue
        if stale.is_file() and stale.name.startswith("shard-"):
            stale.unlink()
    return done


def _finish(out_dir: Path, writer: "_ShardWriter", positions: Positions, model: Any) -> None:
    """The last shard, then index.json (what marks the set complete) in place of progress.json; ValueError when
    nothing was collected."""
    writer.flush()
    if not writer.shards:
        raise ValueError("no activations were collected: the dataset was empty or no position was selected")
    index = {
        "format": INDEX_FORMAT,
        "hooks": writer.spec,
        "positions": describe_positions(positions),
        "n_rows": sum(s["rows"] for s in writer.shards),
        "n_sequences": writer.sequences,
        "shards": writer.shards,
        "model": model_summary(model),
    }
    atomic_write_text(out_dir / INDEX_FILE, json.dumps(index, indent=2) + "\n")
    (out_dir / PROGRESS_FILE).unlink(missing_ok=True)


def _resumable_shards(out_dir: Path, arguments: dict[str, Any]) -> list[dict[str, Any]]:
    """The shards an interrupted harvest in `out_dir` recorded, if it ran with these arguments."""
    path = out_dir / PROGRESS_FILE
    if not path.exists():
        return []
    try:
        progress = read_json_object(path, out_dir, what="harvest record")
        if progress.get("format") != INDEX_FORMAT:
            raise InputError(f"{path} is not a {INDEX_FORMAT} harvest record")
        recorded, shards = progress["arguments"], checked_shards(path, progress["shards"])
        if not isinstance(recorded, dict):
            raise InputError(f"{path}: its arguments are not a JSON object")
    except (ValueError, KeyError) as err:
        raise InputError(f"malformed {path} ({err}); pass overwrite=True to start afresh") from err
    differing = [key for key in sorted(set(recorded) | set(arguments)) if recorded.get(key) != arguments.get(key)]
    if differing:
        key = differing[0]
        raise ValueError(
            f"{out_dir} holds an interrupted harvest with other arguments ({key}: "
            f"{recorded.get(key)!r} then, {arguments.get(key)!r} now); rerun it with the same "
            "arguments to resume, or pass overwrite=True to start afresh"
        )
    missing = [s["file"] for s in shards if not (out_dir / s["file"]).exists()]
    if missing:
        raise FileNotFoundError(
            f"{out_dir}: {PROGRESS_FILE} records shards that are missing ({missing[:3]}); "
            "pass overwrite=True to start afresh"
        )
    for shard in shards:
        try:
            verify_checksum(out_dir, shard)
        except InputError as err:
            raise InputError(f"{err}; pass overwrite=True to start afresh") from None
    return shards


class _TokenDigest(CountedBatches):
    """The dataset's batches, passed through unchanged while a SHA-256 of their token ids runs along.

    `state` is (sequences done, digest) through the batch last read — while stream_activations yields a
    batch's part, that batch's: what a shard ending there records. When resuming after `resume` (the last recorded
    shard), the batches read must end exactly at
    its sequence count with its digest: otherwise these are not the data its shards came from.
    """

    def __init__(self, data: Tensor | Iterable[Tensor], batch_size: int, resume: dict[str, Any] | None):
        self.batches, self.n_sequences = token_batches(data, batch_size)
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
            raise ValueError(
                f"the data hold {self.seen} sequences, but the interrupted harvest had already done "
                f"{self.resume['sequences']}: these are not the same data"
            )

    def _check(self) -> None:
        if self.resume is None or self.seen < self.resume["sequences"]:
            return
        expected, self.resume = self.resume, None
        if self.seen != expected["sequences"]:
            raise ValueError(
                f"the data's batches do not end at sequence {expected['sequences']}, where the "
                "interrupted harvest's last shard ends: these are not the same data"
            )
        if self.digest != expected["tokens_sha256"]:
            raise ValueError(
                f"the first {self.seen} sequences differ from those the interrupted harvest already "
                "wrote (by the SHA-256 of their token ids); rerun it with the same data, or pass "
                "overwrite=True to start afresh"
            )

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
            with safe_open(str(regular_file(directory / done[0]["file"], directory)), framework="pt") as f:
                for name in arguments["hooks"]:  # in the order asked for, as a fresh harvest lists them
                    t = f.get_slice(name)
                    self.spec[name] = {"shape": list(t.get_shape()[1:]), "dtype": dtype_name(t.get_dtype())}

    def add(self, part: Activations, end: tuple[int, str]) -> None:
        """Buffer `part`'s rows; `end` is (sequences done, token digest) once its batch is done."""
        for name, t in part.acts.items():
            shape, kind = list(t.shape[1:]), str(t.dtype).removeprefix("torch.")
            known = self.spec.setdefault(name, {"shape": shape, "dtype": kind})
            if known["shape"] != shape:
                raise ValueError(
                    f"{name}: rows of shape {shape} after rows of shape {known['shape']}; batches of "
                    "different lengths give attention patterns of different widths"
                )
        rows = len(part)
        if rows:
            if not self.buffers:
                row_bytes = sum(t[0].numel() * t.element_size() for t in part.acts.values()) + 16  # + seq, pos
                capacity = max(1, self.limit // row_bytes)
                self.buffers = {
                    name: torch.empty((capacity, *t.shape[1:]), dtype=t.dtype) for name, t in part.acts.items()
                }
                self.buffers |= {
                    "seq": torch.empty(capacity, dtype=torch.long),
                    "pos": torch.empty(capacity, dtype=torch.long),
                }
            capacity = len(self.buffers["seq"])
            if self.filled + rows > capacity:
                self.flush()  # the buffer holds whole batches up to the previous part: a resumable boundary
            if rows > capacity:  # one batch bigger than a shard: write it as it is
                self.sequences, self.digest = end
                self._write(part.acts | {"seq": part.seq, "pos": part.pos}, rows)
                return
            for name, t in (part.acts | {"seq": part.seq, "pos": part.pos}).items():
                self.buffers[name][self.filled : self.filled + rows] = t
            self.filled += rows
        self.sequences, self.digest = end

    def flush(self) -> None:
        if self.filled:
            self._write({name: b[: self.filled] for name, b in self.buffers.items()}, self.filled)
            self.filled = 0

    def _write(self, tensors: dict[str, Tensor], rows: int) -> None:
        file = f"shard-{len(self.shards):05d}.safetensors"
        tensors = {name: t.contiguous() for name, t in tensors.items()}
        atomic_write(
            self.directory / file,
            lambda path: save_file(tensors, str(path), metadata={"format": INDEX_FORMAT}),
            tensors_bytes(tensors),
        )
        self.shards.append(
            {
                "file": file,
                "rows": rows,
                "sequences": self.sequences,
                "tokens_sha256": self.digest,
                "sha256": file_sha256(self.directory / file),
            }
        )
        atomic_write_text(
            self.directory / PROGRESS_FILE,
            json.dumps({"format": INDEX_FORMAT, "arguments": self.arguments, "shards": self.shards}, indent=2) + "\n",
        )
        release_freed_memory()  # what the batches since the last shard freed and left unused (fragments)


def model_summary(model: Any) -> dict[str, Any]:
    """What a harvest records of its model, and compares on a resume: its class and config, not its weights."""
    cfg = getattr(model, "cfg", None)
    summary: dict[str, Any] = {"class": type(model).__name__}
    if hasattr(cfg, "to_dict"):
        summary["config"] = cfg.to_dict()
    return summary


def merge_stores(directory: str | Path, parts: Sequence[tuple[str, dict[str, Any]]]) -> "ActivationStore":
    """One activation set over complete ones in subfolders of `directory`: `parts` is [(subfolder, its index)] in
    row order, and directory/index.json (written atomically) lists every part's shards in that order, as
    "subfolder/shard-00000.safetensors", so ActivationStore(directory) reads all their rows as one set. The shards
    stay where they are; each shard entry keeps what its part recorded (its `sequences` count within the part).
    The parts must hold the same hooks, positions and model. What a harvest across ranks writes at the end."""
    directory = Path(directory)
    if not parts:
        raise ValueError("no activation sets to merge")
    first = parts[0][1]
    for folder, index in parts:
        for key in ("format", "hooks", "positions", "model"):
            if index.get(key) != first.get(key):
                raise ValueError(
                    f"{directory / folder} holds other {key} ({index.get(key)!r}) than "
                    f"{directory / parts[0][0]} ({first.get(key)!r}): its rows cannot join the set"
                )
    index = {
        "format": INDEX_FORMAT,
        "hooks": first["hooks"],
        "positions": first["positions"],
        "n_rows": sum(i["n_rows"] for _, i in parts),
        "n_sequences": sum(i["n_sequences"] for _, i in parts),
        "shards": [dict(shard, file=f"{folder}/{shard['file']}") for folder, i in parts for shard in i["shards"]],
        "model": first["model"],
        "parts": [{"folder": folder, "n_sequences": i["n_sequences"], "n_rows": i["n_rows"]} for folder, i in parts],
    }
    atomic_write_text(directory / INDEX_FILE, json.dumps(index, indent=2) + "\n")
    return ActivationStore(directory)


class ActivationStore:
    """A set of activations written by `save_activations`: read all of it, some hooks, or shard by shard. Its
    index and shards are checked first, and each shard's checksum before its rows are read (see the module's
    docstring)."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        path = self.directory / INDEX_FILE
        if not path.exists():
            raise FileNotFoundError(f"{self.directory} has no {INDEX_FILE}: not a complete activation set")
        self.index = read_json_object(path, self.directory, what="activation index")
        if self.index.get("format") != INDEX_FORMAT:
            older = str(self.index.get("format", "")).startswith("forma-activations/")
            why = ": it was written before shards carried checksums; harvest the set again" if older else ""
            raise InputError(f"{path} is not a {INDEX_FORMAT} index{why}")
        shards = checked_shards(path, self.index.get("shards"))
        hooks = self.index.get("hooks")
        if not isinstance(hooks, dict) or not all(is_row_spec(spec) for spec in hooks.values()):
            raise InputError(f"{path}: its hooks must map each name to a shape (a list of sizes) and a torch dtype")
        if type(self.index.get("n_rows")) is not int or self.index["n_rows"] != sum(s["rows"] for s in shards):
            raise InputError(
                f"{path} says n_rows {self.index.get('n_rows')!r}, but its shards hold "
                f"{sum(s['rows'] for s in shards)} rows"
            )
        missing = [s["file"] for s in shards if not (self.directory / s["file"]).exists()]
        if missing:
            raise FileNotFoundError(f"{self.directory} is missing shards {missing[:3]}")
        for shard in shards:
            check_header(self.directory, self.index["hooks"], shard)
        self._verified: set[str] = set()

    @property
    def names(self) -> list[str]:
        return list(self.index["hooks"])

    def __len__(self) -> int:
        return int(self.index["n_rows"])

    def __repr__(self) -> str:
        return (
            f"ActivationStore({str(self.directory)!r}, rows={len(self)}, shards={len(self.index['shards'])}, "
            f"hooks={self.names})"
        )

    def _names(self, names: str | Sequence[str] | None) -> list[str]:
        names = self.names if names is None else [names] if isinstance(names, str) else list(names)
        unknown = [n for n in names if n not in self.index["hooks"]]
        if unknown:
            raise KeyError(f"{self.directory} holds no {unknown[0]!r}; it holds {self.names}")
        return names

    def shards(self, names: str | Sequence[str] | None = None) -> Iterator[Activations]:
        """One Activations per shard, reading only the hooks asked for."""
        names = self._names(names)
        for i in range(len(self.index["shards"])):
            yield self.shard(i, names)

    def verify_shared(self) -> None:
        """Check every shard's checksum now, the ranks of a torch.distributed group on each machine sharing the
        work (torchrun's LOCAL_RANK of LOCAL_WORLD_SIZE: each rank hashes a share of the shards, and each machine
        checks its own files), where otherwise every rank would hash every shard it reads. A bad shard found by any
        rank is the same InputError on every rank. In one process, or without torchrun's variables, nothing is
        done now: each shard is checked when first read."""
        _, world = rank_world()
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        if world == 1 or local_world == 1 or "LOCAL_RANK" not in os.environ:
            return
        shards = self.index["shards"]
        problem = None
        for shard in share(shards, int(os.environ["LOCAL_RANK"]), local_world):
            try:
                verify_checksum(self.directory, shard)
            except InputError as err:
                problem = str(err)
                break
        found = [p for p in all_gather_json(problem) if p is not None]
        if found:
            raise InputError(found[0])
        self._verified.update(s["file"] for s in shards)

    def shard(self, i: int, names: str | Sequence[str] | None = None) -> Activations:
        """Shard `i` alone (the named hooks): what a reader in an order of its own (a trainer's shuffle) reads. Its
        checksum is checked the first time this store reads it (a probe's fit reads every shard many times)."""
        names = self._names(names)
        if not 0 <= i < len(self.index["shards"]):
            raise IndexError(f"{self.directory} has {len(self.index['shards'])} shards, not shard {i}")
        shard = self.index["shards"][i]
        if shard["file"] not in self._verified:
            verify_checksum(self.directory, shard)
            self._verified.add(shard["file"])
        with safe_open(str(self.directory / shard["file"]), framework="pt") as f:
            return Activations(
                {n: f.get_tensor(n) for n in names},
                f.get_tensor("seq"),
                f.get_tensor("pos"),
                {"positions": self.index.get("positions")},
            )

    def __iter__(self) -> Iterator[Activations]:
        return self.shards()

    def __getitem__(self, name: str) -> "StoredRows":
        """One hook's rows, left on disk: `fit_probe(store[name], y)` fits shard by shard."""
        return StoredRows(self, self._names(name)[0])

    def load(self, names: str | Sequence[str] | None = None) -> Activations:
        """Everything (or the named hooks) in memory, filled shard by shard into preallocated tensors."""
        names = self._names(names)
        n = len(self)
        acts = {
            name: torch.empty(
                (n, *self.index["hooks"][name]["shape"]), dtype=getattr(torch, self.index["hooks"][name]["dtype"])
            )
            for name in names
        }
        seq, pos = torch.empty(n, dtype=torch.long), torch.empty(n, dtype=torch.long)
        start = 0
        for part in self.shards(names):
            stop = start + len(part)
            for name in names:
                acts[name][start:stop] = part.acts[name]
            seq[start:stop], pos[start:stop] = part.seq, part.pos
            start = stop
        return Activations(acts, seq, pos, {"positions": self.index.get("positions")})


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
