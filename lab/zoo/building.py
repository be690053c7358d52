"""Building a zoo model: `build(name)` reads its recipe, trains into a new build folder beside the published
model (from the build's checkpoint when resuming), writes the model, world.json and card.json there, and
publishes it with one rename (lab.zoo.builds). `MODEL_KINDS` makes the model and its batches for each
[model] kind."""

import time
from pathlib import Path
from typing import Any

from lab.data.dates import TranslationData
from lab.folders import PRETRAINED, RECIPE_FILE, check_zoo_name, recipe_kind, zoo_dir
from lab.model.config import ModelConfig
from lab.model.encoder_decoder import EncoderDecoder, EncoderDecoderConfig
from lab.model.transformer import HookedTransformer
from lab.runs import provenance, write_json
from lab.train.batches import PairBatches, SequenceBatches, TokenStream
from lab.train.checkpoint import has_checkpoint
from lab.train.config import TrainConfig
from lab.train.loop import train
from lab.zoo.builds import BUILD_FORMAT, only_build, publish_build, published_build, resume_build, start_build
from lab.zoo.cards import machine_state, measured_card
from lab.zoo.imports import import_model
from lab.zoo.recipes import load_recipe
from lab.zoo.worlds import WorldData, build_world


def build(
    name: str,
    quick: bool = False,
    progress: bool = True,
    out: Path | None = None,
    resume: bool = False,
    dtype: str = "float32",
) -> Path:
    """Train a zoo model from its recipe and publish it in models/<name>/ (or `out`); see "Builds" in lab.zoo. A
    pretrained one ([source] recipe) is made from its file instead (`lab.zoo.imports.import_model`, in `dtype`).

    A fresh build discards an interrupted one; `resume=True` continues the interrupted build from its
    last checkpoint (a clear error when there is none, or when the recipe changed since it began)."""
    if recipe_kind(check_zoo_name(name)) == PRETRAINED:  # made from a file, not trained: nothing to resume
        return import_model(name, dtype=dtype, out=out, progress=progress)
    recipe = load_recipe(name, quick=quick)
    directory = Path(out) if out is not None else zoo_dir() / name
    record = {
        "format": BUILD_FORMAT,
        "name": name,
        "quick": quick,
        **{table: recipe[table] for table in ("world", "model", "train")},
    }
    with only_build(directory, name):
        staging = resume_build(directory, record) if resume else start_build(directory, record)
        if staging != published_build(directory):  # else it was complete, and only its tidying was cut short
            _train_into(staging, name, recipe, quick, progress)
        publish_build(directory, staging)
    return directory


def _train_into(staging: Path, name: str, recipe: dict[str, Any], quick: bool, progress: bool) -> None:
    """Build the world, train (from the build's checkpoint, if it has one) and write the model, world.json
    and card.json into the build folder `staging`."""
    path = check_zoo_name(name) / RECIPE_FILE
    start = time.perf_counter()
    model_table = dict(recipe["model"])
    kind = model_table.pop("kind", "decoder_only")
    n_ctx = model_table["n_ctx"]
    train_cfg = TrainConfig.from_dict({"seq_len": n_ctx} | recipe["train"])  # sequences fill the context by default
    try:
        data = build_world(recipe["world"], n_ctx, train_cfg.seq_len)
    except ValueError as err:
        raise ValueError(f"recipe {path}: [world] {err}") from err
    model, batches = MODEL_KINDS[kind](name, model_table, data, train_cfg.seed)
    world_s = time.perf_counter() - start
    result = train(
        model,
        train_cfg,
        batches,
        out_dir=staging / "train",
        progress=progress,
        resume=has_checkpoint(staging / "train" / "checkpoint"),
    )
    model.eval().save(staging)
    write_json(staging / "world.json", data.world)
    card: dict[str, Any] = {
        "name": name,
        "quick": quick,
        "n_params": sum(p.numel() for p in model.parameters()),
        "world_build_s": world_s,
        "train_s": result.elapsed_s,
        "steps": result.step,
        "final_train_loss_nats": result.train_loss_nats,
        "best_val_loss_nats": result.best_val_loss_nats,
        "best_val_loss_note": "training's own estimate: the best mean loss over eval_batches random held-out batches",
        "world": data.world,
        **measured_card(model, data, recipe["world"], result.history),
        "provenance": provenance(train_cfg.seed, **machine_state()),
    }
    if "held_out" in data.world:
        card["held_out"] = data.world["held_out"]
    write_json(staging / "card.json", card)


def _decoder_only(name: str, table: dict[str, Any], data: Any, seed: int) -> tuple[Any, Any]:
    """A HookedTransformer for a sequence world, and its batches (windows of a stream, or whole documents)."""
    if not isinstance(data, WorldData):
        raise ValueError(
            f"recipe {name}: a {data.world['kind']!r} world gives (source, target) pairs; "
            'it needs [model] kind = "encoder_decoder"'
        )
    cfg = ModelConfig.from_dict(table | {"d_vocab": data.d_vocab, "tokenizer": name})
    model = HookedTransformer(cfg, seed=seed, tokenizer=data.tokenizer)
    if data.train.ndim == 1:
        return model, TokenStream(data.train, data.val)
    return model, SequenceBatches(data.train, data.val, mask=data.train_mask, val_mask=data.val_mask)


def _encoder_decoder(name: str, table: dict[str, Any], data: Any, seed: int) -> tuple[Any, Any]:
    """An EncoderDecoder for a translation world ("dates"), and its (source, target) pair batches."""
    if not isinstance(data, TranslationData):
        raise ValueError(
            f'recipe {name}: an encoder_decoder model needs a translation world (kind = "dates"), '
            f"got {data.world['spec']['kind']!r}"
        )
    cfg = EncoderDecoderConfig.from_dict(
        table
        | {
            "d_vocab_src": data.src_tokenizer.get_vocab_size(),
            "d_vocab_tgt": data.tgt_tokenizer.get_vocab_size(),
            "tokenizer": name,
        }
    )
    model = EncoderDecoder(cfg, seed=seed, src_tokenizer=data.src_tokenizer, tgt_tokenizer=data.tgt_tokenizer)
    return model, PairBatches(data.train, data.held_out)


MODEL_KINDS = {"decoder_only": _decoder_only, "encoder_decoder": _encoder_decoder}
