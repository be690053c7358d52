"""A built model's card.json, beyond the losses training reports: what each world's truth makes measurable
(the exact KL to a source world's law, a translation world's held-out exact match, the English world's
held-out perplexity beside n-gram baselines), how its held-out data are kept apart from training, and the
machine it was measured on."""

import datetime
import math
import os
from collections import Counter
from typing import Any

import numpy as np
import torch

from lab.data.dates import exact_match
from lab.data.stdlib_corpus import split_documents, split_text, stdlib_docstrings
from lab.folders import zoo_dir
from lab.metrics.information import entropy, kl, truncated_context_kl_of
from lab.model.decoding import generate
from lab.zoo.worlds import WorldData, make_source


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
    return {
        "unigram_perplexity": float(np.exp(nll_unigram)),
        "bigram_perplexity": float(math.exp(nll / (len(val_np) - 1))),
    }


def measured_card(model: Any, data: Any, spec: dict[str, Any], history: list[dict[str, Any]]) -> dict[str, Any]:
    """What the card measures beyond the losses: per world kind, what its truth makes measurable (`history`:
    training's per-step records)."""
    if spec["kind"] == "pydoc":
        return _english_card(model, data)
    if spec["kind"] in ("markov", "hmm"):
        return _truth_card(model, data, spec)
    if spec["kind"] == "dates":
        return _translation_card(model, data, history)
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
        "val_kl_to_truth_nats": float(kl_t.mean()),
        "val_entropy_nats": float(h_t.mean()),
        "val_averaged_over": "every held-out prefix, the first positions (shorter than a Markov chain's order) "
        "included",
        "entropy_rate_nats": source.entropy_rate() if hasattr(source, "entropy_rate") else None,
        "val_prefixes": int(p.shape[0] * p.shape[1]),
    }
    order = getattr(source, "order", None)
    if order is not None and order > 1:
        complete, first = slice(order - 1, None), slice(0, order - 1)
        joint = source.stationary()[:, None] * source.transition
        card |= {
            "complete_context_prefix_length": order,
            "val_kl_complete_contexts_nats": float(kl_t[:, complete].mean()),
            "val_entropy_complete_contexts_nats": float(h_t[:, complete].mean()),
            "val_complete_context_prefixes": int(kl_t[:, complete].numel()),
            "val_kl_first_positions_nats": float(kl_t[:, first].mean()),
            "val_entropy_first_positions_nats": float(h_t[:, first].mean()),
            "best_unigram_kl_nats": truncated_context_kl_of(joint, source.vocab_size, 0),
            "best_bigram_kl_nats": truncated_context_kl_of(joint, source.vocab_size, 1),
        }
    same = _identical_rows(data.train, data.val)
    seed = spec.get("seed", 0)
    card["held_out"] = {
        "sequences": len(data.val),
        "train_sequences": len(data.train),
        "equal_to_a_training_sequence": same,
        "how": f"{len(data.val):,} sequences sampled from the source with their own seed "
        f"({seed + 2}) apart from the {len(data.train):,} training sequences (seed {seed + 1}); "
        f"{same} of them equal a training sequence token for token",
    }
    return card


def _translation_card(model: Any, data: Any, history: list[dict[str, Any]]) -> dict[str, Any]:
    """The held-out exact match of greedy, KV-cached decoding, five sample translations, and the plateau a
    decoder that ignores its source cannot leave: the entropy of a uniformly drawn day's target per predicted
    character, ln(days) / (target characters + <eos>) — the loss of the best source-blind predictor —, with the
    first training step whose loss falls below half of it (the model reads its source from there on)."""
    first, last = (datetime.date.fromisoformat(data.world[k]) for k in ("first", "last"))
    days = (last - first).days + 1
    predicted = len(data.train[0][1]) - 1  # every target token after <bos>: the characters and <eos>
    plateau = math.log(days) / predicted
    left = next((r["step"] for r in history if r["train_loss_nats"] < plateau / 2), None)
    samples = []
    for src, tgt in data.held_out[:5]:
        source = data.src_tokenizer.decode(src)
        samples.append(
            {
                "source": source,
                "prediction": "".join(model.translate(source)),
                "truth": "".join(data.tgt_tokenizer.id_to_token(i) for i in tgt[1:-1]),
            }
        )
    return {
        "held_out_exact_match": exact_match(model, data.held_out),
        "n_held_out": len(data.held_out),
        "n_train": len(data.train),
        "samples": samples,
        "source_blind_nats_per_char": plateau,
        "source_blind_days": days,
        "first_step_below_half_source_blind": left,
        "held_out": {
            "pairs": len(data.held_out),
            "how": (
                f"{len(data.held_out):,} days drawn first and never trained on in any written form: the "
                f"{len(data.train):,} training pairs are other days (entity-disjoint by construction)"
            ),
        },
    }


def _identical_rows(train: torch.Tensor, val: torch.Tensor) -> int:
    """How many held-out rows equal some training row, token for token."""
    seen = {row.tobytes() for row in train.numpy()}
    return sum(row.tobytes() in seen for row in val.numpy())


def machine_state() -> dict[str, Any]:
    """Where a card was measured: cores, torch threads and the load average (1, 5 and 15 minutes) when
    training ended — how busy the machine was while it trained."""
    return {
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_1_5_15": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


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
        out = generate(model, tokens, 24, temperature=0.8, top_p=0.95, seed=0)
        samples.append({"prompt": prompt, "text": model.to_string(out[0])})
    fraction = data.world["spec"].get("held_out_fraction", 0.05)
    train_text, val_text = split_text(stdlib_docstrings(cache=zoo_dir() / "pydoc" / "corpus.txt"), fraction)
    train_docs, val_docs = split_documents(train_text), split_documents(val_text)
    shared = len(set(val_docs) & set(train_docs))
    return {
        "val_perplexity": math.exp(nll),
        "val_loss_nats": nll,
        "val_windows": len(val),
        "val_loss_note": "val_loss_nats and val_perplexity = exp(val_loss_nats): one computation over every "
        f"held-out window of {n_ctx} tokens",
        **ngram_perplexities(data.train, data.val, data.d_vocab),
        "samples": samples,
        "held_out": {
            "documents": len(val_docs),
            "train_documents": len(train_docs),
            "shared_documents": shared,
            "how": f"split by whole documents, each placed by a hash of its own bytes "
            f"({fraction:.0%} held out); documents are de-duplicated exactly, so the "
            f"{len(val_docs):,} held-out documents and the {len(train_docs):,} training ones "
            f"share {shared}",
        },
    }
