"""The model zoo: `models/<name>/model.toml` is a recipe; `forma train NAME` builds its weights there.

A recipe has four tables:
    [world]   where the data comes from (kind = "markov" | "hmm" | "facts" | "pydoc" | "dates") and its parameters
    [model]   ModelConfig fields (d_vocab comes from the world); or kind = "encoder_decoder" and
              EncoderDecoderConfig fields (d_vocab_src, d_vocab_tgt from a translation world: "dates")
    [train]   TrainConfig fields
    [quick]   overrides for `--quick` (quick.world, quick.model, quick.train), for tests and the demo

A built model folder holds model.safetensors, config.json, tokenizer.json, world.json (what the world
was, so experiments can recompute its true distribution), card.json (measured training time, losses,
and for pydoc the perplexities against n-gram baselines and sample generations) and train/ (metrics,
checkpoint). All of these are git-ignored; model.toml and MODEL.md are the recipe and its card.
"""

import math
import os
import time
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

DEFAULT_ZOO_DIR = Path(__file__).resolve().parents[1] / "models"
RECIPE_FILE = "model.toml"


def zoo_dir() -> Path:
    """models/ of the checkout, or $FORMA_ZOO_DIR (a private zoo: tests, or models kept elsewhere)."""
    return Path(os.environ.get("FORMA_ZOO_DIR") or DEFAULT_ZOO_DIR)


def zoo_names() -> list[str]:
    """Every model the zoo has a recipe for."""
    return sorted(p.parent.name for p in zoo_dir().glob(f"*/{RECIPE_FILE}"))


def _check_name(name: str) -> Path:
    names = zoo_names()
    if name not in names:
        known = ", ".join(names) if names else "none yet"
        raise ValueError(f"unknown model {name!r}: not a folder and not a zoo name (zoo models: {known})")
    return zoo_dir() / name


def zoo_model_dir(name: str) -> Path:
    """The folder of a trained zoo model; a clear error for an unknown or untrained one."""
    directory = _check_name(name)
    if not (directory / "model.safetensors").is_file():
        raise FileNotFoundError(f"zoo model {name!r} is not trained yet: run `forma train {name}`")
    return directory


def is_trained(name: str) -> bool:
    return (_check_name(name) / "model.safetensors").is_file()


def load_recipe(name: str, quick: bool = False) -> dict[str, dict[str, Any]]:
    """The recipe's world, model and train tables, with the quick overrides applied when asked."""
    path = _check_name(name) / RECIPE_FILE
    try:
        recipe = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"malformed recipe {path}: {err}") from err
    unknown = sorted(set(recipe) - {"description", "world", "model", "train", "quick"})
    if unknown:
        raise ValueError(f"recipe {path} has unknown tables {unknown}")
    tables = {key: dict(recipe.get(key, {})) for key in ("world", "model", "train")}
    if quick:
        for key, overrides in recipe.get("quick", {}).items():
            if key not in tables:
                raise ValueError(f"recipe {path}: unknown quick table {key!r}")
            tables[key] |= overrides
    tables["description"] = recipe.get("description", "")
    return tables


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
    kind = spec.get("kind")
    builders = {"markov": _source_world, "hmm": _source_world, "facts": _facts_world, "pydoc": _pydoc_world,
                "dates": _dates_world}
    if kind not in builders:
        raise ValueError(f"world kind must be one of {sorted(builders)}, got {kind!r}")
    return builders[kind](dict(spec), seq_len or n_ctx)


def make_source(spec: dict[str, Any]):
    from lab.data.sources import HiddenMarkovSource, MarkovSource

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
    from lab.data.facts import FactWorld, FactWorldConfig
    from lab.tokenize import word_level

    form = spec.pop("form", "bare")
    world = FactWorld(FactWorldConfig.from_dict({k: v for k, v in spec.items() if k != "kind"}))
    tokenizer = word_level(world.word_vocabulary())
    docs = world.documents(form=form, seed=world.cfg.seed)
    ids, mask = _pad([tokenizer.encode(f"<bos> {d} <eos>").ids for d in docs], tokenizer.token_to_id("<pad>"), seq_len)
    # Held-out loss: a fresh i.i.d. draw of documents is not available without changing the world, so
    # the validation set is the last 5% of the training draws (the experiments measure truth, not this).
    n_val = max(1, len(docs) // 20)
    return WorldData(ids, ids[-n_val:], d_vocab=tokenizer.get_vocab_size(), tokenizer=tokenizer,
                     world={"spec": spec | {"form": form}, "summary": world.summary()},
                     train_mask=mask, val_mask=mask[-n_val:])


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
    from lab.data.dates import dates_world

    return dates_world(spec["n_train"], spec["n_held_out"], seed=spec.get("seed", 0))


def _pydoc_world(spec: dict[str, Any], seq_len: int) -> WorldData:
    from lab.data.text import split_text, stdlib_docstrings, train_bpe

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
    """Train a zoo model from its recipe and save it into models/<name>/ (or `out`)."""
    from lab.model import HookedTransformer, ModelConfig
    from lab.runs import provenance, write_json
    from lab.train import SequenceBatches, TokenStream, TrainConfig, train

    recipe = load_recipe(name, quick=quick)
    directory = Path(out) if out is not None else zoo_dir() / name
    directory.mkdir(parents=True, exist_ok=True)
    kind = recipe["model"].pop("kind", "decoder_only")
    if kind == "encoder_decoder":
        return _build_encoder_decoder(name, recipe, directory, quick, progress, resume)
    if kind != "decoder_only":
        raise ValueError(f"recipe {name}: [model] kind must be 'decoder_only' or 'encoder_decoder', got {kind!r}")
    start = time.perf_counter()
    n_ctx = recipe["model"]["n_ctx"]
    data = build_world(recipe["world"], n_ctx, recipe["train"].get("seq_len"))
    if not isinstance(data, WorldData):
        raise ValueError(f"recipe {name}: a {recipe['world']['kind']!r} world gives (source, target) pairs; "
                         "it needs [model] kind = \"encoder_decoder\"")
    cfg = ModelConfig.from_dict(recipe["model"] | {"d_vocab": data.d_vocab, "tokenizer": name})
    train_cfg = TrainConfig.from_dict(recipe["train"])
    model = HookedTransformer(cfg, seed=train_cfg.seed, tokenizer=data.tokenizer)
    if data.train.ndim == 1:
        batches = TokenStream(data.train, data.val)
    else:
        batches = SequenceBatches(data.train, data.val, mask=data.train_mask, val_mask=data.val_mask)
    world_s = time.perf_counter() - start
    result = train(model, train_cfg, batches, out_dir=directory / "train", resume=resume, progress=progress)
    train_s = time.perf_counter() - start - world_s
    model.eval().save(directory)
    write_json(directory / "world.json", data.world)
    card: dict[str, Any] = {
        "name": name, "quick": quick, "n_params": cfg.n_params(), "world_build_s": world_s, "train_s": train_s,
        "steps": result.step, "final_train_loss_nats": result.train_loss_nats,
        "best_val_loss_nats": result.best_val_loss_nats,
        "provenance": provenance(train_cfg.seed),
    }
    if recipe["world"]["kind"] == "pydoc":
        card |= _english_card(model, data)
    if recipe["world"]["kind"] in ("markov", "hmm"):
        card |= _truth_card(model, data, recipe["world"])
    write_json(directory / "card.json", card)
    return directory


@torch.inference_mode()
def _truth_card(model: Any, data: WorldData, spec: dict[str, Any]) -> dict[str, Any]:
    """The source is known: the exact KL(p ‖ P_θ) and H over the held-out prefixes, in nats per token."""
    from lab.metrics.information import entropy, kl

    source = make_source(spec)
    p = torch.from_numpy(source.conditionals(data.val.numpy()))[:, :-1]
    q = torch.cat([model(data.val[i : i + 256]).double().softmax(-1)[:, :-1] for i in range(0, len(data.val), 256)])
    return {"val_kl_to_truth_nats": float(kl(p, q).mean()), "val_entropy_nats": float(entropy(p).mean()),
            "entropy_rate_nats": source.entropy_rate() if hasattr(source, "entropy_rate") else None,
            "val_prefixes": int(p.shape[0] * p.shape[1])}


def _build_encoder_decoder(name: str, recipe: dict[str, Any], directory: Path, quick: bool, progress: bool,
                           resume: bool) -> Path:
    """`build` for `[model] kind = "encoder_decoder"`: a translation world, `train_seq2seq`, and a card
    with the held-out exact match of greedy, KV-cached decoding."""
    from lab.data.dates import TranslationData, exact_match
    from lab.model import EncoderDecoder, EncoderDecoderConfig
    from lab.runs import provenance, write_json
    from lab.train import PairBatches, TrainConfig, train_seq2seq

    if resume:
        raise ValueError(f"{name} is an encoder–decoder model: it trains in one go, with no checkpoint to resume")
    start = time.perf_counter()
    data = build_world(recipe["world"], recipe["model"]["n_ctx"])
    if not isinstance(data, TranslationData):
        raise ValueError(f"recipe {name}: an encoder_decoder model needs a translation world (kind = \"dates\"), "
                         f"got {recipe['world']['kind']!r}")
    cfg = EncoderDecoderConfig.from_dict(recipe["model"] | {"d_vocab_src": data.src_tokenizer.get_vocab_size(),
                                                            "d_vocab_tgt": data.tgt_tokenizer.get_vocab_size(),
                                                            "tokenizer": name})
    train_cfg = TrainConfig.from_dict(recipe["train"])
    model = EncoderDecoder(cfg, seed=train_cfg.seed, src_tokenizer=data.src_tokenizer, tgt_tokenizer=data.tgt_tokenizer)
    world_s = time.perf_counter() - start
    result = train_seq2seq(model, train_cfg, PairBatches(data.train, data.held_out), out_dir=directory / "train",
                           progress=progress)
    train_s = time.perf_counter() - start - world_s
    model.eval().save(directory)
    write_json(directory / "world.json", data.world)
    samples = []
    for src, tgt in data.held_out[:5]:
        source = data.src_tokenizer.decode(src)
        samples.append({"source": source, "prediction": "".join(model.translate(source)),
                        "truth": "".join(data.tgt_tokenizer.id_to_token(i) for i in tgt[1:-1])})
    card = {"name": name, "quick": quick, "n_params": sum(p.numel() for p in model.parameters()),
            "world_build_s": world_s, "train_s": train_s, "steps": result.step,
            "final_train_loss_nats": result.train_loss_nats, "best_val_loss_nats": result.best_val_loss_nats,
            "held_out_exact_match": exact_match(model, data.held_out), "n_held_out": len(data.held_out),
            "n_train": len(data.train), "samples": samples, "provenance": provenance(train_cfg.seed)}
    write_json(directory / "card.json", card)
    return directory


@torch.inference_mode()
def _english_card(model: Any, data: WorldData) -> dict[str, Any]:
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
    return {"val_perplexity": math.exp(nll), "val_loss_nats": nll,
            **ngram_perplexities(data.train, data.val, data.d_vocab), "samples": samples}
