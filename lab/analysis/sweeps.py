"""Patching sweeps over a dataset of clean/corrupted prompt pairs, in one process or across the ranks of torchrun,
resumable; gathered into one table per sweep. What `forma patch` runs.

A dataset (`read_pairs`) is a CSV file with the header clean,corrupted,answer,wrong (other columns are ignored), or
a JSONL file of objects with those keys, one pair a line, as IOI-style datasets are written: the clean and the
corrupted prompt (text, encoded by the model's tokenizer; in JSONL also a list of token ids), of the same length in
tokens, and the answer and a wrong answer (text that is one token; in JSONL also a token id).

Each pair is swept alone with `lab.analysis.patching` (the fast path on Forma's models), its metric the logit
difference logit(answer) − logit(wrong) at its last position (`logit_diff`). The sweeps (`SWEEPS`):

    resid_pre, attn_out, mlp_out, resid_post   one (layer, position) of that component at a time   [pair, layer, pos]
    head                                       one head's z at every position               [pair, layer, head]
    head_pos                                   one head's z at one position                 [pair, layer, head, pos]

Positions count from each prompt's start; a pair shorter than the longest holds NaN where it has no position.
A `SweepTable` holds one sweep's values with each pair's clean and corrupted metric; `SweepTable.mean()` is the
sweep averaged over the pairs (NaN left out), a `PatchingResult` (`normalized()`, the usual heatmap).

Across ranks: the pairs are cut into parts (`lab.distributed.plan_parts`, the same at any world size); each rank
sweeps its share of the parts no rank has done (`claim_parts`), writing each part's rows of every table to
out_dir/parts/part-00000.safetensors atomically; the parts' rows are then gathered to rank 0 through the process
group (no shared filesystem needed), which writes out_dir/<sweep>.safetensors for every sweep (values, clean,
corrupted, lengths) and, last, out_dir/sweep.json (what each table is; `load_sweep` reads them back). Every
pair's numbers are computed alike whichever rank computes them, so the tables are bit for bit those of one process.
A rerun after a kill of any rank sweeps only the parts not yet written.
"""

import contextlib
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from lab.analysis.activations.store import model_summary
from lab.analysis.patching import PatchingResult, patch_heads, patch_heads_by_position, patch_positions
from lab.distributed import (
    PARTS,
    PLAN_FILE,
    all_gather_json,
    all_gather_rows,
    claim_parts,
    parts_bar,
    plan_parts,
    rank_world,
    record_plan,
)
from lab.files import (
    OWNER_FILE,
    atomic_write,
    atomic_write_text,
    claim_folder,
    folder_lock,
    is_owned_temporary,
    owned,
    remove_temporary,
    tensors_bytes,
)
from lab.outside_files import InputError, parse_json, read_csv, read_json_object, read_text, regular_file

SWEEP_FORMAT = "forma-sweep/1"
SWEEP_FILE = "sweep.json"
COLUMNS = ("clean", "corrupted", "answer", "wrong")
# A sweep's name: (the component patched, its cells' axis), as lab.analysis.patching names them.
SWEEPS = {
    "resid_pre": ("resid_pre", "pos"),
    "attn_out": ("attn_out", "pos"),
    "mlp_out": ("mlp_out", "pos"),
    "resid_post": ("resid_post", "pos"),
    "head": ("z", "head"),
    "head_pos": ("z", "head_pos"),
}
TENSORS = ("values", "clean", "corrupted")


@dataclass(frozen=True)
class PromptPair:
    """One row of a dataset: clean and corrupted token ids ([pos], the same length), the answer and a wrong one."""

    clean: Tensor
    corrupted: Tensor
    answer: int
    wrong: int


def read_pairs(path: str | Path, model: Any) -> list[PromptPair]:
    """The pairs of a CSV or JSONL dataset (see the module's docstring), encoded for `model`; a bad row is a
    ValueError naming its line."""
    path = Path(path)
    if path.suffix not in (".csv", ".jsonl"):
        raise ValueError(f"{path}: a dataset of prompt pairs is a .csv or a .jsonl file")
    if path.suffix == ".csv":
        rows = _csv_rows(path)
    else:
        text = read_text(path, what="dataset of prompt pairs")
        rows = []
        for line, raw in enumerate(text.splitlines(), 1):
            if raw.strip():
                try:
                    rows.append((line, parse_json(raw, f"{path}:{line}")))
                except InputError as err:  # "malformed JSON in FILE:LINE, line 1 column C: …", said as rows' are
                    detail = str(err).partition(", line 1 ")[2] or err
                    raise InputError(f"{path}:{line}: not a JSON object ({detail})") from None
    pairs = []
    for line, row in rows:
        try:
            pairs.append(_pair(row, model))
        except ValueError as err:
            raise ValueError(f"{path}:{line}: {err}") from err
    if not pairs:
        raise ValueError(f"{path} holds no prompt pair")
    return pairs


def _csv_rows(path: Path) -> list[tuple[int, dict[str, str]]]:
    """A CSV dataset's rows by the line each starts on, as {column: cell} (`lab.outside_files.read_csv`: a cell past the
    csv module's limit, or a quote left open, is refused naming its line)."""
    table = read_csv(path, what="dataset of prompt pairs")
    header = table[0][1] if table else []
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise ValueError(
            f"{path}: no column {missing[0]!r} (the header must name {', '.join(COLUMNS)}; it "
            f"names {', '.join(header) or 'nothing'})"
        )
    return [(line, dict(zip(header, cells))) for line, cells in table[1:] if cells]


def _pair(row: Any, model: Any) -> PromptPair:
    if not isinstance(row, dict):
        raise ValueError(f"a pair is an object with the keys {', '.join(COLUMNS)}, got {type(row).__name__}")
    missing = [c for c in COLUMNS if c not in row]
    if missing:
        raise ValueError(f"no {missing[0]!r} (a pair has the keys {', '.join(COLUMNS)})")
    clean, corrupted = (_prompt(row[c], model, c) for c in ("clean", "corrupted"))
    if clean.shape != corrupted.shape:
        raise ValueError(
            f"the clean prompt is {len(clean)} tokens and the corrupted one {len(corrupted)}: patching "
            "swaps activations position by position, so they must be as long"
        )
    return PromptPair(clean, corrupted, _answer(row["answer"], model, "answer"), _answer(row["wrong"], model, "wrong"))


def _prompt(value: Any, model: Any, what: str) -> Tensor:
    """A prompt's token ids, whole: one longer than the model's context is refused, never cut (cut alike, a clean
    and a corrupted prompt that differ past the cut would become the same prompt)."""
    if isinstance(value, str):
        tokens = model.to_tokens(value, truncate=False)[0].cpu()
    elif isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        outside = [v for v in value if not 0 <= v < model.cfg.d_vocab]
        if outside:
            raise ValueError(
                f"the {what} prompt's token id {_shown(outside[0])} is out of range [0, {model.cfg.d_vocab})"
            )
        tokens = torch.tensor(value, dtype=torch.long)
    else:
        raise ValueError(f"{what} must be text or a non-empty list of token ids, got {_shown(value)}")
    if len(tokens) > model.cfg.n_ctx:
        raise ValueError(
            f"the {what} prompt is {len(tokens):,} tokens, more than the model's context n_ctx = {model.cfg.n_ctx}; "
            "shorten it (Forma cuts no prompt)"
        )
    return tokens


def _shown(value: Any, most: int = 60) -> str:
    """`value`'s repr, at most `most` characters of it (an error line names a bad cell, never quotes a book)."""
    text = repr(value)
    return text if len(text) <= most else f"{text[:most]}… ({len(text):,} characters)"


def _answer(value: Any, model: Any, what: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        token = value
    elif isinstance(value, str):
        try:
            token = model.to_single_token(value)
        except ValueError as err:
            raise ValueError(f"{what}: {err}") from err
    else:
        raise ValueError(f"{what} must be text of one token or a token id, got {_shown(value)}")
    if not 0 <= token < model.cfg.d_vocab:
        raise ValueError(f"{what}: token id {token} is out of range [0, {model.cfg.d_vocab})")
    return token


def sweep_pair(
    model: Any, pair: PromptPair, sweep: str, *, direction: str = "denoise", max_batch: int = 64
) -> PatchingResult:
    """One pair's sweep, its metric logit(answer) − logit(wrong) at the last position."""
    component, axis = SWEEPS[sweep]
    device = next(model.parameters()).device
    clean, corrupted = pair.clean.to(device), pair.corrupted.to(device)
    options = {"answer": pair.answer, "wrong": pair.wrong, "direction": direction, "max_batch": max_batch}
    if axis == "pos":
        return patch_positions(model, clean, corrupted, component, **options)
    if axis == "head":
        return patch_heads(model, clean, corrupted, **options)
    return patch_heads_by_position(model, clean, corrupted, **options)


def row_shape(model: Any, sweep: str, width: int) -> tuple[int, ...]:
    """One pair's values in a table of `sweep` whose position axis is `width` long."""
    layers, heads, axis = model.cfg.n_layers, model.cfg.n_heads, SWEEPS[sweep][1]
    return {"pos": (layers, width), "head": (layers, heads), "head_pos": (layers, heads, width)}[axis]


@dataclass
class SweepTable:
    """One sweep over a dataset: values[pair, layer, ...] (NaN at positions a pair does not have), each pair's
    clean and corrupted metric, and each pair's length in tokens."""

    values: Tensor
    clean: Tensor
    corrupted: Tensor
    lengths: Tensor
    component: str
    axis: str
    direction: str

    @property
    def cells(self) -> list[int]:
        """The positions (pos, head_pos) or heads (head) of the last axis."""
        return list(range(self.values.shape[-1]))

    def mean(self) -> PatchingResult:
        """The sweep averaged over the pairs (NaN, a position a pair does not have, left out)."""
        return PatchingResult(
            self.values.nanmean(0),
            float(self.clean.mean()),
            float(self.corrupted.mean()),
            self.component,
            self.axis,
            self.cells,
            self.direction,
        )


def part_file(out_dir: Path, i: int) -> Path:
    return out_dir / "parts" / f"part-{i:05d}.safetensors"


def sweep_pairs(
    model: Any,
    pairs: Sequence[PromptPair],
    sweeps: Sequence[str],
    out_dir: str | Path,
    *,
    direction: str = "denoise",
    max_batch: int = 64,
    parts: int = PARTS,
    progress: bool = True,
    overwrite: bool = False,
) -> dict[str, SweepTable] | None:
    """Run `sweeps` over every pair into `out_dir` (see the module's docstring): in this process, or — under
    torchrun — this rank's share, every rank calling it alike. Returns the tables on rank 0, None on the others.
    overwrite: start afresh, whatever out_dir holds (rerun without it to resume)."""
    rank = rank_world()[0]
    out_dir = Path(out_dir)
    _check_sweep(pairs, sweeps, direction)
    entries = [PLAN_FILE, "parts", SWEEP_FILE, *(f"{s}.safetensors" for s in sweeps)]
    claim_folder(out_dir, "patching sweep", entries, overwrite=overwrite)
    plan = _plan(model, pairs, sweeps, direction, max_batch, len(plan_parts(len(pairs), most=parts)))
    with folder_lock(out_dir, "patching sweep") if rank == 0 else contextlib.nullcontext():
        if (out_dir / SWEEP_FILE).is_file() and not overwrite:
            if rank == 0:  # a run killed after sweep.json landed left its tidying undone (and its lock: taken over)
                _tidy(out_dir)
            raise FileExistsError(
                f"{out_dir} already holds a complete sweep ({SWEEP_FILE}); overwrite it or choose another folder"
            )
        record_plan(out_dir, plan, overwrite=overwrite, what="patching sweep")
        if overwrite and rank == 0:
            (out_dir / SWEEP_FILE).unlink(missing_ok=True)
        return _sweep_parts(model, pairs, sweeps, out_dir, plan, parts, overwrite, progress)


def _sweep_parts(
    model: Any,
    pairs: Sequence[PromptPair],
    sweeps: Sequence[str],
    out_dir: Path,
    plan: dict[str, Any],
    parts: int,
    overwrite: bool,
    progress: bool,
) -> dict[str, SweepTable] | None:
    """The parts no rank has done, this rank's share of them, then (rank 0) the gathered tables."""
    rank, direction, max_batch = rank_world()[0], plan["direction"], plan["max_batch"]
    ranges = plan_parts(len(pairs), most=parts)
    width = max(len(p.clean) for p in pairs)
    kept, mine = claim_parts(len(ranges), lambda i: not overwrite and part_file(out_dir, i).is_file())
    bar = parts_bar(sum(len(ranges[i]) for i in mine), "pair", "sweep", progress)
    for i in mine:
        tensors = _sweep_part(model, [pairs[j] for j in ranges[i]], sweeps, direction, max_batch, width, bar)
        atomic_write(
            part_file(out_dir, i), lambda path, tensors=tensors: save_file(tensors, str(path)), tensors_bytes(tensors)
        )
    bar.close()

    gathered = _gather(model, out_dir, sweeps, width, ranges, sorted(kept + mine))
    if rank != 0:
        return None
    lengths = torch.tensor([len(p.clean) for p in pairs])
    tables = {
        s: SweepTable(
            gathered[f"{s}.values"],
            gathered[f"{s}.clean"],
            gathered[f"{s}.corrupted"],
            lengths,
            SWEEPS[s][0],
            SWEEPS[s][1],
            direction,
        )
        for s in sweeps
    }
    _write_tables(out_dir, tables, plan)
    return tables


def _check_sweep(pairs: Sequence[PromptPair], sweeps: Sequence[str], direction: str) -> None:
    """ValueError for sweeps, a direction or pairs sweep_pairs does not take."""
    unknown = [s for s in sweeps if s not in SWEEPS]
    if unknown or not sweeps or len(set(sweeps)) != len(sweeps):
        raise ValueError(f"sweeps must be distinct names of {', '.join(SWEEPS)}; got {list(sweeps)}")
    if direction not in ("denoise", "noise"):
        raise ValueError(f"direction must be 'denoise' (clean into corrupted) or 'noise', got {direction!r}")
    if not pairs:
        raise ValueError("no prompt pair to sweep")


def _plan(
    model: Any, pairs: Sequence[PromptPair], sweeps: Sequence[str], direction: str, max_batch: int, n_parts: int
) -> dict[str, Any]:
    """What a sweep into a folder is of (record_plan: a resumed run must be the same), its pairs by digest."""
    digest = hashlib.sha256(
        json.dumps([[p.clean.tolist(), p.corrupted.tolist(), p.answer, p.wrong] for p in pairs]).encode()
    ).hexdigest()
    return {
        "format": SWEEP_FORMAT,
        "sweeps": list(sweeps),
        "direction": direction,
        "max_batch": max_batch,
        "n_pairs": len(pairs),
        "pairs_sha256": digest,
        "parts": n_parts,
        "model": model_summary(model),
    }


def _sweep_part(
    model: Any,
    pairs: list[PromptPair],
    sweeps: Sequence[str],
    direction: str,
    max_batch: int,
    width: int,
    bar: Any,
) -> dict[str, Tensor]:
    """One part's rows: each sweep's values (padded with NaN to `width` positions), clean and corrupted metric."""
    rows: dict[str, list[Tensor]] = {f"{s}.{t}": [] for s in sweeps for t in TENSORS}
    for pair in pairs:
        for s in sweeps:
            result = sweep_pair(model, pair, s, direction=direction, max_batch=max_batch)
            padded = torch.full(row_shape(model, s, width), float("nan"))
            padded[..., : result.values.shape[-1]] = result.values
            rows[f"{s}.values"].append(padded)
            rows[f"{s}.clean"].append(torch.tensor(result.clean))
            rows[f"{s}.corrupted"].append(torch.tensor(result.corrupted))
        bar.update(1)
    return {key: torch.stack(value) for key, value in rows.items()}


def _gather(
    model: Any, out_dir: Path, sweeps: Sequence[str], width: int, ranges: list[range], held: list[int]
) -> dict[str, Tensor]:
    """Every part's rows in pair order, on every rank, from the parts each rank holds (`held`, in out_dir)."""
    order = [i for gathered in all_gather_json(held) for i in gathered]
    if sorted(order) != list(range(len(ranges))):  # claim_parts gives every part to one rank: never seen
        raise RuntimeError(f"the ranks hold parts {sorted(order)}, not each of 0 … {len(ranges) - 1} once")
    local = [_load_part(part_file(out_dir, i), [f"{s}.{t}" for s in sweeps for t in TENSORS]) for i in held]
    shapes = {f"{s}.values": row_shape(model, s, width) for s in sweeps}
    gathered = {}
    for key in (f"{s}.{t}" for s in sweeps for t in TENSORS):
        mine_rows = torch.cat([part[key] for part in local]) if local else torch.empty((0, *shapes.get(key, ())))
        chunks = torch.split(all_gather_rows(mine_rows), [len(ranges[i]) for i in order])
        gathered[key] = torch.cat([chunks[k] for k in sorted(range(len(order)), key=order.__getitem__)])
    return gathered


def _load_part(path: Path, keys: list[str]) -> dict[str, Tensor]:
    """A part's rows, checked: a file that is not one of this sweep's parts is a ValueError naming it."""
    regular_file(path, path.parent.parent, what="sweep part")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as err:
        tensors, detail = None, str(err).splitlines()[0] if str(err) else type(err).__name__
    else:
        missing = [k for k in keys if k not in tensors]
        detail = f"no tensor {missing[0]!r}" if missing else None
    if detail is not None:
        raise ValueError(
            f"{path} is not a part of this sweep ({detail}); remove it to sweep its pairs again, or start afresh "
            "with --overwrite"
        )
    return tensors


def _write_tables(out_dir: Path, tables: dict[str, SweepTable], plan: dict[str, Any]) -> None:
    """Each sweep's safetensors file, then sweep.json (what marks the sweep complete), then the removal of what
    killed writes left half-done (`_tidy`)."""
    for s, table in tables.items():  # the tensors alone (safetensors writes metadata keys in no fixed order)
        tensors = {"values": table.values, "clean": table.clean, "corrupted": table.corrupted, "lengths": table.lengths}
        atomic_write(
            out_dir / f"{s}.safetensors",
            lambda path, tensors=tensors: save_file(tensors, str(path)),
            tensors_bytes(tensors),
        )
    manifest = {
        "format": SWEEP_FORMAT,
        "sweeps": {
            s: {"file": f"{s}.safetensors", "component": t.component, "axis": t.axis, "shape": list(t.values.shape)}
            for s, t in tables.items()
        },
        "direction": plan["direction"],
        "n_pairs": plan["n_pairs"],
        "model": plan["model"],
    }
    atomic_write_text(out_dir / SWEEP_FILE, json.dumps(manifest, indent=2) + "\n")
    _tidy(out_dir)


def _tidy(out_dir: Path) -> None:
    """Remove what killed writes left half-done: only temporaries of the files Forma's manifest lists."""
    wrote = owned(out_dir) | {OWNER_FILE}
    for path in out_dir.glob(".*"):
        if is_owned_temporary(path, wrote):
            remove_temporary(path)
    for path in (out_dir / "parts").glob(".*"):  # parts/ is Forma's (listed) and holds only its parts
        remove_temporary(path)


def load_sweep(out_dir: str | Path) -> dict[str, SweepTable]:
    """The tables of a finished sweep (out_dir/sweep.json and each sweep's safetensors file), by sweep name."""
    out_dir = Path(out_dir)
    path = out_dir / SWEEP_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{out_dir} has no {SWEEP_FILE}: not a finished patching sweep")
    manifest = read_json_object(path, out_dir, what="sweep manifest")
    if manifest.get("format") != SWEEP_FORMAT or not isinstance(manifest.get("sweeps"), dict):
        raise ValueError(f"{path} is not a {SWEEP_FORMAT} manifest")
    tables = {}
    for name, entry in manifest["sweeps"].items():
        tensors = load_file(
            str(
                regular_file(
                    out_dir / str(entry.get("file") if isinstance(entry, dict) else ""), out_dir, what="sweep table"
                )
            )
        )
        tables[name] = SweepTable(
            tensors["values"],
            tensors["clean"],
            tensors["corrupted"],
            tensors["lengths"],
            entry["component"],
            entry["axis"],
            manifest["direction"],
        )
    return tables
