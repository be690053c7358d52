"""Any local Hugging Face causal LM on an MMLU-layout CSV: lettered multiple choice, temperature scaling and P(IK)
probes by the synthetic experiment's rules. The CSV, the model and the prompts are read and checked first
(`read_mmlu_inputs`), before the run writes anything."""

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from experiments.calibration.config import N_OPTIONS, Config
from experiments.calibration.ece import calibration_summary, option_logits, temperature_summary
from experiments.calibration.figures import p_ik_figure, reliability_figure
from experiments.calibration.readouts import (
    class_counts,
    judge_families,
    lens_rows,
    make_parts,
    p_ik_summary,
    probe_rows,
    public_rows,
    residual_hooks,
)
from experiments.calibration.summary import headlines
from lab.analysis.activations.collect import collect_activations
from lab.analysis.lens import logit_lens
from lab.analysis.probes.readouts import random_model
from lab.data.facts import OPTION_LETTERS
from lab.metrics.calibration import softmax
from lab.metrics.discrimination import MIN_PER_CLASS, auroc_ci
from lab.model.transformer import HookedTransformer
from lab.runs import save_table

# --------------------------------------------------------------------------------------------
# Any local Hugging Face causal LM on an MMLU-layout CSV
# --------------------------------------------------------------------------------------------
MMLU_COLUMNS = ("question", "A", "B", "C", "D", "answer")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# Rows read into memory as Python strings and lists take about ten times the file's bytes (measured on
# MMLU-sized rows); a CSV whose bytes times this exceed the memory available is refused before it is read.
CSV_MEMORY_FACTOR = 16
# Temperature scaling needs items on both sides of the calibration / test split (each item's side drawn at
# random with probability calibration_share): with fewer than this many, one side is empty too often.
MIN_MMLU_ITEMS = 10


def read_question_csv(path: str | Path, what: str) -> list[tuple[int, list[str]]]:
    """[(line, cells)] of a question CSV, read through `lab.outside_files.read_csv` (UTF-8, a byte-order mark dropped, a
    byte that is not UTF-8 or a cell over the csv module's limit named by line); refused first, with the numbers,
    when reading it could not fit in the memory available."""
    from lab.model.memory_check import available_memory
    from lab.outside_files import InputError, read_csv, regular_file, size_text

    path = Path(path)
    size = regular_file(path, what=what).stat().st_size
    available = available_memory(torch.device("cpu"))
    if available is not None and size * CSV_MEMORY_FACTOR > available:
        raise InputError(
            f"{path} is {size_text(size)}: reading it takes about {size_text(size * CSV_MEMORY_FACTOR)} "
            f"of memory, and {size_text(available)} is available; split it into smaller files"
        )
    return read_csv(path, what=what)


def read_mmlu(path: str | Path) -> list[dict[str, Any]]:
    """MMLU's CSV layout (Hendrycks et al. 2021's data/test/*.csv): question, A, B, C, D, answer letter; the
    original files have no header, a header row naming those columns is skipped, and so are blank rows. One line
    naming the file and line for a row of another width, an empty question, an answer that is not A–D, and for
    fewer than MIN_MMLU_ITEMS questions."""
    from lab.outside_files import InputError

    path = Path(path)
    rows = read_question_csv(path, "MMLU file")
    if rows and [c.strip().lower() for c in rows[0][1]] == [c.lower() for c in MMLU_COLUMNS]:
        rows = rows[1:]
    items = []
    for line, row in rows:
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(MMLU_COLUMNS):
            raise InputError(
                f"{path}, line {line}: expected {len(MMLU_COLUMNS)} columns {MMLU_COLUMNS}, got {len(row)}"
            )
        if not row[0].strip():
            raise InputError(f"{path}, line {line}: the question is empty")
        answer = row[5].strip().upper()
        if answer not in OPTION_LETTERS[:N_OPTIONS] or not answer:
            raise InputError(f"{path}, line {line}: the answer must be one of A, B, C, D, got {row[5]!r}")
        items.append(
            {
                "question": row[0].strip(),
                "options": [c.strip() for c in row[1:5]],
                "answer_index": OPTION_LETTERS.index(answer),
                "item": len(items),
                "line": line,
            }
        )
    if len(items) < MIN_MMLU_ITEMS:
        raise InputError(
            f"{path} holds {len(items)} question{'s' if len(items) != 1 else ''}; temperature scaling "
            f"needs at least {MIN_MMLU_ITEMS}, to have some on each side of its calibration / test split"
        )
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
    raise ValueError(
        "the tokenizer has no distinct single tokens for the letters A, B, C, D (with or without a "
        "leading space): lettered multiple choice cannot be read from it"
    )


def load_local_model(name_or_path: str | Path, loader: str = "auto") -> tuple[Any, Any, str]:
    """(model, tokenizer, how it was loaded). A local HF folder: a HookedTransformer through lab.hf.loading.load_hf when
    the architecture converts, else (or with loader="bridge") a TransformerBridge through lab.hf.loading.bridge. A zoo
    name or a Forma model folder: HookedTransformer.from_pretrained, with the tokenizer saved beside it. The
    folder is read through lab.hf, which runs none of its code."""
    from lab.hf.families import SUPPORTED
    from lab.hf.folder import hf_model_type, local_tokenizer
    from lab.hf.loading import bridge, load_hf

    path = Path(name_or_path)
    model_type = hf_model_type(path) if path.is_dir() else None
    if model_type is None:
        model = HookedTransformer.from_pretrained(name_or_path)
        if model.tokenizer is None:
            raise FileNotFoundError(f"{name_or_path} has no tokenizer.json beside its weights")
        return model, model.tokenizer, f"Forma model {name_or_path}: HookedTransformer.from_pretrained"
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise FileNotFoundError(f"{path} holds no tokenizer: save it beside the model (tokenizer.save_pretrained)")
    if loader == "auto" and model_type in SUPPORTED:
        model, route = load_hf(path), f"{model_type}: converted into a HookedTransformer by lab.hf.loading.load_hf"
    else:
        model, route = bridge(path), f"{model_type}: wrapped by lab.hf.loading.bridge (TransformerBridge)"
    # The folder's own tokenizer for both routes: the bridge's copy is set to prepend a BOS token, which
    # would give the two routes different prompts.
    return model.eval(), local_tokenizer(path), route


def context_length(model: Any) -> int | None:
    """The most tokens the model reads at once (its n_ctx: a HookedTransformer's, or the bridge's, from the Hugging
    Face config's n_positions / max_position_embeddings); None when it names none."""
    n_ctx = getattr(model.cfg, "n_ctx", None)
    return int(n_ctx) if isinstance(n_ctx, int) and n_ctx > 0 else None


def encode_prompts(
    tokenizer: Any, prompts: list[tuple[int, str]], context: int | None, source: str | Path, reserve: int = 0
) -> list[list[int]]:
    """The token ids of each (line, prompt), counted by a progress bar (a CSV of a million rows takes minutes).
    Forma cuts no prompt: one that, with `reserve` tokens left for the answer, does not fit the model's context
    would lose its start — the question — so an InputError names how many do not fit and the first one's line."""
    from lab.outside_files import InputError
    from lab.progress import bar

    encoded, too_long = [], []
    with bar(len(prompts), "tokenise", unit="prompt") as counter:
        for line, text in prompts:
            ids = encode(tokenizer, text)
            if context is not None and len(ids) + reserve > context:
                too_long.append((line, len(ids)))
            encoded.append(ids)
            counter.update()
    if too_long:
        line, n = too_long[0]
        room = (
            f"{context - reserve} tokens (its context of {context} less {reserve} for the answer)"
            if reserve
            else f"its context of {context} tokens"
        )
        raise InputError(
            f"{source}: {len(too_long)} of {len(prompts)} prompts are longer than the model reads, "
            f"{room} (the first, line {line}, is {n} tokens); Forma cuts no prompt, which would drop its "
            "question: shorten them, or use a model with a longer context"
        )
    return encoded


def check_memory(source: str | Path, n_items: int, per_item: int, what: str) -> None:
    """An InputError, with the numbers, when `n_items` items of `per_item` bytes each cannot fit in the memory
    available; checked before the model reads the first one."""
    from lab.model.memory_check import available_memory
    from lab.outside_files import InputError, size_text

    available = available_memory(torch.device("cpu"))
    if available is not None and n_items * per_item > available:
        raise InputError(
            f"{source}: {n_items:,} items need about {size_text(n_items * per_item)} for {what} "
            f"({size_text(per_item)} each), and {size_text(available)} is available: use fewer items"
        )


def mmlu_splits(n_items: int, cfg: Config) -> np.ndarray:
    """Each item's side, "calibration" (fits T) or "test", drawn with probability calibration_share from the seed."""
    draws = np.random.default_rng([cfg.seed, 9]).random(n_items)
    return np.where(draws < cfg.calibration_share, "calibration", "test")


def check_splits(source: str | Path, splits: np.ndarray, needed: tuple[str, ...], seed: int) -> None:
    """An InputError when the seed's draw leaves one of the `needed` splits without an item."""
    from lab.outside_files import InputError

    empty = [name for name in needed if not (splits == name).any()]
    if empty:
        raise InputError(
            f"{source}: with seed {seed}, none of the {len(splits)} items falls in the {empty[0]} split: "
            "use more items, or another --seed"
        )


@dataclass
class LocalInputs:
    """What a run of a local model on a CSV reads before it writes anything: the items, the model and its
    tokenizer, how the model was loaded, and each item's prompt as token ids."""

    items: list[dict[str, Any]]
    model: Any
    tokenizer: Any
    route: str
    prompts: list[list[int]]


def read_mmlu_inputs(cfg: Config) -> LocalInputs:
    """The MMLU file, the model and the prompts, each checked (`read_mmlu`, `load_local_model`, `encode_prompts`,
    and the memory the activations will take): what `forma run` reads before it makes the run folder."""
    items = read_mmlu(cfg.mmlu)
    check_splits(cfg.mmlu, mmlu_splits(len(items), cfg), ("calibration", "test"), cfg.seed)
    model, tokenizer, route = load_local_model(cfg.model, cfg.hf_loader)
    prompts = encode_prompts(
        tokenizer, [(item["line"], mmlu_prompt(item)) for item in items], context_length(model), cfg.mmlu
    )
    # P(IK) holds each item's residual stream at every layer, for the model and (a HookedTransformer) an untrained
    # copy of it, beside its tokens.
    models = 2 if isinstance(model, HookedTransformer) else 1
    longest = max(len(ids) for ids in prompts)
    check_memory(
        cfg.mmlu,
        len(items),
        8 * longest + 4 * models * model.cfg.n_layers * model.cfg.d_model,
        "their tokens and residual streams",
    )
    return LocalInputs(items, model, tokenizer, route, prompts)


@torch.inference_mode()
def hf_lettered(
    model: Any,
    tokenizer: Any,
    items: list[dict[str, Any]],
    batch_size: int = 16,
    encoded: list[list[int]] | None = None,
) -> tuple[pd.DataFrame, list[Tensor], np.ndarray]:
    """Per item the log-probabilities of the letters A–D after the prompt, in a frame shaped like the synthetic
    one; plus the prompts as equal-length batches and the item order of their rows (for activations). `encoded`:
    the prompts' token ids, when `encode_prompts` has made them already."""
    from lab.progress import bar

    letters = letter_ids(tokenizer)
    if encoded is None:
        encoded = encode_prompts(
            tokenizer,
            [(item.get("line", item["item"]), mmlu_prompt(item)) for item in items],
            context_length(model),
            "the items",
        )
    by_length: dict[int, list[int]] = {}
    for index, ids in enumerate(encoded):
        by_length.setdefault(len(ids), []).append(index)
    log_p = np.empty((len(items), N_OPTIONS))
    batches, order = [], []
    with bar(len(items), "lettered", unit="item") as counter:
        for _, members in sorted(by_length.items()):
            for start in range(0, len(members), batch_size):
                chunk = members[start : start + batch_size]
                tokens = torch.tensor([encoded[i] for i in chunk])
                logits = model(tokens)[:, -1].double().log_softmax(-1).cpu()
                log_p[chunk] = logits[:, letters].numpy()
                batches.append(tokens)
                order += chunk
                counter.update(len(chunk))
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


def hf_p_ik(
    model: Any, frame: pd.DataFrame, batches: list[Tensor], order: np.ndarray, letters: list[int], cfg: Config
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
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
        raise ValueError(
            f"the training items are all {'right' if y[parts.train].all() else 'wrong'}: no probe can be fitted"
        )
    models = {"trained": model}
    if isinstance(model, HookedTransformer):
        models["untrained"] = random_model(model, seed=cfg.seed + 1)
    acts = {
        name: collect_activations(m, batches, hooks, positions="last", progress=False) for name, m in models.items()
    }
    rows = []
    for layer, hook in enumerate(hooks):
        X_untrained = acts["untrained"][hook] if "untrained" in acts else None
        for row in probe_rows(acts["trained"][hook], X_untrained, y, parts, cfg):
            rows.append({"layer": layer, "hook": hook, "position": "last prompt token", "candidate": True, **row})
    if isinstance(model, HookedTransformer):
        lens = {
            name: torch.cat([logit_lens(m, b)[:, :, -1][..., letters] for b in batches], dim=1).double()
            for name, m in models.items()
        }  # [layer, row, 4]
        scores = {
            name: [softmax(v[layer].numpy()).max(axis=1) for layer in range(len(hooks))] for name, v in lens.items()
        }
        readout = "lens lettered confidence"
        rows += lens_rows(readout, "last prompt token", scores["trained"], scores["untrained"], hooks, y, parts, cfg)
    baseline = auroc_ci(confidence[parts.test], y[parts.test], groups[parts.test], n_boot=cfg.n_boot, seed=cfg.seed)
    verdicts = judge_families(rows, "P(IK)", baseline, y, parts, confidence, cfg)
    return public_rows(rows), {
        **baseline.fields("p_ik_baseline_auroc"),
        "n_rows": len(y),
        "class_counts": class_counts(y, parts),
        "share_correct": float(y.mean()),
        "verdicts": verdicts,
    }


def _p_ik_blocks(
    model: Any, frame: pd.DataFrame, batches: Any, order: Any, letters: list[int], cfg: Config
) -> dict[str, Any]:
    """results' P(IK) blocks: the readouts and their verdicts, or a verdict of "not enough data" saying why."""
    try:
        rows, info = hf_p_ik(model, frame, batches, order, letters, cfg)
        verdicts = info.pop("verdicts")
        return {
            "p_ik": rows,
            "p_ik_verdict": verdicts["all readouts"],
            "p_ik_verdicts": verdicts,
            "p_ik_summary": p_ik_summary(verdicts),
            "p_ik_info": info,
            **{k: v for k, v in info.items() if k.startswith("p_ik_baseline_auroc")},
        }
    except ValueError as err:  # fewer items than parts, or one class only: not enough data, said in words
        sentence = (
            f"P(IK): not enough data — {err} ({len(frame)} items; a verdict needs at least "
            f"{MIN_PER_CLASS} right and {MIN_PER_CLASS} wrong answers in each of the validation and test splits)"
        )
        return {
            "p_ik": [],
            "p_ik_baseline_auroc": None,
            "p_ik_summary": [sentence],
            "p_ik_verdict": {
                "verdict": "not enough data",
                "carries_signal": None,
                "sentence": sentence,
                "chosen": None,
                "min_per_class": MIN_PER_CLASS,
            },
        }


def _figures(out: Path, frame: pd.DataFrame, results: dict[str, Any]) -> None:
    """The reliability diagram (all items, and the test split at the fitted T), and P(IK) by layer."""
    test = frame[frame["split"] == "test"]
    after = softmax(option_logits(test), results["temperature"]["T"])
    reliability_figure(
        out,
        "reliability_lettered",
        "Lettered multiple choice (MMLU): reliability",
        {
            "all items": (frame["confidence"], frame["correct"]),
            f"test split, T = {results['temperature']['T']:.2f}": (
                after.max(axis=1),
                after.argmax(axis=1) == test["answer_index"],
            ),
        },
    )
    if results["p_ik"]:
        p_ik_figure(out, results["p_ik"], {"model": results["p_ik_baseline_auroc"]})


def run_hf(cfg: Config, out: Path, inputs: LocalInputs | None = None) -> dict[str, Any]:
    """Lettered multiple choice on an MMLU-layout CSV for a local HF causal LM; T and P(IK) with it. `inputs`:
    what `read_mmlu_inputs(cfg)` read (read here when not given)."""
    inputs = inputs or read_mmlu_inputs(cfg)
    items, model, tokenizer, route = inputs.items, inputs.model, inputs.tokenizer, inputs.route
    timing: dict[str, float] = {}
    began = time.perf_counter()
    frame, batches, order = hf_lettered(model, tokenizer, items, encoded=inputs.prompts)
    timing["lettered_s"] = time.perf_counter() - began
    frame["split"] = mmlu_splits(len(frame), cfg)
    frame["checkpoint"] = "model"
    results: dict[str, Any] = {
        "source": {
            "model": str(cfg.model),
            "route": route,
            "mmlu": str(cfg.mmlu),
            "n_items": len(items),
            "n_layers": int(model.cfg.n_layers),
            "letter_token_ids": letter_ids(tokenizer),
            "prompt_example": mmlu_prompt(items[0]),
        },
        "mc": None,
        "lettered": calibration_summary(frame, cfg.n_boot, cfg.seed),
        "token_level": None,
        "p_true": None,
        "note": "a local Hugging Face model on an MMLU-layout CSV: lettered multiple choice only (no cloze, no "
        "P(True), no token-level run); P(IK) probes read the residual stream at the last prompt token",
    }
    results["temperature"] = temperature_summary(frame, cfg.n_boot, cfg.seed)
    began = time.perf_counter()
    results |= _p_ik_blocks(model, frame, batches, order, letter_ids(tokenizer), cfg)
    timing["p_ik_s"] = time.perf_counter() - began
    results["headlines"] = headlines(results)
    results["timing"] = timing
    save_table(frame, out, "items")
    if results["p_ik"]:
        save_table(pd.DataFrame(results["p_ik"]), out, "p_ik")
    _figures(out, frame, results)
    return results
