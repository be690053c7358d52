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

from lab.analysis.activations import ActivationStore, save_activations
from lab.analysis.transcoders.measures import reconstruction_measures, replacement_loss, top_contexts
from lab.analysis.transcoders.model import TranscoderConfig
from lab.analysis.transcoders.train import TranscoderTraining, train_transcoders
from lab.files import atomic_write, atomic_write_text
from lab.load import load_model
from lab.zoo.recipes import load_recipe
from lab.zoo.worlds import build_world

# The kinds `forma transcoders` trains: (activation, k, cross-layer, sparsity λ). The λ are set for inputs of unit
# scale per coordinate (ln2.hook_normalized) and the per-layer FVU loss; top-k needs none.
PRESETS = {"topk": ("topk", 16, False, 0.0), "relu": ("relu", 0, False, 1.2e-2),
           "jumprelu": ("jumprelu", 0, False, 1e-3), "clt": ("relu", 0, True, 1.2e-2)}
TRANSCODERS_DIR = "transcoders"
QUALITY_FILE = "quality.json"
CONTEXTS_FILE = "contexts.safetensors"


def preset(kind: str, folder: str | Path, d_features: int = 1024, steps: int = 1500
           ) -> tuple[TranscoderConfig, TranscoderTraining]:
    """The config and training of preset `kind` for the model in `folder`."""
    if kind not in PRESETS:
        raise ValueError(f"unknown transcoder kind {kind!r}; kinds: {', '.join(PRESETS)}")
    activation, k, cross_layer, sparsity = PRESETS[kind]
    model = json.loads((Path(folder) / "config.json").read_text())
    cfg = TranscoderConfig(d_model=model["d_model"], n_layers=model["n_layers"], d_features=d_features,
                           activation=activation, k=k, cross_layer=cross_layer, threshold=0.05)
    return cfg, TranscoderTraining(steps=steps, batch_size=512, lr=2e-3, sparsity=sparsity)


def world_windows(folder: str | Path, n: int, length: int, split: str = "train", seed: int = 0) -> Tensor:
    """n windows of `length` tokens (at most the model's n_ctx) from the zoo model's world as it was trained (its
    recipe.json, else the recipe's full profile), drawn with `seed`."""
    folder = Path(folder)
    recipe = json.loads((folder / "recipe.json").read_text()) if (folder / "recipe.json").is_file() else None
    spec = recipe["world"] if recipe else load_recipe(folder.name)["world"]
    config = json.loads((folder / "config.json").read_text())
    length = min(length, config["n_ctx"])  # a world of short documents (facts) has windows as long as the model reads
    data = build_world(spec, config["n_ctx"], length)
    tokens = data.train if split == "train" else data.val
    rng = np.random.default_rng(seed)
    if tokens.ndim == 1:
        starts = rng.choice(len(tokens) - length, size=n, replace=False)
        return torch.stack([tokens[s: s + length] for s in starts.tolist()])
    rows = rng.choice(len(tokens), size=min(n, len(tokens)), replace=False)
    return tokens[torch.as_tensor(rows)][:, :length]


def harvest_windows(folder: str | Path, hooks: list[str], directory: str | Path, *, n_windows: int = 256,
                    window: int = 64, split: str = "train", seed: int = 0,
                    progress: bool = False) -> tuple[ActivationStore, Tensor]:
    """A harvest of `hooks` at every position of n windows of the model's world, and the windows."""
    windows = world_windows(folder, n_windows, window, split, seed=seed)
    store = save_activations(load_model(folder).eval(), windows, hooks, directory, positions="all", batch_size=32,
                             progress=progress, overwrite=True)
    return store, windows


def build_transcoders(folder: str | Path, cfg: TranscoderConfig, training: TranscoderTraining, name: str, *,
                      train: tuple[ActivationStore, Tensor] | None = None,
                      held_out: tuple[ActivationStore, Tensor] | None = None, n_windows: int = 256, window: int = 64,
                      eval_windows: int = 64, progress: bool = False) -> Path:
    """Train on a harvest of the world's training windows (`train`, or one made here), measure on held-out windows
    (`held_out`, or made here), find top contexts; returns folder/transcoders/NAME. Harvests made here are removed
    once done; harvests passed in are kept, so that several transcoders can share them."""
    folder = Path(folder)
    model = load_model(folder).eval()
    out = folder / TRANSCODERS_DIR / name
    made = []
    if train is None:
        made.append(out.with_name(f".{name}.harvest"))
        train = harvest_windows(folder, cfg.hooks(), made[-1], n_windows=n_windows, window=window,
                                seed=training.seed, progress=progress)
    if held_out is None:
        made.append(out.with_name(f".{name}.held-out"))
        held_out = harvest_windows(folder, cfg.hooks(), made[-1], n_windows=eval_windows, window=window, split="val",
                                   seed=training.seed + 1, progress=progress)
    store, windows = train
    transcoders = train_transcoders(store, cfg, training, out)
    quality = {"held_out": reconstruction_measures(transcoders, held_out[0]),
               "loss": replacement_loss(model, transcoders, held_out[1]), "train_rows": len(store),
               "held_out_rows": len(held_out[0]), "transcoders": cfg.to_dict(), "training": training.to_dict()}
    atomic_write_text(out / QUALITY_FILE, json.dumps(quality, indent=2) + "\n")
    contexts = top_contexts(transcoders, store) | {"windows": windows}
    atomic_write(out / CONTEXTS_FILE, lambda path: save_file({k: v.contiguous() for k, v in contexts.items()},
                                                              str(path)))
    for path in made:
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
