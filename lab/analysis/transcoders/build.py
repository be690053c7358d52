"""Transcoders for a zoo model, end to end: windows of the model's own training world, a harvest of every layer's
MLP input and output at every position (shards on disk), training out of core, the measures (FVU, L0 and dead
features per layer on held-out windows, the replacement's loss), and each feature's top contexts — all in the
model's folder:

    models/NAME/transcoders/KIND/   config.json, transcoders.safetensors     the transcoders
                                    training.json                            the loss curve
                                    quality.json                             the measures
                                    contexts.safetensors                     top contexts: values, seq, pos, windows

`transcoder_sets(model folder)` lists what a folder holds; the dashboard's graph page reads them.
"""

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from lab.analysis.activations import save_activations
from lab.analysis.transcoders.measures import reconstruction_measures, replacement_loss, top_contexts
from lab.analysis.transcoders.model import TranscoderConfig
from lab.analysis.transcoders.train import TranscoderTraining, train_transcoders
from lab.files import atomic_write, atomic_write_text
from lab.load import load_model
from lab.zoo.recipes import load_recipe
from lab.zoo.worlds import build_world

TRANSCODERS_DIR = "transcoders"
QUALITY_FILE = "quality.json"
CONTEXTS_FILE = "contexts.safetensors"


def world_windows(folder: str | Path, n: int, length: int, split: str = "train", seed: int = 0) -> Tensor:
    """n windows of `length` tokens from the zoo model's world (its recipe's full profile), drawn with `seed`."""
    folder = Path(folder)
    recipe = json.loads((folder / "recipe.json").read_text()) if (folder / "recipe.json").is_file() else None
    spec = recipe["world"] if recipe else load_recipe(folder.name)["world"]
    config = json.loads((folder / "config.json").read_text())
    data = build_world(spec, config["n_ctx"], length)
    tokens = data.train if split == "train" else data.val
    rng = np.random.default_rng(seed)
    if tokens.ndim == 1:
        starts = rng.choice(len(tokens) - length, size=n, replace=False)
        return torch.stack([tokens[s: s + length] for s in starts.tolist()])
    rows = rng.choice(len(tokens), size=min(n, len(tokens)), replace=False)
    return tokens[torch.as_tensor(rows)][:, :length]


def build_transcoders(folder: str | Path, cfg: TranscoderConfig, training: TranscoderTraining, name: str, *,
                      n_windows: int = 256, window: int = 64, eval_windows: int = 64, work_dir: str | Path | None = None,
                      progress: bool = False) -> Path:
    """Harvest, train, measure and find top contexts; returns folder/transcoders/NAME. The harvest lives in
    `work_dir` (default: beside the result, removed once done)."""
    folder = Path(folder)
    model = load_model(folder).eval()
    out = folder / TRANSCODERS_DIR / name
    harvest = Path(work_dir) if work_dir is not None else out.with_name(f".{name}.harvest")
    windows = world_windows(folder, n_windows, window, "train", seed=training.seed)
    held_out = world_windows(folder, eval_windows, window, "val", seed=training.seed + 1)
    store = save_activations(model, windows, cfg.hooks(), harvest, positions="all", batch_size=32,
                             progress=progress, overwrite=True)
    transcoders = train_transcoders(store, cfg, training, out)
    eval_store = save_activations(model, held_out, cfg.hooks(), harvest.with_name(harvest.name + "-eval"),
                                  positions="all", batch_size=32, progress=progress, overwrite=True)
    quality = {"held_out": reconstruction_measures(transcoders, eval_store), "loss": replacement_loss(
        model, transcoders, held_out), "n_windows": n_windows, "window": window, "eval_windows": eval_windows,
        "transcoders": cfg.to_dict(), "training": training.to_dict()}
    atomic_write_text(out / QUALITY_FILE, json.dumps(quality, indent=2) + "\n")
    contexts = top_contexts(transcoders, store) | {"windows": windows}
    atomic_write(out / CONTEXTS_FILE, lambda path: save_file({k: v.contiguous() for k, v in contexts.items()},
                                                              str(path)))
    for path in (harvest, harvest.with_name(harvest.name + "-eval")):
        if work_dir is None or path != Path(work_dir):
            shutil.rmtree(path, ignore_errors=True)
    return out


def transcoder_sets(folder: str | Path) -> list[str]:
    """The names of the transcoder sets a model folder holds."""
    root = Path(folder) / TRANSCODERS_DIR
    return sorted(p.name for p in root.glob("*") if (p / "transcoders.safetensors").is_file())


def load_quality(path: str | Path) -> dict[str, Any] | None:
    path = Path(path) / QUALITY_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def load_contexts(path: str | Path) -> dict[str, Tensor] | None:
    path = Path(path) / CONTEXTS_FILE
    return load_file(str(path)) if path.is_file() else None
