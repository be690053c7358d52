"""Catch hallucinations while they are generated (issue 22): per-token risk signals read during KV-cached decoding
(`lab.analysis.monitor`), judged against the known truth of a fact world, and abstention that keeps its promise.

The world (`lab.data.facts.FactWorld`, one arbitrary birthday "Month day" per person, Pareto popularity, i.i.d.
statements "<bos> First Last birthday Month day . <eos>" drawn with replacement) and three kinds of subject:
*seen* persons (in at least one training statement), *unseen* real persons (in none: their true value cannot be
known, SCIENCE.md §2) and *invented* name pairs (a first and a last name of the world that form no person: every
value is false). The model — trained here, into the run folder — is prompted "<bos> First Last birthday" and
generates the value greedily (2 tokens) with the monitor on. The claim is false when the generated value is not the
subject's true value. Error kinds: a wrong value for a seen person, any false value for an unseen person, any value
for an invented person.

Subjects are split three ways, disjoint (no person or name pair on two sides): *fit* trains the two readouts and
chooses each signal's sign, *calibration* chooses the abstention thresholds, *test* reports everything.

Signals, each turned into a claim risk by `lab.analysis.monitor.claim_risk` (the riskiest of the answer's tokens,
risk = sign · value): max_prob, entropy, margin, lens_kl (middle layer against the last), subject_attention (the
upper half's attention mass on the two name tokens), probe (a logistic probe on the middle layer's residual stream at
every answer token, label "this claim is false", fitted on the fit split's persons), p_ik (a logistic probe at the
last name token of the last block's residual stream, label "the claim is right" — the P(IK) readout of the
calibration experiment, Kadavath et al. 2022), and the sampling baselines over the value slot: self_consistency
(the share of k answers sampled at T = 1 equal to the greedy one, Wang et al. 2023) and semantic_entropy (the
discrete semantic entropy of Farquhar et al. 2024 over the k answers). The sign of each signal is the one whose
AUROC on the fit split is ≥ ½ (the a priori sign, `RISK_SIGN`, is recorded beside it).

On the test split, per signal: AUROC for "the claim is false" with a stratified bootstrap 95% interval
(`lab.metrics.calibration.auroc_ci`, n_pos / n_neg beside it), per error kind (that kind's false claims against
every right one), the risk–coverage curve, AURC, the oracle's AURC* and E-AURC = AURC − AURC*
(`lab.metrics.selective`). Abstention, for each α in `alphas`:

* split conformal risk control (Angelopoulos et al. 2022, arXiv 2208.02814) with the loss
  L_i(λ) = 1{answered at λ and false}, B = 1: λ̂ = the largest λ with (n/(n+1))·R̂_n(λ) + 1/(n+1) ≤ α on the
  calibration split. It promises E[P(answered and false)] ≤ α — the *joint* rate; the error rate among answered
  prompts is not monotone in λ, and CRC promises nothing about it.
* Learn then Test (Angelopoulos et al. 2021, arXiv 2110.01052) on a grid fixed from the fit split's risks, at
  δ = `ltt_delta`: with probability ≥ 1 − δ the error rate *among answered prompts* is ≤ α.
On the test split: coverage, the joint rate and the rate among answered, each with Wilson's 95% interval.

`--model PATH --qa FILE`: the monitor on a local Hugging Face causal LM or a Forma model with a question–answer CSV
(question, answer; a header row is skipped), prompted "Question: … / Answer:", the answer being the greedy
continuation up to its first line break, scored by exact match (case and surrounding spaces and full stops aside).
The questions are drawn into fit / calibration / test as the subjects are. Signals: the output ones; with a
HookedTransformer also lens_kl, the probe (the middle layer's residual stream at every answer token, label "this
answer is false") and P(IK) (the last block's residual stream at the last prompt token, label "this answer is
right"); and the sampling baselines, k answers per question drawn at T = 1 (seeded, KV-cached `lab.generate.decode`
for a HookedTransformer), each cut and normalised like the greedy one: self_consistency (the share equal to the
greedy answer) and semantic_entropy (over the classes of equal normalised answers). subject_attention is
unavailable: a question marks no subject. The probe and P(IK) are cross-fitted (`lab.analysis.probes.
cross_fit_probe`): the questions are dealt into `qa_folds` folds at random (the seed), regardless of their answers,
and each fold is scored by the readout fitted on the others, so every question's score comes from a readout that
never saw it. Over that random deal every question is treated alike, so the scores of calibration and test
questions stay exchangeable — what conformal risk control assumes (for one fixed deal, only approximately); Learn
then Test's binomial p-values further assume the calibration errors independent given the score, which readouts
fitted on each other's questions only approximate. A fold fitted on fewer than
MIN_PER_CLASS questions of either class (right, false) leaves the readout unavailable, the reason in words. CRC and
LTT are scored at each α whose calibration split can let both answer anything (CRC: n ≥ ⌈1/α⌉ − 1; LTT:
n ≥ ⌈ln δ / ln(1 − α)⌉); the other α are listed in `abstention_unavailable` with the reason. results.json's
`unavailable` names every signal not scored and why.

`headlines(results)` states what the run supports; a direction that the quick profile must share.

Artefacts in `out`: prompts.parquet (one row per subject: kind, split, generated and true value, false or not, every
signal's claim risk), curves.parquet (the test split's risk–coverage curve per signal), model/ (the trained model
and tokenizer, which the dashboard generates with), readouts.safetensors (the probe and P(IK) weights), and plotly
figures (AUROC by signal and error kind, risk–coverage curves, abstention by α).
"""

import csv
import logging
import math
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from lab.analysis.monitor import (RISK_SIGN, LinearReadout, Monitor, answer_lengths, claim_risk,
                                  sample_continuations)
from lab.analysis.probes import cross_fit_probe, fit_probe
from lab.configs import apply_quick, check_fields, need, torch_threads
from lab.data.facts import Fact, FactWorld, FactWorldConfig
from lab.files import atomic_write
from lab.metrics.calibration import MIN_PER_CLASS, auroc, auroc_ci
from lab.metrics.selective import (aurc, crc_min_calibration, crc_threshold, discrete_semantic_entropy, ltt_grid,
                                   ltt_min_answered, ltt_threshold, optimal_aurc, risk_coverage, selective_outcome)
from lab.model import HookedTransformer, ModelConfig
from lab.runs import headline, save_figure, save_table
from lab.tokenize import word_level
from lab.train import SequenceBatches, TrainConfig, train

logger = logging.getLogger(__name__)

KINDS = ("seen", "unseen", "invented")
ERROR_KINDS = {"seen": "wrong value for a seen person", "unseen": "value for an unseen person",
               "invented": "value for an invented person"}
SPLITS = ("fit", "calibration", "test")
SUBJECT = [1, 2]  # "<bos> First Last birthday": the name's two tokens
ATTRIBUTE = "birthday"
READOUT_FILE = "readouts.safetensors"
TRAINED = ("probe", "p_ik")
ABSTENTION_SIGNAL = "max_prob"  # the model's own confidence: the abstention rules' signal in the headlines
QUICK = dict(n_first_names=40, n_last_names=80, n_persons=600, n_train=1200, n_invented=300, d_model=64,
             n_layers=4, steps=350, n_boot=200, k_samples=6,
             n_resplits=100)


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------
@dataclass
class Config:
    """The monitor experiment; `quick` swaps in a smaller world, model and bootstrap (QUICK) for every field left at
    its default. `model` + `qa`: the signals of a local model on a question–answer CSV instead."""

    seed: int = 0
    quick: bool = False
    model: str | None = None  # a local HF folder (with its tokenizer), a zoo name or a Forma folder; needs `qa`
    qa: str | None = None  # a question–answer CSV
    # the world: Pareto(2) popularity and 2 draws per person leave ≈30% of the persons unseen
    n_first_names: int = 100
    n_last_names: int = 200
    n_persons: int = 1000
    n_train: int = 2000
    pareto_gamma: float = 2.0
    n_invented: int = 500  # name pairs that are no person
    # the model and its training: short enough that persons seen once are only partly recalled
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    steps: int = 300
    batch_size: int = 64
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 50
    # measurement
    split_fractions: tuple[float, float, float] = (0.4, 0.3, 0.3)  # fit, calibration, test (subjects)
    k_samples: int = 10  # answers sampled at T = 1 for self-consistency and semantic entropy
    alphas: tuple[float, ...] = (0.05, 0.1, 0.2)
    ltt_delta: float = 0.1
    n_boot: int = 1000
    n_resplits: int = 200  # random re-draws of the calibration / test subjects for the abstention rules' averages
    qa_max_new_tokens: int = 16
    qa_folds: int = 5  # --qa: the probe and P(IK) are cross-fitted over this many folds of questions
    threads: int = 1  # torch intra-op threads (tiny tensors: more threads cost more than they gain)
    hf_loader: str = "auto"  # --model: "auto" converts GPT-2/LLaMA (lab.hf.load_hf), bridges the rest; "bridge" always

    def __post_init__(self) -> None:
        check_fields(self)
        if self.quick:
            apply_quick(self, QUICK)

        need(self, self.seed >= 0, f"seed must be a non-negative integer, got {self.seed!r}")
        for name in ("n_first_names", "n_last_names", "n_persons", "n_train", "n_invented", "d_model", "n_layers",
                     "n_heads", "steps", "batch_size", "k_samples", "n_boot", "qa_max_new_tokens", "threads", "n_resplits",
                     "qa_folds"):
            need(self, getattr(self, name) > 0, f"{name} must be a positive integer, got {getattr(self, name)!r}")
        need(self, self.qa_folds >= 2, f"qa_folds must be at least 2 (cross-fitting), got {self.qa_folds}")
        need(self, self.n_layers >= 2,
             f"n_layers must be at least 2 (a middle layer before the last), got {self.n_layers}")
        need(self, self.n_persons + self.n_invented <= self.n_first_names * self.n_last_names,
             "n_persons + n_invented must fit in the first × last name grid")
        need(self, 0 <= self.warmup_steps <= self.steps,
             f"warmup_steps must lie in [0, steps], got {self.warmup_steps!r}")
        need(self, 0 < self.min_lr <= self.lr, "need 0 < min_lr ≤ lr")
        need(self, self.pareto_gamma > 0, "pareto_gamma must be > 0")
        need(self, self.d_model % self.n_heads == 0, "d_model must be a multiple of n_heads")
        need(self, all(f > 0 for f in self.split_fractions) and abs(sum(self.split_fractions) - 1) < 1e-9,
             f"split_fractions (fit, calibration, test) must be positive and sum to 1, got {self.split_fractions}")
        need(self, len(self.alphas) > 0 and all(0 < a < 1 for a in self.alphas),
             f"alphas must lie in (0, 1), got {self.alphas}")
        need(self, 0 < self.ltt_delta < 1, f"ltt_delta must lie in (0, 1), got {self.ltt_delta!r}")
        need(self, self.hf_loader in ("auto", "bridge"),
             f"hf_loader must be 'auto' or 'bridge', got {self.hf_loader!r}")
        need(self, (self.model is None) == (self.qa is None),
             "--model and --qa go together: the monitor's signals on a local model with a question–answer CSV "
             "(the synthetic experiment trains its own model)")


# --------------------------------------------------------------------------------------------
# The world, the subjects and the model
# --------------------------------------------------------------------------------------------
@dataclass
class Setting:
    """The world, its tokenizer, and one row per subject: its name, kind, split and true value (None: invented)."""

    world: FactWorld
    tokenizer: Any
    subjects: pd.DataFrame  # first, last, kind, person (−1 invented), exposure, split, truth
    train_rows: Tensor
    heldout_rows: Tensor

    @property
    def prompts(self) -> Tensor:
        """"<bos> First Last birthday" for every subject, [n_subjects, 4]."""
        texts = [f"<bos> {f} {l} {ATTRIBUTE}" for f, l in zip(self.subjects["first"], self.subjects["last"])]
        return torch.tensor([e.ids for e in self.tokenizer.encode_batch(texts)], dtype=torch.long)

    @property
    def value_len(self) -> int:
        return len(self.world.value_spaces[ATTRIBUTE][0].split())


def make_setting(cfg: Config) -> Setting:
    world = FactWorld(FactWorldConfig(n_first_names=cfg.n_first_names, n_last_names=cfg.n_last_names,
                                      n_persons=cfg.n_persons, attributes=(ATTRIBUTE,), pareto_gamma=cfg.pareto_gamma,
                                      n_train=cfg.n_train, seed=cfg.seed))
    tokenizer = word_level(world.word_vocabulary())
    exposure = world.train_counts  # one attribute: a fact's training count is its person's exposure
    taken = {(p.first, p.last) for p in world.persons}
    rng = np.random.default_rng([cfg.seed, 22])
    invented: list[tuple[str, str]] = []
    for flat in rng.permutation(len(world.first_names) * len(world.last_names)):
        pair = (world.first_names[flat // len(world.last_names)], world.last_names[flat % len(world.last_names)])
        if pair not in taken:
            invented.append(pair)
            if len(invented) == cfg.n_invented:
                break
    rows = [{"first": p.first, "last": p.last, "kind": "seen" if exposure[i] > 0 else "unseen", "person": i,
             "exposure": int(exposure[i]), "truth": world.true_value(i, ATTRIBUTE)}
            for i, p in enumerate(world.persons)]
    rows += [{"first": f, "last": l, "kind": "invented", "person": -1, "exposure": 0, "truth": None}
             for f, l in invented]
    subjects = pd.DataFrame(rows)
    # Each subject on one side only: fit, calibration or test, drawn independently of its kind.
    cuts = np.cumsum(cfg.split_fractions)[:-1]
    draw = np.random.default_rng([cfg.seed, 23]).random(len(subjects))
    subjects["split"] = np.array(SPLITS)[np.searchsorted(cuts, draw, side="right")]

    def encode(indices: np.ndarray) -> Tensor:
        texts = [f"<bos> {world.render(world.facts[i], 'bare')} <eos>" for i in indices]
        return torch.tensor([e.ids for e in tokenizer.encode_batch(texts)], dtype=torch.long)

    heldout = world.heldout_fact_indices(max(200, cfg.n_train // 4))  # fresh draws, never training examples
    return Setting(world, tokenizer, subjects, encode(world.train_fact_indices), encode(heldout))


def train_model(cfg: Config, setting: Setting) -> tuple[HookedTransformer, dict[str, Any]]:
    model_cfg = ModelConfig(d_vocab=setting.tokenizer.get_vocab_size(), d_model=cfg.d_model, n_layers=cfg.n_layers,
                            n_heads=cfg.n_heads, n_ctx=setting.train_rows.shape[1], positions="learned", mlp="gelu",
                            tokenizer="facts-word-level")
    model = HookedTransformer(model_cfg, seed=cfg.seed, tokenizer=setting.tokenizer)
    train_cfg = TrainConfig(steps=cfg.steps, batch_size=cfg.batch_size, seq_len=setting.train_rows.shape[1],
                            lr=cfg.lr, min_lr=cfg.min_lr, warmup_steps=cfg.warmup_steps, eval_interval=cfg.steps,
                            eval_batches=1, checkpoint_every_s=0.0, seed=cfg.seed)
    with tempfile.TemporaryDirectory(prefix="monitor-") as tmp:
        result = train(model, train_cfg, SequenceBatches(setting.train_rows, setting.heldout_rows), Path(tmp),
                       progress=False)
    return model.eval(), {"steps": cfg.steps, "batch_size": cfg.batch_size, "n_params": model_cfg.n_params(),
                          "train_loss_nats": result.train_loss_nats, "heldout_loss_nats": result.best_val_loss_nats,
                          "train_s": result.elapsed_s}


# --------------------------------------------------------------------------------------------
# Reading the signals
# --------------------------------------------------------------------------------------------
def _chunks(n: int, size: int = 512) -> list[slice]:
    return [slice(start, min(n, start + size)) for start in range(0, n, size)]


def monitored(monitor: Monitor, prompts: Tensor, n_new: int) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]:
    """Greedy generation of every prompt with the monitor on, in chunks: the new tokens, the token signals
    [n, n_new] and the prompt signals [n]."""
    tokens, signals, prompt_signals = [], {}, {}
    for part in _chunks(len(prompts)):
        out = monitor.generate(prompts[part], n_new, subject=SUBJECT if monitor.attention else None)
        tokens.append(out.new_tokens)
        for name, value in out.signals.items():
            signals.setdefault(name, []).append(value)
        for name, value in out.prompt_signals.items():
            prompt_signals.setdefault(name, []).append(value)
    return (torch.cat(tokens), {k: torch.cat(v) for k, v in signals.items()},
            {k: torch.cat(v) for k, v in prompt_signals.items()})


@torch.inference_mode()
def residuals(model: HookedTransformer, tokens: Tensor, hooks: list[str]) -> dict[str, Tensor]:
    """The residual stream of the named hooks over whole sequences (prompt + answer), [n, pos, d_model]."""
    out: dict[str, list[Tensor]] = {h: [] for h in hooks}
    for part in _chunks(len(tokens)):
        _, cache = model.run_with_cache(tokens[part], names_filter=hooks)
        for h in hooks:
            out[h].append(cache[h].float())
    return {h: torch.cat(v) for h, v in out.items()}


def fit_readouts(model: HookedTransformer, tokens: Tensor, prompt_len: int, n_new: int, false: np.ndarray,
                 groups: np.ndarray, seed: int) -> tuple[LinearReadout | None, LinearReadout | None, dict[str, Any]]:
    """The probe (middle layer, every answer token, label: the claim is false) and P(IK) (last layer, last name
    token, label: the claim is right), logistic, fitted on these rows only (the fit split's subjects)."""
    middle = max(0, model.cfg.n_layers // 2 - 1)
    middle_hook, last_hook = f"blocks.{middle}.hook_resid_post", f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    info: dict[str, Any] = {}
    if min(int(false.sum()), int((~false).sum())) < MIN_PER_CLASS:
        why = (f"the fit split holds {int(false.sum())} false and {int((~false).sum())} right claims: a readout "
               f"needs at least {MIN_PER_CLASS} of each")
        return None, None, {"probe": why, "p_ik": why}
    acts = residuals(model, tokens, [middle_hook, last_hook])
    produced = list(range(prompt_len - 1, prompt_len - 1 + n_new))  # the positions that produced each answer token
    X = acts[middle_hook][:, produced].reshape(-1, acts[middle_hook].shape[-1])
    y = np.repeat(false, n_new)
    probe_fit = fit_probe(X, y, "logistic", groups=np.repeat(groups, n_new), seed=seed, n_bootstrap=200)
    pik_fit = fit_probe(acts[last_hook][:, SUBJECT[-1]], ~false, "logistic", groups=groups, seed=seed, n_bootstrap=200)
    probe = None if probe_fit.constant else LinearReadout.from_probe(probe_fit, middle_hook)
    p_ik = None if pik_fit.constant else LinearReadout.from_probe(pik_fit, last_hook, position=SUBJECT[-1])
    for name, fitted in (("probe", probe_fit), ("p_ik", pik_fit)):
        info[name] = {"hook": middle_hook if name == "probe" else last_hook,
                      "held_out_auroc_within_fit": fitted.metrics["auroc"].value if "auroc" in fitted.metrics
                      else None, "regularization": fitted.regularization, "constant": fitted.constant}
    return probe, p_ik, info


def claim_risks(series: dict[str, Tensor], values: dict[str, np.ndarray], lengths: Tensor,
                signs: dict[str, int]) -> dict[str, np.ndarray]:
    """Each claim's risk under `signs`: a token signal's riskiest answer token (`claim_risk`), sign · value for a
    signal read once per prompt."""
    risks = {name: claim_risk(s, lengths, signs[name]).numpy() for name, s in series.items()}
    return risks | {name: signs[name] * np.asarray(v, dtype=np.float64) for name, v in values.items()}


def choose_signs(a_priori: dict[str, np.ndarray], false: np.ndarray, fit: np.ndarray) -> dict[str, int]:
    """Each signal's sign: the probe's and P(IK)'s are their labels' (RISK_SIGN); any other signal keeps RISK_SIGN when the claim risk under it (`a_priori`) has AUROC ≥ ½ for a false claim on
    the fit split — or the fit split lacks a class —, the opposite sign otherwise."""
    signs = {}
    for name, risk in a_priori.items():
        if name in TRAINED:  # fitted on the fit split for this label: their AUROC there is not held out
            signs[name] = RISK_SIGN[name]
            continue
        a = auroc(risk[fit], false[fit])
        signs[name] = RISK_SIGN[name] if not math.isfinite(a) or a >= 0.5 else -RISK_SIGN[name]
    return signs


# --------------------------------------------------------------------------------------------
# Judging the signals
# --------------------------------------------------------------------------------------------
def judge(scores: dict[str, np.ndarray], false: np.ndarray, kinds: np.ndarray, split: np.ndarray, signs: dict[str, int],
          cfg: Config, alphas: list[float] | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                                   list[dict[str, Any]]]:
    """On the test split, per signal: AUROC (overall and per error kind), AURC; for each α (`alphas`, default
    cfg.alphas), CRC's and LTT's thresholds from the calibration split applied to the test split. Returns (signals,
    abstention, curve points)."""
    test, calibration, fit = split == "test", split == "calibration", split == "fit"
    rows, abstention, curves = [], [], []
    level = familywise_level(len(scores) + len(KINDS))

    def familywise(risk_: np.ndarray, false_: np.ndarray) -> dict[str, Any]:
        return {"auroc_familywise_ci": auroc_ci(risk_, false_, n_boot=cfg.n_boot, level=level, seed=cfg.seed).interval,
                "auroc_familywise_level": level}

    for name, risk in scores.items():
        s, e = risk[test], false[test]
        row: dict[str, Any] = {"signal": name, "sign": signs[name], "a_priori_sign": RISK_SIGN[name],
                               "n_test": int(test.sum())}
        row |= auroc_ci(s, e, n_boot=cfg.n_boot, seed=cfg.seed).fields("auroc") | familywise(s, e)
        row |= {"aurc": aurc(s, e), "aurc_optimal": optimal_aurc(e), "error_rate": float(e.mean())}
        row["e_aurc"] = row["aurc"] - row["aurc_optimal"]
        by_kind = {}
        for kind in KINDS:
            keep = test & ((kinds == kind) & false | ~false)  # this kind's false claims against every right one
            if (kinds[test] == kind).any():
                by_kind[kind] = {"error": ERROR_KINDS[kind], "n_false": int((keep & false).sum()),
                                 **auroc_ci(risk[keep], false[keep], n_boot=cfg.n_boot, seed=cfg.seed).fields("auroc"),
                                 **familywise(risk[keep], false[keep])}
        row["by_kind"] = by_kind
        rows.append(row)
        curve = risk_coverage(s, e)
        keep_points = np.unique(np.linspace(0, len(curve.coverage) - 1, min(200, len(curve.coverage))).astype(int))
        curves += [{"signal": name, "threshold": float(curve.threshold[i]), "coverage": float(curve.coverage[i]),
                    "risk": float(curve.risk[i])} for i in keep_points]
        for alpha in cfg.alphas if alphas is None else alphas:
            crc = crc_threshold(risk[calibration], false[calibration], alpha)
            grid = ltt_grid(risk[fit], int(calibration.sum()), alpha, cfg.ltt_delta)
            ltt = ltt_threshold(risk[calibration], false[calibration], alpha, cfg.ltt_delta, grid)
            abstention.append({"signal": name, "alpha": alpha, "n_calibration": int(calibration.sum()),
                               "crc": selective_outcome(s, e, crc),
                               "ltt": selective_outcome(s, e, ltt.threshold) | {"delta": cfg.ltt_delta,
                                                                                "n_certified": ltt.n_certified,
                                                                                "n_grid": ltt.n_grid}})
            if name == ABSTENTION_SIGNAL:
                abstention[-1]["resplits"] = resplit(risk, false, split, alpha, cfg, risk[fit])
    return rows, abstention, curves


def resplit(risk: np.ndarray, false: np.ndarray, split: np.ndarray, alpha: float, cfg: Config,
            reference: np.ndarray) -> dict[str, Any]:
    """Both rules over `cfg.n_resplits` random re-draws of which calibration ∪ test subjects calibrate (as many as
    the calibration split holds) and which are scored. CRC promises E[answered and false] ≤ α over the calibration
    draw, so its check is the mean realised joint rate over re-draws (± 1.96 standard errors) — one split's
    Wilson interval leaves out the calibration draw's own spread. LTT promises P(error rate among answered > α) ≤ δ
    for the true rate: the share of re-draws whose realised rate exceeds α, beside δ (realised rates add the test
    split's sampling noise)."""
    pool = np.flatnonzero((split == "calibration") | (split == "test"))
    n_cal = int((split == "calibration").sum())
    rng = np.random.default_rng([cfg.seed, 41, round(alpha * 1e6)])
    grid = ltt_grid(reference, n_cal, alpha, cfg.ltt_delta)
    joint, coverage, selective, ltt_cover, ltt_risk = [], [], [], [], []
    for _ in range(cfg.n_resplits):
        order = rng.permutation(pool)
        cal, test = order[:n_cal], order[n_cal:]
        crc = selective_outcome(risk[test], false[test], crc_threshold(risk[cal], false[cal], alpha))
        joint.append(crc["joint_risk"])
        coverage.append(crc["coverage"])
        if crc["selective_risk"] is not None:
            selective.append(crc["selective_risk"])
        ltt = ltt_threshold(risk[cal], false[cal], alpha, cfg.ltt_delta, grid)
        outcome = selective_outcome(risk[test], false[test], ltt.threshold)
        ltt_cover.append(outcome["coverage"])
        if outcome["selective_risk"] is not None:
            ltt_risk.append(outcome["selective_risk"])

    def mean_ci(values: list[float]) -> tuple[float | None, list[float] | None]:
        if not values:
            return None, None
        m, se = float(np.mean(values)), float(np.std(values, ddof=1) / math.sqrt(len(values))) if len(values) > 1 \
            else 0.0
        return m, [m - 1.96 * se, m + 1.96 * se]

    out: dict[str, Any] = {"n_resplits": cfg.n_resplits, "n_calibration": n_cal, "n_test": len(pool) - n_cal}
    for key, values in (("crc_joint_risk", joint), ("crc_coverage", coverage), ("crc_selective_risk", selective),
                        ("ltt_coverage", ltt_cover), ("ltt_selective_risk", ltt_risk)):
        out[key], out[f"{key}_ci95"] = mean_ci(values)
    out["ltt_n_answering"] = len(ltt_risk)
    # a draw that answers nothing takes no risk: it counts as keeping the promise
    out["ltt_share_above_alpha"] = float(np.sum([r > alpha for r in ltt_risk]) / cfg.n_resplits)
    return out


# --------------------------------------------------------------------------------------------
# Headlines
# --------------------------------------------------------------------------------------------
def familywise_level(n_claims: int, alpha: float = 0.05) -> float:
    """The confidence level at which `n_claims` intervals hold together with probability ≥ 1 − alpha (Bonferroni):
    the run makes one separation claim per signal and one per error kind, and with a dozen 95% intervals one
    would exclude ½ by chance about half the time."""
    return 1 - alpha / n_claims


def _auroc_headline(name: str, what: str, block: dict[str, Any], sign: int) -> dict[str, Any]:
    """Whether a signal separates false claims from right ones: supported when its familywise interval (every
    separation claim of the run at once, `familywise_level`) excludes ½. The direction is which way the signal's
    raw value points to a false claim (sign · (AUROC > ½))."""
    value, interval = block.get("auroc"), block.get("auroc_ci95")
    joint, level = block.get("auroc_familywise_ci"), block.get("auroc_familywise_level")
    counts = f"{block.get('auroc_n_pos')} false and {block.get('auroc_n_neg')} right claims"
    claim = f"{what} separates false claims from right ones."  # shown only when supported
    if value is None or not math.isfinite(value):
        return headline(name, claim, None, None, 0, False, f"{what}: no AUROC ({counts} on the test split)")
    if interval is None or joint is None or any(not math.isfinite(x) for x in (*interval, *joint)):
        why = block.get("auroc_why_no_interval") or "no familywise interval (the run was made before Forma computed one)"
        return headline(name, claim, value, None, 0, False, f"{what}: {why}")
    text = (f"AUROC {value:.3f}, 95% [{interval[0]:.3f}, {interval[1]:.3f}], {level:.1%} familywise "
            f"[{joint[0]:.3f}, {joint[1]:.3f}], {counts} on the test split")
    if joint[0] <= 0.5 <= joint[1]:
        return headline(name, claim, value, joint, 0, False,
                         f"{what}: the familywise interval straddles ½ ({text}), so no direction is shown")
    points = sign if value > 0.5 else -sign
    return headline(name, f"{what} {'rises' if points > 0 else 'falls'} with the risk of a false claim ({text}).",
                     value, joint, points)


def headlines(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's headlines, a pure function of the rest of results.json: {name, sentence, value, interval, direction,
    supported, why_not}; `direction` is what the quick profile must share with the default one."""
    out = []
    signals = {row["signal"]: row for row in results["signals"]}
    for name, row in signals.items():
        out.append(_auroc_headline(f"{name}_separates", f"The signal {name}", row, row["sign"]))
    own = signals.get("max_prob")
    if own:
        for kind, block in own["by_kind"].items():
            out.append(_auroc_headline(f"max_prob_separates_{kind}", f"max_prob, against the {ERROR_KINDS[kind]}",
                                       block, own["sign"]))
    for entry in results["abstention"]:
        if entry["signal"] != results["abstention_signal"]:
            continue
        alpha, crc, ltt, again = entry["alpha"], entry["crc"], entry["ltt"], entry["resplits"]
        mean, band = again["crc_joint_risk"], again["crc_joint_risk_ci95"]
        out.append(headline(
            f"crc_keeps_joint_risk_alpha_{alpha:g}",
            f"Conformal risk control at α = {alpha:g} on {entry['signal']}, over {again['n_resplits']} draws of the "
            f"calibration subjects: answered and false {mean:.3f} [{band[0]:.3f}, {band[1]:.3f}] of the test prompts "
            f"({'within' if band[0] <= alpha else 'above'} α) at coverage {again['crc_coverage']:.0%}; the error "
            f"rate among those answers is {again['crc_selective_risk'] or 0:.3f} (CRC promises nothing about it).",
            mean, band, bool(band[0] <= alpha)))
        if not again["ltt_n_answering"]:
            out.append(headline(f"ltt_keeps_selective_risk_alpha_{alpha:g}",
                                 f"Learn then Test keeps the error rate among answers at α = {alpha:g}.", None, None,
                                 0, False,
                                 f"Learn then Test certified no threshold at α = {alpha:g} (δ = {ltt['delta']:g}) in "
                                 f"any of {again['n_resplits']} draws of the calibration subjects: even the most "
                                 f"confident answers are false more often than α, so nothing is answered"))
            continue
        share, delta, n = again["ltt_share_above_alpha"], ltt["delta"], again["n_resplits"]
        slack = 3 * math.sqrt(delta * (1 - delta) / n)  # three binomial standard errors of a share of n draws
        out.append(headline(
            f"ltt_keeps_selective_risk_alpha_{alpha:g}",
            f"Learn then Test at α = {alpha:g}, δ = {delta:g} answers in {again['ltt_n_answering']} of {n} draws of "
            f"the calibration subjects (mean coverage {again['ltt_coverage']:.0%}); the error rate among its test "
            f"answers exceeds α in {share:.0%} of the draws ({'within' if share <= delta + slack else 'beyond'} "
            f"δ + {slack:.2f}).", share, None, bool(share <= delta + slack)))
    for entry in results.get("abstention_unavailable", []):  # too few calibration prompts for that α
        out.append(headline(f"abstention_alpha_{entry['alpha']:g}",
                             f"Abstention keeps its promise at α = {entry['alpha']:g}.", None, None, 0, False,
                             f"No abstention rule is scored at α = {entry['alpha']:g}: {entry['why_not']}"))
    return out


# --------------------------------------------------------------------------------------------
# The experiment
# --------------------------------------------------------------------------------------------
def run(cfg: Config, out: Path) -> dict[str, Any]:
    """The synthetic experiment (or, with cfg.model, the signals of a local model on cfg.qa); tables and figures
    into `out`; returns results.json's dict."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with torch_threads(cfg.threads):
        if cfg.model is not None:
            return run_qa(cfg, out)
        return run_synthetic(cfg, out)


def value_strings(setting: Setting, new_tokens: Tensor) -> list[str]:
    vocab = setting.tokenizer
    return [" ".join(vocab.id_to_token(int(t)) for t in row) for row in new_tokens]


def sampling_risks(model: Any, batches: list[Tensor], answers: list[str], answer_of: Any, k: int, n_new: int,
                   seed: int, eos_token_id: int | None = None) -> dict[str, np.ndarray]:
    """Self-consistency and semantic entropy over k answers sampled at T = 1 (risk values before any sign): the
    prompts come in `batches` (rows of one length each), `answer_of` turns a sampled row of new tokens into the
    answer compared with `answers` (the greedy ones) and with the other samples. Each batch is seeded with `seed`
    plus the number of prompts before it."""
    from lab.metrics.selective import answer_agreement

    agreement, entropy, start = [], [], 0
    for batch in batches:
        samples = sample_continuations(model, batch, k, n_new, seed=seed + start, eos_token_id=eos_token_id)
        for row, answer in zip(samples, answers[start:start + len(batch)]):
            texts = [answer_of(s.tolist()) for s in row]
            agreement.append(answer_agreement(texts, answer))
            entropy.append(discrete_semantic_entropy(texts))
        start += len(batch)
    return {"self_consistency": np.array(agreement), "semantic_entropy": np.array(entropy)}


def run_synthetic(cfg: Config, out: Path) -> dict[str, Any]:
    timing: dict[str, float] = {}
    began = time.perf_counter()
    setting = make_setting(cfg)
    model, training = train_model(cfg, setting)
    timing["train_s"] = time.perf_counter() - began
    subjects, prompts, n_new = setting.subjects, setting.prompts, setting.value_len
    split, kinds = subjects["split"].to_numpy(), subjects["kind"].to_numpy()
    groups = np.arange(len(subjects))  # one prompt per subject: a row is its own group

    began = time.perf_counter()
    fit = split == "fit"
    first, _, _ = monitored(Monitor(model), prompts[fit], n_new)
    answers_fit = value_strings(setting, first)
    false_fit = np.array([a != t for a, t in zip(answers_fit, subjects["truth"][fit])])
    probe, p_ik, readout_info = fit_readouts(model, torch.cat([prompts[fit], first], 1), prompts.shape[1], n_new,
                                             false_fit, groups[fit], cfg.seed)
    timing["readouts_s"] = time.perf_counter() - began

    began = time.perf_counter()
    monitor = Monitor(model, probe=probe, p_ik=p_ik)
    new_tokens, token_signals, prompt_signals = monitored(monitor, prompts, n_new)
    timing["monitored_generation_s"] = time.perf_counter() - began
    assert torch.equal(new_tokens[fit], first), "the readouts changed what the model generates"
    answers = value_strings(setting, new_tokens)
    false = np.array([a != t for a, t in zip(answers, subjects["truth"])])  # invented: truth None, always false
    lengths = torch.full((len(subjects),), n_new)

    began = time.perf_counter()
    values = {name: value.double().numpy() for name, value in prompt_signals.items()}
    values |= sampling_risks(model, [prompts[part] for part in _chunks(len(prompts), 256)], answers,
                             lambda ids: " ".join(setting.tokenizer.id_to_token(int(t)) for t in ids),
                             cfg.k_samples, n_new, cfg.seed + 31)
    timing["sampling_s"] = time.perf_counter() - began
    signs = choose_signs(claim_risks(token_signals, values, lengths, RISK_SIGN), false, fit)
    risks = claim_risks(token_signals, values, lengths, signs)

    began = time.perf_counter()
    rows, abstention, curves = judge(risks, false, kinds, split, signs, cfg)
    timing["judging_s"] = time.perf_counter() - began

    frame = subjects.assign(answer=answers, false=false, truth=subjects["truth"].fillna(""))
    for name, value in risks.items():
        frame[f"risk_{name}"] = value
    results: dict[str, Any] = {
        "world": {"n_persons": cfg.n_persons, "n_train_statements": cfg.n_train,
                  "monofact_rate": setting.world.monofact_rate(), "n_values": len(setting.world.value_spaces[ATTRIBUTE]),
                  "prompt": "<bos> First Last birthday", "statement": "<bos> First Last birthday Month day . <eos>",
                  "n_subjects": {kind: int((kinds == kind).sum()) for kind in KINDS},
                  "n_by_split": {s: int((split == s).sum()) for s in SPLITS},
                  "split": "subjects (persons and invented name pairs) drawn into fit / calibration / test, disjoint; "
                           "fit trains the probe and P(IK) and chooses the signs, calibration the thresholds, test "
                           "reports"},
        "model": {"d_model": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
                  "middle_layer": monitor.middle_layer, "attention_layers": list(monitor.attention_layers), **training},
        "answers": {kind: {"n": int((kinds == kind).sum()), "false_rate": float(false[kinds == kind].mean())}
                    for kind in KINDS},
        "readouts": readout_info,
        "unavailable": dict(monitor.unavailable),
        "signals": rows,
        "abstention": abstention,
        "abstention_signal": ABSTENTION_SIGNAL,
        "alphas": list(cfg.alphas),
    }
    results["headlines"] = headlines(results)
    results["timing"] = timing

    save_table(frame, out, "prompts")
    save_table(curves, out, "curves")
    model.save(out / "model")
    save_readouts(out, probe, p_ik, signs)
    figures(out, results, curves)
    return results


def save_readouts(out: Path, probe: LinearReadout | None, p_ik: LinearReadout | None, signs: dict[str, int]) -> None:
    """The probe's and P(IK)'s weights (safetensors), their hooks, biases, positions and the signs (metadata)."""
    import json

    from safetensors.torch import save_file

    tensors, meta = {}, {"signs": json.dumps(signs)}
    for name, readout in (("probe", probe), ("p_ik", p_ik)):
        if readout is not None:
            tensors[name] = readout.weight.contiguous()
            meta[name] = json.dumps({"hook": readout.hook, "bias": readout.bias, "position": readout.position})
    if not tensors:
        tensors["none"] = torch.zeros(0)
    atomic_write(out / READOUT_FILE, lambda path: save_file(tensors, str(path), metadata=meta))


def load_readouts(folder: Path) -> tuple[LinearReadout | None, LinearReadout | None, dict[str, int]]:
    """What `save_readouts` wrote: (probe, p_ik, signs)."""
    import json

    from safetensors import safe_open

    path = Path(folder) / READOUT_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {READOUT_FILE} in {folder}: run `forma run monitor` to make one")
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        readouts = []
        for name in ("probe", "p_ik"):
            if name in meta:
                info = json.loads(meta[name])
                readouts.append(LinearReadout(info["hook"], f.get_tensor(name), float(info["bias"]), info["position"]))
            else:
                readouts.append(None)
    return readouts[0], readouts[1], json.loads(meta.get("signs", "{}"))


# --------------------------------------------------------------------------------------------
# Any local model on a question–answer CSV
# --------------------------------------------------------------------------------------------
def read_qa(path: str | Path) -> list[dict[str, str]]:
    """question, answer rows; a header row naming those columns is skipped, blank rows too."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no question–answer file at {path}")
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    header = bool(rows) and [c.strip().lower() for c in rows[0]] == ["question", "answer"]
    items = []
    for number, row in enumerate(rows[header:], 1 + header):  # the file's own row numbers
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != 2 or not row[0].strip() or not row[1].strip():
            raise ValueError(f"{path}, row {number}: expected 2 non-empty columns (question, answer), got {row!r}")
        items.append({"question": row[0].strip(), "answer": row[1].strip()})
    if not items:
        raise ValueError(f"{path} holds no questions")
    return items


def qa_prompt(question: str) -> str:
    return f"Question: {question}\nAnswer:"


def normalise(text: str) -> str:
    """Exact match up to case, surrounding spaces and full stops."""
    return re.sub(r"\s+", " ", text).strip().strip(".").strip().lower()


def qa_readouts(model: HookedTransformer, middle_hook: str, sequences: list[Tensor], prompt_lengths: list[int],
                lengths: list[int], false: np.ndarray, cfg: Config) -> tuple[dict[str, Any], dict[str, str]]:
    """The probe (`middle_hook`, every answer token, label: the answer is false) and P(IK) (the last block's residual
    stream at the last prompt token, label: the answer is right — the calibration experiment's readout on a local
    model), each cross-fitted over `cfg.qa_folds` folds of questions (`cross_fit_probe`, the same folds for both):
    a question's score comes from the probe fitted on the other folds' questions. The activations are those the
    monitor reads while decoding (the position that produced each answer token), from a forward pass over the
    prompt and its answer. Returns ({"probe": per-question tensors of token values, "p_ik": values, "info": …},
    {signal: why it is unavailable})."""
    last_hook = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    probe_rows, pik_rows = [], []
    for tokens, p, n in zip(sequences, prompt_lengths, lengths):
        acts = residuals(model, tokens, [middle_hook, last_hook])
        probe_rows.append(acts[middle_hook][0, p - 1:p - 1 + n])
        pik_rows.append(acts[last_hook][0, p - 1])
    questions = np.arange(len(sequences))
    probe = cross_fit_probe(torch.cat(probe_rows), np.repeat(false, lengths), np.repeat(questions, lengths),
                            cfg.qa_folds, seed=cfg.seed)
    p_ik = cross_fit_probe(torch.stack(pik_rows), ~false, questions, cfg.qa_folds, seed=cfg.seed)
    out: dict[str, Any] = {"info": {
        "scheme": f"cross-fitted: the questions dealt into {cfg.qa_folds} folds (independently of their answers), each "
                  "fold scored by the probe fitted on the other folds",
        "folds": [f.tolist() for f in (probe.folds or p_ik.folds)],
        "probe": {"hook": middle_hook, "position": "every answer token", "label": "the answer is false",
                  "regularization": probe.regularization, "why_not": probe.why},
        "p_ik": {"hook": last_hook, "position": "the last prompt token", "label": "the answer is right",
                 "regularization": p_ik.regularization, "why_not": p_ik.why}}}
    unavailable = {}
    if probe.scores is None:
        unavailable["probe"] = f"not enough data: {probe.why}"
    else:
        out["probe"] = list(torch.from_numpy(probe.scores).float().split(lengths))
    if p_ik.scores is None:
        unavailable["p_ik"] = f"not enough data: {p_ik.why}"
    else:
        out["p_ik"] = p_ik.scores
    return out, unavailable


def abstention_alphas(alphas: tuple[float, ...], n_calibration: int, n_test: int,
                      delta: float) -> tuple[list[float], list[dict[str, Any]]]:
    """The α at which both abstention rules can answer anything with `n_calibration` calibration prompts — CRC needs
    n ≥ ⌈1/α⌉ − 1 (`crc_min_calibration`), LTT n ≥ ⌈ln δ / ln(1 − α)⌉ (`ltt_min_answered`) — and a test split to
    score them on; the others with the reason in words."""
    scored, skipped = [], []
    for alpha in alphas:
        need = {"conformal risk control": crc_min_calibration(alpha),
                f"Learn then Test (δ = {delta:g})": ltt_min_answered(alpha, delta)}
        short = [f"{rule} needs at least {n}" for rule, n in need.items() if n_calibration < n]
        if short:
            skipped.append({"alpha": alpha, "why_not": f"the calibration split holds {n_calibration} questions and "
                                                       f"{' and '.join(short)} to answer anything at α = {alpha:g}"})
        elif n_test == 0:
            skipped.append({"alpha": alpha, "why_not": "the test split holds no questions"})
        else:
            scored.append(alpha)
    return scored, skipped


def run_qa(cfg: Config, out: Path) -> dict[str, Any]:
    """The monitor's signals on a local model with a question–answer CSV, exact match against the answers."""
    from experiments.calibration import encode, load_local_model

    items = read_qa(cfg.qa)
    model, tokenizer, route = load_local_model(cfg.model, cfg.hf_loader)
    hooked = isinstance(model, HookedTransformer)
    eos = getattr(tokenizer, "eos_token_id", None)
    n_ctx = getattr(model.cfg, "n_ctx", None)
    timing: dict[str, float] = {}
    began = time.perf_counter()
    monitor = Monitor(model, attention=False)

    def text_of(ids: list[int]) -> str:
        return tokenizer.decode(ids) if hasattr(tokenizer, "decode") else ""

    def answer_of(new: list[int]) -> tuple[str, int]:
        """The answer: the continuation up to its first line break or end of text, and how many tokens made it."""
        for k in range(1, len(new) + 1):
            if (eos is not None and new[k - 1] == eos) or "\n" in text_of(new[:k]):
                return text_of(new[:k - 1]).split("\n")[0], max(1, k - 1)
        return text_of(new), len(new)

    rows, series, lengths, prompts, sequences = [], {name: [] for name in monitor.token_signals}, [], [], []
    for item in items:
        ids = encode(tokenizer, qa_prompt(item["question"]))
        budget = cfg.qa_max_new_tokens
        if n_ctx is not None:
            ids = ids[-(n_ctx - budget):]
        tokens = torch.tensor([ids])
        result = monitor.generate(tokens, budget, eos_token_id=eos)
        new = result.new_tokens[0].tolist()
        answer, length = answer_of(new)
        rows.append({"question": item["question"], "answer": item["answer"], "generated": answer, "n_answer_tokens":
                     length, "false": normalise(answer) != normalise(item["answer"])})
        for name in monitor.token_signals:
            series[name].append(result.signals[name][0, :length])
        lengths.append(length)
        prompts.append(tokens)
        sequences.append(result.tokens[:, :len(ids) + length])
    timing["monitored_generation_s"] = time.perf_counter() - began
    frame = pd.DataFrame(rows)
    false = frame["false"].to_numpy()
    cuts = np.cumsum(cfg.split_fractions)[:-1]
    split = np.array(SPLITS)[np.searchsorted(cuts, np.random.default_rng([cfg.seed, 23]).random(len(frame)),
                                             side="right")]
    frame["split"] = split
    unavailable = dict(monitor.unavailable) | {"subject_attention": "a question has no marked subject"}

    # k answers per question at T = 1, each cut like the greedy one and compared after exact match's normalisation
    began = time.perf_counter()
    values = sampling_risks(model, prompts, [normalise(a) for a in frame["generated"]],
                            lambda ids: normalise(answer_of(ids)[0]), cfg.k_samples, cfg.qa_max_new_tokens,
                            cfg.seed + 31, eos)
    timing["sampling_s"] = time.perf_counter() - began

    readout_info: dict[str, Any] = {}
    if hooked:
        began = time.perf_counter()
        fitted, missing = qa_readouts(model, monitor.middle_hook, sequences, [p.shape[1] for p in prompts], lengths,
                                      false, cfg)
        timing["readouts_s"] = time.perf_counter() - began
        readout_info = fitted["info"]
        unavailable = {k: v for k, v in unavailable.items() if k not in TRAINED} | missing
        if "probe" in fitted:
            series["probe"] = fitted["probe"]
        if "p_ik" in fitted:
            values["p_ik"] = fitted["p_ik"]

    width = max(lengths)
    padded = {name: torch.stack([torch.nn.functional.pad(t, (0, width - len(t))) for t in ts])
              for name, ts in series.items()}
    length_tensor = torch.tensor(lengths)
    signs = choose_signs(claim_risks(padded, values, length_tensor, RISK_SIGN), false, split == "fit")
    risks = claim_risks(padded, values, length_tensor, signs)
    for name, value in risks.items():
        frame[f"risk_{name}"] = value
    kinds = np.array(["qa"] * len(frame))
    alphas, skipped = abstention_alphas(cfg.alphas, int((split == "calibration").sum()), int((split == "test").sum()),
                                        cfg.ltt_delta)
    rows_out, abstention, curves = judge(risks, false, kinds, split, signs, cfg, alphas=alphas)
    for row in rows_out:
        row["by_kind"] = {}
    results: dict[str, Any] = {
        "source": {"model": str(cfg.model), "route": route, "qa": str(cfg.qa), "n_items": len(items),
                   "prompt_example": qa_prompt(items[0]["question"]), "hooked": hooked,
                   "scoring": "exact match of the continuation up to its first line break, case, surrounding spaces "
                              "and full stops aside",
                   "n_by_split": {s: int((split == s).sum()) for s in SPLITS},
                   "split": "questions drawn into fit / calibration / test, disjoint; fit chooses the signs of the "
                            "untrained signals and LTT's grid, calibration the thresholds, test reports; the probe "
                            "and P(IK) are cross-fitted over folds of all the questions"},
        "answers": {"qa": {"n": len(frame), "false_rate": float(false.mean())}},
        "readouts": readout_info,
        "k_samples": cfg.k_samples,
        "unavailable": unavailable,
        "signals": rows_out, "abstention": abstention, "abstention_unavailable": skipped,
        "abstention_signal": ABSTENTION_SIGNAL, "alphas": list(cfg.alphas),
    }
    results["headlines"] = headlines(results)
    results["timing"] = timing
    save_table(frame, out, "prompts")
    save_table(curves, out, "curves")
    figures(out, results, curves)
    return results


# --------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------
def figures(out: Path, results: dict[str, Any], curves: list[dict[str, Any]]) -> None:
    import plotly.graph_objects as go

    fig = go.Figure()
    names = [row["signal"] for row in results["signals"]]
    groups = [("all false claims", lambda row: row)] + [
        (ERROR_KINDS[k], lambda row, k=k: row["by_kind"].get(k, {})) for k in KINDS]
    for label, pick in groups:
        blocks = [pick(row) for row in results["signals"]]
        if not any(b.get("auroc") is not None for b in blocks):
            continue
        values = [b.get("auroc") for b in blocks]
        low = [v - b["auroc_ci95"][0] if b.get("auroc_ci95") else 0 for v, b in zip(values, blocks)]
        high = [b["auroc_ci95"][1] - v if b.get("auroc_ci95") else 0 for v, b in zip(values, blocks)]
        fig.add_bar(x=names, y=values, name=label, error_y=dict(type="data", array=high, arrayminus=low))
    fig.add_hline(y=0.5, line_dash="dash", line_color="gray")
    fig.update_layout(title="AUROC for a false claim, test split (95% stratified bootstrap)", barmode="group",
                      yaxis=dict(title="AUROC", range=[0, 1]))
    save_figure(fig, out, "auroc_by_signal")

    fig = go.Figure()
    for name in names:
        points = [c for c in curves if c["signal"] == name]
        fig.add_scatter(x=[c["coverage"] for c in points], y=[c["risk"] for c in points], mode="lines", name=name)
    fig.update_layout(title="Risk–coverage on the test split: error rate among the answered prompts",
                      xaxis=dict(title="coverage", range=[0, 1]), yaxis=dict(title="error rate among answered"))
    save_figure(fig, out, "risk_coverage")

    chosen = [a for a in results["abstention"] if a["signal"] == results["abstention_signal"]]
    if not chosen:  # no α the calibration split could support (results' abstention_unavailable says why)
        return
    fig = go.Figure()
    alphas = [a["alpha"] for a in chosen]
    for rule, key, label in (("crc", "joint_risk", "CRC: answered and false"),
                             ("ltt", "selective_risk", "LTT: false among answered")):
        ys = [a[rule][key] for a in chosen]
        bands = [a[rule][f"{key}_ci95"] for a in chosen]
        fig.add_scatter(x=alphas, y=ys, mode="lines+markers", name=label, error_y=dict(
            type="data", array=[(b[1] - y) if b and y is not None else 0 for b, y in zip(bands, ys)],
            arrayminus=[(y - b[0]) if b and y is not None else 0 for b, y in zip(bands, ys)]))
        fig.add_scatter(x=alphas, y=[a[rule]["coverage"] for a in chosen], mode="lines+markers", yaxis="y2",
                        name=f"{rule.upper()} coverage", line=dict(dash="dot"))
    fig.add_scatter(x=[0, max(alphas)], y=[0, max(alphas)], mode="lines", name="α", line=dict(dash="dash",
                                                                                              color="gray"))
    fig.update_layout(title=f"Abstention on {results['abstention_signal']}: thresholds from the calibration split, "
                            "rates on the test split", xaxis=dict(title="α"), yaxis=dict(title="error rate"),
                      yaxis2=dict(title="coverage", overlaying="y", side="right", range=[0, 1]))
    save_figure(fig, out, "abstention")
