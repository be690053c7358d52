"""The real-model track, `forma run calibration --model smollm2 [--quick]`: Kadavath et al. 2022 (arXiv 2207.05221)
on a pretrained zoo model and Forma's real question set (lab.data.questions), written to runs/calibration_real/.

One seeded draw of facts serves every part (the same facts asked as multiple choice and as short answer):

* multiple choice (`kadavath`): zero-shot and 5-shot, plain and in the chat template — accuracy, ECE (15 equal-width
  bins, with noise floor) and Brier with bootstrap intervals, a reliability diagram per setting, and temperature
  scaling fitted on one half of the questions (the calibration split) and judged on the other (the test split);
* short answers: the model's greedy answer and `n_samples` answers sampled at T = 1 after three solved questions,
  each judged right or wrong by `is_correct` (the rule below);
* P(True) (Kadavath §4): the question, a proposed answer (one of the model's samples), "Is the proposed answer:
  (A) True (B) False", and P(True) = p(A) / (p(A) + p(B)) at "The proposed answer is: (" — without, and with the
  question's samples brainstormed in context before it; AUROC (grouped by question) against the sample's
  correctness, with its interval;
* P(IK) (Kadavath §5): a logistic probe on the residual stream at the short-answer prompt's last token, at every
  layer, predicting whether the greedy answer is right; questions split train / validation / test (held out by
  question), the layer chosen on validation and reported on test, beside the same probe on shuffled labels; the
  baseline is the model's own confidence (the greedy answer's probability) on the same test questions.

Correctness (`is_correct`): the reply is its first line; reply and answer are normalised — NFKD with combining marks
removed, casefolded, every character that is not a letter or digit made a space, a leading "the" dropped, spaces
collapsed — and the reply is right when it equals the answer, the answer with a plural "s" ("Tunisians" for
"Tunisian"), or begins with the answer's words ("Paris, France" for "Paris"). The question set has no aliases.

Every part writes its numbers into the run folder as it finishes (atomically), and a run continued into the same
folder (`--out`) reads them back instead of measuring again.
"""

import dataclasses
import time
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from experiments import peak_rss_gb
from experiments.calibration.ece import temperature_summary
from experiments.calibration.figures import reliability_figure
from experiments.calibration.kadavath import (
    SETTINGS,
    answer_letter_ids,
    read_letters,
    setting_summary,
    split_questions,
    token_ids,
)
from experiments.calibration.readouts import residual_hooks
from lab.data.questions import Question, load_questions
from lab.metrics.discrimination import auroc_ci

REAL_THREADS = 2  # at least two torch threads: a 135M model's matrices gain from them (the toy runs use one)
SHORT_SHOTS = 3  # solved short-answer questions before each asked one
MAX_ANSWER_TOKENS = 10  # a short answer ends at its first newline, or here
PROBE_FRACTIONS = (0.4, 0.3, 0.3)  # P(IK): train / validation / test, by question
GRID = (1e-3, 1e-2, 1e-1, 1.0)  # P(IK): the logistic probes' L2 strengths, cross-validated on the training questions
MODEL_LABEL = {"smollm2": "SmolLM2-135M-Instruct, 4-bit GGUF dequantized"}
FACTS_MODEL = (
    "The zoo's facts model is not measured beside it: it is trained on a synthetic world of invented persons and "
    "their birthdays, not on countries, so none of these questions can be asked of it."
)
CORRECTNESS_RULE = (
    "first line of the reply; NFKD without combining marks, casefolded, non-alphanumerics as spaces, a leading "
    "'the' dropped; right when equal to the answer, to the answer plus 's', or beginning with the answer's words"
)
QUESTION_SET = "Forma's real question set (lab.data.questions: countryinfo 1.0.1 and CLDR country facts)"


# --------------------------------------------------------------------------------------------
# Short answers: the prompt, the rule that judges them, and the model's samples
# --------------------------------------------------------------------------------------------
def normalise(text: str) -> str:
    """The module's normalisation rule: NFKD without combining marks, casefolded, non-alphanumerics as spaces, a
    leading "the" dropped, spaces collapsed."""
    decomposed = unicodedata.normalize("NFKD", text)
    plain = "".join(ch for ch in decomposed if not unicodedata.combining(ch)).casefold()
    words = "".join(ch if ch.isalnum() else " " for ch in plain).split()
    if words[:1] == ["the"]:
        words = words[1:]
    return " ".join(words)


def is_correct(reply: str, answer: str) -> bool:
    """Whether a short reply (its first line) gives `answer`: equal once normalised, or the answer with a plural
    "s", or beginning with the answer's words."""
    said, wanted = normalise(reply.strip().split("\n")[0]), normalise(answer)
    return bool(wanted) and (said in (wanted, wanted + "s") or said.startswith(wanted + " "))


def short_prompt(question: Question, shots: Sequence[Question]) -> str:
    """Solved questions ("Question: …\\nAnswer: …"), then the question and "Answer:" — the reply comes next."""
    solved = "".join(f"Question: {shot.text}\nAnswer: {shot.answer}\n\n" for shot in shots)
    return f"{solved}Question: {question.text}\nAnswer:"


def batches(prompts: list[list[int]], batch_size: int) -> list[list[int]]:
    """The prompts' indices in batches of near lengths (sorted by length: little padding)."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    return [order[begin : begin + batch_size] for begin in range(0, len(order), batch_size)]


def left_padded(prompts: list[list[int]], chunk: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, attention mask) of the chunk's prompts padded on the left to one length: the model's padding
    (lab.model.padding) keeps every real token's result, positions counted from each prompt's first real token."""
    width = max(len(prompts[i]) for i in chunk)
    tokens = torch.tensor([[prompts[i][0]] * (width - len(prompts[i])) + prompts[i] for i in chunk])
    mask = torch.tensor([[0] * (width - len(prompts[i])) + [1] * len(prompts[i]) for i in chunk])
    return tokens, mask


def padded_decode(model: Any, tokens: torch.Tensor, mask: torch.Tensor, temperature: float, seed: int, stop: int):
    """`lab.model.decoding.sample_tokens` on left-padded prompts: the mask goes with the first step and the KV
    cache keeps it for the rest; up to MAX_ANSWER_TOKENS tokens, a row ending at `stop`."""
    from lab.model.decoding import Sampling, sample_tokens, seeded_generator
    from lab.model.kv_cache import KVCache

    first = [mask]

    def step(new: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        padding, first[0] = first[0], None
        return model.next_token_logits(new, kv_cache=cache, attention_mask=padding)

    cache = KVCache.empty(model.cfg.n_layers, tokens.shape[1] + MAX_ANSWER_TOKENS)
    sampling = Sampling(temperature, generator=seeded_generator(seed, tokens.device))
    return sample_tokens(step, tokens, MAX_ANSWER_TOKENS, model.cfg.d_vocab_out, cache, sampling, stop)


def reply(tokenizer: Any, new_tokens: list[int], newline: int) -> tuple[str, int]:
    """(the reply's text up to its first newline, how many tokens it took, the newline included)."""
    end = new_tokens.index(newline) + 1 if newline in new_tokens else len(new_tokens)
    return tokenizer.decode(new_tokens[:end]).strip(), end


@torch.inference_mode()
def short_answers(
    model: Any, tokenizer: Any, prompts: list[list[int]], n_samples: int, seed: int, batch_size: int = 16
) -> dict[str, Any]:
    """Per prompt: the greedy reply and its probability (of its tokens, the closing newline included: the model's
    own confidence in that answer), and `n_samples` replies drawn at T = 1 (seeded per batch)."""
    from lab.progress import bar

    newline = tokenizer.encode("\n", add_special_tokens=False)[-1]
    greedy, confidence = [""] * len(prompts), np.zeros(len(prompts))
    samples: list[list[str]] = [[] for _ in prompts]
    with bar(len(prompts), "short answers", unit="question") as counter:
        for number, chunk in enumerate(batches(prompts, batch_size)):
            tokens, mask = left_padded(prompts, chunk)
            start = tokens.shape[1]
            out = padded_decode(model, tokens, mask, 0.0, seed, newline)
            log_p = out.logits.double().log_softmax(-1)
            for row, index in enumerate(chunk):
                greedy[index], used = reply(tokenizer, out.tokens[row, start:].tolist(), newline)
                taken = out.tokens[row, start : start + used]
                confidence[index] = float(log_p[row, torch.arange(used), taken].sum().exp())
            drawn = padded_decode(
                model,
                tokens.repeat_interleave(n_samples, dim=0),
                mask.repeat_interleave(n_samples, dim=0),
                1.0,
                seed * 100003 + number,
                newline,
            ).tokens
            for row in range(len(drawn)):
                samples[chunk[row // n_samples]].append(reply(tokenizer, drawn[row, start:].tolist(), newline)[0])
            counter.update(len(chunk))
    return {"greedy": greedy, "confidence": confidence, "samples": samples}


# --------------------------------------------------------------------------------------------
# P(True): Kadavath's self-evaluation of a proposed answer, without and with brainstormed samples
# --------------------------------------------------------------------------------------------
def p_true_prompt(question: Question, proposed: str, brainstorm: Sequence[str] = ()) -> str:
    """Kadavath et al.'s format (§4.1, and §4.2 with samples): the question, the brainstormed ideas one a line when
    given, the proposed ("possible", with ideas) answer, the True / False options, and the reply begun at "(" ."""
    word = "possible" if brainstorm else "proposed"
    ideas = "Here are some brainstormed ideas: " + "\n".join(brainstorm) + "\n" if brainstorm else ""
    return (
        f"Question: {question.text}\n{ideas}{word.capitalize()} Answer: {proposed}\n"
        f"Is the {word} answer:\n (A) True\n (B) False\nThe {word} answer is: ("
    )


@torch.inference_mode()
def padded_next_log_probs(model: Any, prompts: list[list[int]], ids: list[int], batch_size: int = 16) -> np.ndarray:
    """[n, len(ids)] log-probabilities of `ids` as each prompt's next token, prompts of any length batched together
    (`left_padded`); `tests/real/test_calibration_real.py` holds that this equals each prompt run alone."""
    from lab.progress import bar

    out = np.empty((len(prompts), len(ids)))
    with bar(len(prompts), "P(True)", unit="prompt") as counter:
        for chunk in batches(prompts, batch_size):
            tokens, mask = left_padded(prompts, chunk)
            logits = model.next_token_logits(tokens, attention_mask=mask).double().log_softmax(-1)
            out[chunk] = logits[:, ids].numpy()
            counter.update(len(chunk))
    return out


def p_true_scores(model: Any, tokenizer: Any, texts: list[str], batch_size: int = 16) -> np.ndarray:
    """P(True) = p(A) / (p(A) + p(B)) after each prompt's "(" ."""
    prompts = [token_ids(tokenizer, text, False) for text in texts]
    letters = answer_letter_ids(tokenizer, prompts[0], False, texts[0], ("A", "B"))
    log_p = padded_next_log_probs(model, prompts, letters, batch_size)
    return np.exp(log_p[:, 0] - np.logaddexp(log_p[:, 0], log_p[:, 1]))


def p_true_block(scores: np.ndarray, correct: np.ndarray, groups: np.ndarray, n_boot: int, seed: int) -> dict:
    """AUROC of P(True) against the sample's correctness (bootstrap over questions), mean P(True), share right."""
    metric = auroc_ci(scores, correct, groups, n_boot=n_boot, seed=seed)
    return {
        **metric.fields("auroc"),
        "n": len(scores),
        "mean_p_true": float(scores.mean()),
        "share_correct": float(np.mean(correct)),
    }


# --------------------------------------------------------------------------------------------
# P(IK): a probe on the residual stream at every layer, held out by question, against the model's confidence
# --------------------------------------------------------------------------------------------
def layer_row(X: Any, y: np.ndarray, parts: tuple, layer: int, n_boot: int, seed: int) -> dict[str, Any]:
    """One layer's logistic probe fitted on the training questions: its validation AUROC (which chooses the
    layer) and its test AUROC with interval; a layer whose probe cannot be fitted says why."""
    from lab.analysis.probes.probe import fit_probe
    from lab.metrics.discrimination import auroc

    train, validation, test = parts
    row: dict[str, Any] = {"layer": layer}
    try:
        fitted = fit_probe(X, y, "logistic", split=(train, test), n_folds=3, grid=GRID, n_bootstrap=n_boot, seed=seed)
    except ValueError as err:  # one class among the training questions, or a fold without one
        return row | {"validation_auroc": float("nan"), "auroc": float("nan"), "why_not": str(err)}
    if fitted.constant:  # layer 0 at the last token: every prompt ends in the same token
        why = "constant features (every prompt's residual stream is the same here)"
        return row | {"validation_auroc": float("nan"), "auroc": float("nan"), "why_not": why}
    row["validation_auroc"] = float(auroc(fitted.predict_scores(X[validation]).numpy(), y[validation]))
    return row | fitted.metrics["auroc"].fields("auroc") | {"why_not": None}


def p_ik_probe(acts: dict[str, Any], y: np.ndarray, confidence: np.ndarray, n_boot: int, seed: int) -> dict:
    """Every layer's probe (`layer_row`); the layer of best validation AUROC reported on the test questions beside
    the same probe on shuffled labels, and the baseline: the model's own confidence on the same test questions."""
    from lab.analysis.probes.probe import fit_probe
    from lab.analysis.probes.splits import group_partition
    from lab.progress import bar

    y = np.asarray(y).astype(int)
    parts = group_partition(np.arange(len(y)), PROBE_FRACTIONS, seed=seed)
    rows = []
    with bar(len(acts), "P(IK) probes", unit="layer") as counter:
        for layer, hook in enumerate(acts):
            rows.append(layer_row(acts[hook], y, parts, layer, n_boot, seed))
            counter.update()
    test = parts[2]
    baseline = auroc_ci(confidence[test], y[test], n_boot=n_boot, seed=seed)
    block: dict[str, Any] = {
        "layers": rows,
        "n_questions": len(y),
        "share_correct": float(y.mean()),
        "class_counts": {
            name: {"n_pos": int(y[rows_].sum()), "n_neg": int(len(rows_) - y[rows_].sum())}
            for name, rows_ in zip(("train", "validation", "test"), parts)
        },
        **baseline.fields("baseline_auroc"),
    }
    scored = [r for r in rows if np.isfinite(r["validation_auroc"])]
    if not scored:
        return block | {"chosen_layer": None, "auroc": None, "auroc_ci95": None, "why_not": rows[0]["why_not"]}
    best = max(scored, key=lambda r: r["validation_auroc"])
    shuffled = np.random.default_rng(seed + 12345).permutation(y)
    hook = list(acts)[best["layer"]]
    try:
        control = fit_probe(
            acts[hook], shuffled, "logistic", split=(parts[0], test), n_folds=3, grid=GRID, n_bootstrap=n_boot
        )
        block |= control.metrics["auroc"].fields("control_shuffled_auroc")
    except ValueError as err:
        block |= {"control_shuffled_auroc": None, "control_shuffled_auroc_why_no_interval": str(err)}
    return block | {
        "chosen_layer": best["layer"],
        **{k: best[k] for k in best if k.startswith("auroc")},
        "why_not": best["why_not"],
    }


def residuals(model: Any, prompts: list[list[int]]) -> dict[str, Any]:
    """The residual stream at each prompt's last token, at every layer's input and after the last block: {hook:
    [n, d_model]} in the prompts' order."""
    from lab.analysis.activations.collect import collect_activations

    groups: dict[int, list[int]] = {}  # one length a batch: no padding for the hooks to see
    for index, ids in enumerate(prompts):
        groups.setdefault(len(ids), []).append(index)
    chunks = [members[b : b + 16] for _, members in sorted(groups.items()) for b in range(0, len(members), 16)]
    order = np.concatenate([np.array(chunk) for chunk in chunks])
    hooks = residual_hooks(model.cfg.n_layers)
    acts = collect_activations(
        model, [torch.tensor([prompts[i] for i in chunk]) for chunk in chunks], hooks, positions="last", progress=False
    )
    inverse = np.argsort(order)
    return {hook: acts[hook][torch.from_numpy(inverse)] for hook in hooks}


# --------------------------------------------------------------------------------------------
# The run: its parts, each kept in the run folder as it finishes, and what results.json says of them
# --------------------------------------------------------------------------------------------
def part(folder: Path, name: str, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A part of the run: read back from <folder>/parts/<name>.json when an earlier attempt finished it, else
    computed, timed and written there atomically (so an interrupted run continued into the folder skips it)."""
    from lab.outside_files import read_json
    from lab.runs import to_jsonable, write_json

    path = folder / "parts" / f"{name}.json"
    if path.is_file():
        return read_json(path, folder)
    path.parent.mkdir(exist_ok=True)
    began = time.perf_counter()
    value = compute() | {"seconds": time.perf_counter() - began}
    write_json(path, value)
    return to_jsonable(value)  # plain lists and numbers, as a later attempt reads them back


def draw_facts(n_mc: int, n_short: int, seed: int) -> tuple[list, list, list, list]:
    """(mc questions, mc shots, short questions, short shots): one seeded draw of facts; the short-answer forms are
    the first n_short of the drawn facts, their shots the short forms of the first multiple-choice shots."""
    mc = load_questions(form="mc")
    short = {q.id: q for q in load_questions(form="short")}
    most_shots = max(shots for _, shots, _ in SETTINGS)
    evaluated, shown = split_questions(mc, max(n_mc, n_short), most_shots, seed)

    def short_form(q: Question) -> Question:
        return short[q.id.rsplit("/", 1)[0] + "/short"]

    return evaluated[:n_mc], shown, [short_form(q) for q in evaluated[:n_short]], [short_form(q) for q in shown]


def mc_part(model: Any, questions: list, shots: list) -> dict[str, Any]:
    """Each multiple-choice setting's readings: the four letters' probabilities and their label mass."""
    from lab.progress import bar

    out: dict[str, Any] = {}
    with bar(len(SETTINGS), "multiple choice", unit="setting") as counter:
        for name, n_shots, chat in SETTINGS:
            readings = read_letters(model, model.tokenizer, questions, shots[:n_shots], chat)
            out[name] = {"probabilities": readings.probabilities, "label_mass": readings.label_mass}
            counter.update()
    return out


def mc_splits(n: int, seed: int) -> np.ndarray:
    """Each question's side for temperature scaling: half "calibration" (fits T), half "test" (judges it)."""
    side = np.array(["calibration", "test"])[np.arange(n) % 2]
    return side[np.random.default_rng([seed, 9]).permutation(n)]


def mc_results(readings: dict, questions: list, n_boot: int, seed: int, out: Path) -> dict[str, Any]:
    """Per setting: accuracy, ECE and Brier with intervals (`setting_summary`), temperature scaling fitted on the
    calibration half and judged on the test half; one reliability diagram of the four settings."""
    from experiments.calibration.kadavath import Readings
    from lab.data.questions import LETTERS

    answer = np.array([LETTERS.index(q.label) for q in questions])
    split = mc_splits(len(questions), seed)
    blocks, curves = {}, {}
    for name, n_shots, chat in SETTINGS:
        probabilities = np.asarray(readings[name]["probabilities"], dtype=np.float64)
        reading = Readings(probabilities, np.asarray(readings[name]["label_mass"]), answer)
        frame = pd.DataFrame({f"option_logit_{k}": np.log(probabilities[:, k]) for k in range(len(LETTERS))})
        frame["answer_index"], frame["split"] = answer, split
        blocks[name] = {
            "shots": n_shots,
            "chat": chat,
            **setting_summary(reading, n_boot, seed),
            "temperature": temperature_summary(frame, n_boot, seed),
        }
        curves[name] = (reading.confidence, reading.correct)
    reliability_figure(out, "reliability_real", "Multiple choice on real questions: reliability", curves)
    return blocks


def short_part(model: Any, questions: list, shots: list, n_samples: int, seed: int) -> dict[str, Any]:
    """The model's greedy and sampled short answers to each question, and whether each is right (`is_correct`)."""
    tokenizer = model.tokenizer
    prompts = [token_ids(tokenizer, short_prompt(q, shots[:SHORT_SHOTS]), False) for q in questions]
    answers = short_answers(model, tokenizer, prompts, n_samples, seed)
    answers["greedy_correct"] = [is_correct(a, q.answer) for a, q in zip(answers["greedy"], questions)]
    answers["samples_correct"] = [
        [is_correct(s, q.answer) for s in samples] for samples, q in zip(answers["samples"], questions)
    ]
    return answers


def p_true_part(model: Any, questions: list, answers: dict[str, Any]) -> dict[str, Any]:
    """P(True) of every sampled answer, judged alone and with the question's samples brainstormed before it."""
    texts: dict[str, list[str]] = {"alone": [], "brainstorm": []}
    for question, samples in zip(questions, answers["samples"]):
        for sample in samples:
            texts["alone"].append(p_true_prompt(question, sample))
            texts["brainstorm"].append(p_true_prompt(question, sample, samples))
    return {name: p_true_scores(model, model.tokenizer, prompts) for name, prompts in texts.items()}


def p_true_results(scores: dict, answers: dict[str, Any], n_boot: int, seed: int) -> dict[str, Any]:
    """P(True)'s AUROC against each sample's correctness, without and with brainstormed samples."""
    correct = np.array([c for row in answers["samples_correct"] for c in row], dtype=int)
    groups = np.repeat(np.arange(len(answers["samples_correct"])), [len(r) for r in answers["samples_correct"]])
    return {
        name: p_true_block(np.asarray(scores[name]), correct, groups, n_boot, seed) for name in ("alone", "brainstorm")
    }


def p_ik_part(model: Any, questions: list, shots: list, answers: dict, n_boot: int, seed: int) -> dict[str, Any]:
    """P(IK) at every layer from the short-answer prompts' residual streams (`p_ik_probe`)."""
    tokenizer = model.tokenizer
    prompts = [token_ids(tokenizer, short_prompt(q, shots[:SHORT_SHOTS]), False) for q in questions]
    acts = residuals(model, prompts)
    y = np.array(answers["greedy_correct"], dtype=int)
    return p_ik_probe(acts, y, np.asarray(answers["confidence"]), n_boot, seed)


def profile(cfg: Any) -> dict[str, int]:
    """The run's sizes: its real-model profile (experiments.calibration.config, REAL_DEFAULT or REAL_QUICK)."""
    return dataclasses.asdict(cfg.real_profile)


# --------------------------------------------------------------------------------------------
# Headlines: what the run supports, each from an interval that can fail to exclude the null at the run's size
# --------------------------------------------------------------------------------------------
def against(name: str, what: str, value: Any, interval: Any, null: float, why: str | None = None) -> dict[str, Any]:
    """A headline that `what` is above (or below) `null`: supported when its 95% interval excludes `null`, else
    kept with the reason (the interval holds it, or there is no interval: `why`)."""
    from lab.runs import headline

    if value is None or not np.isfinite(value) or not interval:
        reason = why or "no interval"
        return headline(name, f"{what}: not measured", value, None, None, False, reason)
    low, high = interval
    above = low > null
    if not (above or high < null):
        return headline(
            name,
            f"{what} differs from {null:g}",
            value,
            interval,
            None,
            False,
            f"its 95% interval [{low:.3f}, {high:.3f}] includes {null:g} at this run's size",
        )
    side = "above" if above else "below"
    sentence = f"{what} is {side} {null:g}: {value:.3f} [{low:.3f}, {high:.3f}]"
    return headline(name, sentence, value, interval, 1 if above else -1)


def versus_confidence(p_ik: dict[str, Any]) -> dict[str, Any]:
    """Whether the P(IK) probe beats the model's own confidence on the same test questions: supported when the two
    95% intervals do not overlap."""
    from lab.runs import headline

    probe, baseline = p_ik.get("auroc_ci95"), p_ik.get("baseline_auroc_ci95")
    name = "p_ik_versus_confidence"
    if not (probe and baseline):
        why = "the probe or the confidence baseline has no interval at this run's size"
        return headline(name, "P(IK) probe against the model's own confidence", None, None, None, False, why)
    if probe[0] <= baseline[1] and baseline[0] <= probe[1]:
        why = (
            f"the intervals overlap: probe [{probe[0]:.3f}, {probe[1]:.3f}], "
            f"confidence [{baseline[0]:.3f}, {baseline[1]:.3f}]"
        )
        return headline(name, "P(IK) probe against the model's own confidence", None, probe, None, False, why)
    above = probe[0] > baseline[1]
    sentence = (
        f"The P(IK) probe's AUROC {p_ik['auroc']:.3f} [{probe[0]:.3f}, {probe[1]:.3f}] is "
        f"{'above' if above else 'below'} "
        f"the model's own confidence's {p_ik['baseline_auroc']:.3f} [{baseline[0]:.3f}, {baseline[1]:.3f}]"
    )
    return headline(name, sentence, p_ik["auroc"] - p_ik["baseline_auroc"], probe, 1 if above else -1)


def real_headlines(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The real track's headlines, a pure function of the rest of its results."""
    entries = []
    for name, block in results["mc"].items():
        key = name.replace(", ", "_").replace("-", "_")
        entries.append(
            against(
                f"multiple_choice_accuracy_{key}",
                f"Multiple-choice accuracy ({name})",
                block["accuracy"],
                block["accuracy_ci95"],
                block["chance"],
            )
        )
    zero = results["mc"]["zero-shot"]["temperature"]
    entries.append(
        against(
            "temperature_nll_decrease",
            "Temperature scaling's NLL decrease on the test split (zero-shot)",
            zero["nll_decrease"],
            zero["nll_decrease_ci95"],
            0.0,
        )
    )
    for name, words in (("alone", "without"), ("brainstorm", "with")):
        block = results["p_true"][name]
        entries.append(
            against(
                f"p_true_auroc_{name}",
                f"P(True) AUROC {words} brainstormed samples",
                block["auroc"],
                block["auroc_ci95"],
                0.5,
                block.get("auroc_why_no_interval"),
            )
        )
    p_ik = results["p_ik"]
    entries.append(
        against(
            "p_ik_auroc",
            f"P(IK) probe AUROC (layer {p_ik['chosen_layer']}, chosen on validation)",
            p_ik.get("auroc"),
            p_ik.get("auroc_ci95"),
            0.5,
            p_ik.get("auroc_why_no_interval") or p_ik["why_not"],
        )
    )
    entries.append(versus_confidence(p_ik))
    return entries


def measure(cfg: Any, out: Path, model: Any) -> dict[str, Any]:
    """Every part of the real track on `model`, each kept in `out/parts/` (`part`), and the results."""
    sizes = profile(cfg)
    n_boot, seed = sizes["n_boot"], cfg.seed
    mc, mc_shots, short, short_shots = draw_facts(sizes["n_mc"], sizes["n_short"], seed)
    readings = part(out, "mc", lambda: mc_part(model, mc, mc_shots))
    answers = part(out, "short", lambda: short_part(model, short, short_shots, sizes["n_samples"], seed))
    scores = part(out, "p_true", lambda: p_true_part(model, short, answers))
    p_ik = part(out, "p_ik", lambda: p_ik_part(model, short, short_shots, answers, n_boot, seed))
    timing = {
        f"{name}_s": value["seconds"]
        for name, value in (("mc", readings), ("short_answers", answers), ("p_true", scores), ("p_ik", p_ik))
    }
    p_ik.pop("seconds")
    return {
        "model": cfg.model,
        "model_label": MODEL_LABEL.get(str(cfg.model), str(cfg.model)),
        "question_set": QUESTION_SET,
        "profile": "quick" if cfg.quick else "default",
        "sizes": sizes,
        "mc": mc_results(readings, mc, n_boot, seed, out),
        "short_answers": {
            "n_questions": len(short),
            "greedy_accuracy": float(np.mean(answers["greedy_correct"])),
            "sample_accuracy": float(np.mean(answers["samples_correct"])),
            "mean_confidence": float(np.mean(answers["confidence"])),
            "correctness_rule": CORRECTNESS_RULE,
            "examples": [
                {"question": q.text, "answer": q.answer, "greedy": g, "correct": c, "samples": " | ".join(s)}
                for q, g, c, s in list(zip(short, answers["greedy"], answers["greedy_correct"], answers["samples"]))[:8]
            ],
        },
        "p_true": p_true_results(scores, answers, n_boot, seed),
        "p_ik": p_ik,
        "facts_model": FACTS_MODEL,
        "timing": timing,
        "questions": {"mc": [q.id for q in mc], "short": [q.id for q in short]},
    }


def run_real(cfg: Any, out: Path) -> dict[str, Any]:
    """The real-model track of `cfg.model` into `out`: results with headlines, its items and figures, the peak
    memory, and each part's and the whole's wall time."""
    from lab.model.transformer import HookedTransformer
    from lab.runs import save_table

    began = time.perf_counter()
    model = HookedTransformer.from_pretrained(cfg.model).eval()
    load_s = time.perf_counter() - began
    if model.tokenizer is None:
        raise ValueError(f"{cfg.model} has no tokenizer: the real-model track needs one to ask questions")
    results = measure(cfg, Path(out), model)
    results["timing"] |= {"load_s": load_s, "wall_s": time.perf_counter() - began}
    results["peak_rss_gb"] = peak_rss_gb()
    results["headlines"] = real_headlines(results)
    save_table(pd.DataFrame(results["p_ik"]["layers"]), out, "p_ik_layers")
    return results
