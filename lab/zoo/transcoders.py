"""Transcoders for a zoo model, end to end: windows of the model's own training world (a pretrained model's: of
the corpus `forma corpus real` wrote), a harvest of every layer's MLP input and output at every position (shards on
disk), training out of core, the measures (FVU, L0 and dead
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
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from lab.analysis.activations.harvest import harvest
from lab.analysis.activations.store import INDEX_FILE, ActivationStore
from lab.analysis.transcoders.measures import reconstruction_measures, replacement_loss, top_contexts
from lab.analysis.transcoders.model import (
    CONFIG_FILE,
    SOURCE_FILE,
    WEIGHTS_FILE,
    TranscoderConfig,
    Transcoders,
    model_fingerprint,
)
from lab.analysis.transcoders.stream import ActivationStream, WindowActivations
from lab.analysis.transcoders.train import (
    CHECKPOINT_DIR,
    TRAINING_FILE,
    TranscoderTraining,
    has_checkpoint,
    train_transcoders,
)
from lab.data.real_corpus import read_split
from lab.distributed import barrier, rank_world
from lab.files import atomic_write, atomic_write_text, is_owned_temporary, remove_temporary
from lab.hf.folder import read_hf_config
from lab.load import load_model
from lab.outside_files import read_json_object, regular_file
from lab.zoo.recipes import load_recipe
from lab.zoo.worlds import build_world

# The kinds `forma transcoders` trains: (activation, k, cross-layer, sparsity λ). The λ are set for inputs of unit
# scale per coordinate (ln2.hook_normalized) and the per-layer FVU loss; top-k needs none.
PRESETS = {
    "topk": ("topk", 16, False, 0.0),
    "relu": ("relu", 0, False, 1.2e-2),
    "jumprelu": ("jumprelu", 0, False, 1e-3),
    "clt": ("relu", 0, True, 1.2e-2),
}
TRANSCODERS_DIR = "transcoders"
DISK_BUDGET = 20e9  # bytes the harvests may take on disk (`forma transcoders --disk-budget`, in GB); past it, streamed
QUALITY_FILE = "quality.json"
CONTEXTS_FILE = "contexts.safetensors"
GRAPHS_REPORT = "known_graphs.json"  # `forma graphs NAME`'s report (lab.zoo.graphs)
# what a set's folder holds
SET_FILES = {CONFIG_FILE, WEIGHTS_FILE, SOURCE_FILE, TRAINING_FILE, QUALITY_FILE, CONTEXTS_FILE, GRAPHS_REPORT}


def preset(
    kind: str,
    folder: str | Path,
    d_features: int = 1024,
    steps: int = 1500,
    checkpoint_interval: int = 100,
    layers: list[int] | None = None,
) -> tuple[TranscoderConfig, TranscoderTraining]:
    """The config and training of preset `kind` for the model in `folder`: for every layer, or for `layers` alone
    (a subset, the quick profile; every layer named is every layer)."""
    if kind not in PRESETS:
        raise ValueError(f"unknown transcoder kind {kind!r}; kinds: {', '.join(PRESETS)}")
    activation, k, cross_layer, sparsity = PRESETS[kind]
    model = model_shape(folder)
    chosen = None if layers is None else sorted(set(layers))
    if chosen is not None and not 0 <= chosen[0] <= chosen[-1] < model["n_layers"]:
        raise ValueError(f"--layers: the model has layers 0 … {model['n_layers'] - 1}, not {chosen[-1]}")
    if chosen == list(range(model["n_layers"])):
        chosen = None
    cfg = TranscoderConfig(
        d_model=model["d_model"],
        n_layers=model["n_layers"] if chosen is None else len(chosen),
        d_features=d_features,
        activation=activation,
        k=k,
        cross_layer=cross_layer,
        threshold=0.05,
        layers=None if chosen is None else tuple(chosen),
    )
    return cfg, TranscoderTraining(
        steps=steps, batch_size=512, lr=2e-3, sparsity=sparsity, checkpoint_interval=checkpoint_interval
    )


def model_shape(folder: str | Path) -> dict[str, int]:
    """d_model and n_layers of the model in `folder`, from its config.json alone: a Forma folder's, or a Hugging Face
    folder's (a pretrained zoo model's: read by transformers, which names those fields for every architecture)."""
    config = read_json_object(Path(folder) / "config.json", folder, what="model config")
    if "d_model" in config and "n_layers" in config:
        return {"d_model": config["d_model"], "n_layers": config["n_layers"]}
    hf = read_hf_config(Path(folder))
    return {"d_model": int(hf.hidden_size), "n_layers": int(hf.num_hidden_layers)}


def world_tokens(folder: str | Path, length: int, split: str = "train") -> tuple[Tensor, int]:
    """The tokens of the zoo model's world as it was trained (its recipe.json, else the recipe's full profile), of
    `split`, and the window length it allows (`length`, at most the model's n_ctx)."""
    folder = Path(folder)
    recipe = read_json_object(folder / "recipe.json", folder) if (folder / "recipe.json").is_file() else None
    spec = recipe["world"] if recipe else load_recipe(folder.name)["world"]
    config = read_json_object(folder / "config.json", folder, what="model config")
    length = min(length, config["n_ctx"])  # a world of short documents (facts) has windows as long as the model reads
    data = build_world(spec, config["n_ctx"], length)
    return (data.train if split == "train" else data.val), length


def world_windows(folder: str | Path, n: int, length: int, split: str = "train", seed: int = 0) -> Tensor:
    """n windows of `length` tokens (at most the model's n_ctx) from the zoo model's world as it was trained (its
    recipe.json, else the recipe's full profile), drawn with `seed`."""
    tokens, length = world_tokens(folder, length, split)
    rng = np.random.default_rng(seed)
    if tokens.ndim == 1:
        starts = rng.choice(len(tokens) - length, size=n, replace=False)
        return torch.stack([tokens[s : s + length] for s in starts.tolist()])
    rows = rng.choice(len(tokens), size=min(n, len(tokens)), replace=False)
    return tokens[torch.as_tensor(rows)][:, :length]


def corpus_windows(corpus: str | Path, n: int, length: int, split: str = "train", seed: int = 0) -> Tensor:
    """n windows of `length` tokens of a corpus `forma corpus real` wrote (train: train.npy; val: held_out.npy, whose
    documents the training never sees), at starts drawn without replacement with `seed`; a window may cross a
    document's end (<|endoftext|>), as in the model's pretraining."""
    stream = read_split(corpus, "train" if split == "train" else "held_out")
    starts = len(stream) - length + 1
    if starts < n:
        raise ValueError(
            f"{corpus}'s {split} split holds {len(stream):,} tokens: too few for {n} windows of {length} tokens"
        )
    chosen = np.sort(np.random.default_rng(seed).choice(starts, size=n, replace=False))
    return torch.from_numpy(np.stack([stream[s : s + length] for s in chosen.tolist()]).astype(np.int64))


def model_windows(
    folder: str | Path, n: int, length: int, split: str = "train", seed: int = 0, corpus: str | Path | None = None
) -> Tensor:
    """The windows transcoders for the model in `folder` read: of the corpus when one is given (a pretrained
    model's: `corpus_windows`), else of the zoo model's own world (`world_windows`)."""
    if corpus is not None:
        return corpus_windows(corpus, n, length, split, seed)
    return world_windows(folder, n, length, split, seed)


def window_tokens(
    folder: str | Path, length: int, split: str = "train", corpus: str | Path | None = None
) -> tuple[Any, str]:
    """What windows of `split` are drawn from, and its name: the corpus's split (one stream), else the zoo model's
    world's tokens (`world_tokens`)."""
    if corpus is not None:
        part = "train" if split == "train" else "held_out"
        return read_split(corpus, part), f"{Path(corpus).name}/{part}.npy"
    return world_tokens(folder, length, split)[0], f"the world of {Path(folder).name}'s recipe ({split})"


def harvest_windows(
    folder: str | Path,
    hooks: list[str],
    directory: str | Path,
    *,
    n_windows: int = 256,
    window: int = 64,
    split: str = "train",
    seed: int = 0,
    corpus: str | Path | None = None,
    model: Any = None,
    progress: bool = False,
) -> tuple[ActivationStore, Tensor]:
    """A harvest of `hooks` at every position of n windows (`model_windows`: of the corpus, else of the model's
    world), and the windows: in one process, or each rank of a torch.distributed group its share (`harvest`), every
    rank calling it alike and getting the whole set. A harvest cut short is resumed; a complete one is kept. model:
    the folder's, loaded already (else loaded here)."""
    windows = model_windows(folder, n_windows, window, split, seed=seed, corpus=corpus)
    directory = Path(directory)
    if not (directory / INDEX_FILE).is_file():
        model = load_model(folder) if model is None else model
        harvest(model.eval(), windows, hooks, directory, batch_size=32, progress=progress)
    barrier()  # rank 0 has written the index
    store = ActivationStore(directory)
    if len(store) != windows.numel():
        raise ValueError(
            f"{directory} holds a harvest of {len(store):,} rows, not of these {len(windows):,} windows "
            f"of {windows.shape[1]} tokens (an earlier run's, with other arguments); run that again to "
            "finish it, or start afresh (overwrite)"
        )
    return store, windows


def build_transcoders(
    folder: str | Path,
    cfg: TranscoderConfig,
    training: TranscoderTraining,
    name: str,
    *,
    train: tuple[ActivationStore, Tensor] | None = None,
    held_out: tuple[ActivationStore, Tensor] | None = None,
    n_windows: int = 256,
    window: int = 64,
    eval_windows: int = 64,
    corpus: str | Path | None = None,
    disk_budget: float = DISK_BUDGET,
    parallel: str = "data",
    overwrite: bool = False,
    progress: bool = False,
) -> Path | None:
    """Train on a harvest of training windows (`train`, or one made here), measure on held-out windows (`held_out`,
    or made here), find top contexts; the windows are the corpus's (a pretrained model's: train.npy and
    held_out.npy of `forma corpus real`), else the zoo model's own world's; returns folder/transcoders/NAME.
    Harvests made here are removed once done; harvests passed in are kept, so that several transcoders can share
    them. Where the harvests to make would not fit `disk_budget` bytes (`plan_route`), none is made: the training
    rows stream from the model (each batch from windows drawn for it, `ActivationStream`), the measures and top
    contexts run the model on the held-out windows; progress says which and why, quality.json records it.

    Under torchrun every rank calls it alike: the harvests made here are shared out over the ranks, the training
    is `train_transcoders(..., parallel=parallel)`, and rank 0 alone measures and writes (the other ranks return
    None). Cut short (any rank, any way), the same call again resumes the harvests and the training from its last
    checkpoint; overwrite: start afresh instead."""
    folder = Path(folder)
    rank, _ = rank_world()
    out = folder / TRANSCODERS_DIR / name
    harvests = {"train": out.with_name(f".{name}.harvest"), "held_out": out.with_name(f".{name}.held-out")}
    if rank == 0:
        remove_leftovers(out)
    if overwrite:
        _start_afresh([*harvests.values(), out / CHECKPOINT_DIR], rank)
    model = load_model(folder).eval()
    length = min(window, int(model.cfg.n_ctx))
    rows = (n_windows if train is None else 0) + (eval_windows if held_out is None else 0)
    route = plan_route(cfg, rows * length, _value_bytes(model), disk_budget)
    if rows:
        _stage(progress, rank, route["why"])
    windows = _Windows(n_windows, length, eval_windows, corpus)
    if route["route"] == "stream":
        source, held_out, made = _streams(folder, model, cfg, training, windows)
    else:
        source, held_out, made = _harvests(folder, model, cfg, training, windows, harvests, train, held_out, progress)
    transcoders = train_transcoders(
        source[0],
        cfg,
        training,
        out,
        resume=not overwrite and has_checkpoint(out),
        parallel=parallel,
        progress=progress,
        fingerprint=model_fingerprint(model),
    )
    if rank != 0:
        return None
    _stage(progress, rank, "measuring them on the held-out windows")
    contexts = {"contexts_from": "held_out" if route["route"] == "stream" else "train"}
    quality = _quality(model, transcoders, source[0], held_out, cfg, training) | {"route": route} | contexts
    atomic_write_text(out / QUALITY_FILE, json.dumps(quality, indent=2) + "\n")
    _stage(progress, rank, "each feature's top contexts")
    _write_contexts(out, transcoders, *(held_out if route["route"] == "stream" else source))
    for path in made:
        shutil.rmtree(path, ignore_errors=True)
    return out


def plan_route(cfg: TranscoderConfig, rows: int, value_bytes: int, disk_budget: float) -> dict[str, Any]:
    """Whether harvests of `rows` rows of every hook of `cfg` (rows × hooks × d_model × value_bytes) fit
    `disk_budget` bytes: route "harvest" (to disk, read back while training) or "stream" (from the model into
    training, nothing on disk), with the sentence saying why."""
    hooks = len(cfg.hooks())
    need = rows * hooks * cfg.d_model * value_bytes
    size = f"{need / 1e9:.3g} GB ({rows:,} rows × {hooks} hooks × d_model {cfg.d_model} × {value_bytes} bytes)"
    budget = f"the disk budget of {disk_budget / 1e9:.3g} GB"
    fits = need <= disk_budget
    why = (
        f"the harvests take {size}, within {budget}: harvesting to disk, then training from it"
        if fits
        else f"the harvests would take {size}, past {budget}: streaming the activations from the model into "
        "training (no harvest on disk)"
    )
    return {
        "route": "harvest" if fits else "stream",
        "harvest_bytes": need,
        "disk_budget_bytes": disk_budget,
        "why": why,
    }


def _value_bytes(model: Any) -> int:
    """The bytes of one harvested value: the model's own dtype (a harvest keeps the activations as computed)."""
    return next(model.parameters()).dtype.itemsize


@dataclass(frozen=True)
class _Windows:
    """The windows a set is built from: n_windows of `window` tokens to train on (the training split's, seeded by the
    training's seed) and eval_windows to measure on (the held-out split's, seed + 1); the corpus's, else (corpus
    None) the zoo model's own world's."""

    n_windows: int
    window: int
    eval_windows: int
    corpus: str | Path | None


def _harvests(
    folder: Path,
    model: Any,
    cfg: TranscoderConfig,
    training: TranscoderTraining,
    windows: _Windows,
    harvests: dict[str, Path],
    train: tuple[ActivationStore, Tensor] | None,
    held_out: tuple[ActivationStore, Tensor] | None,
    progress: bool,
) -> tuple[tuple[ActivationStore, Tensor], tuple[ActivationStore, Tensor], list[Path]]:
    """The harvests to train on and to measure on (those passed in, else made here, resumed where an earlier call
    was cut short), and the folders of those made here."""
    rank, _ = rank_world()
    made = []
    source = "the corpus's windows" if windows.corpus is not None else "the world's windows"
    _stage(progress, rank, f"{source}, then a harvest of every layer's MLP input and output")
    common = {"window": windows.window, "corpus": windows.corpus, "model": model, "progress": progress}
    if train is None:
        made.append(harvests["train"])
        train = harvest_windows(
            folder, cfg.hooks(), made[-1], n_windows=windows.n_windows, seed=training.seed, **common
        )
    if held_out is None:
        made.append(harvests["held_out"])
        held_out = harvest_windows(
            folder,
            cfg.hooks(),
            made[-1],
            n_windows=windows.eval_windows,
            split="val",
            seed=training.seed + 1,
            **common,
        )
    return train, held_out, made


def _streams(
    folder: Path, model: Any, cfg: TranscoderConfig, training: TranscoderTraining, windows: _Windows
) -> tuple[tuple[ActivationStream, None], tuple[WindowActivations, Tensor], list[Path]]:
    """The training rows streamed from the model over the training split (or world), and the held-out windows run
    through the model as the measures read them; no folder made."""
    tokens, describe = window_tokens(folder, windows.window, "train", windows.corpus)
    stream = ActivationStream(model, tokens, windows.window, describe)
    held = model_windows(folder, windows.eval_windows, windows.window, "val", training.seed + 1, windows.corpus)
    return (stream, None), (WindowActivations(model, held, cfg), held), []


def _stage(progress: bool, rank: int, what: str) -> None:
    """A line on stderr as a stage no bar counts begins (rank 0, with progress): the command is never silent."""
    if progress and rank == 0:
        print(f"transcoders: {what} …", file=sys.stderr, flush=True)


def remove_leftovers(out: Path) -> None:
    """Remove what writes killed half-way left in a transcoder set's folder: atomic_write's temporaries of the files
    the set is made of (by their names, .<file>.<random>.tmp), never anything else."""
    if out.is_dir():
        for path in out.glob(".*"):
            if is_owned_temporary(path, SET_FILES):
                remove_temporary(path)


def _start_afresh(paths: list[Path], rank: int) -> None:
    """Remove what an earlier call left (rank 0 does, every rank waits for it)."""
    if rank == 0:
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)
    barrier()


def _quality(
    model: Any,
    transcoders: Any,
    store: ActivationStore | ActivationStream,
    held_out: tuple[ActivationStore | WindowActivations, Tensor],
    cfg: TranscoderConfig,
    training: TranscoderTraining,
) -> dict[str, Any]:
    """What quality.json records: the layers, the reconstruction on the held-out harvest, the replacement model's
    loss on its windows (every trained layer's MLP replaced), the rows trained on (a harvest's, else the rows
    streamed: steps × batch size) and measured on, and the configs."""
    return {
        "layers": cfg.model_layers(),  # the model's layer of each entry of held_out's lists
        "held_out": reconstruction_measures(transcoders, held_out[0]),
        # replaced (and zero-ablated, the baseline): the MLPs of `layers`, the others kept
        "loss": replacement_loss(model, transcoders, held_out[1]) | {"replaced_layers": cfg.model_layers()},
        "train_rows": len(store) if isinstance(store, ActivationStore) else training.steps * training.batch_size,
        "held_out_rows": len(held_out[0]),
        "transcoders": cfg.to_dict(),
        "training": training.to_dict(),
    }


def _write_contexts(out: Path, transcoders: Any, store: ActivationStore | WindowActivations, windows: Tensor) -> None:
    """contexts.safetensors: each feature's top contexts in the training harvest (streamed: in the held-out windows),
    beside its windows' tokens."""
    contexts = top_contexts(transcoders, store) | {"windows": windows}
    atomic_write(
        out / CONTEXTS_FILE, lambda path: save_file({k: v.contiguous() for k, v in contexts.items()}, str(path))
    )


def transcoder_sets(folder: str | Path, graphs: bool = False) -> list[str]:
    """The names of the transcoder sets a model folder holds; graphs: only those an attribution graph can use, a
    transcoder for every layer (not a --layers subset's)."""
    root = Path(folder) / TRANSCODERS_DIR
    names = sorted(p.name for p in root.glob("*") if (p / "transcoders.safetensors").is_file())
    return [name for name in names if not graphs or _every_layer(root / name)]


def open_set(folder: str | Path, kind: str, every_layer: bool = False) -> tuple[Any, Any]:
    """(model, transcoders): the zoo model in `folder` and its transcoder set `kind`, checked to be built from this
    model (Transcoders.load); every_layer: refused, in one line, unless it has a transcoder for every layer (what an
    attribution graph needs)."""
    folder = Path(folder)
    path = folder / TRANSCODERS_DIR / kind
    if kind not in transcoder_sets(folder):
        have = ", ".join(transcoder_sets(folder)) or "none"
        raise ValueError(
            f"{folder.name} has no transcoder set {kind!r} (it has: {have}): run `forma transcoders {folder.name} "
            f"--kind {kind}` first"
        )
    if every_layer and not _every_layer(path):
        raise ValueError(
            f"{path} holds transcoders for some layers only (--layers): attribution graphs need every layer; "
            f"run `forma transcoders {folder.name} --kind {kind}` without --layers"
        )
    model = load_model(folder).eval()
    return model, Transcoders.load(path, model).eval()


def _every_layer(path: Path) -> bool:
    """Whether the set at `path` has a transcoder for every layer of its model (its config names no subset; an
    unreadable config counts as one: loading it names the problem)."""
    try:
        config = read_json_object(path / CONFIG_FILE, path, what="transcoder config")
    except (ValueError, OSError):
        return True
    return config.get("layers") is None


def load_quality(path: str | Path) -> dict[str, Any] | None:
    path = Path(path) / QUALITY_FILE
    return read_json_object(path, path.parent) if path.is_file() else None


def load_contexts(path: str | Path) -> dict[str, Tensor] | None:
    path = Path(path) / CONTEXTS_FILE
    return load_file(str(regular_file(path, path.parent))) if path.is_file() else None
