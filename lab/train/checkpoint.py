"""A training checkpoint: the model folder (`lab.model.checkpoint`) plus the optimizer's moments and step counts,
torch's RNG state(s) and the run's scalars, in one folder written into a temporary sibling and renamed into place,
so that a crash leaves either the previous checkpoint or the new one, never half of one. Nothing is pickled.

    out_dir/checkpoint/model.safetensors, config.json   the model (`HookedTransformer.save`)
                       optimizer.safetensors             AdamW moments and step counts
                       rng_state.safetensors             torch's RNG state(s) as uint8 tensors
                       train_state.json                  step, losses, TrainConfig, ModelConfig
    out_dir/metrics.jsonl                                one JSON line per step
"""

import dataclasses
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from lab.distributed import rank_world
from lab.files import current_umask, record_written
from lab.model.checkpoint import CONFIG_FILE, WEIGHTS_FILE
from lab.model.transformer import HookedTransformer
from lab.outside_files import InputError, parse_json, read_json, read_text, regular_file
from lab.train.config import TrainConfig

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


@dataclass
class TrainState:
    """The scalars a resumed run picks up (weights, optimizer moments and RNG live beside it)."""

    step: int = 0  # updates done
    train_loss_nats: float | None = None  # at the last update
    best_val_loss_nats: float | None = None
    elapsed_s: float = 0.0  # wall time spent training, summed over resumptions
    tokens_seen: int = 0  # decoder tokens read by the updates (an encoder–decoder's targets, not sources)


def save_checkpoint(
    directory: str | Path,
    model: HookedTransformer,
    optimizer: torch.optim.Optimizer,
    cfg: TrainConfig,
    state: TrainState,
) -> Path:
    """Write a complete checkpoint into a temporary sibling folder, then rename it into place (`swap_in`)."""

    def write(tmp: Path) -> None:
        model.save(tmp)
        save_file(optimizer_tensors(optimizer), str(tmp / OPTIMIZER_FILE))
        save_file(_rng_tensors(), str(tmp / RNG_FILE))
        meta = {
            "format": STATE_FORMAT,
            **dataclasses.asdict(state),
            "world_size": rank_world()[1],
            "train_config": cfg.to_dict(),
            "model_config": model.cfg.to_dict(),
        }
        (tmp / STATE_FILE).write_text(json.dumps(meta, indent=2) + "\n")

    return swap_in(Path(directory), write)


def swap_in(directory: Path, write: Callable[[Path], None]) -> Path:
    """A checkpoint folder written whole or not at all: `write` fills a temporary sibling, which is then renamed
    into place. A directory cannot be renamed over a non-empty one, so the old one is moved aside first: a crash
    leaves the old checkpoint complete, at its name or (between the two renames) at `.{name}.old`, which
    `find_checkpoint` falls back to."""
    record_written(directory)  # in a run folder, listed as Forma's before its temporary is made
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.tmp-"))
    try:
        record_written(tmp)
        tmp.chmod(0o777 & ~current_umask())  # mkdtemp makes it private; the checkpoint should not be
        write(tmp)
        old = _old_path(directory)
        record_written(old)
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


def load_checkpoint(
    directory: str | Path, model: HookedTransformer, optimizer: torch.optim.Optimizer, cfg: TrainConfig
) -> TrainState:
    """Restore weights, optimizer state and RNG from a checkpoint made with the same configs."""
    directory = find_checkpoint(directory)
    missing = [name for name in CHECKPOINT_FILES if not os.path.lexists(directory / name)]
    if missing:
        raise FileNotFoundError(f"checkpoint {directory} is incomplete: missing {', '.join(missing)}")
    meta = _read_state_file(directory / STATE_FILE, cfg.steps)
    differences = []
    for what, saved, now, skip in (
        ("config", meta["train_config"], cfg.to_dict(), RESUMABLE_CHANGES),
        ("model config", meta["model_config"], model.cfg.to_dict(), ("tokenizer",)),
    ):
        changed = _differences(saved, now, skip)
        if changed:
            differences.append(f"{what} differs in {', '.join(changed)}")
    if differences:
        raise ValueError(
            f"resume: the checkpoint in {directory} was made with other settings: " + "; ".join(differences)
        )

    # Everything read and checked before anything is set: a refused checkpoint leaves the model as it was.
    weights = read_safetensors(directory / WEIGHTS_FILE)
    check_like(weights, model.state_dict(), directory / WEIGHTS_FILE)
    moments = read_safetensors(directory / OPTIMIZER_FILE)
    rng = read_safetensors(directory / RNG_FILE)
    _check_rng_tensors(rng, directory / RNG_FILE)
    model.load_weights(weights, source=str(directory / WEIGHTS_FILE))
    load_optimizer_tensors(optimizer, moments, directory / OPTIMIZER_FILE)
    _set_rng_tensors(rng)
    # Checkpoints from before tokens_seen was kept were all of fixed-length windows.
    tokens_seen = meta.get("tokens_seen", meta["step"] * cfg.batch_size * cfg.seq_len)
    return TrainState(
        step=meta["step"],
        train_loss_nats=meta["train_loss_nats"],
        best_val_loss_nats=meta["best_val_loss_nats"],
        elapsed_s=meta["elapsed_s"],
        tokens_seen=tokens_seen,
    )


def _old_path(directory: Path) -> Path:
    return directory.with_name(f".{directory.name}.old")


def remove_checkpoints(directory: Path, keep: bool = False) -> None:
    """Remove the checkpoint (unless `keep`) and what crashed saves left: their temporary folders."""
    if not keep:
        discard_tree(directory)
        discard_tree(_old_path(directory))
    for leftover in [*directory.parent.glob(f".{directory.name}.tmp-*"), *directory.parent.glob("*.tmp-discarded-*")]:
        shutil.rmtree(leftover, ignore_errors=True)


def _differences(saved: dict[str, Any], now: dict[str, Any], skip: tuple[str, ...]) -> list[str]:
    keys = [k for k in dict.fromkeys([*now, *saved]) if k not in skip]
    return [
        f"{k} (checkpoint {saved.get(k, '<absent>')!r}, now {now.get(k, '<absent>')!r})"
        for k in keys
        if saved.get(k, "<absent>") != now.get(k, "<absent>")
    ]


def _read_state_file(path: Path, steps: int) -> dict[str, Any]:
    """train_state.json (through lab.outside_files: a regular file inside its folder, bounded, nested at most so deep),
    each field of its type and range: a step of the run's 0 … `steps`, finite losses (or none), configs as
    objects. The losses and time come back as floats."""
    meta = read_json(path, path.parent, what="checkpoint state")
    need = {"format", "step", "train_loss_nats", "best_val_loss_nats", "elapsed_s", "train_config", "model_config"}
    if not isinstance(meta, dict) or need - set(meta):
        missing = sorted(need - set(meta)) if isinstance(meta, dict) else sorted(need)
        raise InputError(f"malformed checkpoint state {path}: missing {missing}")
    if meta["format"] != STATE_FORMAT:
        raise InputError(f"checkpoint state {path} has format {meta['format']!r}; this Forma reads {STATE_FORMAT!r}")

    def number(value: Any, low: float = -math.inf) -> bool:
        return type(value) in (int, float) and math.isfinite(value) and value >= low

    problems = [
        f"step {meta['step']!r} is not one of the run's 0 … {steps} steps"
        if type(meta["step"]) is not int or not 0 <= meta["step"] <= steps
        else None,
        *(
            f"{key} {meta[key]!r} is not a finite number"
            for key in ("train_loss_nats", "best_val_loss_nats")
            if meta[key] is not None and not number(meta[key])
        ),
        f"elapsed_s {meta['elapsed_s']!r} is not a number ≥ 0" if not number(meta["elapsed_s"], 0) else None,
        "tokens_seen is not a whole number ≥ 0"
        if "tokens_seen" in meta and (type(meta["tokens_seen"]) is not int or meta["tokens_seen"] < 0)
        else None,
        *(f"{key} is not an object" for key in ("train_config", "model_config") if not isinstance(meta[key], dict)),
    ]
    problems = [p for p in problems if p]
    if problems:
        raise InputError(f"malformed checkpoint state {path}: {'; '.join(problems)}")
    for key in ("train_loss_nats", "best_val_loss_nats", "elapsed_s"):
        meta[key] = None if meta[key] is None else float(meta[key])
    return meta


def read_safetensors(path: Path) -> dict[str, Tensor]:
    """A checkpoint's safetensors file (a regular file inside its folder), every floating-point tensor finite."""
    regular_file(path, path.parent, what="checkpoint file")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise InputError(f"malformed or truncated checkpoint file {path}: {err}") from err
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise InputError(f"checkpoint file {path}: {name} holds values that are not finite (NaN or infinite)")
    return tensors


def check_like(tensors: dict[str, Tensor], reference: dict[str, Tensor], path: Path) -> None:
    """InputError naming `path` for a tensor of `reference`'s names whose dtype differs (its names and shapes
    are the loader's to check)."""
    for name, tensor in tensors.items():
        if name in reference and tensor.dtype != reference[name].dtype:
            raise InputError(f"{path}: {name} is {tensor.dtype}, the model's is {reference[name].dtype}")


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> dict[str, Tensor]:
    """AdamW's per-parameter state flattened to '{param index}.{name}' → tensor (step is a tensor too)."""
    out = {}
    for index, slots in optimizer.state_dict()["state"].items():
        for name, value in slots.items():
            if not isinstance(value, Tensor):
                raise TypeError(f"optimizer state {index}.{name} is a {type(value).__name__}, not a tensor")
            out[f"{index}.{name}"] = value.detach().cpu().contiguous()
    return out


def load_optimizer_tensors(optimizer: torch.optim.Optimizer, tensors: dict[str, Tensor], path: Path) -> None:
    """Adam(W)'s state from '{param index}.{exp_avg, exp_avg_sq, step}' tensors: moments of their parameter's
    shape and dtype, a step a scalar ≥ 0, each parameter's three together; an InputError naming `path` else."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state: dict[int, dict[str, Tensor]] = {}
    for key, value in tensors.items():
        index, _, name = key.partition(".")
        if not index.isdigit() or int(index) >= len(params) or name not in ("exp_avg", "exp_avg_sq", "step"):
            raise InputError(f"{path}: unexpected entry {key!r} for an optimizer over {len(params)} tensors")
        param = params[int(index)]
        if name == "step" and (value.shape != () or not value.is_floating_point() or value < 0):
            raise InputError(f"{path}: {key} is not a step count (a scalar ≥ 0)")
        if name != "step" and (value.shape != param.shape or value.dtype != param.dtype):
            raise InputError(
                f"{path}: {key} is {value.dtype} {tuple(value.shape)}, the parameter {param.dtype} {tuple(param.shape)}"
            )
        state.setdefault(int(index), {})[name] = value
    incomplete = [i for i, slots in state.items() if len(slots) != 3]
    if incomplete:
        raise InputError(f"{path}: parameter {incomplete[0]}'s state lacks a moment or its step")
    # The parameter groups (lr, betas, decay) follow from the TrainConfig, already checked equal.
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})


def _rng_tensors() -> dict[str, Tensor]:
    out = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["torch_cuda"] = torch.cuda.get_rng_state()
    return out


def _check_rng_tensors(tensors: dict[str, Tensor], path: Path) -> None:
    """torch's CPU RNG state as torch writes it: uint8, of its length (a CUDA state is used where there is CUDA)."""
    want = torch.get_rng_state()
    got = tensors.get("torch_cpu")
    if got is None or got.dtype != torch.uint8 or got.shape != want.shape:
        raise InputError(f"{path}: no 'torch_cpu' RNG state of {want.numel()} bytes (uint8)")
    cuda = tensors.get("torch_cuda")
    if cuda is not None and (cuda.dtype != torch.uint8 or cuda.dim() != 1):
        raise InputError(f"{path}: its 'torch_cuda' RNG state is not a row of bytes (uint8)")


def _set_rng_tensors(tensors: dict[str, Tensor]) -> None:
    torch.set_rng_state(tensors["torch_cpu"])
    if "torch_cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["torch_cuda"])


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl records; a torn last line (a crash mid-append) is dropped, any other bad line is an error."""
    if not path.is_file():
        return []
    lines = read_text(path, path.parent).splitlines()  # through lab.outside_files: a regular file inside its folder
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(parse_json(line, f"{path}, line {number}"))
        except InputError as err:
            if number == len(lines):
                break
            raise InputError(f"malformed metrics line: {err}") from err
    return records
