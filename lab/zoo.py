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
        "name": name, "quick": quick, "n_params": cfg.n_params(), "d_vocab": cfg.d_vocab, "world": data.world,
        "world_build_s": world_s, "train_s": train_s, "steps": result.step, "final_train_loss_nats": result.train_loss_nats,
        "best_val_loss_nats": result.best_val_loss_nats,
        "best_val_loss_note": "training's own estimate: the best mean loss over eval_batches random held-out batches",
        "provenance": provenance(train_cfg.seed, **_machine()),
    }
    if "held_out" in data.world:
        card["held_out"] = data.world["held_out"]
    if recipe["world"]["kind"] == "pydoc":
        card |= _english_card(model, data)
    if recipe["world"]["kind"] in ("markov", "hmm"):
        card |= _truth_card(model, data, recipe["world"])
    write_json(directory / "card.json", card)
    return directory


def _identical_rows(train: torch.Tensor, val: torch.Tensor) -> int:
    """How many held-out rows equal some training row, token for token."""
    held = {row.tobytes() for row in val.numpy()}
    return sum(row.tobytes() in held for row in train.numpy())


@torch.inference_mode()
def _truth_card(model: Any, data: WorldData, spec: dict[str, Any]) -> dict[str, Any]:
    """The source is known: the exact KL(p ‖ P_θ) and H over the held-out prefixes, in nats per token, over
    every position and, for a Markov chain, over complete contexts (prefix length ≥ its order: the context
    is π-distributed and E[H_t] is the entropy rate) and the first positions apart; and how the held-out
    sequences are kept out of training."""
    from lab.metrics.information import entropy, kl, truncated_context_kl_of

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
    card = {"name": name, "quick": quick, "n_params": sum(p.numel() for p in model.parameters()), "world": data.world,
            "world_build_s": world_s, "train_s": train_s, "steps": result.step,
            "final_train_loss_nats": result.train_loss_nats, "best_val_loss_nats": result.best_val_loss_nats,
            "held_out_exact_match": exact_match(model, data.held_out), "n_held_out": len(data.held_out),
            "n_train": len(data.train), "samples": samples, "provenance": provenance(train_cfg.seed, **_machine()),
            "held_out": {"pairs": len(data.held_out), "how": (
                f"{len(data.held_out):,} days drawn first and never trained on in any written form: the "
                f"{len(data.train):,} training pairs are other days (entity-disjoint by construction)")}}
    write_json(directory / "card.json", card)
    return directory


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
    from lab.data.text import split_documents, split_text, stdlib_docstrings

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
