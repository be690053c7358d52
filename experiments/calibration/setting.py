"""The synthetic world as token ids, the model's readings of it (cloze and lettered multiple choice), and
training in stages towards the partial checkpoint."""

import copy
import logging
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

from experiments.calibration.config import EXPOSURE_BINS, N_OPTIONS, Config
from lab.analysis.lens import logit_lens
from lab.data.facts import OPTION_LETTERS, Fact, FactWorld, FactWorldConfig
from lab.data.tokenizers import word_level
from lab.metrics.calibration import softmax
from lab.metrics.discrimination import auroc
from lab.model.config import ModelConfig
from lab.model.transformer import HookedTransformer
from lab.train.batches import SequenceBatches, pad_documents
from lab.train.config import TrainConfig
from lab.train.loop import train

logger = logging.getLogger(__name__)


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
    heldout_rows: Tensor  # independent i.i.d. statements from p (the held-out NLL), not unseen facts
    heldout_mask: Tensor
    doc_counts: dict[str, int]
    held_out: dict[str, Any]  # how the held-out statements were drawn, their overlap with training

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
    """ "<bos> First Last birthday": the bare statement up to its value slot."""
    return "<bos> " + world.render(Fact(person, attribute, "\x00"), "bare").split("\x00")[0].strip()


def claim_text(world: FactWorld, person: int, attribute: str, value: str) -> str:
    """ "<bos> First Last birthday Month day . Answer :" — a claim waiting for its True/False judgement."""
    return f"<bos> {world.render(Fact(person, attribute, value), 'bare')} Answer :"


def _training_documents(
    cfg: Config, world: FactWorld, tokenizer: Any, format_persons: np.ndarray, rng: np.random.Generator
) -> tuple[list[list[int]], list[list[bool]], dict[str, int]]:
    """The training documents as token ids, which of their tokens are scored, and how many of each kind: every
    statement, and the format persons' quizzes and true and false claims (one wrong value each, drawn by `rng`)."""

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text).ids

    attribute = "birthday"
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
    return rows, scored, counts


def make_setting(cfg: Config) -> Setting:
    world = FactWorld(
        FactWorldConfig(
            n_first_names=cfg.n_first_names,
            n_last_names=cfg.n_last_names,
            n_persons=cfg.n_persons,
            attributes=("birthday",),
            pareto_gamma=cfg.pareto_gamma,
            n_train=cfg.n_train,
            seed=cfg.seed,
        )
    )
    tokenizer = word_level(world.word_vocabulary())
    # One fact per person (one attribute), so a fact's training count is its person's exposure.
    exposure = world.train_counts.copy()
    rng = np.random.default_rng([cfg.seed, 7])
    seen = np.flatnonzero(exposure > 0)
    format_persons = np.sort(rng.choice(seen, size=round(cfg.format_share * len(seen)), replace=False))
    eval_persons = np.setdiff1d(np.arange(len(world.persons)), format_persons)

    rows, scored, counts = _training_documents(cfg, world, tokenizer, format_persons, rng)
    length = max(len(r) for r in rows)
    pad_id = tokenizer.token_to_id("<pad>")
    train_rows, train_mask = pad_documents(rows, pad_id, length, scored)

    heldout = world.heldout_fact_indices(cfg.n_heldout)  # independent draws from p, not unseen facts
    held = [tokenizer.encode(f"<bos> {world.render(world.facts[i], 'bare')} <eos>").ids for i in heldout]
    heldout_rows, heldout_mask = pad_documents(held, pad_id, length, [[False] + [True] * (len(r) - 1) for r in held])
    return Setting(
        world,
        tokenizer,
        "birthday",
        exposure,
        format_persons,
        eval_persons,
        train_rows,
        train_mask,
        heldout_rows,
        heldout_mask,
        counts,
        world.heldout_record(heldout),
    )


def make_model(cfg: Config, setting: Setting) -> HookedTransformer:
    model_cfg = ModelConfig(
        d_vocab=setting.tokenizer.get_vocab_size(),
        d_model=cfg.d_model,
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
        n_ctx=setting.seq_len,
        positions="learned",
        mlp="gelu",
        tokenizer="facts-word-level",
    )
    return HookedTransformer(model_cfg, seed=cfg.seed, tokenizer=setting.tokenizer)


# --------------------------------------------------------------------------------------------
# Reading the model
# --------------------------------------------------------------------------------------------
def right_padded(rows: Sequence[Sequence[int]], pad_id: int) -> Int[Tensor, "n pos"]:
    """Right-padded rows (a causal model never looks right, so padding changes nothing before it)."""
    length = max(len(r) for r in rows)
    out = torch.full((len(rows), length), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row)
    return out


@torch.inference_mode()
def continuation_logprobs(
    model: HookedTransformer,
    prefixes: Sequence[Sequence[int]],
    continuations: Sequence[Sequence[int]],
    pad_id: int,
    lens: bool = False,
    batch_size: int = 512,
) -> np.ndarray:
    """log P(continuation | prefix) for each pair, in nats: [n] from the model, or [layer, n] through the
    logit lens of every layer (the last row is the model's own)."""
    out = []
    for start in range(0, len(prefixes), batch_size):
        pre, cont = prefixes[start : start + batch_size], continuations[start : start + batch_size]
        tokens = right_padded([list(p) + list(c) for p, c in zip(pre, cont)], pad_id)
        log_p = logit_lens(model, tokens) if lens else model(tokens).log_softmax(-1)[None]
        total = torch.zeros(log_p.shape[0], len(pre), dtype=torch.float64)
        for i, (p, c) in enumerate(zip(pre, cont)):
            positions = torch.arange(len(p) - 1, len(p) + len(c) - 1)
            total[:, i] = log_p[:, i, positions, torch.tensor(c)].double().sum(-1)
        out.append(total)
    result = torch.cat(out, dim=1).numpy()
    return result if lens else result[0]


@torch.inference_mode()
def next_token_logprobs(
    model: Any, prompts: Sequence[Sequence[int]], pad_id: int, batch_size: int = 256
) -> Float[Tensor, "n d_vocab"]:
    """log P(next token | prompt) at each prompt's last position."""
    out = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        logits = model(right_padded(chunk, pad_id))
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
    """Mean −log P(statement) in nats per held-out statement (independent i.i.d. draws from p)."""
    rows, mask = setting.heldout_rows, setting.heldout_mask
    log_p = model(rows).double().log_softmax(-1)[:, :-1].gather(-1, rows[:, 1:, None])[..., 0]
    return float(-(log_p * mask[:, 1:]).sum(dim=1).mean())


def _train_config(cfg: Config, setting: Setting) -> TrainConfig:
    """The whole run's training configuration (one cosine schedule over cfg.steps; stages stop and resume it)."""
    return TrainConfig(
        steps=cfg.steps,
        batch_size=cfg.batch_size,
        seq_len=setting.seq_len,
        lr=cfg.lr,
        min_lr=cfg.min_lr,
        warmup_steps=cfg.warmup_steps,
        eval_interval=cfg.steps,
        eval_batches=1,
        seed=cfg.seed,
    )


def train_in_stages(
    cfg: Config, setting: Setting, model: HookedTransformer, work: Path
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Train for cfg.steps in cfg.n_stages equal stages (one cosine schedule); after each, the held-out NLL, the
    cloze recall of the format persons (`recall_selection`) and that of the seen evaluation persons
    (`recall_seen`). Returns the stage records and the partial checkpoint: the stage before the last whose recall
    of the format persons is nearest cfg.partial_recall, with its weights. It is chosen on other persons than the
    evaluation persons it is reported on (all seen, and every one of them outside the evaluation), so the recall
    it reports is measured, not selected."""
    train_cfg = _train_config(cfg, setting)
    data = SequenceBatches(
        setting.train_rows, setting.heldout_rows, mask=setting.train_mask, val_mask=setting.heldout_mask
    )
    stage_items = setting.world.quiz_items(setting.eval_persons, N_OPTIONS, seed=cfg.seed + 17)
    selection_items = setting.world.quiz_items(setting.format_persons, N_OPTIONS, seed=cfg.seed + 18)
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
        selection = float(cloze_table(model, setting, selection_items)["correct"].mean())
        stages.append(
            {
                "stage": index + 1,
                "step": end,
                "heldout_nll": nll_value,
                "recall_selection": selection,
                "recall_seen": recall,
                "cloze_accuracy": float(cloze["correct"].mean()),
                "cloze_auroc_confidence": auroc(cloze["confidence"], cloze["correct"]),
                "cloze_auroc_confidence_n_pos": int(cloze["correct"].sum()),
                "cloze_auroc_confidence_n_neg": int((~cloze["correct"]).sum()),
                "train_loss_nats": result.train_loss_nats,
                "stage_s": time.perf_counter() - began,
            }
        )
        logger.info(
            "step %d: held-out NLL %.4f nats per statement, cloze recall of the format persons %.3f, of "
            "seen evaluation persons %.3f",
            end,
            nll_value,
            selection,
            recall,
        )
        if partial_stage(stages, cfg.partial_recall, cfg.steps) == index:  # nearer than any stage before it
            partial = {
                "step": end,
                "recall_selection": selection,
                "recall_seen": recall,
                "state": copy.deepcopy(model.state_dict()),
            }
    return stages, partial


def partial_stage(stages: list[dict[str, Any]], target: float, steps: int) -> int | None:
    """The index of the partial checkpoint among `stages`: the stage before the end of training (step < steps)
    whose recall of the format persons (`recall_selection`) is nearest `target`, the earliest on a tie — never
    the evaluation persons' recall (`recall_seen`), which is reported there. None when every stage is the end."""
    before = [i for i, stage in enumerate(stages) if stage["step"] < steps]
    return min(before, key=lambda i: abs(stages[i]["recall_selection"] - target)) if before else None
