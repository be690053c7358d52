"""Calibration: does the model know what it knows? (issue 7; Kadavath et al. 2022, arXiv 2207.05221)

Definitions and what tiny models do: shared/SCIENCE.md §3. Every number comes from the pure functions of
`lab.metrics.calibration` (ECE with 15 equal-width and 10 equal-mass bins, RMS, MCE, Brier and its
decomposition, NLL, AUROC, bootstrap intervals, the noise floor of a perfectly calibrated model with the
same confidences, temperature fitted by NLL); probes come from `lab.analysis.probes` on activations
streamed by `lab.analysis.activations`.

The synthetic world (`lab.data.facts.FactWorld`, one arbitrary birthday per person, Pareto popularity,
i.i.d. statements drawn with replacement): a person's *exposure* is the number of training statements
about them (0 — never seen —, 1, 2–5, 6+). A random share of the seen persons (the *format subset*) also
gets lettered quizzes ("Question : When was F L born ? A ) … D ) … Answer : B") and True/False
judgements ("F L birthday M d . Answer : True") in training; only the answer letter and the judgement
are scored, so the quizzes teach the format without stating facts as text. Every other person — seen
only in statements, or never seen — is an *evaluation person*.

Measured at two checkpoints: *partial* — training runs in equal stages, each followed by the held-out
NLL (fresh i.i.d. statements) and the cloze recall of seen evaluation persons, and the partial checkpoint
is the stage (before the last) whose recall is nearest `partial_recall` (0.6). The held-out optimum would
be the textbook choice, but in this world it comes where every seen person is already recalled (memorising
keeps lowering the held-out NLL of seen facts for longer than confident invention raises that of unseen
ones), so it cannot show partial recall; its step is reported beside the stages. And *end*: the end of
training. At each:

* cloze multiple choice (the primary readout): at the statement's value slot "<bos> F L birthday", the
  model's log-probability of each of 4 candidate values (the truth and 3 others: the quiz's options),
  renormalised over the 4; label mass = the share of the model's probability on the 4 at all.
* lettered multiple choice: the quiz prompt, probabilities of the letter tokens A–D after "Answer :",
  renormalised; label mass = the share on the 4 letters. On evaluation persons this measures knowledge
  *extraction* (a format trained on other persons); on held-out quizzes of the format subset it says
  whether the format itself was learned.
* temperature scaling: one T fitted by NLL on a calibration split of the evaluation persons (the cloze
  log-probabilities), both ECEs (15 equal-width, 10 equal-mass bins), NLL and Brier before and after on the test
  split (accuracy is unchanged by T).
* P(True): the model's own answer, sampled at T = 1 from the full softmax, put back into a claim and
  judged: P(True) = p(True) / (p(True) + p(False)) after "Answer :"; AUROC and Brier against whether the
  sampled answer was right, for the format subset (the judgement was trained on them) and outside it. Layer by
  layer too: the lens P(True) of every layer, chosen on a validation half of the persons and judged on the other
  half beside shuffled labels and the untrained model; baseline: the model's own probability of its answer.
* P(IK), layer by layer, on evaluation persons (label: the cloze answer is right), persons split train /
  validation / test: logistic and small-MLP probes on the residual stream at the last name token and at the value
  slot (fitted on train), and the logit-lens readouts of the layers before the last at the value slot (the cloze
  confidence recomputed from that layer's lens, the lens's top token probability, its negative entropy). The
  readout with the best validation AUROC is reported on test; baseline, beside it and never chosen: the model's
  own final cloze confidence (= the last layer's lens cloze confidence). Controls: the probe on shuffled labels
  (the lens readouts: scored against shuffled labels), and the same readout of an untrained model of the same
  shape. Verdicts by `lab.analysis.probes.judge_readouts` (SCIENCE.md §5): constant readouts are flagged, not
  scored; "carries the signal" needs the test interval above both controls' intervals; fewer than MIN_PER_CLASS
  right or wrong answers in the validation or test split is "not enough data".
* token-level calibration of next-token predictions on held-out English for the pydoc zoo model (its
  quick recipe, trained into the run folder, when the zoo model is not trained), through the logit lens
  at each layer as well.

`--model PATH --mmlu FILE.csv`: lettered multiple choice on MMLU's CSV layout (question, A, B, C, D,
answer; with or without a header) for any local Hugging Face causal LM — converted into a
HookedTransformer by `lab.hf.load_hf` when the architecture is supported (lab.hf.SUPPORTED: GPT-2, LLaMA,
GPT-NeoX / Pythia, Qwen2, Mistral), else wrapped
by `lab.hf.bridge` (TransformerBridge) — with temperature scaling and per-layer P(IK) probes on the
residual stream at the last prompt token, by the same rules (items split train / validation / test, controls,
"not enough data" for a small CSV).

`headlines(results)` (a pure function of the rest of results.json) states what the run supports, each with a
direction that the quick profile — a smaller run of the same experiment — must share with the default one;
what a run cannot support is kept with the reason (`why_not`), and the dashboard lists it as not shown.

Artefacts in `out`: items.parquet (one row per item: option_logit_0..3 — log-probabilities of the options,
so softmax(·/T) gives the option probabilities —, answer_index, kind = cloze/lettered, checkpoint,
split, person, exposure, label_mass, confidence, correct), p_true.parquet, p_ik.parquet,
token_level.parquet, stages.parquet, and plotly figures (reliability diagrams, ECE and accuracy by
exposure, P(IK) and P(True) AUROC by layer, token-level ECE by layer).
"""

import copy
import csv
import logging
import math
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from lab.analysis.activations import collect_activations
from lab.analysis.lens import logit_lens
from lab.analysis.probes import (feature_rank, fit_probe, group_partition, judge_readouts, random_model,
                                 shuffled_control)
from lab.configs import apply_quick, check_fields, need, torch_threads
from lab.data.facts import OPTION_LETTERS, Fact, FactWorld, FactWorldConfig
from lab.metrics.calibration import (MIN_PER_CLASS, Metric, auroc, auroc_ci, bootstrap_ci, brier, ece_fields,
                                     fit_temperature, multiclass_summary, nll, reliability, softmax)
from lab.model import HookedTransformer, ModelConfig
from lab.runs import save_figure, save_table
from lab.tokenize import word_level
from lab.train import SequenceBatches, TrainConfig, train

logger = logging.getLogger(__name__)

N_OPTIONS = 4  # Kadavath et al. §3: lettered multiple choice with (A)–(D); chance = 1/4
EXPOSURE_BINS = ((0, 0, "0"), (1, 1, "1"), (2, 5, "2-5"), (6, None, "6+"))  # issue 7 item 1
QUICK = dict(n_first_names=40, n_last_names=60, n_persons=400, n_train=800, d_model=64, n_layers=2, steps=240,
             warmup_steps=20, n_stages=6, n_heldout=400, mlp_steps=100, mlp_decays=(1e-2,), n_boot=200,
             token_windows=8, p_true_samples=1)


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------
@dataclass
class Config:
    """The calibration experiment; `quick` swaps in a smaller world, model and training (QUICK) for every
    field left at its default. `model` + `mmlu`: lettered multiple choice on a local HF model instead."""

    seed: int = 0
    quick: bool = False
    model: str | None = None  # a local HF folder (with its tokenizer), a zoo name or a Forma folder; needs `mmlu`
    mmlu: str | None = None  # an MMLU-layout CSV: question, A, B, C, D, answer
    # the world: Pareto(2) popularity and 2,000 draws leave ≈30% of 1,000 persons unseen, ≈34% seen once
    n_first_names: int = 100
    n_last_names: int = 200
    n_persons: int = 1000
    n_train: int = 2000
    pareto_gamma: float = 2.0
    format_share: float = 0.3  # share of seen persons whose quizzes and True/False claims are trained
    quiz_copies: int = 2  # quizzes per format person (fresh options and order each)
    # the model and its training
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    steps: int = 720
    batch_size: int = 64
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 50
    n_stages: int = 12  # equal training stages, each followed by the held-out NLL and the recall of seen persons
    partial_recall: float = 0.6  # the partial checkpoint: the stage whose recall of seen persons is nearest this
    n_heldout: int = 1000  # fresh i.i.d. statements for the held-out NLL
    # measurement
    calibration_share: float = 0.5  # evaluation persons whose items fit T (the rest are the test split)
    p_true_samples: int = 2  # sampled answers per person judged True/False
    probe_test_fraction: float = 0.3  # persons (items) whose rows report every readout: the test split
    probe_validation_fraction: float = 0.3  # persons (items) on which readouts are chosen; the rest fit the probes
    mlp_steps: int = 200
    mlp_decays: tuple[float, ...] = (1e-3, 1e-1)  # the MLP probes' weight-decay grid (cross-validated)
    probe_folds: int = 3
    n_boot: int = 500
    token_windows: int = 32  # held-out pydoc windows of n_ctx tokens for token-level calibration
    threads: int = 1  # torch intra-op threads (tiny tensors: more threads cost more than they gain)
    hf_loader: str = "auto"  # --model: "auto" converts lab.hf.SUPPORTED (lab.hf.load_hf), bridges the rest; "bridge" always

    def __post_init__(self) -> None:
        check_fields(self)
        if self.quick:
            apply_quick(self, QUICK)

        need(self, self.seed >= 0, f"seed must be a non-negative integer, got {self.seed!r}")
        for name in ("n_first_names", "n_last_names", "n_persons", "n_train", "quiz_copies", "d_model", "n_layers",
                     "n_heads", "steps", "batch_size", "n_stages", "n_heldout", "p_true_samples", "mlp_steps",
                     "n_boot", "token_windows", "threads"):
            need(self, getattr(self, name) > 0,
                 f"{name} must be a positive integer, got {getattr(self, name)!r}")
        need(self, 0 <= self.warmup_steps <= self.steps,
             f"warmup_steps must lie in [0, steps], got {self.warmup_steps!r}")
        need(self, self.n_stages >= 2 and self.steps >= self.n_stages, "need n_stages ≥ 2 and steps ≥ n_stages")
        need(self, len(self.mlp_decays) > 0 and all(d > 0 for d in self.mlp_decays), "mlp_decays must be positive")
        need(self, self.probe_folds >= 2, "probe_folds must be an integer ≥ 2")
        for name in ("format_share", "calibration_share", "probe_test_fraction", "probe_validation_fraction",
                     "partial_recall"):
            need(self, 0 < getattr(self, name) < 1, f"{name} must lie in (0, 1), got {getattr(self, name)!r}")
        need(self, self.probe_test_fraction + self.probe_validation_fraction < 1,
             "probe_test_fraction + probe_validation_fraction must leave a training split (sum < 1)")
        need(self, self.pareto_gamma > 0, "pareto_gamma must be > 0")
        need(self, 0 < self.min_lr <= self.lr, "need 0 < min_lr ≤ lr")
        need(self, self.d_model % self.n_heads == 0, "d_model must be a multiple of n_heads")
        need(self, self.hf_loader in ("auto", "bridge"),
             f"hf_loader must be 'auto' or 'bridge', got {self.hf_loader!r}")
        need(self, (self.model is None) == (self.mmlu is None),
             "--model and --mmlu go together: lettered multiple choice of a local Hugging Face model on an "
             "MMLU-layout CSV (the synthetic experiment trains its own model)")


# --------------------------------------------------------------------------------------------
# The world as token ids
# --------------------------------------------------------------------------------------------
@dataclass
class Setting:
    """A fact world, its tokenizer, the persons' roles and the training documents."""

    world: FactWorld
    tokenizer: Any
    attribute: str
    exposure: np.ndarray  # [n_persons] training statements about each person
    format_persons: np.ndarray  # persons whose quizzes and True/False claims are trained
    eval_persons: np.ndarray  # every other person: seen only in statements, or never seen
    train_rows: Tensor  # [n_docs, seq_len]
    train_mask: Tensor  # [n_docs, seq_len] which predicted tokens are scored
    heldout_rows: Tensor  # fresh i.i.d. statements
    heldout_mask: Tensor
    doc_counts: dict[str, int]

    @property
    def seq_len(self) -> int:
        return int(self.train_rows.shape[1])

    def ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def token(self, word: str) -> int:
        index = self.tokenizer.token_to_id(word)
        if index is None:
            raise KeyError(f"{word!r} is not in the world's vocabulary")
        return index


def statement_prefix(world: FactWorld, person: int, attribute: str) -> str:
    """"<bos> First Last birthday": the bare statement up to its value slot."""
    return "<bos> " + world.render(Fact(person, attribute, "\x00"), "bare").split("\x00")[0].strip()


def claim_text(world: FactWorld, person: int, attribute: str, value: str) -> str:
    """"<bos> First Last birthday Month day . Answer :" — a claim waiting for its True/False judgement."""
    return f"<bos> {world.render(Fact(person, attribute, value), 'bare')} Answer :"


def _pad(rows: list[list[int]], scored: list[list[bool]], pad_id: int, length: int) -> tuple[Tensor, Tensor]:
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.bool)
    for i, (row, keep) in enumerate(zip(rows, scored)):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = torch.tensor(keep)
    return ids, mask


def make_setting(cfg: Config) -> Setting:
    world = FactWorld(FactWorldConfig(n_first_names=cfg.n_first_names, n_last_names=cfg.n_last_names,
                                      n_persons=cfg.n_persons, attributes=("birthday",),
                                      pareto_gamma=cfg.pareto_gamma, n_train=cfg.n_train, seed=cfg.seed))
    attribute = "birthday"
    tokenizer = word_level(world.word_vocabulary())
    # One fact per person (one attribute), so a fact's training count is its person's exposure.
    exposure = world.train_counts.copy()
    rng = np.random.default_rng([cfg.seed, 7])
    seen = np.flatnonzero(exposure > 0)
    format_persons = np.sort(rng.choice(seen, size=round(cfg.format_share * len(seen)), replace=False))
    eval_persons = np.setdiff1d(np.arange(len(world.persons)), format_persons)

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text).ids

    rows: list[list[int]] = []
    scored: list[list[bool]] = []
    counts = {"statements": 0, "quizzes": 0, "claims": 0}
    # Statements: every token after <bos> is scored (the model learns names and values alike).
    for doc in world.documents("bare", seed=cfg.seed):
        ids = encode(f"<bos> {doc} <eos>")
        rows.append(ids)
        scored.append([False] + [True] * (len(ids) - 1))
        counts["statements"] += 1
    # Quizzes and claims of the format subset: only the answer letter / judgement (and <eos>) are scored,
    # so no option or false claim is ever trained as text.
    for copy_index in range(cfg.quiz_copies):
        for item in world.quiz_items(format_persons, N_OPTIONS, seed=cfg.seed * 1000 + 100 + copy_index):
            ids = encode(f"<bos> {world.quiz_prompt(item)} {OPTION_LETTERS[item['answer_index']]} <eos>")
            rows.append(ids)
            scored.append([False] * (len(ids) - 2) + [True, True])
            counts["quizzes"] += 1
    values = world.value_spaces[attribute]
    for person in format_persons:
        truth = world.true_value(int(person), attribute)
        draw = int(rng.integers(len(values) - 1))  # uniform over the other values: skip the truth's index
        wrong = values[draw + (draw >= values.index(truth))]
        for value, verdict in ((truth, "True"), (wrong, "False")):
            ids = encode(f"{claim_text(world, int(person), attribute, value)} {verdict} <eos>")
            rows.append(ids)
            scored.append([False] * (len(ids) - 2) + [True, True])
            counts["claims"] += 1
    length = max(len(r) for r in rows)
    pad_id = tokenizer.token_to_id("<pad>")
    train_rows, train_mask = _pad(rows, scored, pad_id, length)

    heldout = np.random.default_rng([cfg.seed, 5]).choice(len(world.facts), size=cfg.n_heldout, p=world.p)
    held = [encode(f"<bos> {world.render(world.facts[i], 'bare')} <eos>") for i in heldout]
    heldout_rows, heldout_mask = _pad(held, [[False] + [True] * (len(r) - 1) for r in held], pad_id, length)
    return Setting(world, tokenizer, attribute, exposure, format_persons, eval_persons, train_rows, train_mask,
                   heldout_rows, heldout_mask, counts)


def make_model(cfg: Config, setting: Setting) -> HookedTransformer:
    model_cfg = ModelConfig(d_vocab=setting.tokenizer.get_vocab_size(), d_model=cfg.d_model, n_layers=cfg.n_layers,
                            n_heads=cfg.n_heads, n_ctx=setting.seq_len, positions="learned", mlp="gelu",
                            tokenizer="facts-word-level")
    return HookedTransformer(model_cfg, seed=cfg.seed, tokenizer=setting.tokenizer)


# --------------------------------------------------------------------------------------------
# Reading the model
# --------------------------------------------------------------------------------------------
def _batch(rows: Sequence[Sequence[int]], pad_id: int) -> Int[Tensor, "n pos"]:
    """Right-padded rows (a causal model never looks right, so padding changes nothing before it)."""
    length = max(len(r) for r in rows)
    out = torch.full((len(rows), length), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row)
    return out


@torch.inference_mode()
def continuation_logprobs(model: HookedTransformer, prefixes: Sequence[Sequence[int]],
                          continuations: Sequence[Sequence[int]], pad_id: int, lens: bool = False,
                          batch_size: int = 512) -> np.ndarray:
    """log P(continuation | prefix) for each pair, in nats: [n] from the model, or [layer, n] through the
    logit lens of every layer (the last row is the model's own)."""
    out = []
    for start in range(0, len(prefixes), batch_size):
        pre, cont = prefixes[start: start + batch_size], continuations[start: start + batch_size]
        tokens = _batch([list(p) + list(c) for p, c in zip(pre, cont)], pad_id)
        log_p = logit_lens(model, tokens) if lens else model(tokens).log_softmax(-1)[None]
        total = torch.zeros(log_p.shape[0], len(pre), dtype=torch.float64)
        for i, (p, c) in enumerate(zip(pre, cont)):
            positions = torch.arange(len(p) - 1, len(p) + len(c) - 1)
            total[:, i] = log_p[:, i, positions, torch.tensor(c)].double().sum(-1)
        out.append(total)
    result = torch.cat(out, dim=1).numpy()
    return result if lens else result[0]


@torch.inference_mode()
def next_token_logprobs(model: Any, prompts: Sequence[Sequence[int]], pad_id: int,
                        batch_size: int = 256) -> Float[Tensor, "n d_vocab"]:
    """log P(next token | prompt) at each prompt's last position."""
    out = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start: start + batch_size]
        logits = model(_batch(chunk, pad_id))
        last = torch.tensor([len(p) - 1 for p in chunk])
        out.append(logits[torch.arange(len(chunk)), last].double().log_softmax(-1).cpu())
    return torch.cat(out)


def cloze_table(model: HookedTransformer, setting: Setting, items: list[dict[str, Any]]) -> pd.DataFrame:
    """Cloze multiple choice: log P(option value | "<bos> F L birthday") for the quiz's 4 options."""
    world, pad_id = setting.world, setting.token("<pad>")
    prefixes, continuations = [], []
    for item in items:
        prefix = setting.ids(statement_prefix(world, item["person"], item["attribute"]))
        for option in item["options"]:
            prefixes.append(prefix)
            continuations.append(setting.ids(option))
    log_p = continuation_logprobs(model, prefixes, continuations, pad_id).reshape(len(items), N_OPTIONS)
    return _option_frame(items, log_p, "cloze", setting)


def lettered_table(model: HookedTransformer, setting: Setting, items: list[dict[str, Any]]) -> pd.DataFrame:
    """Lettered multiple choice: log P(letter | quiz prompt) for A–D after "Answer :"."""
    prompts = [setting.ids("<bos> " + setting.world.quiz_prompt(item)) for item in items]
    letters = [setting.token(letter) for letter in OPTION_LETTERS[:N_OPTIONS]]
    log_p = next_token_logprobs(model, prompts, setting.token("<pad>"))[:, letters].numpy()
    return _option_frame(items, log_p, "lettered", setting)


def _option_frame(items: list[dict[str, Any]], log_p: np.ndarray, kind: str, setting: Setting) -> pd.DataFrame:
    """One row per item: the options' log-probabilities and everything derived from them."""
    probs = softmax(log_p)
    answer = np.array([item["answer_index"] for item in items])
    persons = np.array([item["person"] for item in items])
    frame = pd.DataFrame({f"option_logit_{k}": log_p[:, k] for k in range(N_OPTIONS)})
    frame["answer_index"] = answer
    frame["kind"] = kind
    frame["person"] = persons
    frame["exposure"] = setting.exposure[persons]
    frame["label_mass"] = np.exp(log_p).sum(axis=1)  # share of the model's probability on the 4 options
    frame["confidence"] = probs.max(axis=1)
    frame["correct"] = probs.argmax(axis=1) == answer
    frame["p_correct"] = probs[np.arange(len(items)), answer]
    return frame


def exposure_bin(exposure: np.ndarray) -> np.ndarray:
    labels = np.empty(len(exposure), dtype=object)
    for low, high, label in EXPOSURE_BINS:
        labels[(exposure >= low) & ((exposure <= high) if high is not None else True)] = label
    return labels


# --------------------------------------------------------------------------------------------
# Training in stages
# --------------------------------------------------------------------------------------------
@torch.inference_mode()
def heldout_nll(model: HookedTransformer, setting: Setting) -> float:
    """Mean −log P(statement) in nats per held-out statement (fresh i.i.d. draws from p)."""
    rows, mask = setting.heldout_rows, setting.heldout_mask
    log_p = model(rows).double().log_softmax(-1)[:, :-1].gather(-1, rows[:, 1:, None])[..., 0]
    return float(-(log_p * mask[:, 1:]).sum(dim=1).mean())


def train_in_stages(cfg: Config, setting: Setting, model: HookedTransformer,
                    work: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Train for cfg.steps in cfg.n_stages equal stages (one cosine schedule); after each, the held-out NLL and
    the cloze recall of seen evaluation persons. Returns the stage records and the partial checkpoint: the
    stage before the last whose recall is nearest cfg.partial_recall, with its weights."""
    train_cfg = TrainConfig(steps=cfg.steps, batch_size=cfg.batch_size, seq_len=setting.seq_len, lr=cfg.lr,
                            min_lr=cfg.min_lr, warmup_steps=cfg.warmup_steps, eval_interval=cfg.steps,
                            eval_batches=1, seed=cfg.seed)
    data = SequenceBatches(setting.train_rows, setting.heldout_rows, mask=setting.train_mask,
                           val_mask=setting.heldout_mask)
    stage_items = setting.world.quiz_items(setting.eval_persons, N_OPTIONS, seed=cfg.seed + 17)
    seen = setting.exposure[setting.eval_persons] > 0
    stages: list[dict[str, Any]] = []
    partial: dict[str, Any] = {}
    ends = sorted({round(cfg.steps * k / cfg.n_stages) for k in range(1, cfg.n_stages + 1)})
    for index, end in enumerate(ends):
        began = time.perf_counter()
        result = train(model, train_cfg, data, out_dir=work, resume=index > 0, progress=False, stop_after=end)
        nll_value = heldout_nll(model, setting)
        cloze = cloze_table(model, setting, stage_items)
        recall = float(cloze["correct"][seen].mean())
        stages.append({"stage": index + 1, "step": end, "heldout_nll": nll_value, "recall_seen": recall,
                       "cloze_accuracy": float(cloze["correct"].mean()),
                       "cloze_auroc_confidence": auroc(cloze["confidence"], cloze["correct"]),
                       "cloze_auroc_confidence_n_pos": int(cloze["correct"].sum()),
                       "cloze_auroc_confidence_n_neg": int((~cloze["correct"]).sum()),
                       "train_loss_nats": result.train_loss_nats, "stage_s": time.perf_counter() - began})
        logger.info("step %d: held-out NLL %.4f nats per statement, cloze recall of seen persons %.3f",
                    end, nll_value, recall)
        gap = abs(recall - cfg.partial_recall)
        if end < cfg.steps and (not partial or gap < partial["gap"]):
            partial = {"gap": gap, "step": end, "recall_seen": recall, "state": copy.deepcopy(model.state_dict())}
    return stages, partial


# --------------------------------------------------------------------------------------------
# Calibration numbers: every ECE with its bootstrap interval and its noise floor
# --------------------------------------------------------------------------------------------
def option_logits(frame: pd.DataFrame) -> np.ndarray:
    return frame[[f"option_logit_{k}" for k in range(N_OPTIONS)]].to_numpy(dtype=np.float64)


def calibration_block(frame: pd.DataFrame, n_boot: int, seed: int) -> dict[str, Any]:
    """Issue 7 item 8's `mc` / `lettered` block for a table of items, with the per-exposure breakdown. Every ECE
    (15 equal-width and 10 equal-mass bins) carries its interval, noise floor and debiased estimate."""
    probs = softmax(option_logits(frame))
    labels = frame["answer_index"].to_numpy()
    block = multiclass_summary(probs, labels, n_boot=n_boot, seed=seed)
    confidence, correct = probs.max(axis=1), probs.argmax(axis=1) == labels
    block["label_mass"] = float(frame["label_mass"].mean())
    block["by_exposure"] = []
    if "exposure" not in frame:  # items of a real benchmark: nobody counted what the model saw
        return block
    bins = exposure_bin(frame["exposure"].to_numpy())
    for _, _, label in EXPOSURE_BINS:
        rows = bins == label
        if not rows.any():
            continue
        block["by_exposure"].append({
            "exposure": label, "n": int(rows.sum()), "accuracy": float(correct[rows].mean()),
            "mean_confidence": float(confidence[rows].mean()), "label_mass": float(frame["label_mass"][rows].mean()),
            **ece_fields(confidence[rows], correct[rows], "ece", n_boot=n_boot, seed=seed)})
    return block


BINNINGS = (("ece_15_equal_width", 15, "equal_width"), ("ece_10_equal_mass", 10, "equal_mass"))


def temperature_block(frame: pd.DataFrame, n_boot: int, seed: int) -> dict[str, Any]:
    """One T fitted by NLL on the calibration split (Guo et al. 2017 §4.2); both ECEs (15 equal-width, 10
    equal-mass bins), NLL and Brier before and after on the test split. Accuracy cannot change: dividing logits by
    T > 0 keeps their order. T's interval resamples the calibration split (refitting T each time); the NLL change's
    interval resamples the test items, paired (the same items before and after)."""
    cal, test = frame[frame["split"] == "calibration"], frame[frame["split"] == "test"]
    cal_logits, cal_labels = option_logits(cal), cal["answer_index"].to_numpy()
    T = fit_temperature(cal_logits, cal_labels)
    t_interval = bootstrap_ci(lambda z, y: fit_temperature(z, y, iterations=40), cal_logits, cal_labels,
                              n_boot=min(n_boot, 200), seed=seed)
    logits, labels = option_logits(test), test["answer_index"].to_numpy()
    block: dict[str, Any] = {"T": T, "T_ci95": t_interval.interval, "n_calibration": len(cal), "n_test": len(test)}
    for name, temperature in (("before", 1.0), ("after", T)):
        probs = softmax(logits, temperature)
        confidence, correct = probs.max(axis=1), probs.argmax(axis=1) == labels
        for key, n_bins, scheme in BINNINGS:
            block |= ece_fields(confidence, correct, f"{key}_{name}", n_bins, scheme, n_boot=n_boot, seed=seed)
        block[f"nll_{name}"] = nll(probs, labels)
        block[f"brier_{name}"] = brier(confidence, correct).score
        block[f"accuracy_{name}"] = float(correct.mean())
        block[f"mean_confidence_{name}"] = float(confidence.mean())
        block[f"nll_calibration_split_{name}"] = nll(softmax(cal_logits, temperature), cal_labels)
    change = bootstrap_ci(lambda z, y: nll(softmax(z), y) - nll(softmax(z, T), y), logits, labels, n_boot=n_boot,
                          seed=seed)
    block["nll_decrease"], block["nll_decrease_ci95"] = change.value, change.interval
    return block


# --------------------------------------------------------------------------------------------
# Readouts judged honestly: chosen on a validation split, reported on a test split, beside controls
# --------------------------------------------------------------------------------------------
@dataclass
class Parts:
    """Entity-disjoint rows: `train` fits the probes, `validation` chooses among readouts, `test` reports."""

    groups: np.ndarray  # the entity of each row (a person, an MMLU item)
    train: np.ndarray
    validation: np.ndarray
    test: np.ndarray
    shuffle: np.ndarray  # one permutation of the rows: the shuffled-label control of every readout


def make_parts(groups: np.ndarray, cfg: Config, probes: bool = True) -> Parts:
    """Train / validation / test by entity (validation and test only, half each, when nothing is fitted)."""
    fractions = ((1 - cfg.probe_validation_fraction - cfg.probe_test_fraction, cfg.probe_validation_fraction,
                  cfg.probe_test_fraction) if probes else (0.5, 0.5))
    split = group_partition(groups, fractions, seed=cfg.seed)
    train, validation, test = split if probes else (np.array([], dtype=int), *split)
    return Parts(np.asarray(groups), train, validation, test,
                 np.random.default_rng(cfg.seed + 12345).permutation(len(groups)))


def _validation_fields(scores: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """The validation AUROC and its class counts: used to choose, so it needs no interval."""
    y = np.asarray(y).astype(bool)
    return {"validation_auroc": auroc(scores, y), "validation_auroc_n_pos": int(y.sum()),
            "validation_auroc_n_neg": int((~y).sum())}


def class_counts(y: np.ndarray, parts: Parts) -> dict[str, dict[str, int]]:
    y = np.asarray(y).astype(bool)
    return {name: {"n_pos": int(y[rows].sum()), "n_neg": int((~y[rows]).sum())}
            for name, rows in (("train", parts.train), ("validation", parts.validation), ("test", parts.test))}


def _unscored(y: np.ndarray, parts: Parts, why: str) -> dict[str, Any]:
    """The fields of a readout flagged and not scored: NaN AUROCs beside the splits' class counts, and why."""
    y = np.asarray(y).astype(bool)
    test = y[parts.test]
    blank = Metric(float("nan"), float("nan"), float("nan"), int(test.sum()), int((~test).sum()), why)
    return {**_validation_fields(np.zeros(len(parts.validation)), y[parts.validation]), "validation_auroc": float("nan"),
            **blank.fields("auroc"), **blank.fields("control_shuffled_auroc"), **blank.fields("control_untrained_auroc")}


def fixed_readout_row(scores: np.ndarray, untrained: np.ndarray | None, y: np.ndarray, parts: Parts, n_boot: int,
                      seed: int) -> dict[str, Any]:
    """A readout that fits nothing (a logit-lens readout): constant when its scores do not vary (feature_rank 0);
    else its validation AUROC, its test AUROC with a stratified entity interval, the same score against shuffled
    labels, and the untrained model's same readout."""
    y = np.asarray(y).astype(int)
    test, groups = parts.test, parts.groups[parts.test]
    if feature_rank(scores[:, None]) == 0:
        return {"constant": True, **_unscored(y, parts, "constant scores (the same for every row): not scored")}
    row: dict[str, Any] = {"constant": False, **_validation_fields(scores[parts.validation], y[parts.validation])}
    row |= auroc_ci(scores[test], y[test], groups, n_boot=n_boot, seed=seed).fields("auroc")
    row |= auroc_ci(scores[test], y[parts.shuffle][test], groups, n_boot=n_boot, seed=seed).fields(
        "control_shuffled_auroc")
    row |= (auroc_ci(untrained[test], y[test], groups, n_boot=n_boot, seed=seed).fields("control_untrained_auroc")
            if untrained is not None else {"control_untrained_auroc": None})
    return row


def probe_rows(X: Any, X_untrained: Any | None, y: np.ndarray, parts: Parts, cfg: Config) -> list[dict[str, Any]]:
    """A logistic and a small MLP probe fitted on the training persons, chosen on validation, reported on test,
    each beside the same probe on shuffled labels and on the untrained model's activations."""
    rows = []
    options = dict(groups=parts.groups, split=(parts.train, parts.test), n_bootstrap=cfg.n_boot, seed=cfg.seed,
                   n_folds=cfg.probe_folds)
    for kind in ("logistic", "mlp"):
        extra = dict(mlp_steps=cfg.mlp_steps, grid=cfg.mlp_decays) if kind == "mlp" else {}
        fitted = fit_probe(X, y, kind, **options, **extra)
        row: dict[str, Any] = {"readout": f"{kind} probe", "constant": fitted.constant,
                               "feature_rank": fitted.feature_rank, "n_features": fitted.n_features,
                               "regularization": None if fitted.constant else fitted.regularization}
        if fitted.constant:
            rows.append(row | _unscored(y, parts, fitted.metrics["auroc"].why_no_interval))
            continue
        row |= _validation_fields(fitted.predict_scores(X[parts.validation]).numpy(), y[parts.validation])
        row |= fitted.metrics["auroc"].fields("auroc")
        shuffled = shuffled_control(X, y, kind, **options, **extra)
        row |= shuffled.metrics["auroc"].fields("control_shuffled_auroc")
        if X_untrained is None:
            row["control_untrained_auroc"] = None
        else:
            row |= fit_probe(X_untrained, y, kind, **options, **extra).metrics["auroc"].fields("control_untrained_auroc")
        row["test_scores"] = fitted.test_scores.numpy()
        rows.append(row)
    return rows


FAMILIES = {"logistic probes": ("logistic probe",), "mlp probes": ("mlp probe",)}


def judge(rows: list[dict[str, Any]], what: str, baseline: Metric, y: np.ndarray, parts: Parts,
          baseline_scores: np.ndarray, n_boot: int, seed: int) -> dict[str, Any]:
    """`judge_readouts` over every candidate, and the paired test-split difference between the baseline and the
    chosen readout (both score the same test rows, so the difference is resampled by entity, stratified)."""
    verdict = judge_readouts(rows, what, baseline)
    chosen = verdict["chosen"]
    if chosen is not None:
        row = next(r for r in rows if all(r.get(k) == chosen.get(k) for k in ("readout", "position", "layer")))
        test = parts.test
        labels = np.asarray(y).astype(int)[test]
        gap = bootstrap_ci(lambda b, c, l: auroc(b, l) - auroc(c, l), baseline_scores[test], row["test_scores"],
                           labels, groups=parts.groups[test], strata=labels, n_boot=n_boot, seed=seed)
        chosen |= {"baseline_minus_chosen_auroc": gap.value, "baseline_minus_chosen_auroc_ci95": gap.interval}
    return verdict


def judge_families(rows: list[dict[str, Any]], name: str, baseline: Metric, y: np.ndarray, parts: Parts,
                   baseline_scores: np.ndarray, cfg: Config) -> dict[str, dict[str, Any]]:
    """The verdict over all candidates, then one per family of readouts (each chosen on validation within it)."""
    families = {"all readouts": None, **FAMILIES,
                "lens readouts": tuple(sorted({r["readout"] for r in rows if r["readout"].startswith("lens")}))}
    out = {}
    for family, kinds in families.items():
        subset = [r for r in rows if kinds is None or r["readout"] in kinds]
        if subset:
            what = name if kinds is None else f"{name}, {family}"
            out[family] = judge(subset, what, baseline, y, parts, baseline_scores, cfg.n_boot, cfg.seed)
    return out


def public_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows without their per-item test scores (kept only to pair the chosen readout with the baseline)."""
    return [{k: v for k, v in r.items() if k != "test_scores"} for r in rows]


# --------------------------------------------------------------------------------------------
# P(True): the model judges its own sampled answer, layer by layer
# --------------------------------------------------------------------------------------------
@torch.inference_mode()
def p_true_table(model: HookedTransformer, setting: Setting, persons: np.ndarray, samples: int,
                 seed: int) -> tuple[pd.DataFrame, list[list[int]]]:
    """Sample the value at T = 1 from the full softmax after "<bos> F L birthday", put it into the claim
    "… F L birthday <sample> . Answer :" and read P(True) = p(True) / (p(True) + p(False)). Also the model's own
    probability of the value it sampled (the baseline). Returns the table and the claims' token ids."""
    world, attribute = setting.world, setting.attribute
    value_len = len(world.value_spaces[attribute][0].split())
    people = np.repeat(persons, samples)
    prompts = torch.tensor([setting.ids(statement_prefix(world, int(p), attribute)) for p in people])
    sampled = model.generate(prompts, value_len, temperature=1.0, seed=seed)[:, prompts.shape[1]:]
    tail = setting.ids(". Answer :")
    claims = [row + ids + tail for row, ids in zip(prompts.tolist(), sampled.tolist())]
    log_p = next_token_logprobs(model, claims, setting.token("<pad>"))
    p_yes, p_no = log_p[:, setting.token("True")].exp(), log_p[:, setting.token("False")].exp()
    answer = continuation_logprobs(model, prompts.tolist(), sampled.tolist(), setting.token("<pad>"))
    values = [" ".join(setting.tokenizer.id_to_token(i) for i in ids) for ids in sampled.tolist()]
    truth = [world.true_value(int(p), attribute) for p in people]
    space = set(world.value_spaces[attribute])
    frame = pd.DataFrame({"person": people, "exposure": setting.exposure[people], "value": values, "truth": truth,
                          "well_formed": [v in space for v in values],
                          "correct": [v == t for v, t in zip(values, truth)],
                          "p_true": (p_yes / (p_yes + p_no)).numpy(), "judgement_mass": (p_yes + p_no).numpy(),
                          "answer_probability": np.exp(answer)})
    return frame, claims


@torch.inference_mode()
def lens_p_true(model: HookedTransformer, claims: list[list[int]], setting: Setting) -> np.ndarray:
    """[layer, n]: p(True) / (p(True) + p(False)) read through each layer's logit lens after "Answer :" (the last
    row is the model's own P(True))."""
    tokens = torch.tensor(claims)
    ids = [setting.token("True"), setting.token("False")]
    out = []
    for start in range(0, len(claims), 256):
        log_p = logit_lens(model, tokens[start: start + 256])[:, :, -1][..., ids].double()  # [layer, n, 2]
        out.append(log_p.softmax(-1)[..., 0])
    return torch.cat(out, dim=1).numpy()


def p_true_block(frame: pd.DataFrame, n_boot: int, seed: int) -> dict[str, Any]:
    """P(True) of the model's own answer (the last layer) for every claim and for the subsets; each AUROC with
    n_pos / n_neg and a stratified interval over persons (refused below MIN_PER_CLASS of a class)."""
    def summary(part: pd.DataFrame) -> dict[str, Any]:
        y, s = part["correct"].to_numpy(), part["p_true"].to_numpy()
        return {"n": len(part), "n_correct": int(y.sum()), "accuracy": float(y.mean()),
                "mean_p_true": float(s.mean()), "judgement_mass": float(part["judgement_mass"].mean()),
                "well_formed": float(part["well_formed"].mean()),
                **auroc_ci(s, y, part["person"].to_numpy(), n_boot=n_boot, seed=seed).fields("auroc"),
                "brier": float(np.mean((s - y) ** 2))}

    block = summary(frame)
    block["in_subset"] = summary(frame[frame["subset"] == "format"])
    block["out_of_subset"] = summary(frame[frame["subset"] == "outside"])
    block["out_of_subset_seen"] = summary(frame[(frame["subset"] == "outside") & (frame["exposure"] > 0)])
    return block


def p_true_layers(model: HookedTransformer, untrained: HookedTransformer, frame: pd.DataFrame,
                  claims: list[list[int]], setting: Setting, cfg: Config) -> dict[str, Any]:
    """P(True) given P(IK)'s treatment: the lens P(True) of every layer (the last is the model's own) as the
    candidates, chosen on a validation half of the persons and reported on the other half (nothing is fitted, so
    there is no training split), beside shuffled labels and the untrained model's lens P(True). Baseline: the
    model's own probability of the answer it sampled."""
    y = frame["correct"].to_numpy().astype(int)
    parts = make_parts(frame["person"].to_numpy(), cfg, probes=False)
    lens = {"trained": lens_p_true(model, claims, setting), "untrained": lens_p_true(untrained, claims, setting)}
    rows = []
    n_layers = lens["trained"].shape[0] - 1
    for layer in range(n_layers + 1):
        rows.append({"layer": layer, "readout": "lens P(True)", "position": "judgement slot", "candidate": True,
                     "hook": "the model's own output" if layer == n_layers else f"blocks.{layer}.hook_resid_pre",
                     **fixed_readout_row(lens["trained"][layer], lens["untrained"][layer], y, parts, cfg.n_boot,
                                         cfg.seed),
                     "test_scores": lens["trained"][layer][parts.test]})
    baseline_scores = frame["answer_probability"].to_numpy()
    baseline = auroc_ci(baseline_scores[parts.test], y[parts.test], parts.groups[parts.test], n_boot=cfg.n_boot,
                        seed=cfg.seed)
    verdict = judge(rows, "P(True) by layer", baseline, y, parts, baseline_scores, cfg.n_boot, cfg.seed)
    return {"by_layer": public_rows(rows), "verdict": verdict, "class_counts": class_counts(y, parts),
            "baseline": "the model's own probability of the answer it sampled", "min_per_class": MIN_PER_CLASS,
            "split": "persons: validation half chooses the layer, test half reports it"}


# --------------------------------------------------------------------------------------------
# P(IK): which readouts of the residual stream predict a right answer, layer by layer
# --------------------------------------------------------------------------------------------
def residual_hooks(n_layers: int) -> list[str]:
    """The residual stream entering each layer, and after the last: layer l = 0..n_layers."""
    return [f"blocks.{layer}.hook_resid_pre" for layer in range(n_layers)] + [f"blocks.{n_layers - 1}.hook_resid_post"]


@torch.inference_mode()
def lens_readouts(model: HookedTransformer, setting: Setting, items: list[dict[str, Any]],
                  slot: int) -> dict[str, np.ndarray]:
    """Per layer and item ([layer, n]): the cloze confidence recomputed from that layer's logit lens, and the lens's
    top-token probability and negative entropy at the value slot."""
    world, pad_id = setting.world, setting.token("<pad>")
    prefixes = [setting.ids(statement_prefix(world, item["person"], item["attribute"])) for item in items]
    log_p = continuation_logprobs(model, [p for p in prefixes for _ in range(N_OPTIONS)],
                                  [setting.ids(o) for item in items for o in item["options"]], pad_id, lens=True)
    cloze = softmax(log_p.reshape(log_p.shape[0], len(items), N_OPTIONS)).max(axis=-1)
    lens = logit_lens(model, _batch(prefixes, pad_id))[:, :, slot].double()  # [layer, n, d_vocab]
    entropy = -(lens.exp() * lens).sum(-1)
    return {"lens cloze confidence": cloze, "lens top probability": lens.exp().amax(-1).numpy(),
            "lens negative entropy": (-entropy).numpy()}


def p_ik(model: HookedTransformer, setting: Setting, items: list[dict[str, Any]], frame: pd.DataFrame,
         cfg: Config) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """P(IK) rows (issue 7 item 6) and their verdicts. Label: the cloze answer is right. Candidates: logistic and
    MLP probes on the residual stream at the last name token and at the value slot, and the logit-lens readouts of
    the layers before the last at the value slot. The last layer's lens readouts are the model's own output —
    its lens cloze confidence *is* the baseline — so they are shown beside it and never chosen."""
    world = setting.world
    persons = frame["person"].to_numpy()
    y = frame["correct"].to_numpy().astype(int)
    prefixes = [setting.ids(statement_prefix(world, int(p), setting.attribute)) for p in persons]
    if len({len(p) for p in prefixes}) != 1:
        raise ValueError("every cloze prompt must have the same length (fixed probe positions)")
    tokens = torch.tensor(prefixes)
    name_pos = len(setting.ids("<bos> " + world.persons[int(persons[0])].name)) - 1
    slot = tokens.shape[1] - 1
    parts = make_parts(persons, cfg)
    hooks = residual_hooks(model.cfg.n_layers)
    untrained = random_model(model, seed=cfg.seed + 1)
    acts = {name: collect_activations(m, tokens, hooks, positions=[name_pos, slot], progress=False)
            for name, m in (("trained", model), ("untrained", untrained))}
    rows: list[dict[str, Any]] = []
    for layer, hook in enumerate(hooks):
        for position, index in (("last name token", name_pos), ("value slot", slot)):
            X = {name: a[hook][a.pos == index] for name, a in acts.items()}
            for row in probe_rows(X["trained"], X["untrained"], y, parts, cfg):
                rows.append({"layer": layer, "hook": hook, "position": position, "candidate": True, **row})
    readouts = {name: lens_readouts(m, setting, items, slot) for name, m in (("trained", model), ("untrained", untrained))}
    for readout, scores in readouts["trained"].items():
        for layer, hook in enumerate(hooks):
            rows.append({"layer": layer, "hook": hook, "readout": readout, "position": "value slot",
                         "candidate": layer < len(hooks) - 1, "regularization": None,
                         **fixed_readout_row(scores[layer], readouts["untrained"][readout][layer], y, parts,
                                             cfg.n_boot, cfg.seed),
                         "test_scores": scores[layer][parts.test]})
    confidence = frame["confidence"].to_numpy()
    baseline = auroc_ci(confidence[parts.test], y[parts.test], persons[parts.test], n_boot=cfg.n_boot, seed=cfg.seed)
    verdicts = judge_families(rows, "P(IK)", baseline, y, parts, confidence, cfg)
    info = {**baseline.fields("p_ik_baseline_auroc"), "n_rows": len(y), "class_counts": class_counts(y, parts),
            "share_correct": float(y.mean()), "positions": {"last name token": name_pos, "value slot": slot},
            "verdicts": verdicts}
    return public_rows(rows), info


def p_ik_summary(verdicts: dict[str, dict[str, Any]]) -> list[str]:
    """The verdicts' sentences: over every candidate first, then per family of readouts."""
    return [v["sentence"] for v in verdicts.values()]


# --------------------------------------------------------------------------------------------
# Token-level calibration of English next-token predictions (the pydoc model), layer by layer
# --------------------------------------------------------------------------------------------
def pydoc_model(out: Path) -> tuple[HookedTransformer, str]:
    """The pydoc zoo model, or — when it is not trained — its quick recipe trained into the run folder."""
    from lab.zoo import build, is_trained

    if is_trained("pydoc"):
        return HookedTransformer.from_pretrained("pydoc"), "zoo model pydoc"
    directory = build("pydoc", quick=True, progress=False, out=Path(out) / "pydoc-quick")
    return HookedTransformer.load(directory), ("pydoc quick recipe trained into the run folder (pydoc-quick/): "
                                               "models/pydoc/model.safetensors is missing")


def heldout_english(model: HookedTransformer, n_windows: int) -> Int[Tensor, "window pos"]:
    """The first n_windows × n_ctx tokens of the pydoc corpus's held-out documents, as windows."""
    from lab.data.text import split_text, stdlib_docstrings
    from lab.zoo import load_recipe, zoo_dir

    fraction = load_recipe("pydoc")["world"].get("held_out_fraction", 0.05)
    _, held_out = split_text(stdlib_docstrings(cache=zoo_dir() / "pydoc" / "corpus.txt"), fraction)
    n_ctx, need = model.cfg.n_ctx, n_windows * model.cfg.n_ctx
    ids = model.tokenizer.encode(held_out[: need * 16]).ids  # ≥ 1 byte per token: 16 bytes per token is ample
    if len(ids) < need:
        ids = model.tokenizer.encode(held_out).ids
    n = min(n_windows, len(ids) // n_ctx)
    if n == 0:
        raise ValueError("the held-out English text is shorter than one context window")
    return torch.tensor(ids[: n * n_ctx]).view(n, n_ctx)


def token_level(cfg: Config, out: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Confidence = the top next-token probability, correct = the top token is the next token; for the model
    and through the logit lens at each layer's input (layer n_layers is the model's own prediction)."""
    model, source = pydoc_model(out)  # may train, so outside inference mode
    windows = heldout_english(model, cfg.token_windows)
    confidence, correct, target_lp = [], [], []
    with torch.inference_mode():
        for start in range(0, len(windows), 4):
            tokens = windows[start: start + 4]
            log_p = logit_lens(model, tokens)[:, :, :-1].double()  # [layer, batch, pos − 1, d_vocab]
            target = tokens[:, 1:]
            top_lp, top = log_p.max(dim=-1)
            confidence.append(top_lp.exp().flatten(1))
            correct.append((top == target).flatten(1))
            index = target[None, ..., None].expand(log_p.shape[0], -1, -1, 1)
            target_lp.append(log_p.gather(-1, index)[..., 0].flatten(1))
    c, y, lp = (torch.cat(x, dim=1).numpy() for x in (confidence, correct, target_lp))
    by_layer = []
    for layer in range(c.shape[0]):
        by_layer.append({"layer": layer, "n_tokens": int(c.shape[1]), "accuracy": float(y[layer].mean()),
                         "mean_confidence": float(c[layer].mean()), "nll_nats": float(-lp[layer].mean()),
                         **ece_fields(c[layer], y[layer], "ece", n_boot=cfg.n_boot, seed=cfg.seed),
                         **ece_fields(c[layer], y[layer], "ece_10_equal_mass", 10, "equal_mass", n_boot=cfg.n_boot,
                                      seed=cfg.seed)})
    final = by_layer[-1]
    block = {"model": source, "n_windows": int(len(windows)), "n_ctx": model.cfg.n_ctx,
             "d_vocab": model.cfg.d_vocab, **{k: v for k, v in final.items() if k != "layer"},
             "by_layer": by_layer,
             "note": "intervals resample tokens, which are not independent within a window: they are too narrow"}
    diagram = reliability(c[-1], y[-1])
    curve = [{"bin": int(b), "count": int(n), "confidence": float(x), "accuracy": float(a)}
             for b, n, x, a in zip(diagram.bin, diagram.count, diagram.confidence, diagram.accuracy)]
    return block, curve


# --------------------------------------------------------------------------------------------
# Any local Hugging Face causal LM on an MMLU-layout CSV (issue 7 item 7)
# --------------------------------------------------------------------------------------------
MMLU_COLUMNS = ("question", "A", "B", "C", "D", "answer")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def read_mmlu(path: str | Path) -> list[dict[str, Any]]:
    """MMLU's CSV layout (Hendrycks et al. 2021's data/test/*.csv): question, A, B, C, D, answer letter; the
    original files have no header, a header row naming those columns is skipped."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no MMLU file at {path}")
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if rows and [c.strip().lower() for c in rows[0]] == [c.lower() for c in MMLU_COLUMNS]:
        rows = rows[1:]
    items = []
    for number, row in enumerate(rows, 1):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(MMLU_COLUMNS):
            raise ValueError(f"{path}, row {number}: expected {len(MMLU_COLUMNS)} columns {MMLU_COLUMNS}, "
                             f"got {len(row)}")
        answer = row[5].strip().upper()
        if answer not in OPTION_LETTERS[:N_OPTIONS] or not answer:
            raise ValueError(f"{path}, row {number}: the answer must be one of A, B, C, D, got {row[5]!r}")
        items.append({"question": row[0].strip(), "options": [c.strip() for c in row[1:5]],
                      "answer_index": OPTION_LETTERS.index(answer), "item": len(items)})
    if not items:
        raise ValueError(f"{path} holds no questions")
    return items


def mmlu_prompt(item: dict[str, Any]) -> str:
    """Hendrycks et al.'s zero-shot format: the question, lettered options, then "Answer:"."""
    options = "".join(f"\n{letter}. {option}" for letter, option in zip(OPTION_LETTERS, item["options"]))
    return f"{item['question']}{options}\nAnswer:"


def encode(tokenizer: Any, text: str, special_tokens: bool = True) -> list[int]:
    """Token ids from a Hugging Face tokenizer or a `tokenizers.Tokenizer` (Forma's zoo models)."""
    from tokenizers import Tokenizer

    if isinstance(tokenizer, Tokenizer):
        return tokenizer.encode(text, add_special_tokens=special_tokens).ids
    return list(tokenizer.encode(text, add_special_tokens=special_tokens))


def letter_ids(tokenizer: Any) -> list[int]:
    """The single tokens of " A" … " D" (or of "A" … "D"): where the answer letter's probability is read."""
    from tokenizers import Tokenizer

    unknown = tokenizer.token_to_id("<unk>") if isinstance(tokenizer, Tokenizer) else tokenizer.unk_token_id
    for form in (" {}", "{}"):
        ids = [encode(tokenizer, form.format(letter), False) for letter in OPTION_LETTERS[:N_OPTIONS]]
        flat = [i[0] for i in ids if len(i) == 1]
        if len(flat) == N_OPTIONS and len(set(flat)) == N_OPTIONS and unknown not in flat:
            return flat
    raise ValueError("the tokenizer has no distinct single tokens for the letters A, B, C, D (with or without a "
                     "leading space): lettered multiple choice cannot be read from it")


def load_local_model(name_or_path: str | Path, loader: str = "auto") -> tuple[Any, Any, str]:
    """(model, tokenizer, how it was loaded). A local HF folder: a HookedTransformer through lab.hf.load_hf when
    the architecture converts, else (or with loader="bridge") a TransformerBridge through lab.hf.bridge. A zoo
    name or a Forma model folder: HookedTransformer.from_pretrained, with the tokenizer saved beside it."""
    import json

    from transformers import AutoConfig, AutoTokenizer

    from lab.hf import SUPPORTED, bridge, load_hf

    path = Path(name_or_path)
    config = path / "config.json"
    if not (path.is_dir() and config.is_file() and "model_type" in json.loads(config.read_text())):
        model = HookedTransformer.from_pretrained(name_or_path)
        if model.tokenizer is None:
            raise FileNotFoundError(f"{name_or_path} has no tokenizer.json beside its weights")
        return model, model.tokenizer, f"Forma model {name_or_path}: HookedTransformer.from_pretrained"
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise FileNotFoundError(f"{path} holds no tokenizer: save it beside the model (tokenizer.save_pretrained)")
    model_type = AutoConfig.from_pretrained(path, local_files_only=True).model_type
    if loader == "auto" and model_type in SUPPORTED:
        model, route = load_hf(path), f"{model_type}: converted into a HookedTransformer by lab.hf.load_hf"
    else:
        model, route = bridge(path), f"{model_type}: wrapped by lab.hf.bridge (TransformerBridge)"
    # The folder's own tokenizer for both routes: the bridge's copy is set to prepend a BOS token, which
    # would give the two routes different prompts.
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model.eval(), tokenizer, route


@torch.inference_mode()
def hf_lettered(model: Any, tokenizer: Any, items: list[dict[str, Any]], batch_size: int = 16
                ) -> tuple[pd.DataFrame, list[Tensor], np.ndarray]:
    """Per item the log-probabilities of the letters A–D after the prompt, in a frame shaped like the synthetic
    one; plus the prompts as equal-length batches and the item order of their rows (for activations)."""
    letters = letter_ids(tokenizer)
    n_ctx = getattr(model.cfg, "n_ctx", None)
    encoded = []
    for item in items:
        ids = encode(tokenizer, mmlu_prompt(item))
        encoded.append(ids[-n_ctx:] if n_ctx else ids)  # keep the end: the options and "Answer:"
    by_length: dict[int, list[int]] = {}
    for index, ids in enumerate(encoded):
        by_length.setdefault(len(ids), []).append(index)
    log_p = np.empty((len(items), N_OPTIONS))
    batches, order = [], []
    for _, members in sorted(by_length.items()):
        for start in range(0, len(members), batch_size):
            chunk = members[start: start + batch_size]
            tokens = torch.tensor([encoded[i] for i in chunk])
            logits = model(tokens)[:, -1].double().log_softmax(-1).cpu()
            log_p[chunk] = logits[:, letters].numpy()
            batches.append(tokens)
            order += chunk
    frame = pd.DataFrame({f"option_logit_{k}": log_p[:, k] for k in range(N_OPTIONS)})
    probs = softmax(log_p)
    answer = np.array([item["answer_index"] for item in items])
    frame["answer_index"] = answer
    frame["kind"] = "lettered"
    frame["item"] = np.arange(len(items))
    frame["label_mass"] = np.exp(log_p).sum(axis=1)
    frame["confidence"] = probs.max(axis=1)
    frame["correct"] = probs.argmax(axis=1) == answer
    frame["p_correct"] = probs[np.arange(len(items)), answer]
    return frame, batches, np.array(order)


def hf_p_ik(model: Any, frame: pd.DataFrame, batches: list[Tensor], order: np.ndarray, letters: list[int],
            cfg: Config) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """P(IK) by P(IK)'s rules on MMLU items: logistic and MLP probes on the residual stream at the last prompt
    token per layer (and, for a HookedTransformer, the lens's lettered confidence of the layers before the last
    and the untrained-model control), items split train / validation / test, the verdict from the validation-
    chosen readout on the test items. Baseline: the model's own lettered confidence."""
    y = frame["correct"].to_numpy().astype(int)[order]
    groups = frame["item"].to_numpy()[order]
    confidence = frame["confidence"].to_numpy()[order]
    hooks = residual_hooks(model.cfg.n_layers)
    parts = make_parts(groups, cfg)
    if min(np.bincount(y[parts.train], minlength=2)) == 0:  # a probe cannot be fitted on one class
        raise ValueError(f"the training items are all {'right' if y[parts.train].all() else 'wrong'}: "
                         "no probe can be fitted")
    models = {"trained": model}
    if isinstance(model, HookedTransformer):
        models["untrained"] = random_model(model, seed=cfg.seed + 1)
    acts = {name: collect_activations(m, batches, hooks, positions="last", progress=False)
            for name, m in models.items()}
    rows = []
    for layer, hook in enumerate(hooks):
        X_untrained = acts["untrained"][hook] if "untrained" in acts else None
        for row in probe_rows(acts["trained"][hook], X_untrained, y, parts, cfg):
            rows.append({"layer": layer, "hook": hook, "position": "last prompt token", "candidate": True, **row})
    if isinstance(model, HookedTransformer):
        lens = {name: torch.cat([logit_lens(m, b)[:, :, -1][..., letters] for b in batches], dim=1).double()
                for name, m in models.items()}  # [layer, row, 4]
        for layer, hook in enumerate(hooks):
            scores = {name: softmax(v[layer].numpy()).max(axis=1) for name, v in lens.items()}
            rows.append({"layer": layer, "hook": hook, "readout": "lens lettered confidence",
                         "position": "last prompt token", "candidate": layer < len(hooks) - 1, "regularization": None,
                         **fixed_readout_row(scores["trained"], scores["untrained"], y, parts, cfg.n_boot, cfg.seed),
                         "test_scores": scores["trained"][parts.test]})
    baseline = auroc_ci(confidence[parts.test], y[parts.test], groups[parts.test], n_boot=cfg.n_boot, seed=cfg.seed)
    verdicts = judge_families(rows, "P(IK)", baseline, y, parts, confidence, cfg)
    return public_rows(rows), {**baseline.fields("p_ik_baseline_auroc"), "n_rows": len(y),
                               "class_counts": class_counts(y, parts), "share_correct": float(y.mean()),
                               "verdicts": verdicts}


def run_hf(cfg: Config, out: Path) -> dict[str, Any]:
    """Lettered multiple choice on an MMLU-layout CSV for a local HF causal LM; T and P(IK) with it."""
    items = read_mmlu(cfg.mmlu)
    model, tokenizer, route = load_local_model(cfg.model, cfg.hf_loader)
    timing: dict[str, float] = {}
    began = time.perf_counter()
    frame, batches, order = hf_lettered(model, tokenizer, items)
    timing["lettered_s"] = time.perf_counter() - began
    split_rng = np.random.default_rng([cfg.seed, 9])
    frame["split"] = np.where(split_rng.random(len(frame)) < cfg.calibration_share, "calibration", "test")
    frame["checkpoint"] = "model"
    results: dict[str, Any] = {
        "source": {"model": str(cfg.model), "route": route, "mmlu": str(cfg.mmlu), "n_items": len(items),
                   "n_layers": int(model.cfg.n_layers), "letter_token_ids": letter_ids(tokenizer),
                   "prompt_example": mmlu_prompt(items[0])},
        "mc": None, "lettered": calibration_block(frame, cfg.n_boot, cfg.seed),
        "token_level": None, "p_true": None,
        "note": "a local Hugging Face model on an MMLU-layout CSV: lettered multiple choice only (no cloze, no "
                "P(True), no token-level run); P(IK) probes read the residual stream at the last prompt token",
    }
    results["temperature"] = temperature_block(frame, cfg.n_boot, cfg.seed)
    began = time.perf_counter()
    try:
        rows, info = hf_p_ik(model, frame, batches, order, letter_ids(tokenizer), cfg)
        verdicts = info.pop("verdicts")
        results |= {"p_ik": rows, "p_ik_verdict": verdicts["all readouts"], "p_ik_verdicts": verdicts,
                    "p_ik_summary": p_ik_summary(verdicts), "p_ik_info": info,
                    **{k: v for k, v in info.items() if k.startswith("p_ik_baseline_auroc")}}
    except ValueError as err:  # fewer items than parts, or one class only: not enough data, said in words
        sentence = (f"P(IK): not enough data — {err} ({len(items)} items; a verdict needs at least "
                    f"{MIN_PER_CLASS} right and {MIN_PER_CLASS} wrong answers in each of the validation and test splits)")
        results |= {"p_ik": [], "p_ik_baseline_auroc": None, "p_ik_summary": [sentence],
                    "p_ik_verdict": {"verdict": "not enough data", "carries_signal": None, "sentence": sentence,
                                     "chosen": None, "min_per_class": MIN_PER_CLASS}}
    timing["p_ik_s"] = time.perf_counter() - began
    results["headlines"] = headlines(results)
    results["timing"] = timing
    save_table(frame, out, "items")
    if results["p_ik"]:
        save_table(pd.DataFrame(results["p_ik"]), out, "p_ik")
    test = frame[frame["split"] == "test"]
    after = softmax(option_logits(test), results["temperature"]["T"])
    reliability_figure(out, "reliability_lettered", "Lettered multiple choice (MMLU): reliability", {
        "all items": (frame["confidence"], frame["correct"]),
        f"test split, T = {results['temperature']['T']:.2f}": (after.max(axis=1),
                                                               after.argmax(axis=1) == test["answer_index"])})
    if results["p_ik"]:
        p_ik_figure(out, results["p_ik"], {"model": results["p_ik_baseline_auroc"]})
    return results


# --------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------
def reliability_figure(out: Path, name: str, title: str, curves: dict[str, tuple[Any, Any]]) -> None:
    """Reliability diagrams (15 equal-width bins): accuracy against mean confidence per bin, marker area ∝ count."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for label, (confidence, correct) in curves.items():
        if len(confidence) == 0:
            continue
        r = reliability(np.asarray(confidence, dtype=float), np.asarray(correct, dtype=float))
        size = 6 + 24 * np.sqrt(r.count / r.count.max())
        fig.add_trace(go.Scatter(x=r.confidence, y=r.accuracy, mode="lines+markers", name=label,
                                 marker=dict(size=size), text=[f"n = {n}" for n in r.count]))
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="perfect calibration",
                             line=dict(dash="dash", color="gray")))
    fig.update_layout(title=title, xaxis=dict(title="confidence (top option's probability)", range=[0, 1]),
                      yaxis=dict(title="accuracy", range=[0, 1]))
    save_figure(fig, out, name)


def exposure_figures(out: Path, blocks: dict[str, dict[str, Any]]) -> None:
    """ECE (with its 95% interval and noise floor) and accuracy against confidence, by exposure."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for label, block in blocks.items():
        rows = block["by_exposure"]
        fig.add_trace(go.Bar(x=[r["exposure"] for r in rows], y=[r["ece"] for r in rows], name=f"{label}: ECE",
                             error_y=dict(type="data", symmetric=False,
                                          array=[r["ece_ci95"][1] - r["ece"] for r in rows],
                                          arrayminus=[r["ece"] - r["ece_ci95"][0] for r in rows])))
        fig.add_trace(go.Scatter(x=[r["exposure"] for r in rows], y=[r["noise_floor_ece"] for r in rows],
                                 mode="markers", marker=dict(symbol="line-ew-open", size=24),
                                 name=f"{label}: noise floor"))
    fig.update_layout(title="ECE (15 equal-width bins) by exposure, with 95% bootstrap intervals and the noise floor "
                            "of a perfectly calibrated model", barmode="group",
                      xaxis_title="training statements about the person", yaxis_title="ECE")
    save_figure(fig, out, "ece_by_exposure")

    fig = go.Figure()
    for label, block in blocks.items():
        rows = block["by_exposure"]
        x = [r["exposure"] for r in rows]
        fig.add_trace(go.Scatter(x=x, y=[r["accuracy"] for r in rows], mode="lines+markers", name=f"{label}: accuracy"))
        fig.add_trace(go.Scatter(x=x, y=[r["mean_confidence"] for r in rows], mode="lines+markers",
                                 line=dict(dash="dot"), name=f"{label}: mean confidence"))
    fig.add_hline(y=1 / N_OPTIONS, line_dash="dash", line_color="gray", annotation_text="chance")
    fig.update_layout(title="Accuracy and confidence by exposure", xaxis_title="training statements about the person",
                      yaxis=dict(title="share", range=[0, 1.02]))
    save_figure(fig, out, "accuracy_by_exposure")


def _error_bars(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Asymmetric error bars from each row's key_ci95 (none where the interval was refused)."""
    def span(r: dict[str, Any], side: int) -> float:
        interval = r.get(f"{key}_ci95")
        return float("nan") if not interval else abs(interval[side] - r[key])

    return dict(type="data", symmetric=False, array=[span(r, 1) for r in rows], arrayminus=[span(r, 0) for r in rows])


def p_ik_figure(out: Path, rows: list[dict[str, Any]], baselines: dict[str, float | None],
                name: str = "p_ik_auroc_by_layer", title: str = "P(IK)") -> None:
    """Test-split AUROC of every readout by layer (95% intervals; constant readouts left out) at each checkpoint,
    its controls (in the legend), and the baseline: the model's own final confidence."""
    import plotly.graph_objects as go

    fig = go.Figure()
    rows = [r for r in rows if not r.get("constant")]
    for key in dict.fromkeys((r.get("checkpoint", "model"), r["readout"], r["position"]) for r in rows):
        group = [r for r in rows if (r.get("checkpoint", "model"), r["readout"], r["position"]) == key]
        label = f"{key[0]}: {key[1]} @ {key[2]}"
        x = [r["layer"] for r in group]
        fig.add_trace(go.Scatter(x=x, y=[r["auroc"] for r in group], mode="lines+markers", name=label,
                                 line=dict(dash="solid" if key[0] != "end" else "dashdot"),
                                 error_y=_error_bars(group, "auroc")))
        if any(r["control_untrained_auroc"] is not None for r in group):
            fig.add_trace(go.Scatter(x=x, y=[r["control_untrained_auroc"] for r in group], mode="lines",
                                     line=dict(dash="dot"), name=f"{label}: untrained model", visible="legendonly"))
        fig.add_trace(go.Scatter(x=x, y=[r["control_shuffled_auroc"] for r in group], mode="lines",
                                 line=dict(dash="dash", color="lightgray"), name=f"{label}: shuffled labels",
                                 visible="legendonly"))
    for checkpoint, value in baselines.items():
        if value is not None:
            fig.add_hline(y=value, line_dash="dash", annotation_text=f"{checkpoint}: baseline (the model's own confidence)")
    fig.add_hline(y=0.5, line_color="gray", annotation_text="chance")
    fig.update_layout(title=f"{title}: test-split AUROC of each readout, by layer (entity-disjoint; readouts are "
                            "chosen on a separate validation split)",
                      xaxis_title="layer (residual stream entering it; the last is after the final block)",
                      yaxis=dict(title="AUROC", range=[0, 1]))
    save_figure(fig, out, name)


def token_level_figure(out: Path, block: dict[str, Any]) -> None:
    import plotly.graph_objects as go

    rows = block["by_layer"]
    x = [r["layer"] for r in rows]
    fig = go.Figure([
        go.Scatter(x=x, y=[r["ece"] for r in rows], mode="lines+markers", name="ECE (15 equal-width)",
                   error_y=dict(type="data", symmetric=False, array=[r["ece_ci95"][1] - r["ece"] for r in rows],
                                arrayminus=[r["ece"] - r["ece_ci95"][0] for r in rows])),
        go.Scatter(x=x, y=[r["noise_floor_ece"] for r in rows], mode="lines", line=dict(dash="dot"),
                   name="noise floor"),
        go.Scatter(x=x, y=[r["accuracy"] for r in rows], mode="lines+markers", name="top-1 accuracy"),
        go.Scatter(x=x, y=[r["mean_confidence"] for r in rows], mode="lines+markers", name="mean confidence")])
    fig.update_layout(title=f"Token-level calibration through the logit lens ({block['model']})",
                      xaxis_title="layer (the last is the model's own prediction)", yaxis_title="value")
    save_figure(fig, out, "token_level_by_layer")


def stages_figure(out: Path, stages: list[dict[str, Any]], partial_step: int) -> None:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(specs=[[{"secondary_y": True}]])
    steps = [s["step"] for s in stages]
    fig.add_trace(go.Scatter(x=steps, y=[s["heldout_nll"] for s in stages], mode="lines+markers",
                             name="held-out NLL (nats per statement)"), secondary_y=False)
    fig.add_trace(go.Scatter(x=steps, y=[s["recall_seen"] for s in stages], mode="lines+markers",
                             name="cloze recall of seen persons"), secondary_y=True)
    fig.add_vline(x=partial_step, line_dash="dash", annotation_text="partial checkpoint")
    fig.update_layout(title="Training: held-out NLL and recall by stage", xaxis_title="step")
    fig.update_yaxes(title_text="nats per statement", secondary_y=False)
    fig.update_yaxes(title_text="recall", range=[0, 1.02], secondary_y=True)
    save_figure(fig, out, "training_stages")


# --------------------------------------------------------------------------------------------
# Acceptance (issue 7), checked on the results themselves
# --------------------------------------------------------------------------------------------
def eces_without_interval(results: Any, where: str = "results") -> list[str]:
    """Every ECE in the results that lacks its `_ci95` interval, its `noise_floor_` or its `_debiased` estimate."""
    missing = []
    if isinstance(results, dict):
        for key, value in results.items():
            if (key.startswith("ece") and isinstance(value, float) and not key.endswith(("_p95", "_debiased"))
                    and not all(k in results for k in (f"{key}_ci95", f"noise_floor_{key}", f"{key}_debiased"))):
                missing.append(f"{where}.{key}")
            missing += eces_without_interval(value, f"{where}.{key}")
    elif isinstance(results, list):
        for index, value in enumerate(results):
            missing += eces_without_interval(value, f"{where}[{index}]")
    return missing


def aurocs_without_counts(results: Any, where: str = "results") -> list[str]:
    """Every AUROC in the results without its class counts (`_n_pos`, `_n_neg`) beside it."""
    missing = []
    if isinstance(results, dict):
        for key, value in results.items():
            if ("auroc" in key and isinstance(value, float) and math.isfinite(value) and "minus" not in key
                    and not (f"{key}_n_pos" in results and f"{key}_n_neg" in results)):
                missing.append(f"{where}.{key}")
            missing += aurocs_without_counts(value, f"{where}.{key}")
    elif isinstance(results, list):
        for index, value in enumerate(results):
            missing += aurocs_without_counts(value, f"{where}[{index}]")
    return missing


def acceptance(results: dict[str, Any]) -> dict[str, Any]:
    """Issue 7's acceptance, measured at the partial checkpoint and at the end of training."""
    checks: dict[str, Any] = {}
    for name, blocks in (("partial", results), ("end", results["at_end"])):
        rows = blocks["mc"]["by_exposure"]
        accuracy = [r["accuracy"] for r in rows]
        unseen = next((r for r in rows if r["exposure"] == "0"), None)
        band = None if unseen is None else 2 * math.sqrt(0.25 * 0.75 / unseen["n"])  # ≈95% binomial band at chance
        checks[name] = {
            "cloze_accuracy_by_exposure": dict(zip([r["exposure"] for r in rows], accuracy)),
            "cloze_accuracy_rises_with_exposure": all(b >= a for a, b in zip(accuracy, accuracy[1:])),
            "exposure_0_near_chance": unseen is not None and abs(unseen["accuracy"] - 1 / N_OPTIONS) <= band,
            "exposure_0_chance_band": band,
            "temperature_does_not_raise_test_nll":
                blocks["temperature"]["nll_after"] <= blocks["temperature"]["nll_before"] + 1e-12,
            "p_ik_verdict": blocks["p_ik_verdict"]["verdict"],
            "p_ik_chosen": blocks["p_ik_verdict"]["chosen"],
            "p_true_verdict": blocks["p_true"]["layers"]["verdict"]["verdict"],
        }
    checks["eces_without_interval_or_floor"] = eces_without_interval(results)
    checks["every_ece_has_interval_and_floor"] = not checks["eces_without_interval_or_floor"]
    checks["aurocs_without_counts"] = aurocs_without_counts(results)
    checks["every_auroc_has_counts"] = not checks["aurocs_without_counts"]
    return checks


# --------------------------------------------------------------------------------------------
# Headlines: what a run supports, in words, with the direction a smaller profile must agree on
# --------------------------------------------------------------------------------------------
def _headline(name: str, sentence: str, value: float | None, interval: list[float] | None,
              direction: bool | int | None, why_not: str | None = None) -> dict[str, Any]:
    supported = why_not is None
    return {"name": name, "sentence": sentence, "value": value, "interval": interval,
            "direction": direction if supported else None, "supported": supported, "why_not": why_not}


def _signed(name: str, value: float, interval: list[float] | None, null: float, up: str, down: str,
            what: str) -> dict[str, Any]:
    """A headline whose direction is the side of `null` its 95% interval lies on; none when it straddles."""
    if interval is None or not all(map(math.isfinite, interval)):
        return _headline(name, up, value, None, None, f"{what}: no interval, so no direction")
    if interval[0] <= null <= interval[1]:
        return _headline(name, up, value, interval, None, f"{what}: its 95% interval [{interval[0]:.3f}, "
                         f"{interval[1]:.3f}] includes {null:g}, so this run cannot tell the direction")
    up_side = interval[0] > null
    return _headline(name, up if up_side else down, value, interval, 1 if up_side else -1)


def _wald(p: float, n: int) -> float:
    return 1.96 * math.sqrt(max(p * (1 - p), 0.0) / n)


def _wilson(p: float, n: int) -> list[float]:
    """Wilson's 95% interval for a proportion (Wilson 1927): sound near 0 and 1, where Wald's collapses."""
    z = 1.96
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [centre - half, centre + half]


def _exposure_headlines(block: dict[str, Any], where: str) -> list[dict[str, Any]]:
    rows = {r["exposure"]: r for r in block["by_exposure"]}
    unseen = rows.get("0")
    seen = [rows[k] for k in ("2-5", "6+") if k in rows]
    n_seen = sum(r["n"] for r in seen)
    out = []
    name = f"accuracy_rises_with_exposure_{where}"
    if unseen is None or unseen["n"] < MIN_PER_CLASS or n_seen < MIN_PER_CLASS:
        out.append(_headline(name, "Cloze accuracy by exposure", None, None, None,
                             f"fewer than {MIN_PER_CLASS} never-seen or often-seen evaluation persons"))
    else:
        a0, a1 = unseen["accuracy"], sum(r["accuracy"] * r["n"] for r in seen) / n_seen
        half = math.sqrt(_wald(a0, unseen["n"]) ** 2 + _wald(a1, n_seen) ** 2)
        text = (f"persons seen at least twice are answered right {a1:.0%} of the time, never-seen persons {a0:.0%} "
                f"(difference {a1 - a0:+.2f} [{a1 - a0 - half:+.2f}, {a1 - a0 + half:+.2f}], {where})")
        out.append(_signed(name, a1 - a0, [a1 - a0 - half, a1 - a0 + half], 0.0,
                           f"Cloze accuracy rises with exposure: {text}.", f"Cloze accuracy falls with exposure: {text}.",
                           "the accuracy gap between often-seen and never-seen persons"))
    if where == "end" and unseen is not None and unseen["n"] >= MIN_PER_CLASS:
        low, high = _wilson(unseen["accuracy"], unseen["n"])
        at_chance = low <= 1 / N_OPTIONS <= high
        text = f"{unseen['accuracy']:.0%} [{low:.0%}, {high:.0%}] right of {unseen['n']}, chance {1 / N_OPTIONS:.0%}"
        out.append(_headline("never_seen_at_chance", ("Never-seen persons are answered at chance: " if at_chance else
                                                      "Never-seen persons are not answered at chance: ") + text + ".",
                             unseen["accuracy"], [low, high], at_chance))
        gap, half = unseen["mean_confidence"] - unseen["accuracy"], _wald(unseen["accuracy"], unseen["n"])
        text = (f"mean confidence {unseen['mean_confidence']:.2f} against accuracy {unseen['accuracy']:.2f} "
                f"(gap {gap:+.2f} [{gap - half:+.2f}, {gap + half:+.2f}])")
        out.append(_signed("never_seen_overconfident", gap, [gap - half, gap + half], 0.0,
                           f"Never-seen persons get confident inventions: {text}.",
                           f"On never-seen persons the model is underconfident: {text}.",
                           "the confidence gap on never-seen persons"))
    return out


def _ece_headline(name: str, what: str, block: dict[str, Any], key: str) -> dict[str, Any]:
    """Miscalibration beyond noise (the ECE's interval above a calibrated model's 95th-percentile ECE), or
    calibration within noise (the interval below it); otherwise no direction."""
    value, interval = block[key], block.get(f"{key}_ci95")
    floor, p95 = block[f"noise_floor_{key}"], block[f"noise_floor_{key}_p95"]
    text = (f"ECE {value:.3f}" + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "")
            + f", debiased {block[f'{key}_debiased']:.3f}, against a calibrated model's {floor:.3f} "
              f"(95th percentile {p95:.3f}) at n = {block.get('n', block.get('n_tokens'))}")
    if not interval:
        return _headline(name, f"{what}: {text}.", value, None, None, "no interval for the ECE")
    if interval[0] > p95:
        return _headline(name, f"{what} is miscalibrated beyond noise: {text}.", value, interval, 1)
    if interval[1] < p95:
        return _headline(name, f"{what} is calibrated within noise: {text}.", value, interval, -1)
    return _headline(name, f"{what}: {text}.", value, interval, None,
                     f"the ECE's interval [{interval[0]:.3f}, {interval[1]:.3f}] straddles the noise floor's 95th "
                     f"percentile {p95:.3f}: this run cannot tell miscalibration from noise")


def _temperature_headlines(block: dict[str, Any]) -> list[dict[str, Any]]:
    T, interval = block["T"], block.get("T_ci95")
    eces = "; ".join(f"{label} ECE {block[f'{key}_before']:.3f} → {block[f'{key}_after']:.3f}"
                     for key, label in (("ece_15_equal_width", "15-bin equal-width"),
                                        ("ece_10_equal_mass", "10-bin equal-mass")))
    return [
        _signed("temperature_above_1", T, interval, 1.0,
                f"The model is overconfident: the NLL-fitted temperature is T = {T:.2f}"
                + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "") + " > 1.",
                f"The model is underconfident: the NLL-fitted temperature is T = {T:.2f} < 1.",
                "the fitted temperature"),
        _signed("temperature_lowers_test_nll", block["nll_decrease"], block.get("nll_decrease_ci95"), 0.0,
                f"Temperature scaling lowers the test NLL from {block['nll_before']:.3f} to {block['nll_after']:.3f} "
                f"nats ({eces}; accuracy unchanged).",
                f"Temperature scaling raises the test NLL from {block['nll_before']:.3f} to {block['nll_after']:.3f} "
                f"nats ({eces}).", "the test NLL's change under temperature scaling"),
    ]


def _verdict_headline(name: str, verdict: dict[str, Any] | None) -> dict[str, Any]:
    """A verdict as a headline; its direction: whether the chosen readout carries the signal. True needs the
    verdict's own rule (the test interval clear of both controls' intervals). False needs the interval to reach
    a control's estimate — consistent with no signal; an interval above both estimates yet not clear of their
    intervals is too wide to tell either way, and is not shown. "not enough data", "nothing to score" and "no
    verdict" are not shown, with the verdict's own sentence as the reason."""
    if verdict is None:
        return _headline(name, "", None, None, None, "not measured in this run")
    chosen = verdict.get("chosen") or {}
    value, interval = chosen.get("auroc"), chosen.get("auroc_ci95")
    if verdict["carries_signal"] is None:
        return _headline(name, verdict["sentence"], value, interval, None, verdict["sentence"])
    if verdict["carries_signal"]:
        return _headline(name, verdict["sentence"], value, interval, True)
    controls = max(chosen["control_shuffled_auroc"], chosen["control_untrained_auroc"])
    if interval[0] > controls:
        return _headline(name, verdict["sentence"], value, interval, None,
                         f"{verdict['what']}: the chosen readout's interval [{interval[0]:.3f}, {interval[1]:.3f}] lies "
                         f"above both controls' estimates (up to {controls:.3f}) but not clear of their intervals — "
                         "too few items to tell signal from its absence")
    return _headline(name, verdict["sentence"], value, interval, False)


def _baseline_headline(name: str, blocks: dict[str, Any], what: str) -> dict[str, Any]:
    value, interval = blocks.get("p_ik_baseline_auroc"), blocks.get("p_ik_baseline_auroc_ci95")
    if value is None:
        return _headline(name, "", None, None, None, "not measured in this run")
    counts = (f"{blocks.get('p_ik_baseline_auroc_n_pos')} right and {blocks.get('p_ik_baseline_auroc_n_neg')} wrong "
              "answers on the test split")
    if interval is None:
        return _headline(name, "", value, None, None, f"{what}: {blocks.get('p_ik_baseline_auroc_why_no_interval')}")
    text = f"AUROC {value:.3f} [{interval[0]:.3f}, {interval[1]:.3f}] ({counts})"
    return _signed(name, value, interval, 0.5, f"{what} separates right from wrong answers: {text}.",
                   f"{what} ranks wrong answers above right ones: {text}.", "the baseline's AUROC")


def headlines(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's headlines, a pure function of the rest of results.json. Each is {name, sentence, value, interval,
    direction, supported, why_not}: a supported one is shown with its sentence; an unsupported one is not shown —
    its why_not says in words what this run cannot support (too few items, an interval that straddles the null,
    a verdict of "not enough data"). `direction` (a bool or ±1) is what a smaller profile must agree on."""
    if "at_end" not in results:  # --model PATH --mmlu FILE: lettered multiple choice of a local model
        return [_ece_headline("lettered_ece_beyond_noise", "Lettered multiple choice", results["lettered"],
                              "ece_15_equal_width"),
                *_temperature_headlines(results["temperature"]),
                _baseline_headline("own_confidence_separates", results, "The model's own lettered confidence"),
                _verdict_headline("p_ik_verdict", results.get("p_ik_verdict"))]
    end = results["at_end"]
    out = _exposure_headlines(end["mc"], "end") + _exposure_headlines(results["mc"], "partial")
    out.append(_ece_headline("cloze_ece_beyond_noise", "Cloze multiple choice at the end of training", end["mc"],
                             "ece_15_equal_width"))
    cloze, lettered = end["mc"], end["lettered"]
    gap = cloze["accuracy"] - lettered["accuracy"]
    half = math.sqrt(_wald(cloze["accuracy"], cloze["n"]) ** 2 + _wald(lettered["accuracy"], lettered["n"]) ** 2)
    text = (f"on the evaluation persons cloze multiple choice is answered {cloze['accuracy']:.0%} right, the lettered "
            f"quiz — a format trained on other persons — {lettered['accuracy']:.0%} (chance 25%) at mean confidence "
            f"{lettered['mean_confidence']:.2f}")
    out.append(_signed("lettered_does_not_transfer", gap, [gap - half, gap + half], 0.0,
                       f"Lettered multiple choice does not transfer: {text}.",
                       f"Lettered multiple choice beats cloze: {text}.", "the cloze − lettered accuracy gap"))
    out += _temperature_headlines(end["temperature"])
    out.append(_baseline_headline("own_confidence_separates", end, "The model's own cloze confidence"))
    verdicts = end.get("p_ik_verdicts", {})
    out.append(_verdict_headline("p_ik_verdict", verdicts.get("all readouts")))
    out.append(_verdict_headline("p_ik_verdict_partial", results.get("p_ik_verdicts", {}).get("all readouts")))
    linear = verdicts.get("logistic probes")
    out.append(_verdict_headline("linear_probe_verdict", linear))
    chosen = (linear or {}).get("chosen") or {}
    if chosen.get("baseline_minus_chosen_auroc") is not None:
        value, interval = chosen["baseline_minus_chosen_auroc"], chosen.get("baseline_minus_chosen_auroc_ci95")
        where = f"{chosen['readout']} at the {chosen['position']}, layer {chosen['layer']}"
        out.append(_signed("own_confidence_beats_linear_probes", value, interval, 0.0,
                           f"The model's own confidence beats the best linear probe ({where}, chosen on validation) "
                           f"by {value:.3f} AUROC on the test persons" + (
                               f" [{interval[0]:.3f}, {interval[1]:.3f}]." if interval else "."),
                           f"The best linear probe ({where}) beats the model's own confidence by {-value:.3f} AUROC.",
                           "the AUROC gap between the model's own confidence and the best linear probe"))
    out.append(_verdict_headline("p_true_verdict", end["p_true"]["layers"]["verdict"]))
    token = results.get("token_level")
    if token:
        out.append(_ece_headline("token_level_ece_beyond_noise",
                                 "Next-token prediction of held-out English by the pydoc model", token, "ece"))
    return out


# --------------------------------------------------------------------------------------------
# The experiment
# --------------------------------------------------------------------------------------------
def run(cfg: Config, out: Path) -> dict[str, Any]:
    """The synthetic experiment (or, with cfg.model, lettered multiple choice of a local HF model on
    cfg.mmlu); tables and figures into `out`; returns results.json's dict."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with torch_threads(cfg.threads):
        if cfg.model is not None:
            return run_hf(cfg, out)
        return run_synthetic(cfg, out)


@dataclass
class Evaluation:
    """Everything measured at one checkpoint: per-item tables and their summary blocks."""

    frames: dict[str, pd.DataFrame]  # kind (cloze, lettered) → items of the evaluation persons
    p_true_frame: pd.DataFrame
    p_ik_rows: list[dict[str, Any]]
    blocks: dict[str, Any]  # mc, lettered, temperature, p_true, p_ik, p_ik_baseline_auroc, ...
    timing: dict[str, float]


def evaluate(name: str, step: int, model: HookedTransformer, setting: Setting, items: list[dict[str, Any]],
             cfg: Config) -> Evaluation:
    """Cloze and lettered multiple choice (the same 4 options), temperature scaling, P(True) and P(IK)."""
    world, timing = setting.world, {}
    began = time.perf_counter()
    calibration_person = np.random.default_rng([cfg.seed, 9]).random(len(world.persons)) < cfg.calibration_share
    frames = {}
    for table in (cloze_table, lettered_table):
        frame = table(model, setting, items)
        frame["checkpoint"] = name
        frame["split"] = np.where(calibration_person[frame["person"]], "calibration", "test")
        frames[frame["kind"].iloc[0]] = frame
    format_items = world.quiz_items(setting.format_persons, N_OPTIONS, seed=cfg.seed + 4)  # fresh option sets
    blocks: dict[str, Any] = {
        "mc": {"checkpoint": name, "step": step, **calibration_block(frames["cloze"], cfg.n_boot, cfg.seed)},
        "lettered": {"checkpoint": name, "step": step, **calibration_block(frames["lettered"], cfg.n_boot, cfg.seed),
                     "format_subset_accuracy": float(lettered_table(model, setting, format_items)["correct"].mean()),
                     "note": "knowledge extraction: the lettered format was trained on the format subset only; "
                             "format_subset_accuracy is on fresh option sets for those persons (did the format "
                             "itself generalise beyond the trained quizzes?)"},
        "temperature": temperature_block(frames["cloze"], cfg.n_boot, cfg.seed),
        "format_subset_cloze_accuracy": float(cloze_table(model, setting, format_items)["correct"].mean()),
    }
    timing["multiple_choice_s"] = time.perf_counter() - began

    began = time.perf_counter()
    parts, claims = [], []
    for subset, persons in (("format", setting.format_persons), ("outside", setting.eval_persons)):
        part, part_claims = p_true_table(model, setting, persons, cfg.p_true_samples, seed=cfg.seed + 5)
        part["subset"] = subset
        parts.append(part)
        claims += part_claims
    p_true_frame = pd.concat(parts, ignore_index=True)
    p_true_frame["checkpoint"] = name
    blocks["p_true"] = p_true_block(p_true_frame, cfg.n_boot, cfg.seed)
    blocks["p_true"]["layers"] = p_true_layers(model, random_model(model, seed=cfg.seed + 1), p_true_frame, claims,
                                               setting, cfg)
    for row in blocks["p_true"]["layers"]["by_layer"]:
        row["checkpoint"] = name
    timing["p_true_s"] = time.perf_counter() - began

    began = time.perf_counter()
    rows, info = p_ik(model, setting, items, frames["cloze"], cfg)
    for row in rows:
        row["checkpoint"] = name
    verdicts = info.pop("verdicts")
    blocks |= {"p_ik": rows, **{k: v for k, v in info.items() if k.startswith("p_ik_baseline_auroc")},
               "p_ik_info": info | {"checkpoint": name, "label": "the cloze answer is right",
                                   "split": "entity-disjoint (persons): train fits the probes, validation chooses "
                                            "the readout, test reports it"},
               "p_ik_verdict": verdicts["all readouts"], "p_ik_verdicts": verdicts,
               "p_ik_summary": p_ik_summary(verdicts)}
    timing["p_ik_s"] = time.perf_counter() - began
    return Evaluation(frames, p_true_frame, rows, blocks, timing)


def run_synthetic(cfg: Config, out: Path) -> dict[str, Any]:
    timing: dict[str, float] = {}
    began = time.perf_counter()
    setting = make_setting(cfg)
    world = setting.world
    model = make_model(cfg, setting)
    with tempfile.TemporaryDirectory(prefix="calibration-") as tmp:
        stages, partial = train_in_stages(cfg, setting, model, Path(tmp))
    partial_model = make_model(cfg, setting)
    partial_model.load_state_dict(partial["state"])
    timing["train_s"] = time.perf_counter() - began

    items = world.quiz_items(setting.eval_persons, N_OPTIONS, seed=cfg.seed + 3)
    evaluations = {"partial": evaluate("partial", partial["step"], partial_model.eval(), setting, items, cfg),
                   "end": evaluate("end", cfg.steps, model.eval(), setting, items, cfg)}
    for name, e in evaluations.items():
        timing |= {f"{name}_{k}": v for k, v in e.timing.items()}
    began = time.perf_counter()
    token_block, token_curve = token_level(cfg, out)
    timing["token_level_s"] = time.perf_counter() - began

    eval_exposure = setting.exposure[setting.eval_persons]
    step = partial["step"]
    results: dict[str, Any] = {
        "world": {"n_persons": len(world.persons), "n_train_statements": cfg.n_train, "pareto_gamma": cfg.pareto_gamma,
                  "monofact_rate": world.monofact_rate(), "n_values": len(world.value_spaces[setting.attribute]),
                  "n_format_persons": len(setting.format_persons), "n_eval_persons": len(setting.eval_persons),
                  "eval_persons_by_exposure": {label: int((exposure_bin(eval_exposure) == label).sum())
                                               for *_, label in EXPOSURE_BINS},
                  "documents": setting.doc_counts, "d_vocab": setting.tokenizer.get_vocab_size(),
                  "statement": "<bos> First Last birthday Month day . <eos>",
                  "quiz": "<bos> " + world.quiz_prompt(items[0]) + " " + OPTION_LETTERS[items[0]["answer_index"]],
                  "claim": claim_text(world, int(items[0]["person"]), setting.attribute,
                                      world.true_value(int(items[0]["person"]), setting.attribute)) + " True"},
        "model": {"d_model": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
                  "n_params": model.cfg.n_params(), "n_ctx": model.cfg.n_ctx},
        "training": {"steps": cfg.steps, "batch_size": cfg.batch_size, "stages": stages, "partial_step": step,
                     "partial_recall_seen": partial["recall_seen"], "partial_recall_target": cfg.partial_recall,
                     "heldout_optimum_step": min(stages, key=lambda s: s["heldout_nll"])["step"]},
        "checkpoint": f"partial: step {step} of {cfg.steps}, where the cloze recall of seen evaluation persons is "
                      f"{partial['recall_seen']:.2f}; `at_end` holds the same blocks at the end of training",
        **evaluations["partial"].blocks,
        "token_level": token_block,
        "at_end": {"step": cfg.steps, **evaluations["end"].blocks},
    }
    results["acceptance"] = acceptance(results)
    results["headlines"] = headlines(results)
    results["timing"] = timing

    began = time.perf_counter()
    save_table(pd.concat([f for e in evaluations.values() for f in e.frames.values()], ignore_index=True), out, "items")
    save_table(pd.concat([e.p_true_frame for e in evaluations.values()], ignore_index=True), out, "p_true")
    save_table(pd.DataFrame([r for e in evaluations.values() for r in e.p_ik_rows]), out, "p_ik")
    save_table(pd.DataFrame(token_block["by_layer"]), out, "token_level")
    save_table(pd.DataFrame(stages), out, "stages")
    _figures(out, evaluations, results, token_curve)
    timing["figures_s"] = time.perf_counter() - began
    return results


def _figures(out: Path, evaluations: dict[str, Evaluation], results: dict[str, Any],
             token_curve: list[dict[str, Any]]) -> None:
    import plotly.graph_objects as go

    for kind, title in (("cloze", "Cloze multiple choice"), ("lettered", "Lettered multiple choice")):
        curves = {name: (e.frames[kind]["confidence"], e.frames[kind]["correct"]) for name, e in evaluations.items()}
        if kind == "cloze":
            test = evaluations["partial"].frames["cloze"]
            test = test[test["split"] == "test"]
            T = results["temperature"]["T"]
            probs = softmax(option_logits(test), T)
            curves[f"partial, test split, T = {T:.2f}"] = (probs.max(axis=1),
                                                           probs.argmax(axis=1) == test["answer_index"])
        reliability_figure(out, f"reliability_{kind}", f"{title}: reliability diagram (evaluation persons)", curves)
    exposure_figures(out, {"cloze, partial": results["mc"], "cloze, end": results["at_end"]["mc"],
                           "lettered, partial": results["lettered"]})
    p_ik_figure(out, results["p_ik"] + results["at_end"]["p_ik"],
                {"partial": results["p_ik_baseline_auroc"], "end": results["at_end"]["p_ik_baseline_auroc"]})
    p_ik_figure(out, results["p_true"]["layers"]["by_layer"] + results["at_end"]["p_true"]["layers"]["by_layer"],
                {}, name="p_true_auroc_by_layer", title="P(True) by layer")
    token_level_figure(out, results["token_level"])
    fig = go.Figure([go.Scatter(x=[r["confidence"] for r in token_curve], y=[r["accuracy"] for r in token_curve],
                                mode="lines+markers", name="next token"),
                     go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="perfect calibration",
                                line=dict(dash="dash", color="gray"))])
    fig.update_layout(title=f"Token-level reliability diagram ({results['token_level']['model']})",
                      xaxis=dict(title="confidence", range=[0, 1]), yaxis=dict(title="accuracy", range=[0, 1]))
    save_figure(fig, out, "reliability_token_level")
    stages_figure(out, results["training"]["stages"], results["training"]["partial_step"])
