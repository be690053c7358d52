"""Any local Hugging Face causal LM on an MMLU-layout CSV (issue 7 item 7): lettered multiple choice, temperature
scaling and P(IK) probes by the synthetic experiment's rules."""

import csv
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from lab.analysis.activations import collect_activations
from lab.analysis.lens import logit_lens
from lab.analysis.probes import random_model
from lab.data.facts import OPTION_LETTERS
from lab.metrics.calibration import MIN_PER_CLASS, auroc_ci, softmax
from lab.model import HookedTransformer
from lab.runs import save_table

from experiments.calibration.blocks import calibration_block, option_logits, temperature_block
from experiments.calibration.config import N_OPTIONS, Config
from experiments.calibration.figures import p_ik_figure, reliability_figure
from experiments.calibration.readouts import (class_counts, fixed_readout_row, judge_families, make_parts,
                                              p_ik_summary, probe_rows, public_rows, residual_hooks)
from experiments.calibration.summary import headlines


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
