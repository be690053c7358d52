"""A corpus's activations into one set on disk, in one process or across the ranks of torchrun, resumable: what
`forma harvest` runs.

The corpus ([n, seq_len] token ids: a tensor, or an array memory-mapped from a .npy file so that a rank harvests
only its own rows, once `split_corpus` has checked the ids a chunk at a time) is cut into parts
(`lab.distributed.plan_parts`: at most 256, bounds on whole batches, the same at any world size). Part i is a
complete activation set (`save_activations`) in out_dir/part-0000i/, whose rows' `seq` count from the part's first
sequence in the corpus. Each rank harvests its share of the parts no rank has done yet
(`lab.distributed.claim_parts`); inside a part, a harvest killed mid-way goes on from its last recorded shard. Once
every part is done, rank 0 writes out_dir/index.json over all their shards (`merge_stores`), and
`ActivationStore(out_dir)` reads the whole corpus's rows: bit for bit the rows of one process, since neither the
parts nor their batches depend on the world size (the shard files are the same bytes too).

    out_dir/.forma-folder.json           what Forma writes there (lab.files.claim_folder): a folder holding
                                         anything else is refused unless overwrite, and that is never removed
    out_dir/.forma-lock                  the pid of the process writing it (rank 0), while it does
    out_dir/plan.json                    the arguments, written first; a rerun with other ones is refused
    out_dir/part-00000/shard-*.safetensors, index.json   ...   one activation set per part
    out_dir/index.json                   written last: its presence means the harvest is complete

A rerun of the same call (after a kill of any rank, at any moment) does only what is missing, over however many
ranks it has; a part already complete is checked against the corpus (the SHA-256 of its token ids, which its
index recorded) before it is kept.
"""

import contextlib
import hashlib
import json
import shutil
import tokenize
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lab.analysis.activations.collect import check_names
from lab.analysis.activations.store import (
    INDEX_FILE,
    ActivationStore,
    check_shard_mb,
    merge_stores,
    model_summary,
    save_activations,
)
from lab.distributed import (
    PARTS,
    PLAN_FILE,
    all_gather_json,
    claim_parts,
    parts_bar,
    plan_parts,
    rank_world,
    record_plan,
)
from lab.files import OWNER_FILE, claim_folder, folder_lock, is_owned_temporary, owned, remove_temporary
from lab.outside_files import read_text, regular_file

HARVEST_FORMAT = "forma-harvest/1"
DEFAULT_SEQ_LEN = 128


def read_corpus(path: str | Path, model: Any, *, seq_len: int | None = None, tokens: int | None = None) -> np.ndarray:
    """A corpus file as [n, seq_len] token ids (`split_corpus`, without the count of what is left over)."""
    return split_corpus(path, model, seq_len=seq_len, tokens=tokens)[0]


def split_corpus(
    path: str | Path, model: Any, *, seq_len: int | None = None, tokens: int | None = None
) -> tuple[np.ndarray, int]:
    """A corpus file as [n, seq_len] token ids, cut into sequences of `seq_len` tokens, and the number of tokens
    left over (fewer than a sequence: a caller says so, nothing is cut silently):

        .npy   token ids of any integer dtype, one stream ([tokens]) or sequences ([n, seq_len]); memory-mapped:
               the ids are checked against the vocabulary a chunk at a time, then a part reads only its rows
        .txt   UTF-8 text, encoded whole as one stream by the model's tokenizer (no special tokens added, never
               cut to the model's context); for a corpus larger than memory, encode it once into a .npy

    seq_len: by default a 2-D array's width, else min(128, the model's n_ctx). tokens: keep only the sequences that
    the first `tokens` tokens fill (at least one); by default every whole sequence."""
    path = Path(path)
    ids = _corpus_ids(path, model)
    n_ctx = model.cfg.n_ctx
    if ids.ndim == 2:
        if seq_len is not None and seq_len != ids.shape[1]:
            raise ValueError(f"{path} holds sequences of {ids.shape[1]} tokens, not the {seq_len} asked for")
        if not 1 <= ids.shape[1] <= n_ctx:
            raise ValueError(f"{path} holds sequences of {ids.shape[1]} tokens; the model reads 1 … {n_ctx}")
        seq_len = int(ids.shape[1])
    seq_len = min(DEFAULT_SEQ_LEN, n_ctx) if seq_len is None else seq_len
    if not 1 <= seq_len <= n_ctx:
        raise ValueError(f"the sequence length must be 1 … n_ctx = {n_ctx}, got {seq_len}")
    available = ids.shape[0] if ids.ndim == 2 else ids.shape[0] // seq_len
    n = available if tokens is None else tokens // seq_len
    if n < 1 or n > available:
        held = ids.size
        raise ValueError(
            f"{path} holds {held:,} tokens ({available:,} sequences of {seq_len}); "
            + (
                "it fills no sequence"
                if n < 1 and tokens is None
                else f"{tokens:,} tokens fill {n:,} sequences" + (": ask for at least one" if n < 1 else "")
            )
        )
    used = ids.size if tokens is None else tokens
    left_over = used - n * seq_len
    return (ids[:n] if ids.ndim == 2 else ids[: n * seq_len].reshape(n, seq_len)), int(left_over)


def _corpus_ids(path: Path, model: Any) -> np.ndarray:
    """A corpus file's token ids, 1-D or 2-D, checked to be a regular file of integer ids before a byte is read."""
    if path.suffix == ".npy":
        regular_file(path, what="corpus")  # a FIFO would block np.load for ever
        try:
            ids = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError, SyntaxError, tokenize.TokenError) as err:
            # (numpy reads the header with the tokenize and ast modules; an empty file is an EOFError)
            raise ValueError(f"{path}: not a .npy array of token ids ({err})") from err
        if not np.issubdtype(ids.dtype, np.integer) or ids.ndim not in (1, 2):
            raise ValueError(
                f"{path}: token ids must be a 1-D or 2-D integer array, got {ids.dtype} {tuple(ids.shape)}"
            )
        check_ids(ids, model.cfg.d_vocab, path)
        return ids
    if path.suffix == ".txt":
        if getattr(model, "tokenizer", None) is None:
            raise ValueError(f"{path}: the model has no tokenizer to encode text with; give token ids as a .npy")
        text = read_text(path, what="corpus")
        return model.to_tokens(text, prepend_bos=False, truncate=False)[0].cpu().numpy()
    raise ValueError(f"{path}: a corpus is a .txt (text) or a .npy (token ids) file")


def check_ids(ids: np.ndarray, d_vocab: int, path: Path, chunk: int = 2**24) -> None:
    """ValueError naming `path` for a token id outside [0, d_vocab): read once, `chunk` ids at a time (a memory-
    mapped corpus is never read whole into memory), before anything is written — the model would refuse it only
    mid-harvest, naming no file."""
    flat = np.ravel(ids, order="K")  # a view of either memory order
    for start in range(0, flat.size, chunk):
        piece = flat[start : start + chunk]
        low, high = piece.min(), piece.max()
        if low < 0 or high >= d_vocab:
            bad = int(low) if low < 0 else int(high)
            raise ValueError(f"{path}: token id {bad:,} is out of range: ids must lie in [0, d_vocab) = [0, {d_vocab})")


def part_tokens(corpus: Tensor | np.ndarray, rows: range) -> Tensor:
    """The corpus's rows `rows` as int64 token ids (only they are read from a memory-mapped array)."""
    if isinstance(corpus, Tensor):
        return corpus[rows.start : rows.stop].to(torch.long)
    return torch.from_numpy(np.ascontiguousarray(corpus[rows.start : rows.stop], dtype=np.int64))


def tokens_sha256(tokens: Tensor) -> str:
    """The SHA-256 of token ids as save_activations records it (int64 bytes, row after row)."""
    return hashlib.sha256(tokens.to(device="cpu", dtype=torch.int64).contiguous().numpy().tobytes()).hexdigest()


def part_folder(out_dir: Path, i: int) -> Path:
    return out_dir / f"part-{i:05d}"


def harvest(
    model: Any,
    corpus: Tensor | np.ndarray,
    hooks: str | Sequence[str],
    out_dir: str | Path,
    positions: str | Sequence[int] = "all",
    *,
    batch_size: int = 32,
    dtype: torch.dtype | None = None,
    shard_mb: float = 32.0,
    parts: int = PARTS,
    progress: bool = True,
    overwrite: bool = False,
) -> ActivationStore | None:
    """Harvest `hooks` at `positions` over every sequence of `corpus` into `out_dir` (see the module's docstring):
    in this process, or — under torchrun — this rank's share, every rank calling it alike. Returns the finished
    set on rank 0 and None on the other ranks. positions: "all", "last" or indices (a predicate cannot be
    compared on a rerun). overwrite: start afresh, whatever out_dir holds (rerun without it to resume)."""
    rank = rank_world()[0]
    out_dir = Path(out_dir)
    names = [hooks] if isinstance(hooks, str) else list(hooks)
    _check_inputs(model, corpus, names, positions, shard_mb)
    ranges = plan_parts(int(corpus.shape[0]), unit=batch_size, most=parts)
    if not ranges:
        raise ValueError("the corpus holds no sequence")
    entries = [PLAN_FILE, INDEX_FILE, *(part_folder(out_dir, i).name for i in range(len(ranges)))]
    wrote_before = claim_folder(out_dir, "harvest", entries, overwrite=overwrite)
    plan = _plan(model, corpus, names, positions, batch_size, dtype, shard_mb, len(ranges))
    with folder_lock(out_dir, "harvest") if rank == 0 else contextlib.nullcontext():
        if (out_dir / INDEX_FILE).is_file() and not overwrite:
            if rank == 0:  # a run killed after index.json landed left its tidying undone (and its lock: taken over)
                _tidy(out_dir, len(ranges), wrote_before | set(owned(out_dir)))
            raise FileExistsError(
                f"{out_dir} already holds a complete harvest ({INDEX_FILE}); overwrite it or choose another folder"
            )
        record_plan(out_dir, plan, overwrite=overwrite, what="harvest")
        if overwrite and rank == 0:
            (out_dir / INDEX_FILE).unlink(missing_ok=True)
        return _harvest_parts(model, corpus, names, out_dir, positions, plan, ranges, overwrite, wrote_before, progress)


def _harvest_parts(
    model: Any,
    corpus: Tensor | np.ndarray,
    names: list[str],
    out_dir: Path,
    positions: str | Sequence[int],
    plan: dict[str, Any],
    ranges: list[range],
    overwrite: bool,
    wrote_before: set[str],
    progress: bool,
) -> ActivationStore | None:
    """The parts no rank has done, this rank's share of them, then (rank 0) the merged index."""
    rank = rank_world()[0]
    dtype = None if plan["dtype"] is None else getattr(torch, plan["dtype"])
    batch_size, shard_mb = plan["batch_size"], plan["shard_mb"]
    kept, mine = claim_parts(len(ranges), lambda i: not overwrite and (part_folder(out_dir, i) / INDEX_FILE).is_file())
    _check_kept(corpus, out_dir, ranges, kept)
    bar = parts_bar(sum(len(ranges[i]) for i in mine), "seq", "harvest", progress)
    for i in mine:
        save_activations(
            model,
            part_tokens(corpus, ranges[i]),
            names,
            part_folder(out_dir, i),
            positions,
            batch_size=batch_size,
            dtype=dtype,
            shard_mb=shard_mb,
            progress=False,
            overwrite=overwrite,
            first_sequence=ranges[i].start,
        )
        bar.update(len(ranges[i]))
    bar.close()
    held = {i: json.loads((part_folder(out_dir, i) / INDEX_FILE).read_text()) for i in sorted(kept + mine)}
    everything = {int(i): index for gathered in all_gather_json(held) for i, index in gathered.items()}
    if rank != 0:
        return None
    store = merge_stores(out_dir, [(part_folder(out_dir, i).name, everything[i]) for i in range(len(ranges))])
    _tidy(out_dir, len(ranges), wrote_before | set(owned(out_dir)))
    return store


def _check_inputs(model: Any, corpus: Tensor | np.ndarray, names: list[str], positions: Any, shard_mb: float) -> None:
    """Before anything is written (a plan recorded from a typo would block the corrected rerun): KeyError for a
    hook the model does not have; TypeError for positions given as a predicate (a rerun cannot compare one);
    ValueError for a shard size out of range, or a corpus that is not [n, seq_len]."""
    check_names(model, names)
    check_shard_mb(shard_mb)
    if callable(positions):
        raise TypeError('a harvest takes positions "all", "last" or a list of indices, not a predicate')
    if corpus.ndim != 2:
        raise ValueError(f"the corpus must be [n, seq_len] token ids, got shape {tuple(corpus.shape)}")


def _plan(
    model: Any,
    corpus: Tensor | np.ndarray,
    names: list[str],
    positions: str | Sequence[int],
    batch_size: int,
    dtype: torch.dtype | None,
    shard_mb: float,
    n_parts: int,
) -> dict[str, Any]:
    """What a harvest into a folder is of (record_plan: a resumed run must be the same)."""
    return {
        "format": HARVEST_FORMAT,
        "hooks": names,
        "positions": positions if isinstance(positions, str) else [int(p) for p in positions],
        "batch_size": batch_size,
        "dtype": None if dtype is None else str(dtype).removeprefix("torch."),
        "shard_mb": shard_mb,
        "n_sequences": int(corpus.shape[0]),
        "seq_len": int(corpus.shape[1]),
        "parts": n_parts,
        "model": model_summary(model),
    }


def _check_kept(corpus: Tensor | np.ndarray, out_dir: Path, ranges: list[range], kept: list[int]) -> None:
    """ValueError for a part an earlier run finished from other token ids than the corpus's."""
    for i in kept:
        index = json.loads((part_folder(out_dir, i) / INDEX_FILE).read_text())
        last = index["shards"][-1]
        if index["n_sequences"] != len(ranges[i]) or last["tokens_sha256"] != tokens_sha256(
            part_tokens(corpus, ranges[i])
        ):
            raise ValueError(
                f"{part_folder(out_dir, i)} was harvested from other token ids than the corpus's "
                f"sequences {ranges[i].start}…{ranges[i].stop - 1}; rerun with the same corpus, or "
                "start afresh with overwrite"
            )


def _tidy(out_dir: Path, n_parts: int, wrote: set[str]) -> None:
    """Remove an earlier plan's parts (only after overwrite), and killed writes' temporaries: only what the folder's
    manifest lists as Forma's (`wrote`), never a file of the user's, whatever its name."""
    planned = {part_folder(out_dir, i).name for i in range(n_parts)}
    for path in out_dir.iterdir():
        if path.is_dir() and not path.is_symlink() and path.name in wrote - planned - {PLAN_FILE, INDEX_FILE}:
            shutil.rmtree(path)
        elif is_owned_temporary(path, wrote | {OWNER_FILE}):
            remove_temporary(path)
        elif path.is_dir() and not path.is_symlink() and path.name in planned & wrote:  # a part folder is Forma's
            for inside in path.glob(".*"):
                remove_temporary(inside)
