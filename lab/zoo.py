"""The model zoo: `models/<name>/model.toml` is a recipe; `forma train NAME` builds its weights there.

A recipe has four tables:
    [world]   where the data comes from (kind = "markov" | "hmm" | "facts" | "pydoc" | "dates") and its parameters
    [model]   ModelConfig fields (d_vocab comes from the world); or kind = "encoder_decoder" and
              EncoderDecoderConfig fields (d_vocab_src, d_vocab_tgt from a translation world: "dates")
    [train]   TrainConfig fields
    [quick]   overrides for `--quick` (quick.world, quick.model, quick.train), for tests and the demo

Every key of every table is checked when the recipe is read: an unknown key is an error that names it
and the known ones, and so is a missing required one.

A built model folder holds model.safetensors, config.json, tokenizer.json, world.json (what the world
was, so experiments can recompute its true distribution), card.json (measured training time, losses,
and for pydoc the perplexities against n-gram baselines and sample generations), recipe.json (the
tables it was built from) and train/ (metrics, checkpoint). All of these are git-ignored; model.toml
and MODEL.md are the recipe and its card.

Builds. `forma train NAME` trains into a new folder models/NAME/.builds/<id>/, marked by the link
`.next`, while the previous model stays where it was; every name above is a link `NAME → .current/NAME`,
and `.current` links to the published build, so that one rename of `.current` publishes the new
model's files all at once (`_publish`). Training checkpoints into the build's train/ folder, so an
interrupted build — killed, Ctrl-C, SIGTERM — is continued by `forma train NAME --resume` to the same
bits an uninterrupted build gives.
"""

import contextlib
import dataclasses
import fcntl
import json
import logging
import math
import os
import secrets
import shutil
import tempfile
import time
import tomllib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lab.data.dates import TranslationData, dates_world, exact_match
from lab.data.facts import FactWorld, FactWorldConfig
from lab.data.sources import HiddenMarkovSource, MarkovSource, source_from_dict
from lab.data.text import split_documents, split_text, stdlib_docstrings, train_bpe
from lab.files import current_umask
from lab.metrics.information import entropy, kl, truncated_context_kl_of
from lab.model import EncoderDecoder, EncoderDecoderConfig, HookedTransformer, ModelConfig
from lab.runs import provenance, read_json, write_json
from lab.tokenize import word_level
from lab.train import (RESUMABLE_CHANGES, PairBatches, SequenceBatches, TokenStream, TrainConfig, discard_tree,
                       has_checkpoint, train)
from lab.folders import (DEFAULT_ZOO_DIR, RECIPE_FILE, check_zoo_name, is_trained, zoo_dir,  # noqa: F401
                         zoo_model_dir, zoo_names)  # re-exported: lab.zoo names them too

TABLES = ("world", "model", "train")
MODEL_KIND_NAMES = ("decoder_only", "encoder_decoder")
# The most documents a facts world may draw (the recipe's 5,000 are far below): each is a row of
# seq_len token ids, so 2^24 of them are already a gigabyte or more.
MAX_FACT_DOCUMENTS = 2**24

logger = logging.getLogger(__name__)


def world_source(folder: str | Path):
    """The Markov or hidden-Markov source a model folder's world.json records (a zoo model trained on a source
    world), whose `conditionals` are the true next-token law; None for a folder trained on another world or
    with no world.json. A world.json that cannot be read is a ValueError naming it."""
    path = Path(folder) / "world.json"
    if not path.is_file():
        return None
    world = read_json(path)
    if not isinstance(world, dict) or "source" not in world:
        return None
    try:
        return source_from_dict(world["source"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path}: its source cannot be rebuilt ({err})") from err


def load_recipe(name: str, quick: bool = False) -> dict[str, dict[str, Any]]:
    """The recipe's world, model and train tables, with the quick overrides applied when asked."""
    path = check_zoo_name(name) / RECIPE_FILE
    try:
        recipe = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"malformed recipe {path}: {err}") from err
    unknown = sorted(set(recipe) - {"description", *TABLES, "quick"})
    if unknown:
        raise ValueError(f"recipe {path} has unknown tables {unknown}; known tables are "
                         f"{sorted(['description', *TABLES, 'quick'])}")
    for key in (*TABLES, "quick"):
        if not isinstance(recipe.get(key, {}), dict):
            raise ValueError(f"recipe {path}: [{key}] must be a table, got {recipe[key]!r}")
    tables = {key: dict(recipe.get(key, {})) for key in TABLES}
    overridden = {key: dict(tables[key]) for key in TABLES}
    for key, overrides in recipe.get("quick", {}).items():
        if key not in tables:
            raise ValueError(f"recipe {path}: unknown quick table {key!r}; known ones are {list(TABLES)}")
        if not isinstance(overrides, dict):
            raise ValueError(f"recipe {path}: [quick.{key}] must be a table, got {overrides!r}")
        overridden[key] |= overrides
    for profile in (tables, overridden):  # both profiles, whichever is asked for: a typo is found either way
        try:
            check_recipe_tables(profile)
        except ValueError as err:
            raise ValueError(f"recipe {path}: {err}") from err
    tables = overridden if quick else tables
    tables["description"] = recipe.get("description", "")
    return tables


def check_recipe_tables(tables: dict[str, dict[str, Any]]) -> None:
    """What a recipe needs before anything is built: a known world kind with known keys of the right
    types (`check_world`), and a [model] with a known kind and an n_ctx. The other [model] and
    [train] keys are checked by ModelConfig / EncoderDecoderConfig and TrainConfig, which reject
    unknown keys by name."""
    check_world(tables["world"])
    kind = tables["model"].get("kind", "decoder_only")
    if kind not in MODEL_KIND_NAMES:
        raise ValueError(f"[model] kind must be one of {list(MODEL_KIND_NAMES)}, got {kind!r}")
    if "n_ctx" not in tables["model"]:
        raise ValueError("[model] needs n_ctx, the context length in tokens (it also sets the training "
                         "sequences' length unless [train] seq_len does)")


@dataclass(frozen=True)
class WorldKey:
    """One key a [world] table may hold: its type (an int is accepted where a float belongs) and whether
    the world needs it."""

    type: type
    required: bool = False


WORLD_KEYS: dict[str, dict[str, WorldKey]] = {
    "markov": {"vocab_size": WorldKey(int, True), "order": WorldKey(int), "concentration": WorldKey(float),
               "seed": WorldKey(int), "n_sequences": WorldKey(int, True), "val_sequences": WorldKey(int)},
    "hmm": {"n_states": WorldKey(int, True), "vocab_size": WorldKey(int, True), "concentration": WorldKey(float),
            "seed": WorldKey(int), "n_sequences": WorldKey(int, True), "val_sequences": WorldKey(int)},
    "pydoc": {"vocab_size": WorldKey(int), "held_out_fraction": WorldKey(float), "max_train_chars": WorldKey(int)},
    "dates": {"n_train": WorldKey(int, True), "n_held_out": WorldKey(int, True), "seed": WorldKey(int)},
    # facts: FactWorldConfig's fields (it checks their types and values) and the document form
}


TYPE_NAMES = {int: "an integer", float: "a number", str: "a string"}


def check_world(spec: dict[str, Any]) -> None:
    """A [world] table's kind, keys and types; sizes that would not fit in memory are refused by the
    world itself, before it allocates (lab.data.sources.MAX_TABLE_ENTRIES, MAX_SAMPLE_TOKENS)."""
    kinds = sorted([*WORLD_KEYS, "facts"])
    if not isinstance(spec, dict) or spec.get("kind") not in kinds:
        got = spec.get("kind") if isinstance(spec, dict) else spec
        raise ValueError(f"[world] needs kind = one of {kinds}, got {got!r}")
    kind = spec["kind"]
    if kind == "facts":
        keys = {f.name: WorldKey(object) for f in dataclasses.fields(FactWorldConfig)} | {"form": WorldKey(str)}
    else:
        keys = WORLD_KEYS[kind]
    unknown = sorted(set(spec) - set(keys) - {"kind"})
    if unknown:
        raise ValueError(f"[world] has unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
                         f"for a {kind} world; known keys are {', '.join(sorted(keys))}")
    missing = sorted(k for k, key in keys.items() if key.required and k not in spec)
    if missing:
        raise ValueError(f"[world] needs {', '.join(missing)} for a {kind} world")
    for k, key in keys.items():
        value = spec.get(k)
        if value is None or key.type is object:
            continue
        accepted = (int, float) if key.type is float else key.type
        if isinstance(value, bool) or not isinstance(value, accepted):
            raise ValueError(f"[world] {k} must be {TYPE_NAMES[key.type]}, got {value!r}")
    if kind == "facts" and isinstance(spec.get("n_train"), int) and spec["n_train"] > MAX_FACT_DOCUMENTS:
        raise ValueError(f"[world] n_train = {spec['n_train']:,} documents is more than a facts world may draw "
                         f"({MAX_FACT_DOCUMENTS:,})")


# --------------------------------------------------------------------------------------------
# Worlds → tokens
# --------------------------------------------------------------------------------------------
@dataclass
class WorldData:
    """What a recipe's world gives training: token tensors, a tokenizer, and a record of the world."""

    train: torch.Tensor  # [n, seq] sequences, or [n_tokens] one stream
    val: torch.Tensor
    d_vocab: int
    tokenizer: Any  # tokenizers.Tokenizer or None
    world: dict[str, Any]  # enough to rebuild the world (and its true distribution) later
    train_mask: torch.Tensor | None = None  # [n, seq] False at padding
    val_mask: torch.Tensor | None = None


def build_world(spec: dict[str, Any], n_ctx: int, seq_len: int | None = None) -> Any:
    """Tokens for a recipe's world; sequence worlds come as rows of `seq_len` (default n_ctx) tokens, a
    translation world ("dates") as a `lab.data.dates.TranslationData` of (source, target) pairs."""
    check_world(spec)
    builders = {"markov": _source_world, "hmm": _source_world, "facts": _facts_world, "pydoc": _pydoc_world,
                "dates": _dates_world}
    return builders[spec["kind"]](dict(spec), seq_len or n_ctx)


def make_source(spec: dict[str, Any]):
    if spec["kind"] == "markov":
        return MarkovSource(spec["vocab_size"], order=spec.get("order", 2),
                            concentration=spec.get("concentration", 0.5), seed=spec.get("seed", 0))
    return HiddenMarkovSource(spec["n_states"], spec["vocab_size"], concentration=spec.get("concentration", 0.5),
                              seed=spec.get("seed", 0))


def _source_world(spec: dict[str, Any], seq_len: int) -> WorldData:
    source = make_source(spec)
    seed = spec.get("seed", 0)
    train = source.sample(spec["n_sequences"], seq_len, seed=seed + 1)
    val = source.sample(spec.get("val_sequences", 256), seq_len, seed=seed + 2)
    return WorldData(torch.as_tensor(train, dtype=torch.long), torch.as_tensor(val, dtype=torch.long),
                     d_vocab=spec["vocab_size"], tokenizer=None, world={"spec": spec, "source": source.to_dict()})


def _facts_world(spec: dict[str, Any], seq_len: int) -> WorldData:
    form = spec.pop("form", "bare")
    n_val = spec.pop("n_heldout", None)
    world = FactWorld(FactWorldConfig.from_dict({k: v for k, v in spec.items() if k != "kind"}))
    tokenizer = word_level(world.word_vocabulary())
    pad = tokenizer.token_to_id("<pad>")

    def encode(docs: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        return _pad([tokenizer.encode(f"<bos> {d} <eos>").ids for d in docs], pad, seq_len)

    ids, mask = encode(world.documents(form=form, seed=world.cfg.seed))
    # Held-out loss on fresh i.i.d. draws from p (their own random stream): never training examples.
    n_val = n_val or max(1, world.cfg.n_train // 5)
    heldout = world.heldout_fact_indices(n_val)
    val_ids, val_mask = encode(world.documents(form=form, seed=world.cfg.seed + 1, fact_indices=heldout))
    overlap = world.heldout_overlap(heldout)
    held_out = overlap | {"how": (
        f"{n_val:,} held-out documents drawn i.i.d. from p apart from the {world.cfg.n_train:,} training draws "
        f"(never a training example); as draws from the same popularity law they share facts with training: "
        f"{overlap['distinct_facts_in_training']:,} of their {overlap['distinct_facts']:,} distinct facts and "
        f"{overlap['distinct_persons_in_training']:,} of their {overlap['distinct_persons']:,} persons also occur "
        f"in training, and {overlap['draws_of_facts_in_training']:,} of the {n_val:,} draws are of such facts")}
    return WorldData(ids, val_ids, d_vocab=tokenizer.get_vocab_size(), tokenizer=tokenizer,
                     world={"spec": spec | {"form": form, "n_heldout": n_val}, "summary": world.summary(),
                            "held_out": held_out},
                     train_mask=mask, val_mask=val_mask)


def _pad(rows: list[list[int]], pad_id: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(len(r) for r in rows)
    if longest > length:
        raise ValueError(f"a document is {longest} tokens, longer than the training seq_len = {length}")
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = True
    return ids, mask


def _dates_world(spec: dict[str, Any], seq_len: int) -> Any:
    return dates_world(spec["n_train"], spec["n_held_out"], seed=spec.get("seed", 0))


def _pydoc_world(spec: dict[str, Any], seq_len: int) -> WorldData:
    cache = zoo_dir() / "pydoc" / "corpus.txt"
    text = stdlib_docstrings(cache=cache)
    train_text, val_text = split_text(text, held_out_fraction=spec.get("held_out_fraction", 0.05))
    tokenizer = train_bpe(train_text, vocab_size=spec.get("vocab_size", 4096))
    max_chars = spec.get("max_train_chars")
    train_ids = tokenizer.encode(train_text[:max_chars] if max_chars else train_text).ids
    val_ids = tokenizer.encode(val_text).ids
    return WorldData(torch.tensor(train_ids, dtype=torch.long), torch.tensor(val_ids, dtype=torch.long),
                     d_vocab=tokenizer.get_vocab_size(), tokenizer=tokenizer,
                     world={"spec": spec, "train_tokens": len(train_ids), "val_tokens": len(val_ids),
                            "corpus_bytes": len(text.encode())})


# --------------------------------------------------------------------------------------------
# Baselines for the English card
# --------------------------------------------------------------------------------------------
def ngram_perplexities(train: torch.Tensor, val: torch.Tensor, d_vocab: int) -> dict[str, float]:
    """Held-out perplexity of add-one unigram and interpolated bigram models fitted on the same tokens."""
    train_np, val_np = train.numpy(), val.numpy()
    unigram = (np.bincount(train_np, minlength=d_vocab) + 1.0) / (len(train_np) + d_vocab)
    nll_unigram = -np.log(unigram[val_np[1:]]).mean()
    pairs = Counter(zip(train_np[:-1].tolist(), train_np[1:].tolist()))
    context = np.bincount(train_np[:-1], minlength=d_vocab).astype(float)
    # Jelinek–Mercer interpolation with the unigram (λ = 0.8 on the bigram where its context was seen).
    nll = 0.0
    for prev, nxt in zip(val_np[:-1].tolist(), val_np[1:].tolist()):
        bigram = pairs.get((prev, nxt), 0) / context[prev] if context[prev] else 0.0
        lam = 0.8 if context[prev] else 0.0
        nll -= math.log(lam * bigram + (1 - lam) * unigram[nxt])
    return {"unigram_perplexity": float(np.exp(nll_unigram)), "bigram_perplexity": float(math.exp(nll / (len(val_np) - 1)))}


# --------------------------------------------------------------------------------------------
# Building a zoo model
# --------------------------------------------------------------------------------------------
def build(name: str, quick: bool = False, progress: bool = True, out: Path | None = None, resume: bool = False) -> Path:
    """Train a zoo model from its recipe and publish it in models/<name>/ (or `out`); see "Builds" above.

    A fresh build discards an interrupted one; `resume=True` continues the interrupted build from its
    last checkpoint (a clear error when there is none, or when the recipe changed since it began)."""
    recipe = load_recipe(name, quick=quick)
    directory = Path(out) if out is not None else zoo_dir() / name
    record = {"format": BUILD_FORMAT, "name": name, "quick": quick,
              **{table: recipe[table] for table in ("world", "model", "train")}}
    with _only_build(directory, name):
        staging = _resume_build(directory, record) if resume else _start_build(directory, record)
        if staging != _published(directory):  # else it was complete, and only its tidying was cut short
            _train_into(staging, name, recipe, quick, progress)
        _publish(directory, staging)
    return directory


@contextlib.contextmanager
def _only_build(directory: Path, name: str) -> Iterator[None]:
    """Hold models/NAME/.lock while building: a second `forma train NAME` at the same time would
    discard the first one's build. The lock goes with the process, however it ends."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(f"another `forma train {name}` is building in {directory}; "
                             "wait for it to finish (or stop it and --resume)") from None
        yield
    finally:
        os.close(fd)


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
    result = train(model, train_cfg, batches, out_dir=staging / "train", progress=progress,
                   resume=has_checkpoint(staging / "train" / "checkpoint"))
    model.eval().save(staging)
    write_json(staging / "world.json", data.world)
    card: dict[str, Any] = {
        "name": name, "quick": quick, "n_params": sum(p.numel() for p in model.parameters()),
        "world_build_s": world_s, "train_s": result.elapsed_s, "steps": result.step,
        "final_train_loss_nats": result.train_loss_nats, "best_val_loss_nats": result.best_val_loss_nats,
        "best_val_loss_note": "training's own estimate: the best mean loss over eval_batches random held-out batches",
        "world": data.world, **_measured_card(model, data, recipe["world"]),
        "provenance": provenance(train_cfg.seed, **_machine()),
    }
    if "held_out" in data.world:
        card["held_out"] = data.world["held_out"]
    write_json(staging / "card.json", card)


def _decoder_only(name: str, table: dict[str, Any], data: Any, seed: int) -> tuple[Any, Any]:
    """A HookedTransformer for a sequence world, and its batches (windows of a stream, or whole documents)."""
    if not isinstance(data, WorldData):
        raise ValueError(f"recipe {name}: a {data.world['kind']!r} world gives (source, target) pairs; "
                         "it needs [model] kind = \"encoder_decoder\"")
    cfg = ModelConfig.from_dict(table | {"d_vocab": data.d_vocab, "tokenizer": name})
    model = HookedTransformer(cfg, seed=seed, tokenizer=data.tokenizer)
    if data.train.ndim == 1:
        return model, TokenStream(data.train, data.val)
    return model, SequenceBatches(data.train, data.val, mask=data.train_mask, val_mask=data.val_mask)


def _encoder_decoder(name: str, table: dict[str, Any], data: Any, seed: int) -> tuple[Any, Any]:
    """An EncoderDecoder for a translation world ("dates"), and its (source, target) pair batches."""
    if not isinstance(data, TranslationData):
        raise ValueError(f"recipe {name}: an encoder_decoder model needs a translation world (kind = \"dates\"), "
                         f"got {data.world['spec']['kind']!r}")
    cfg = EncoderDecoderConfig.from_dict(table | {"d_vocab_src": data.src_tokenizer.get_vocab_size(),
                                                  "d_vocab_tgt": data.tgt_tokenizer.get_vocab_size(),
                                                  "tokenizer": name})
    model = EncoderDecoder(cfg, seed=seed, src_tokenizer=data.src_tokenizer, tgt_tokenizer=data.tgt_tokenizer)
    return model, PairBatches(data.train, data.held_out)


MODEL_KINDS = {"decoder_only": _decoder_only, "encoder_decoder": _encoder_decoder}


def _measured_card(model: Any, data: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """What the card measures beyond the losses: per world kind, what its truth makes measurable."""
    if spec["kind"] == "pydoc":
        return _english_card(model, data)
    if spec["kind"] in ("markov", "hmm"):
        return _truth_card(model, data, spec)
    if spec["kind"] == "dates":
        return _translation_card(model, data)
    return {}


@torch.inference_mode()
def _truth_card(model: Any, data: WorldData, spec: dict[str, Any]) -> dict[str, Any]:
    """The source is known: the exact KL(p ‖ P_θ) and H over the held-out prefixes, in nats per token, over
    every position and, for a Markov chain, over complete contexts (prefix length ≥ its order: the context
    is π-distributed and E[H_t] is the entropy rate) and the first positions apart; and how the held-out
    sequences are kept out of training."""
    source = make_source(spec)
    p = torch.from_numpy(source.conditionals(data.val.numpy()))[:, :-1]
    q = torch.cat([model(data.val[i : i + 256]).double().softmax(-1)[:, :-1] for i in range(0, len(data.val), 256)])
    kl_t, h_t = kl(p, q), entropy(p)
    card: dict[str, Any] = {
        "val_kl_to_truth_nats": float(kl_t.mean()), "val_entropy_nats": float(h_t.mean()),
        "val_averaged_over": "every held-out prefix, the first positions (shorter than a Markov chain's order) included",
        "entropy_rate_nats": source.entropy_rate() if hasattr(source, "entropy_rate") else None,
        "val_prefixes": int(p.shape[0] * p.shape[1])}
    order = getattr(source, "order", None)
    if order is not None and order > 1:
        complete, first = slice(order - 1, None), slice(0, order - 1)
        joint = source.stationary()[:, None] * source.transition
        card |= {"complete_context_prefix_length": order,
                 "val_kl_complete_contexts_nats": float(kl_t[:, complete].mean()),
                 "val_entropy_complete_contexts_nats": float(h_t[:, complete].mean()),
                 "val_complete_context_prefixes": int(kl_t[:, complete].numel()),
                 "val_kl_first_positions_nats": float(kl_t[:, first].mean()),
                 "val_entropy_first_positions_nats": float(h_t[:, first].mean()),
                 "best_unigram_kl_nats": truncated_context_kl_of(joint, source.vocab_size, 0),
                 "best_bigram_kl_nats": truncated_context_kl_of(joint, source.vocab_size, 1)}
    same = _identical_rows(data.train, data.val)
    seed = spec.get("seed", 0)
    card["held_out"] = {"sequences": len(data.val), "train_sequences": len(data.train), "equal_to_a_training_sequence": same,
                        "how": f"{len(data.val):,} sequences sampled from the source with their own seed "
                               f"({seed + 2}) apart from the {len(data.train):,} training sequences (seed {seed + 1}); "
                               f"{same} of them equal a training sequence token for token"}
    return card


def _translation_card(model: Any, data: Any) -> dict[str, Any]:
    """The held-out exact match of greedy, KV-cached decoding, and five sample translations."""
    samples = []
    for src, tgt in data.held_out[:5]:
        source = data.src_tokenizer.decode(src)
        samples.append({"source": source, "prediction": "".join(model.translate(source)),
                        "truth": "".join(data.tgt_tokenizer.id_to_token(i) for i in tgt[1:-1])})
    return {"held_out_exact_match": exact_match(model, data.held_out), "n_held_out": len(data.held_out),
            "n_train": len(data.train), "samples": samples,
            "held_out": {"pairs": len(data.held_out), "how": (
                f"{len(data.held_out):,} days drawn first and never trained on in any written form: the "
                f"{len(data.train):,} training pairs are other days (entity-disjoint by construction)")}}


def _identical_rows(train: torch.Tensor, val: torch.Tensor) -> int:
    """How many held-out rows equal some training row, token for token."""
    held = {row.tobytes() for row in val.numpy()}
    return sum(row.tobytes() in held for row in train.numpy())


# --------------------------------------------------------------------------------------------
# Builds: train beside the published model, then switch to the new one with one rename
# --------------------------------------------------------------------------------------------
BUILDS_DIR = ".builds"  # every build, complete or in progress, in a folder of its own
CURRENT_LINK = ".current"  # → .builds/<id>: the published build
NEXT_LINK = ".next"  # → .builds/<id>: the build in progress, which --resume continues
BUILD_RECIPE = "recipe.json"  # the recipe a build was started from (after the quick overrides)
BUILD_FORMAT = "forma-build/1"
LOCK_FILE = ".lock"  # held by the one `forma train NAME` building here
# What a model folder held as plain files before builds were published through links. The first
# publish moves them into a build of their own (by hard links) so that they, too, swap in one rename.
UNLINKED_NAMES = ("model.safetensors", "config.json", "tokenizer.json", "src_tokenizer.json", "tgt_tokenizer.json",
                  "world.json", "card.json", "train")


def _start_build(directory: Path, record: dict[str, Any]) -> Path:
    """A new, empty build folder holding its recipe, marked as the build in progress."""
    builds = directory / BUILDS_DIR
    builds.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=builds, prefix=time.strftime("%Y%m%dT%H%M%S-"))).resolve()
    staging.chmod(0o777 & ~current_umask())  # mkdtemp makes it private; the model should not be
    write_json(staging / BUILD_RECIPE, record)
    abandoned = _target(directory / NEXT_LINK)
    _point(directory / NEXT_LINK, staging)
    if abandoned is not None and abandoned != _published(directory):
        logger.warning("%s: discarding the interrupted build in %s (`forma train %s --resume` continues one)",
                       record["name"], abandoned, record["name"])
        discard_tree(abandoned)
    return staging


def _resume_build(directory: Path, record: dict[str, Any]) -> Path:
    """The interrupted build, after checking that it was started from the same recipe."""
    name = record["name"]
    again = f"`forma train {name}{' --quick' if record['quick'] else ''}`"
    staging = _target(directory / NEXT_LINK)
    if staging is None or not (staging / BUILD_RECIPE).is_file():
        raise FileNotFoundError(f"nothing to resume for {name}: {directory} holds no interrupted build "
                                f"(the last one finished, or none began); run {again} to train afresh")
    try:
        saved = json.loads((staging / BUILD_RECIPE).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot resume {name}: malformed {staging / BUILD_RECIPE} ({err}); run {again}") from err
    if saved.get("quick") != record["quick"]:
        flag = " --quick" if saved.get("quick") else ""
        raise ValueError(f"cannot resume {name}: the interrupted build was started {'with' if flag else 'without'} "
                         f"--quick; resume it with `forma train {name}{flag} --resume`")
    changes = _recipe_changes(saved, record)
    if changes:
        raise ValueError(f"cannot resume {name}: the recipe differs from the interrupted build's in "
                         f"{'; '.join(changes)}; run {again} to start afresh (or resume with the build's recipe)")
    return staging


def _recipe_changes(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Each difference that would change what the build computes, as '[table] key (build …, now …)'."""
    changes = [f"{key} (build {saved.get(key)!r}, now {now.get(key)!r})"
               for key in ("format", "name") if saved.get(key) != now.get(key)]
    for table in ("world", "model", "train"):
        before, after = saved.get(table) or {}, now.get(table) or {}
        skip = RESUMABLE_CHANGES if table == "train" else ()
        for key in dict.fromkeys([*before, *after]):
            if key not in skip and before.get(key, "<absent>") != after.get(key, "<absent>"):
                changes.append(f"[{table}] {key} (build {before.get(key, '<absent>')!r}, "
                               f"now {after.get(key, '<absent>')!r})")
    return changes


def _publish(directory: Path, staging: Path) -> None:
    """Make the complete build `staging` the model in `directory`, with one atomic rename.

    Each published name (model.safetensors, config.json, card.json, train/, …) is a link
    `NAME → .current/NAME` and `.current` a link to one build, so switching `.current` switches every
    file at once: at any moment, and after a crash at any point, each name shows the previous build or
    the new one, complete. The previous build is kept until the next publish, for readers that
    resolved it a moment before the switch; older ones are removed."""
    _move_unlinked_into_a_build(directory)
    previous = _published(directory)
    for leftover in staging.rglob(".*.tmp"):  # temporary files of writes a crash cut short
        leftover.unlink()
    entries = sorted(entry for entry in staging.iterdir() if not entry.name.startswith("."))
    for entry in entries:  # before the switch a new name shows nothing, as before
        path = directory / entry.name
        if not path.is_symlink():
            if path.exists():
                raise ValueError(f"cannot publish {staging.name}: {path} is in the way (a file Forma did not link)")
            _point(path, directory / CURRENT_LINK / entry.name)
    _point(directory / CURRENT_LINK, staging)  # the switch
    if _target(directory / NEXT_LINK) == staging:
        (directory / NEXT_LINK).unlink()
    _tidy(directory, keep={staging, previous})


def _published(directory: Path) -> Path | None:
    return _target(directory / CURRENT_LINK)


def _target(link: Path) -> Path | None:
    """Where a link points, when it is one and its target exists."""
    if not link.is_symlink():
        return None
    target = link.resolve()
    return target if target.exists() else None


def _point(link: Path, target: Path) -> None:
    """Make `link` a relative symlink to `target`, atomically (a new link renamed over the old one)."""
    tmp = link.with_name(f"{link.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    os.symlink(os.path.relpath(target, link.parent), tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _move_unlinked_into_a_build(directory: Path) -> None:
    """Turn a model folder's plain files (from before links) into a published build, name by name.

    The files are hard-linked into the build first and `.current` pointed at it; only then is each
    plain name replaced by its link, which shows the same content. Every step can be repeated, so a
    crash part-way is finished by the next publish."""
    unlinked = [name for name in UNLINKED_NAMES if (directory / name).exists() and not (directory / name).is_symlink()]
    if not unlinked:
        return
    current = _published(directory)
    if current is None:
        (directory / BUILDS_DIR).mkdir(exist_ok=True)
        current = Path(tempfile.mkdtemp(dir=directory / BUILDS_DIR, prefix="unlinked-")).resolve()
        current.chmod(0o777 & ~current_umask())
        for name in unlinked:
            _link_copy(directory / name, current / name)
        _point(directory / CURRENT_LINK, current)
    for name in unlinked:
        path = directory / name
        _link_copy(path, current / name)  # again: a crash may have cut the first copy short
        if path.is_dir():  # a link cannot be renamed over a folder: move the folder aside first
            aside = directory / f".{name}.tmp-unlinked-{os.getpid()}"
            os.replace(path, aside)
            _point(path, directory / CURRENT_LINK / name)
            shutil.rmtree(aside)
        else:
            _point(path, directory / CURRENT_LINK / name)


def _link_copy(source: Path, destination: Path) -> None:
    """Hard-link a file or a folder's files to `destination`, skipping what is there (a copy if links fail)."""
    def link(src: str, dst: str) -> None:
        if os.path.lexists(dst):
            return
        try:
            os.link(src, dst)
        except OSError:  # another filesystem, or one without hard links
            tmp = f"{dst}.tmp-{os.getpid()}"
            shutil.copy2(src, tmp)
            os.replace(tmp, dst)

    if source.is_dir():
        shutil.copytree(source, destination, copy_function=link, dirs_exist_ok=True)
    else:
        link(str(source), str(destination))


def _tidy(directory: Path, keep: set[Path | None]) -> None:
    """Remove links to names the published build lacks, leftovers of crashed renames, and old builds."""
    for path in [*directory.iterdir(), *(directory / BUILDS_DIR).iterdir()]:
        if ".tmp-" not in path.name:
            continue
        if path.is_symlink() or not path.is_dir():
            path.unlink(missing_ok=True)
        else:
            shutil.rmtree(path, ignore_errors=True)
    for path in directory.iterdir():
        if path.is_symlink() and os.readlink(path).startswith(CURRENT_LINK + os.sep) and not path.exists():
            path.unlink(missing_ok=True)
    keep = keep | {_target(directory / NEXT_LINK)}
    for build_dir in (directory / BUILDS_DIR).iterdir():
        if build_dir.resolve() not in keep:
            discard_tree(build_dir)


def _machine() -> dict[str, Any]:
    """Where a card was measured: cores, torch threads and the load average (1, 5 and 15 minutes) when
    training ended — how busy the machine was while it trained."""
    return {"cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "load_average_1_5_15": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


@torch.inference_mode()
def _english_card(model: Any, data: WorldData) -> dict[str, Any]:
    """Held-out loss and perplexity from one computation (every held-out window of n_ctx tokens:
    val_perplexity = exp(val_loss_nats)), the n-gram baselines on the same tokens, samples, and how the
    held-out text is kept out of training."""
    n_ctx = model.cfg.n_ctx
    val = data.val[: (len(data.val) // n_ctx) * n_ctx].reshape(-1, n_ctx)
    losses = [model.loss(val[i : i + 32]).item() for i in range(0, len(val), 32)]
    weights = [len(val[i : i + 32]) for i in range(0, len(val), 32)]
    nll = float(np.average(losses, weights=weights))
    prompts = ["Return the", "This module provides", "The default value is"]
    samples = []
    for prompt in prompts:
        tokens = model.to_tokens(prompt)
        out = model.generate(tokens, 24, temperature=0.8, top_p=0.95, seed=0)
        samples.append({"prompt": prompt, "text": model.to_string(out[0])})
    fraction = data.world["spec"].get("held_out_fraction", 0.05)
    train_text, val_text = split_text(stdlib_docstrings(cache=zoo_dir() / "pydoc" / "corpus.txt"), fraction)
    train_docs, val_docs = split_documents(train_text), split_documents(val_text)
    shared = len(set(val_docs) & set(train_docs))
    return {"val_perplexity": math.exp(nll), "val_loss_nats": nll, "val_windows": len(val),
            "val_loss_note": "val_loss_nats and val_perplexity = exp(val_loss_nats): one computation over every "
                             f"held-out window of {n_ctx} tokens",
            **ngram_perplexities(data.train, data.val, data.d_vocab), "samples": samples,
            "held_out": {"documents": len(val_docs), "train_documents": len(train_docs), "shared_documents": shared,
                         "how": f"split by whole documents, each placed by a hash of its own bytes "
                                f"({fraction:.0%} held out); documents are de-duplicated exactly, so the "
                                f"{len(val_docs):,} held-out documents and the {len(train_docs):,} training ones "
                                f"share {shared}"}}
