"""Worlds → tokens: what a recipe's [world] gives training (`build_world`: token tensors, a tokenizer and a
record of the world, or a translation world's pairs), and the source a built model's world.json records
(`world_source`), whose conditionals are the true next-token law."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lab.data.dates import dates_world
from lab.data.facts import FactWorld, FactWorldConfig
from lab.data.sources import HiddenMarkovSource, MarkovSource, source_from_dict
from lab.data.stdlib_corpus import split_text, stdlib_docstrings, train_bpe
from lab.data.tokenizers import word_level
from lab.folders import zoo_dir
from lab.outside_files import read_json
from lab.train.batches import pad_documents
from lab.zoo.recipes import check_world


def world_source(folder: str | Path):
    """The Markov or hidden-Markov source a model folder's world.json records (a zoo model trained on a source
    world), whose `conditionals` are the true next-token law; None for a folder trained on another world or
    with no world.json. A world.json that cannot be read is a ValueError naming it."""
    path = Path(folder) / "world.json"
    if not path.is_file():
        return None
    world = read_json(path, folder)
    if not isinstance(world, dict) or "source" not in world:
        return None
    try:
        return source_from_dict(world["source"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path}: its source cannot be rebuilt ({err})") from err


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
    builders = {
        "markov": _source_world,
        "hmm": _source_world,
        "facts": _facts_world,
        "pydoc": _pydoc_world,
        "dates": _dates_world,
    }
    return builders[spec["kind"]](dict(spec), seq_len or n_ctx)


def make_source(spec: dict[str, Any]):
    if spec["kind"] == "markov":
        return MarkovSource(
            spec["vocab_size"],
            order=spec.get("order", 2),
            concentration=spec.get("concentration", 0.5),
            seed=spec.get("seed", 0),
        )
    return HiddenMarkovSource(
        spec["n_states"], spec["vocab_size"], concentration=spec.get("concentration", 0.5), seed=spec.get("seed", 0)
    )


def _source_world(spec: dict[str, Any], seq_len: int) -> WorldData:
    source = make_source(spec)
    seed = spec.get("seed", 0)
    train = source.sample(spec["n_sequences"], seq_len, seed=seed + 1)
    val = source.sample(spec.get("val_sequences", 256), seq_len, seed=seed + 2)
    return WorldData(
        torch.as_tensor(train, dtype=torch.long),
        torch.as_tensor(val, dtype=torch.long),
        d_vocab=spec["vocab_size"],
        tokenizer=None,
        world={"spec": spec, "source": source.to_dict()},
    )


def _facts_world(spec: dict[str, Any], seq_len: int) -> WorldData:
    form = spec.pop("form", "bare")
    n_val = spec.pop("n_heldout", None)
    world = FactWorld(FactWorldConfig.from_dict({k: v for k, v in spec.items() if k != "kind"}))
    tokenizer = word_level(world.word_vocabulary())
    pad = tokenizer.token_to_id("<pad>")

    def encode(docs: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        return pad_documents([tokenizer.encode(f"<bos> {d} <eos>").ids for d in docs], pad, seq_len)

    ids, mask = encode(world.documents(form=form, seed=world.cfg.seed))
    # Held-out loss on independent i.i.d. draws from p (their own random stream): the expected loss on new draws,
    # most of them of facts training holds too (the record counts them).
    n_val = n_val or max(1, world.cfg.n_train // 5)
    heldout = world.heldout_fact_indices(n_val)
    val_ids, val_mask = encode(world.documents(form=form, seed=world.cfg.seed + 1, fact_indices=heldout))
    held_out = world.heldout_record(heldout, "documents")
    return WorldData(
        ids,
        val_ids,
        d_vocab=tokenizer.get_vocab_size(),
        tokenizer=tokenizer,
        world={"spec": spec | {"form": form, "n_heldout": n_val}, "summary": world.summary(), "held_out": held_out},
        train_mask=mask,
        val_mask=val_mask,
    )


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
    return WorldData(
        torch.tensor(train_ids, dtype=torch.long),
        torch.tensor(val_ids, dtype=torch.long),
        d_vocab=tokenizer.get_vocab_size(),
        tokenizer=tokenizer,
        world={
            "spec": spec,
            "train_tokens": len(train_ids),
            "val_tokens": len(val_ids),
            "corpus_bytes": len(text.encode()),
        },
    )
