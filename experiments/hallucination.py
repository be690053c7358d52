"""Hallucination on arbitrary facts: the Kalai–Vempala bound, measured exactly, and what moves it (issue 5).

Kalai & Vempala (arXiv 2311.14648) prove that a calibrated model must hallucinate arbitrary facts at about
the rate of facts seen once in training; Miao & Kearns (arXiv 2502.08666) moved that rate with the Pareto
shape γ of fact popularity and lowered hallucination by repeating a few examples. Definitions and traps:
shared/SCIENCE.md §2; the formulas are the pure functions of `lab.metrics.hallucination`.

The world (`lab.data.facts.FactWorld`): persons with two-word names drawn from a first × last name grid,
one arbitrary value each for one attribute, popularity ∝ max(1, ⌊Pareto(γ)⌋), and n i.i.d. training draws
with replacement. The default attribute is FactWorld's generic one, `code`, with 336 single-token values
code_0 … code_335 (as many as birthdays have); `attribute="birthday"` gives "Month day" values (12 × 28,
two tokens each) and runs through the same code. A document is the bare factoid "<bos> First Last code
code_17": a fixed number of words after <bos>. The bare form's final "." (and an <eos>) carry no
information and are left out on purpose: with them, the probability of a complete document needs the
model run once more at every one of the |Y| ≈ 6.7 million leaves; without them, every document has the
same length, the model's distribution over documents is exactly its distribution over these strings, and

    g(First Last a v₁…v_k) = P(First) · P(Last | First) · P(a | First Last) · Π_t P(v_t | …, v_<t)

is computed for every well-formed factoid by enumeration — every first × last name pair, persons or not
(a pair that is no person is a subject the model can invent: its factoids are hallucinations) — with
shared prefixes: one forward pass over "<bos> First" for all first names, the KV cache expanded to all
pairs for "Last a", and, for values of k > 1 tokens, expanded again for each distinct value prefix
(the 12 months of a birthday). Single-token values keep that to one position per name pair, which is
what lets the default profile measure 35 checkpoints exactly within its budget. Nothing is
renormalised: the mass on strings that are not factoids (a non-name first word, a value token where the
attribute belongs, …) is the malformed rate, computed separately as the sum of the probability that
leaks out of the grammar at each position, so g(F) + g(H) + malformed = 1 is a check, not an identity.
Documents drawn at T = 1 from the full softmax and judged by `FactWorld.classify_bare` must agree within
3 standard errors.

What runs:
* sweep: for each γ, a model trained for max(epochs) epochs in stages (`lab.train.train` with
  stop_after/resume, one stage per epoch), with the held-out NLL of fresh i.i.d. draws after each epoch;
  at the listed epochs and at the held-out optimum every quantity of issue 5 item 3 is measured.
* upweighting: from the held-out optimum at γ = upweight_gamma, the same number of optimizer steps
  (matched compute) on: the full data (control); full + 5% of the examples ×10; full + 15% ×10; the 5%
  block ×10 alone; full + 5% of the monofact examples ×10 (`upweighting_conditions`). Which examples
  land in a block moves g(H) by a point or two, so each condition is trained on `upweight_draws`
  independent draws of its blocks and reported as their mean, with the spread.
* singleton: Kalai, Nachum, Vempala & Zhang 2025 (arXiv 2509.04664, Thm. 2) with prompt = "First Last a"
  for a person and answer = the value, read off the same models' conditionals.

What a run shows is `headlines(results)` (results.json "headlines"): g(H) against MF across γ by Spearman's
ρ (only with ≥ 3 γ in the regime where MF rises with γ), both sides of the bound where its right side is
positive ("bound vacuous" where it is negative at every check: it then holds whatever the model does),
the enumeration against sampled documents, each upweighting condition against its matched control (only
when every draw of its blocks falls on one side), and the singleton variant (vacuous at these N). A γ
whose world puts ≥ MAX_FACT_PROBABILITY_FLAG of p on one fact is flagged: the theorem assumes a bounded
largest fact probability. The quick profile (QUICK) is the same experiment at a smaller size, with the
world's draws per person as in the default (n_train/n_persons = 1.25), so that MF rises with γ there too,
and enough upweighting steps for the repeated blocks to act.

Artefacts in `out`: checkpoints.parquet (one row per γ and checkpoint), calibration_bins.parquet (per
γ, checkpoint and binning: bin edges, g mass, p mass, |B| and the bin's share of the coarsened TV),
train_counts.parquet (per γ and fact: person, value, p and the training count), heldout.parquet,
upweighting.parquet, singleton.parquet, and plotly figures.
"""

import copy
import dataclasses
import logging
import math
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from lab.data.facts import FactWorld, FactWorldConfig
from lab.generate import decode
from lab.metrics.hallucination import (bin_table, bound_slack, kl_hat, missing_mass, monofact_rate, singleton_bound,
                                       singleton_calibration_delta)
from lab.metrics.statistics import sign, spearman
from lab.model import HookedTransformer, KVCache, KVCacheEntry, ModelConfig
from lab.parallel import run_tasks
from lab.runs import headline, save_figure, save_table
from lab.tokenize import word_level
from lab.train import SequenceBatches, TrainConfig, train
from lab.configs import apply_quick, check_fields, need, torch_threads

logger = logging.getLogger(__name__)

DELTAS = (0.1, 0.01)  # the bound's confidence levels (issue 5 item 3)
# Kalai & Vempala's bound is proved for worlds whose largest fact probability is bounded (their abstract: "if
# the maximum probability of any fact is bounded"); the theorem gives no number. Forma flags a γ whose world
# puts at least this share of p on one fact: most of its training draws then repeat that fact, and the
# monofact rate describes the rest of a world that is mostly one fact.
MAX_FACT_PROBABILITY_FLAG = 0.1
# The limit on |z| for the family of enumeration-against-sampling comparisons (one per γ and checkpoint, 30
# in the default run): 4 standard errors keep the chance that a fair one exceeds it near 0.2% (2·Φ(−4) each).
FAMILY_Z = 4.0
EPS = 0.1  # ε-log bins ((1−ε)^(i+1), (1−ε)^i] (Kalai & Vempala's ε-log binning)
ADAPTIVE_BINS = 20  # b adaptive bins, each ≈ 1/b of g's mass
# The quick profile is the default experiment at a smaller size: a tenth of the name grid, the default's
# draws per person (n_train / n_persons = 1.25, where MF rises with γ: fewer persons than draws would put
# the sweep where MF falls with γ), three γ in that regime, and most of the default's optimizer steps of
# upweighting (16 epochs of 15 steps against 8 of 50: with 1 epoch, as before, no condition moved g(H)
# below its control), from the held-out optimum at the same γ.
QUICK = dict(n_first_names=30, n_last_names=60, n_persons=1200, n_train=1500, gammas=(1.5, 2.0, 4.0),
             epochs=(4, 8, 16, 32), n_heldout=500, upweight_epochs=16, upweight_draws=2)


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------
@dataclass
class Config:
    """The hallucination experiment; `quick` swaps in a smaller world and fewer γ values and epochs
    (QUICK) for every field left at its default."""

    seed: int = 0
    quick: bool = False
    # world (issue 5 item 1): ≥ 100 × 200 names, |H| ≫ 300·|F|, n = 5,000
    n_first_names: int = 100
    n_last_names: int = 200
    n_persons: int = 4000
    n_train: int = 5000
    attribute: str = "code"  # generic: n_values one-token values; "birthday": "Month day" (12 × 28, two tokens)
    n_values: int = 336  # value-space size of a generic attribute (FactWorldConfig.n_values)
    gammas: tuple[float, ...] = (1.0, 1.5, 2.0, 3.0, 4.0)
    n_heldout: int = 1000  # fresh i.i.d. draws for the held-out NLL that picks the optimum
    # model and training
    d_model: int = 64
    n_layers: int = 1
    n_heads: int = 2
    batch_size: int = 100
    lr: float = 5e-3
    min_lr: float = 5e-4
    warmup_steps: int = 50
    epochs: tuple[int, ...] = (2, 4, 8, 16, 40)
    # measurement
    n_samples: int = 5000  # documents drawn at T = 1 to check the enumeration
    # selective upweighting (issue 5 item 4)
    upweight_gamma: float = 1.5
    upweight_epochs: int = 8  # every condition gets the optimizer steps of this many epochs of the full data
    upweight_factor: int = 10
    upweight_shares: tuple[float, ...] = (0.05, 0.15)
    upweight_lr: float = 1e-3
    upweight_draws: int = 3  # independent draws of the repeated blocks; a condition's figures are their mean
    threads: int = 1  # torch intra-op threads (tiny tensors: more threads cost more than they gain)
    workers: int = 2  # processes for the independent trainings (lab.parallel); results do not depend on it

    def __post_init__(self) -> None:
        check_fields(self)
        if self.quick:
            apply_quick(self, QUICK)

        need(self, self.seed >= 0, f"seed must be a non-negative integer, got {self.seed!r}")
        need(self, self.attribute.isidentifier() and self.attribute.islower(),
             f"attribute must be a lower-case word, got {self.attribute!r}")
        for name in ("n_first_names", "n_last_names", "n_persons", "n_train", "n_values", "n_heldout", "d_model",
                     "n_layers", "n_heads", "batch_size", "n_samples", "upweight_epochs", "upweight_factor",
                     "upweight_draws", "threads", "workers"):
            value = getattr(self, name)
            need(self, value > 0,
                 f"{name} must be a positive integer, got {value!r}")
        need(self, self.n_train % self.batch_size == 0,
             f"n_train ({self.n_train}) must be a multiple of batch_size ({self.batch_size}) so epochs end on steps")
        need(self, len(self.gammas) >= 2 and all(g > 0 for g in self.gammas),
             f"gammas must hold at least two finite values > 0, got {self.gammas}")
        need(self, len(self.epochs) > 0 and list(self.epochs) == sorted(set(self.epochs)) and self.epochs[0] >= 1,
             f"epochs must be increasing positive integers, got {self.epochs}")
        need(self, self.upweight_gamma > 0, "upweight_gamma must be > 0")
        need(self, all(0 < s < 1 for s in self.upweight_shares) and len(self.upweight_shares) >= 1,
             f"upweight_shares must lie in (0, 1), got {self.upweight_shares}")
        for name in ("lr", "min_lr", "upweight_lr"):
            need(self, getattr(self, name) > 0, f"{name} must be > 0")
        need(self, self.min_lr <= self.lr, "min_lr must be at most lr")
        need(self, self.d_model % self.n_heads == 0, "d_model must be a multiple of n_heads")
        need(self, self.n_samples >= 5000, "n_samples must be ≥ 5,000 (issue 5 item 2)")


# --------------------------------------------------------------------------------------------
# The world as token ids
# --------------------------------------------------------------------------------------------
@dataclass
class Setting:
    """One world and the token ids its grammar allows at each position of a document.

    Factoid y = (first i, last j, value v) has the flat index (i · n_last + j) · n_values + v.
    """

    world: FactWorld
    tokenizer: Any
    bos_id: int
    first_ids: Int[Tensor, "n_first"]
    last_ids: Int[Tensor, "n_last"]
    attribute_id: int
    value_ids: Int[Tensor, "n_values value_len"]
    fact_first: np.ndarray  # [n_facts] index into first names
    fact_last: np.ndarray
    fact_value: np.ndarray
    fact_y: np.ndarray  # flat factoid index of each fact
    train_rows: Int[Tensor, "n_train doc_len"]
    heldout_rows: Int[Tensor, "n_heldout doc_len"]

    @property
    def shape(self) -> tuple[int, int, int]:
        return len(self.first_ids), len(self.last_ids), len(self.value_ids)

    @property
    def n_factoids(self) -> int:
        return int(np.prod(self.shape))

    @property
    def doc_len(self) -> int:
        return 4 + self.value_ids.shape[1]


def make_setting(cfg: Config, gamma: float) -> Setting:
    """The world at shape γ (persons and facts do not depend on γ; popularity and the sample do)."""
    world = FactWorld(FactWorldConfig(n_first_names=cfg.n_first_names, n_last_names=cfg.n_last_names,
                                      n_persons=cfg.n_persons, attributes=(cfg.attribute,), pareto_gamma=gamma,
                                      n_train=cfg.n_train, seed=cfg.seed, n_values=cfg.n_values))
    tokenizer = word_level(world.word_vocabulary())
    vocab = tokenizer.get_vocab()
    values = world.value_spaces[cfg.attribute]
    value_words = [v.split() for v in values]
    if len({len(w) for w in value_words}) != 1:
        raise ValueError(f"every {cfg.attribute} value must have the same number of words (fixed-length documents)")
    first_index = {name: i for i, name in enumerate(world.first_names)}
    last_index = {name: j for j, name in enumerate(world.last_names)}
    value_index = {v: k for k, v in enumerate(values)}
    fact_first = np.array([first_index[world.persons[f.person_index].first] for f in world.facts])
    fact_last = np.array([last_index[world.persons[f.person_index].last] for f in world.facts])
    fact_value = np.array([value_index[f.value] for f in world.facts])
    n_last, n_values = len(world.last_names), len(values)
    heldout = world.heldout_fact_indices(cfg.n_heldout)  # fresh i.i.d. draws, never training examples

    def rows(fact_indices: np.ndarray) -> Tensor:
        # The bare render "{first} {last} {attribute} {value} ." without its constant final ".".
        texts = ["<bos> " + world.render(world.facts[i], "bare").removesuffix(" .") for i in fact_indices]
        return torch.tensor([e.ids for e in tokenizer.encode_batch(texts)], dtype=torch.long)

    return Setting(world=world, tokenizer=tokenizer, bos_id=vocab["<bos>"],
                   first_ids=torch.tensor([vocab[w] for w in world.first_names]),
                   last_ids=torch.tensor([vocab[w] for w in world.last_names]),
                   attribute_id=vocab[cfg.attribute],
                   value_ids=torch.tensor([[vocab[w] for w in words] for words in value_words]),
                   fact_first=fact_first, fact_last=fact_last, fact_value=fact_value,
                   fact_y=(fact_first * n_last + fact_last) * n_values + fact_value,
                   train_rows=rows(world.train_fact_indices), heldout_rows=rows(heldout))


def make_model(cfg: Config, setting: Setting) -> HookedTransformer:
    model_cfg = ModelConfig(d_vocab=setting.tokenizer.get_vocab_size(), d_model=cfg.d_model, n_layers=cfg.n_layers,
                            n_heads=cfg.n_heads, n_ctx=setting.doc_len, tokenizer="facts-word-level")
    return HookedTransformer(model_cfg, seed=cfg.seed, tokenizer=setting.tokenizer)


# --------------------------------------------------------------------------------------------
# g by enumeration
# --------------------------------------------------------------------------------------------
@dataclass
class Enumeration:
    """The model's exact distribution over documents, split by the grammar.

    log_g[i, j, v]: log-probability of the well-formed document (first i, last j, value v);
    prompt_log_p[i, j]: log P(first i, last j, attribute) — the prompt of the singleton variant;
    leaks[k]: probability of leaving the grammar at document position k + 1 (the malformed mass, by where).
    """

    log_g: Float[np.ndarray, "n_first n_last n_values"]
    prompt_log_p: Float[np.ndarray, "n_first n_last"]
    leaks: list[float]

    @property
    def malformed(self) -> float:
        return float(sum(self.leaks))


def _expand(cache: KVCache, rows: Tensor, repeats: int) -> KVCache:
    """A new cache holding `rows` of `cache`, each repeated `repeats` times in place (row-major)."""
    return KVCache([KVCacheEntry(e.keys[rows].repeat_interleave(repeats, 0),
                                 e.values[rows].repeat_interleave(repeats, 0)) for e in cache.entries])


def _log_probs(logits: Tensor) -> Tensor:
    # In the model's float32 (≈1e-7 relative per probability); what is gathered from it is summed in float64.
    return logits.log_softmax(dim=-1)


def _leak(log_p: Tensor, allowed: Tensor) -> Tensor:
    """Probability of the tokens outside `allowed` (summed directly, never as 1 − the allowed mass)."""
    return log_p.exp().masked_fill(allowed, 0.0).sum(dim=-1).double()


def _allowed(ids: Tensor, d_vocab: int) -> Tensor:
    mask = torch.zeros(d_vocab, dtype=torch.bool)
    mask[ids] = True
    return mask


@torch.inference_mode()
def enumerate_g(model: HookedTransformer, setting: Setting, firsts_per_chunk: int = 4) -> Enumeration:
    """g over every well-formed factoid, exactly, with shared prefixes (module docstring)."""
    model.eval()
    n_first, n_last, n_values = setting.shape
    d_vocab = model.cfg.d_vocab
    first_ok, last_ok = _allowed(setting.first_ids, d_vocab), _allowed(setting.last_ids, d_vocab)
    attribute_ok = _allowed(torch.tensor([setting.attribute_id]), d_vocab)
    value_len = setting.value_ids.shape[1]

    # Positions 0–1: "<bos> First" for every first name, in one batch.
    head = torch.stack((torch.full((n_first,), setting.bos_id), setting.first_ids), dim=1)
    head_cache = KVCache.empty(model.cfg.n_layers)
    head_lp = _log_probs(model(head, kv_cache=head_cache))  # [first, 2, vocab]
    first_lp = head_lp[0, 0, setting.first_ids].double()  # P(First | <bos>), the same in every row
    last_lp = head_lp[:, 1][:, setting.last_ids].double()  # [first, last]
    leaks = [float(_leak(head_lp[0, 0], first_ok)),
             float((first_lp.exp() * _leak(head_lp[:, 1], last_ok)).sum())]
    leaks += [0.0] * (1 + value_len)

    # Value prefixes at each depth t: the distinct first-t-token prefixes, which tokens may follow each.
    depth_prefixes, depth_inverse, depth_allowed = [], [], []
    for t in range(value_len):
        if t == 0:  # the empty prefix: every value shares it
            prefixes, inverse = setting.value_ids[:1, :0], torch.zeros(n_values, dtype=torch.long)
        else:
            prefixes, inverse = torch.unique(setting.value_ids[:, :t], dim=0, return_inverse=True)
        allowed = torch.zeros(len(prefixes), d_vocab, dtype=torch.bool)
        allowed[inverse, setting.value_ids[:, t]] = True
        depth_prefixes.append(prefixes)
        depth_inverse.append(inverse)
        depth_allowed.append(allowed)

    log_g = np.empty((n_first, n_last, n_values))
    prompt_log_p = np.empty((n_first, n_last))
    for start in range(0, n_first, firsts_per_chunk):
        firsts = torch.arange(start, min(start + firsts_per_chunk, n_first))
        n_pairs = len(firsts) * n_last
        # Positions 2–3: "Last attribute" after every first name of the chunk.
        cache = _expand(head_cache, firsts, n_last)
        tail = torch.stack((setting.last_ids.repeat(len(firsts)), torch.full((n_pairs,), setting.attribute_id)), 1)
        tail_lp = _log_probs(model(tail, kv_cache=cache))  # [pair, 2, vocab]
        name_lp = first_lp[firsts].repeat_interleave(n_last) + last_lp[firsts].reshape(-1)
        leaks[2] += float((name_lp.exp() * _leak(tail_lp[:, 0], attribute_ok)).sum())
        prompt_lp = name_lp + tail_lp[:, 0, setting.attribute_id].double()
        value_lp = torch.zeros(n_pairs, n_values, dtype=torch.float64)
        for t in range(value_len):
            prefixes, inverse, allowed = depth_prefixes[t], depth_inverse[t], depth_allowed[t]
            if t == 0:
                next_lp = tail_lp[:, 1][:, None, :]  # [pair, 1, vocab]
            else:  # Positions 4+: each distinct value prefix after every pair, on the pair's cache.
                prefix_cache = _expand(cache, torch.arange(n_pairs), len(prefixes))
                tokens = prefixes.repeat(n_pairs, 1)
                next_lp = _log_probs(model(tokens, kv_cache=prefix_cache)[:, -1]).view(n_pairs, len(prefixes), -1)
            # The mass of each prefix (one value stands for all that share it) times its leak.
            representative = torch.zeros(len(prefixes), dtype=torch.long).scatter_(
                0, inverse, torch.arange(n_values))
            prefix_mass = (prompt_lp[:, None] + value_lp[:, representative]).exp()
            leak = _leak(next_lp, allowed[None])  # [pair, prefix]
            leaks[3 + t] += float((prefix_mass * leak).sum())
            value_lp += next_lp[:, inverse, setting.value_ids[:, t]].double()  # gather [pair, value]
        log_g[firsts.numpy()] = (prompt_lp[:, None] + value_lp).view(len(firsts), n_last, n_values).numpy()
        prompt_log_p[firsts.numpy()] = prompt_lp.view(len(firsts), n_last).numpy()
    return Enumeration(log_g, prompt_log_p, leaks)


@torch.inference_mode()
def sample_documents(model: HookedTransformer, setting: Setting, n: int, seed: int) -> dict[str, int]:
    """Draw n documents at T = 1 from the full softmax (no top-k, no top-p) and judge each with
    `FactWorld.classify_bare` (the constant "." the documents leave out is put back for it)."""
    model.eval()
    prompt = torch.full((n, 1), setting.bos_id)
    tokens = decode(model, prompt, setting.doc_len - 1, temperature=1.0, seed=seed).tokens[:, 1:]
    words = [[setting.tokenizer.id_to_token(int(i)) for i in row] for row in tokens]
    verdicts = [setting.world.classify_bare(" ".join(w) + " .") for w in words]
    return {kind: verdicts.count(kind) for kind in ("fact", "hallucination", "malformed")}


@torch.inference_mode()
def heldout_nll(model: HookedTransformer, rows: Tensor) -> float:
    """Mean −log P(document) in nats over held-out documents (every position after <bos>)."""
    model.eval()
    log_p = model(rows).double().log_softmax(-1)[:, :-1]
    return float(-log_p.gather(-1, rows[:, 1:, None]).sum(dim=(1, 2)).mean())


# --------------------------------------------------------------------------------------------
# Everything measured at one checkpoint
# --------------------------------------------------------------------------------------------
def _key(delta: float) -> str:
    return str(delta).replace(".", "_")


def measure(model: HookedTransformer, setting: Setting, cfg: Config, seed: int) -> tuple[dict, list[dict], dict]:
    """(issue 5 item 3 metrics, per-bin rows, singleton-variant numbers) for the model as it is."""
    world = setting.world
    enum = enumerate_g(model, setting)
    g = np.exp(enum.log_g).reshape(-1)
    n_first, n_last, n_values = setting.shape
    counts = world.train_counts
    is_fact = np.zeros(g.size, dtype=bool)
    is_fact[setting.fact_y] = True
    p = np.zeros(g.size)
    p[setting.fact_y] = world.p
    g_facts = float(g[setting.fact_y].sum())
    g_hall = float(g[~is_fact].sum())
    malformed = enum.malformed

    pair_mass = g.reshape(n_first * n_last, n_values).sum(axis=1)
    seen_pair = np.zeros(n_first * n_last, dtype=bool)
    person_pair = np.zeros(n_first * n_last, dtype=bool)
    pair_of_fact = setting.fact_first * n_last + setting.fact_last
    person_pair[pair_of_fact] = True
    seen_pair[pair_of_fact[counts > 0]] = True

    seen = counts > 0
    answers = enum.log_g[setting.fact_first, setting.fact_last]  # [fact, value]
    recalled = answers.argmax(axis=1) == setting.fact_value
    conditional = np.exp(answers - enum.prompt_log_p[setting.fact_first, setting.fact_last][:, None])

    tables = {scheme: bin_table(g, p, scheme, EPS, ADAPTIVE_BINS) for scheme in ("eps", "adaptive")}
    mis_eps = tables["eps"].miscalibration
    mf = monofact_rate(counts)
    n_hall = setting.n_factoids - len(world.facts)
    metrics: dict[str, Any] = {
        "hallucination_rate": g_hall, "fact_rate": g_facts, "malformed_rate": malformed,
        "sum_check": g_facts + g_hall + malformed - 1.0,
        "malformed_by_position": enum.leaks,
        "hallucination_share": g_hall / (g_hall + g_facts),
        "unseen_person_mass": float(pair_mass[~seen_pair].sum()),
        "invented_person_mass": float(pair_mass[~person_pair].sum()),
        "miscalibration_tv_eps": mis_eps, "miscalibration_tv_adaptive": tables["adaptive"].miscalibration,
        "miscalibration_binmass": tables["eps"].binmass, "miscalibration_binmass_adaptive": tables["adaptive"].binmass,
        # p^Π(H) (p lives on all of F): g(H) ≥ p^Π(H) − Mis for every model, the deterministic half of the bound.
        "p_pi_hallucination_mass": tables["eps"].spread_off_support,
        "kl_hat": kl_hat(g[setting.fact_y[seen]], counts[seen], "eps", EPS),
        "recall_seen": float(recalled[seen].mean()),
        "recall_seen_mass": float(conditional[seen, setting.fact_value[seen]].mean()),
    }
    for delta in DELTAS:
        bound = bound_slack(g_hall, mf, mis_eps, len(world.facts), n_hall, cfg.n_train, delta)
        metrics[f"bound_rhs_delta_{_key(delta)}"] = bound.right_side
        metrics[f"bound_slack_delta_{_key(delta)}"] = bound.slack
        metrics[f"bound_margin_delta_{_key(delta)}"] = bound.margin

    drawn = sample_documents(model, setting, cfg.n_samples, seed)
    n = cfg.n_samples
    for kind, exact in (("hallucination", g_hall), ("fact", g_facts), ("malformed", malformed)):
        rate = drawn[kind] / n
        se = math.sqrt(max(exact * (1.0 - exact), 1e-300) / n)  # the binomial SE at the exact rate
        metrics[f"sampled_{kind}_rate"] = rate
        metrics[f"sampled_{kind}_z"] = (rate - exact) / se
    metrics["sampled_se"] = math.sqrt(g_hall * (1.0 - g_hall) / n)
    metrics["n_samples"] = n

    bins = [{"scheme": scheme, **row} for scheme, table in tables.items() for row in table.rows()]

    # Singleton variant: prompts c = persons ("First Last attribute"), μ(c) = p(c's fact), one correct answer.
    min_wrong = n_values - 1
    error = float(world.p @ (conditional.sum(axis=1) - conditional[np.arange(len(world.facts)), setting.fact_value]))
    sr = monofact_rate(counts)  # prompts are facts here: the singleton rate is the monofact rate
    delta = singleton_calibration_delta(conditional, setting.fact_value, world.p, 1.0 / min_wrong)
    sb = singleton_bound(error, sr, min_wrong, cfg.n_train, delta)
    singleton = {"error": error, "singleton_rate": sr, "calibration_delta": delta, "min_wrong_answers": min_wrong,
                 "n_train": cfg.n_train, "finite_n_term": sb.finite_n_term, "bound_rhs": sb.right_side,
                 "bound_rhs_without_finite_n": sb.right_side_without_finite_n, "margin": sb.margin,
                 "margin_without_finite_n": sb.margin_without_finite_n,
                 "malformed_answer_mass": float(world.p @ (1.0 - conditional.sum(axis=1)))}
    return metrics, bins, singleton


# --------------------------------------------------------------------------------------------
# Training: the sweep over γ, and the upweighting conditions
# --------------------------------------------------------------------------------------------
@dataclass
class SweepRun:
    """One γ: the world, what was measured at each checkpoint, and the weights at the held-out optimum."""

    setting: Setting
    heldout: list[dict[str, float]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    bins: list[dict[str, Any]] = field(default_factory=list)
    singleton: list[dict[str, Any]] = field(default_factory=list)
    optimum_epoch: int = 0
    optimum_state: dict[str, Tensor] | None = None
    seconds: float = 0.0  # its own time, in whichever process ran it


def _record(run: SweepRun, model: HookedTransformer, cfg: Config, epoch: int, label: str, seed: int) -> None:
    metrics, bins, singleton = measure(model, run.setting, cfg, seed)
    logger.info("γ = %s, %s: g(H) %.4f, malformed %.4f, Mis %.4f, recall %.3f", run.setting.world.cfg.pareto_gamma,
                label, metrics["hallucination_rate"], metrics["malformed_rate"], metrics["miscalibration_tv_eps"],
                metrics["recall_seen"])
    run.checkpoints.append({"epoch": epoch, "checkpoint": label, **metrics})
    run.bins += [{"checkpoint": label, "epoch": epoch, **row} for row in bins]
    run.singleton.append({"checkpoint": label, "epoch": epoch, **singleton})


def sweep_gamma(cfg: Config, gamma: float, work: Path) -> SweepRun:
    """Train at shape γ in one-epoch stages; measure at cfg.epochs and at the held-out optimum."""
    began = time.perf_counter()
    setting = make_setting(cfg, gamma)
    run = SweepRun(setting)
    model = make_model(cfg, setting)
    steps_per_epoch = cfg.n_train // cfg.batch_size
    last = cfg.epochs[-1]
    train_cfg = TrainConfig(steps=last * steps_per_epoch, batch_size=cfg.batch_size, seq_len=setting.doc_len,
                            lr=cfg.lr, min_lr=cfg.min_lr, warmup_steps=min(cfg.warmup_steps, steps_per_epoch),
                            eval_interval=last * steps_per_epoch, eval_batches=1, seed=cfg.seed)
    data = SequenceBatches(setting.train_rows, setting.heldout_rows)
    best = math.inf
    for epoch in range(1, last + 1):
        train(model, train_cfg, data, out_dir=work, resume=epoch > 1, progress=False,
              stop_after=epoch * steps_per_epoch)
        nll = heldout_nll(model, setting.heldout_rows)
        run.heldout.append({"epoch": epoch, "heldout_nll": nll})
        if nll < best:
            best, run.optimum_epoch = nll, epoch
            run.optimum_state = copy.deepcopy(model.state_dict())
        if epoch in cfg.epochs:
            _record(run, model, cfg, epoch, f"epoch {epoch}", seed=cfg.seed + epoch)
    model.load_state_dict(run.optimum_state)
    _record(run, model, cfg, run.optimum_epoch, "optimum", seed=cfg.seed + 1000)
    run.seconds = time.perf_counter() - began
    return run


def upweighting_conditions(cfg: Config, setting: Setting, draw: int = 0) -> dict[str, Tensor]:
    """Training rows per condition: the full sample, plus blocks of its examples repeated ×factor.

    A share s is s·n training examples drawn without replacement (the blocks are nested: the 5% block opens
    the 15% one), so frequent facts are in it as often as in the sample; "of monofacts" takes that share of
    the examples whose fact occurs exactly once. "full + block ×k" adds k copies of the block to the sample.
    Each `draw` picks other blocks (the control, the full sample, is the same in every draw).
    """
    rng = np.random.default_rng([cfg.seed, 11, draw])
    n = cfg.n_train
    order = rng.permutation(n)  # nested blocks: the 5% block is the start of the 15% block
    full = setting.train_rows
    factor = cfg.upweight_factor
    counts = setting.world.train_counts[setting.world.train_fact_indices]
    monofacts = np.flatnonzero(counts == 1)
    first_share = cfg.upweight_shares[0]
    mono_block = rng.choice(monofacts, size=max(1, round(first_share * len(monofacts))), replace=False)
    first_block = full[order[: round(first_share * n)]]
    conditions = {CONTROL: full}
    for share in cfg.upweight_shares:
        block = full[order[: round(share * n)]]
        conditions[f"full + {share:.0%} ×{factor}"] = torch.cat([full, block.repeat(factor, 1)])
    conditions[f"{first_share:.0%} block ×{factor} alone"] = first_block.repeat(factor, 1)
    conditions[f"full + {first_share:.0%} of monofacts ×{factor}"] = torch.cat([full, full[mono_block].repeat(factor, 1)])
    return conditions


CONTROL = "control (full data)"
UPWEIGHT_KEYS = ("hallucination_rate", "miscalibration_tv_eps", "miscalibration_tv_adaptive", "kl_hat",
                 "recall_seen", "malformed_rate", "unseen_person_mass")


def upweighting_tasks(cfg: Config, run: SweepRun) -> list[tuple[Any, ...]]:
    """One training per condition and draw of its blocks (the control, the full sample, once: it does not
    depend on the draw), each from the held-out optimum of `run`: lab.parallel tasks."""
    names = list(upweighting_conditions(cfg, run.setting))
    return [(upweight_condition, cfg, run, draw, condition) for draw in range(cfg.upweight_draws)
            for condition in names if not (condition == CONTROL and draw > 0)]


def upweight_condition(cfg: Config, run: SweepRun, draw: int, condition: str) -> dict[str, Any]:
    """From the held-out optimum, the same optimizer steps (matched compute) on one condition's data."""
    began = time.perf_counter()
    setting = run.setting
    steps = cfg.upweight_epochs * (cfg.n_train // cfg.batch_size)
    train_cfg = TrainConfig(steps=steps, batch_size=cfg.batch_size, seq_len=setting.doc_len, lr=cfg.upweight_lr,
                            min_lr=cfg.upweight_lr / 10, warmup_steps=min(cfg.warmup_steps, steps),
                            eval_interval=steps, eval_batches=1, seed=cfg.seed)
    rows = upweighting_conditions(cfg, setting, draw)[condition]
    model = make_model(cfg, setting)
    model.load_state_dict(run.optimum_state)
    train(model, train_cfg, SequenceBatches(rows, setting.heldout_rows), progress=False)
    metrics, _, _ = measure(model, setting, cfg, seed=cfg.seed + 2000)
    logger.info("upweighting, draw %d, %s: g(H) %.4f, Mis %.4f, recall %.3f", draw, condition,
                metrics["hallucination_rate"], metrics["miscalibration_tv_eps"], metrics["recall_seen"])
    # Distinct training examples repeated ×factor (the alone condition holds only them).
    repeated = (len(rows) - cfg.n_train * (not condition.endswith("alone"))) // cfg.upweight_factor
    return {"condition": condition, "draw": draw, "n_documents": len(rows), "steps": steps,
            "documents_seen": steps * cfg.batch_size, "upweighted_examples": repeated, **metrics,
            "seconds": time.perf_counter() - began}


def summarise_upweighting(per_draw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per condition: the mean over its draws (and the standard error of g(H) over them)."""
    summary = []
    for condition in dict.fromkeys(r["condition"] for r in per_draw):
        rows = [r for r in per_draw if r["condition"] == condition]
        rates = np.array([r["hallucination_rate"] for r in rows])
        entry = {k: v for k, v in rows[0].items() if k not in ("draw", *UPWEIGHT_KEYS, "malformed_by_position")}
        entry |= {key: float(np.mean([r[key] for r in rows])) for key in UPWEIGHT_KEYS}
        entry |= {"n_draws": len(rows), "hallucination_rate_draws": rates.tolist(),
                  "miscalibration_tv_eps_draws": [r["miscalibration_tv_eps"] for r in rows],
                  "hallucination_rate_se": float(rates.std(ddof=1) / math.sqrt(len(rates))) if len(rates) > 1 else 0.0}
        summary.append(entry)
    return summary


# --------------------------------------------------------------------------------------------
# Summaries, tables, figures
# --------------------------------------------------------------------------------------------
def relative_change(reduction: float) -> str:
    """A reduction 1 − new/old in words: "14.0% lower", or "3.2% higher" when it is negative."""
    return f"{abs(reduction):.1%} {'lower' if reduction >= 0 else 'higher'}"


def acceptance(sweep: list[dict[str, Any]], upweighting: list[dict[str, Any]], cfg: Config) -> dict[str, Any]:
    """Issue 5's acceptance checks, computed from the results (never asserted here)."""
    mf = [s["monofact_rate"] for s in sweep]
    by_epoch = {}
    for epoch in cfg.epochs:
        rates = [next(c["hallucination_rate"] for c in s["checkpoints"] if c["checkpoint"] == f"epoch {epoch}")
                 for s in sweep]
        by_epoch[str(epoch)] = spearman(mf, rates)
    sides = [(c[f"bound_rhs_delta_{_key(d)}"], c[f"bound_margin_delta_{_key(d)}"])
             for s in sweep for c in s["checkpoints"] for d in DELTAS]
    informative = [margin for rhs, margin in sides if rhs > 0]  # where the right side is negative it says nothing
    out: dict[str, Any] = {
        "spearman_monofact_vs_hallucination": by_epoch,
        "spearman_at_least_0_9": all(v >= 0.9 for v in by_epoch.values()),
        "min_bound_margin": min(margin for _, margin in sides),
        "min_bound_margin_where_right_side_positive": min(informative) if informative else None,
        "bound_holds_where_right_side_positive": all(m >= 0 for m in informative) if informative else None,
        "bound_checks_with_positive_right_side": len(informative), "bound_checks": len(sides),
        "largest_right_side": max(rhs for rhs, _ in sides),
    }
    if upweighting:
        control = upweighting[0]
        mixed = [u for u in upweighting[1: 1 + len(cfg.upweight_shares)]]
        out["upweighting"] = [{
            "condition": u["condition"],
            "hallucination_reduction": 1 - u["hallucination_rate"] / control["hallucination_rate"],
            "hallucination_reduction_draws": [1 - r / control["hallucination_rate"] for r in u["hallucination_rate_draws"]],
            "miscalibration_change": u["miscalibration_tv_eps"] - control["miscalibration_tv_eps"],
            "recall_change": u["recall_seen"] - control["recall_seen"]} for u in upweighting[1:]]
        out["mixed_upweighting_passes"] = all(
            1 - u["hallucination_rate"] / control["hallucination_rate"] >= 0.15
            and u["miscalibration_tv_eps"] > control["miscalibration_tv_eps"]
            and abs(u["recall_seen"] - control["recall_seen"]) <= 0.05 for u in mixed)
    return out


def headlines(results: dict[str, Any]) -> list[dict[str, Any]]:
    """What the run shows, one sentence each, computed from the rest of results: {name, sentence, value,
    interval, direction (must agree between the quick and default profiles), supported, why_not}. A headline
    the run cannot support is kept, unsupported, with the reason in words."""
    sweep = sorted(results["sweep"], key=lambda s: s["gamma"])
    out = []

    # Hallucination against the monofact rate across γ, at each γ's held-out optimum.
    mf = [s["monofact_rate"] for s in sweep]
    optimum = [next(c for c in s["checkpoints"] if c["checkpoint"] == "optimum") for s in sweep]
    rates = [c["hallucination_rate"] for c in optimum]
    rho = spearman(mf, rates)
    by_epoch = results["acceptance"]["spearman_monofact_vs_hallucination"]
    rising = all(b > a for a, b in zip(mf, mf[1:]))
    flagged = [s for s in sweep if s["max_fact_probability"] >= MAX_FACT_PROBABILITY_FLAG]
    note = ("" if not flagged else " (one fact holds " + ", ".join(
        f"{s['max_fact_probability']:.0%} of p at γ = {s['gamma']:g}" for s in flagged)
        + f": beyond the theorem's bounded largest fact, flagged at ≥ {MAX_FACT_PROBABILITY_FLAG:.0%})")
    why = None
    if len(sweep) < 3:
        why = f"only {len(sweep)} γ values: a rank correlation of {len(sweep)} points can only be ±1"
    elif not rising:
        why = ("the monofact rate does not rise with γ across " + ", ".join(f"γ = {s['gamma']:g} (MF {m:.3f})"
               for s, m in zip(sweep, mf)) + ": the sweep is outside the regime where γ moves MF up")
    out.append(headline(
        "hallucination_rises_with_monofact_rate",
        f"Across {len(sweep)} popularity shapes (MF {min(mf):.3f} … {max(mf):.3f}), g(H) at each γ's held-out optimum "
        f"has Spearman ρ = {rho:+.2f} with the monofact rate (at fixed epochs: "
        + ", ".join(f"{e}: {v:+.2f}" for e, v in by_epoch.items()) + ")" + note + ".",
        rho, None, sign(rho) if math.isfinite(rho) else 0, why is None, why))

    # Both sides of the bound, at every checkpoint and δ.
    checks = [(c[f"bound_rhs_delta_{_key(d)}"], c[f"bound_margin_delta_{_key(d)}"])
              for s in sweep for c in s["checkpoints"] for d in DELTAS]
    positive = [(rhs, margin) for rhs, margin in checks if rhs > 0]
    if positive:
        worst = min(margin for _, margin in positive)
        out.append(headline(
            "bound_holds", f"Where its right side is positive ({len(positive)} of {len(checks)} checks), the bound "
                           f"g(H) ≥ MF − Mis − slack holds with smallest margin {worst:+.3f}.",
            worst, None, bool(worst >= 0)))
    else:
        best = max(rhs for rhs, _ in checks)
        out.append(headline(
            "bound_holds", "The Kalai–Vempala bound's right side is negative at every check.", best, None, 0,
            False, f"bound vacuous: right side < 0 at every check ({len(checks)} of {len(checks)}; the largest is "
                   f"{best:+.3f}), so g(H) ≥ right side holds whatever the model does and says nothing"))

    # The enumeration against sampled documents, and the grammar's mass.
    z = max(abs(c["sampled_hallucination_rate"] - c["hallucination_rate"]) / c["sampled_se"]
            for s in sweep for c in s["checkpoints"] if c["sampled_se"] > 0)
    n_checkpoints = sum(len(s["checkpoints"]) for s in sweep)
    out.append(headline(
        "enumeration_matches_sampling",
        f"The exact g(H) by enumeration and the rate among documents sampled at T = 1 agree at all {n_checkpoints} "
        f"checkpoints (worst |z| = {z:.2f}; over these comparisons the limit is |z| ≤ {FAMILY_Z}).", z, None,
        bool(z <= FAMILY_Z)))
    gap = max(abs(c["sum_check"]) for s in sweep for c in s["checkpoints"])
    out.append(headline(
        "mass_closes", f"g(F) + g(H) + malformed, the last summed from the grammar's leaks, is 1 within {gap:.1e} at "
                       f"every checkpoint.", gap, None, bool(gap <= 1e-4)))

    # Selective upweighting against its matched-compute control (Miao & Kearns).
    upweighting = results.get("upweighting") or []
    if upweighting:
        control = upweighting[0]
        n_shares = len(results["config"]["upweight_shares"])
        for u in upweighting[1: 1 + n_shares]:
            draws = u["hallucination_rate_draws"]
            reductions = [1 - r / control["hallucination_rate"] for r in draws]
            sides = {sign(r - control["hallucination_rate"]) for r in draws}
            why = (f"only {len(draws)} draw of the repeated blocks: no spread to judge it by" if len(draws) < 2 else
                   f"its draws fall on both sides of the control (g(H) {', '.join(f'{r:.4f}' for r in draws)} "
                   f"against {control['hallucination_rate']:.4f})" if len(sides) > 1 else None)
            out.append(headline(
                f"upweighting {u['condition']}",
                f"Upweighting ({u['condition']}) moves g(H) from {control['hallucination_rate']:.4f} to "
                f"{u['hallucination_rate']:.4f} against the matched-compute control "
                f"({relative_change(1 - u['hallucination_rate'] / control['hallucination_rate'])}; draws "
                f"{', '.join(relative_change(r) for r in reductions)}), Mis {control['miscalibration_tv_eps']:.3f} "
                f"→ {u['miscalibration_tv_eps']:.3f}, recall {control['recall_seen']:.3f} → {u['recall_seen']:.3f}.",
                1 - u["hallucination_rate"] / control["hallucination_rate"], [min(reductions), max(reductions)],
                sign(u["hallucination_rate"] - control["hallucination_rate"]), why is None, why))
        mixed = upweighting[1: 1 + n_shares]
        changes = [m - control["miscalibration_tv_eps"] for u in mixed for m in u["miscalibration_tv_eps_draws"]]
        mean = float(np.mean(changes))
        sides = {sign(c) for c in changes}
        why = None if len(changes) >= 2 and len(sides) == 1 else (
            "the mixed conditions' draws move Mis both ways: " + ", ".join(f"{c:+.3f}" for c in changes))
        out.append(headline(
            "upweighting_raises_miscalibration",
            f"Those mixed conditions change the miscalibration Mis by {mean:+.3f} on average (draws "
            + ", ".join(f"{c:+.3f}" for c in changes) + ").", mean, [min(changes), max(changes)], sign(mean),
            why is None, why))

    # The singleton-rate variant: its finite-N term swamps it at these sizes.
    singleton = results.get("singleton") or {}
    if singleton:
        why = None if singleton["bound_rhs"] > 0 else (
            f"vacuous at N = {singleton['n_train']:,}: the finite-N term (35 + 6 ln N)/√N = "
            f"{singleton['finite_n_term']:.2f} makes the right side {singleton['bound_rhs']:+.3f}; without it the "
            f"margin is {singleton['margin_without_finite_n']:+.3f}")
        out.append(headline(
            "singleton_bound", f"The singleton-rate bound (Kalai et al. 2025) holds with margin {singleton['margin']:+.3f}.",
            singleton["margin"], None, bool(singleton["margin"] >= 0), why is None, why))
    return out



def figures(out: Path, sweep: list[dict[str, Any]], runs: list[SweepRun], upweighting: list[dict[str, Any]],
            cfg: Config) -> None:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    # g(H) against the monofact rate, one line per checkpoint.
    fig = go.Figure()
    order = sorted(range(len(sweep)), key=lambda i: sweep[i]["monofact_rate"])
    labels = [f"epoch {e}" for e in cfg.epochs] + ["optimum"]
    for label in labels:
        xs = [sweep[i]["monofact_rate"] for i in order]
        ys = [next(c["hallucination_rate"] for c in sweep[i]["checkpoints"] if c["checkpoint"] == label) for i in order]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=label,
                                 text=[f"γ = {sweep[i]['gamma']}" for i in order]))
    fig.update_layout(title="Hallucination rate g(H) against the monofact rate (exact enumeration)",
                      xaxis_title="monofact rate MF (measured)", yaxis_title="g(H)")
    save_figure(fig, out, "hallucination_vs_monofact")

    # Both sides of the bound at every checkpoint: points above the diagonal satisfy it.
    fig = go.Figure()
    for delta in DELTAS:
        xs, ys, texts = [], [], []
        for s in sweep:
            for c in s["checkpoints"]:
                xs.append(c[f"bound_rhs_delta_{_key(delta)}"])
                ys.append(c["hallucination_rate"])
                texts.append(f"γ = {s['gamma']}, {c['checkpoint']}")
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name=f"δ = {delta}", text=texts))
    lo = min(min(t.x) for t in fig.data)
    fig.add_trace(go.Scatter(x=[lo, 1], y=[lo, 1], mode="lines", name="g(H) = right side",
                             line=dict(dash="dash", color="gray")))
    fig.update_layout(title="Kalai–Vempala bound: g(H) against MF − Mis − 3e^(−s)/δ − √(6 ln(6/δ)/n)",
                      xaxis_title="right side", yaxis_title="g(H) (left side)")
    save_figure(fig, out, "bound")

    # Training: held-out NLL per epoch, and g(H), recall and miscalibration at each checkpoint.
    fig = make_subplots(rows=1, cols=3, subplot_titles=("held-out NLL (nats/document)", "g(H)", "Mis (ε bins)"))
    for run, s in zip(runs, sweep):
        name = f"γ = {s['gamma']} (MF {s['monofact_rate']:.3f})"
        fig.add_trace(go.Scatter(x=[h["epoch"] for h in run.heldout], y=[h["heldout_nll"] for h in run.heldout],
                                 name=name, legendgroup=name), row=1, col=1)
        points = [c for c in s["checkpoints"] if c["checkpoint"] != "optimum"]
        for col, key in ((2, "hallucination_rate"), (3, "miscalibration_tv_eps")):
            fig.add_trace(go.Scatter(x=[c["epoch"] for c in points], y=[c[key] for c in points], name=name,
                                     legendgroup=name, showlegend=False), row=1, col=col)
    fig.update_xaxes(type="log", title_text="epoch")
    save_figure(fig, out, "training")

    if upweighting:
        fig = make_subplots(rows=1, cols=3, subplot_titles=("g(H)", "Mis (ε bins)", "recall on seen facts"))
        names = [u["condition"] for u in upweighting]
        for col, key in ((1, "hallucination_rate"), (2, "miscalibration_tv_eps"), (3, "recall_seen")):
            errors = {"type": "data", "array": [u["hallucination_rate_se"] for u in upweighting]} if col == 1 else None
            fig.add_trace(go.Bar(x=names, y=[u[key] for u in upweighting], error_y=errors, showlegend=False),
                          row=1, col=col)
        fig.update_layout(title=f"Selective upweighting at γ = {cfg.upweight_gamma}, matched compute: mean of "
                                f"{cfg.upweight_draws} draws of the repeated blocks (g(H) ± 1 SE)")
        save_figure(fig, out, "upweighting")

    # Calibration per ε-bin at the held-out optimum of each γ.
    fig = go.Figure()
    for run, s in zip(runs, sweep):
        rows = [b for b in run.bins if b["checkpoint"] == "optimum" and b["scheme"] == "eps"]
        fig.add_trace(go.Scatter(x=[b["g_mass"] for b in rows], y=[b["p_mass"] for b in rows], mode="markers",
                                 name=f"γ = {s['gamma']}", text=[f"bin {b['bin']}, |B| = {b['n_factoids']}"
                                                                  for b in rows]))
    fig.add_trace(go.Scatter(x=[1e-6, 1], y=[1e-6, 1], mode="lines", name="p(B) = g(B)",
                             line=dict(dash="dash", color="gray")))
    fig.update_layout(title="Per ε-bin mass at the held-out optimum: p(B) against g(B)",
                      xaxis=dict(type="log", title="g(B)"), yaxis=dict(type="log", title="p(B)"))
    save_figure(fig, out, "calibration_bins")


# --------------------------------------------------------------------------------------------
# The experiment
# --------------------------------------------------------------------------------------------
def run(cfg: Config, out: Path) -> dict:
    """The sweep, upweighting and singleton variant; tables and figures into `out`; results.json's dict."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    timing: dict[str, float] = {}
    start = time.perf_counter()
    with torch_threads(cfg.threads), tempfile.TemporaryDirectory(prefix="hallucination-") as tmp:
        # Every γ trains alone, and every upweighting condition from the optimum of upweight_gamma's run (its
        # own run when that γ is not swept): cfg.workers processes share them out, results independent of it.
        tasks = [(sweep_gamma, cfg, gamma, Path(tmp) / f"gamma-{gamma}") for gamma in cfg.gammas]
        if cfg.upweight_gamma in cfg.gammas:
            base_index = cfg.gammas.index(cfg.upweight_gamma)
        else:
            base_index = len(tasks)
            tasks.append((sweep_gamma, dataclasses.replace(cfg, epochs=(cfg.epochs[-1],)), cfg.upweight_gamma,
                          Path(tmp) / "upweight-base"))
        done = run_tasks(tasks, workers=cfg.workers, then={base_index: lambda base: upweighting_tasks(cfg, base)},
                         threads=cfg.threads)
    runs, base, upweighting_draws = done[:len(cfg.gammas)], done[base_index], done[len(tasks):]
    for gamma, r in zip(cfg.gammas, runs):
        timing[f"sweep_gamma_{gamma}_s"] = r.seconds
    timing["upweighting_s"] = sum(row.pop("seconds") for row in upweighting_draws) + (
        base.seconds if base_index == len(cfg.gammas) else 0.0)
    upweighting = summarise_upweighting(upweighting_draws)

    sweep = []
    for gamma, r in zip(cfg.gammas, runs):
        world = r.setting.world
        sweep.append({"gamma": gamma, "monofact_rate": monofact_rate(world.train_counts),
                      "missing_mass": missing_mass(world.p, world.train_counts),
                      "n_distinct_facts_seen": int((world.train_counts > 0).sum()),
                      "max_fact_probability": float(world.p.max()),
                      "max_fact_probability_flagged": bool(world.p.max() >= MAX_FACT_PROBABILITY_FLAG),
                      "heldout_optimum_epoch": r.optimum_epoch, "heldout": r.heldout,
                      "checkpoints": r.checkpoints})
    setting = runs[0].setting
    world = setting.world
    n_hall = setting.n_factoids - len(world.facts)
    optimum = next(s for s in base.singleton if s["checkpoint"] == "optimum")
    results = {
        "world": {"n_facts": len(world.facts), "n_factoids": setting.n_factoids, "n_train": cfg.n_train,
                  "n_hallucinations": n_hall, "n_persons": cfg.n_persons, "n_first_names": cfg.n_first_names,
                  "n_last_names": cfg.n_last_names, "n_name_pairs": cfg.n_first_names * cfg.n_last_names,
                  "attribute": cfg.attribute, "n_values": setting.shape[2],
                  "facts_per_hallucination": len(world.facts) / n_hall,
                  "kv_term_delta_0_01": 3 * len(world.facts) / n_hall / 0.01,
                  "document": f"<bos> First Last {cfg.attribute} " + " ".join(
                      f"v{t + 1}" for t in range(setting.value_ids.shape[1])), "n_heldout": cfg.n_heldout,
                  "d_vocab": setting.tokenizer.get_vocab_size()},
        "sweep": sweep,
        "upweighting": upweighting,
        "singleton": {"gamma": cfg.upweight_gamma, "checkpoint": "optimum", "epoch": base.optimum_epoch,
                      **{k: v for k, v in optimum.items() if k not in ("checkpoint", "epoch")},
                      "note": f"prompt = a person's 'First Last {cfg.attribute}', answer = the value; μ = p. Prompts are "
                              "facts here, so the singleton rate equals the monofact rate."},
    }
    results["acceptance"] = acceptance(sweep, upweighting, cfg)
    results["config"] = {"upweight_shares": list(cfg.upweight_shares), "gammas": list(cfg.gammas),
                         "epochs": list(cfg.epochs), "max_fact_probability_flag": MAX_FACT_PROBABILITY_FLAG}
    results["headlines"] = headlines(results)

    save_table([{"gamma": s["gamma"], "monofact_rate": s["monofact_rate"], **{k: v for k, v in c.items()
                                                                               if k != "malformed_by_position"}}
                for s in sweep for c in s["checkpoints"]], out, "checkpoints")
    save_table([{"gamma": g, **b} for g, r in zip(cfg.gammas, runs) for b in r.bins], out, "calibration_bins")
    save_table([{"gamma": g, **h} for g, r in zip(cfg.gammas, runs) for h in r.heldout], out, "heldout")
    save_table([{"gamma": g, **s} for g, r in zip(cfg.gammas, runs) for s in r.singleton], out, "singleton")
    save_table([{k: v for k, v in u.items() if k != "malformed_by_position"} for u in upweighting_draws], out,
               "upweighting")
    counts_rows = []
    for gamma, r in zip(cfg.gammas, runs):
        w = r.setting.world
        for index, fact in enumerate(w.facts):
            person = w.persons[fact.person_index]
            counts_rows.append({"gamma": gamma, "fact": index, "first": person.first, "last": person.last,
                                "value": fact.value, "p": float(w.p[index]), "count": int(w.train_counts[index])})
    save_table(counts_rows, out, "train_counts")
    figures(out, sweep, runs, upweighting, cfg)
    # Each part's own time (in its worker), and the run's wall time: with workers > 1 the parts overlap.
    timing["total_s"] = time.perf_counter() - start
    results["timing"] = timing
    return results
