"""The real-model track: `forma run monitor --model smollm2 [--quick]` — the monitor's per-token risk signals on a
pretrained model's answers to Forma's real short-answer questions (lab.data.questions: countries' capitals,
currencies, languages, regions, subregions and demonyms, each with its source), into runs/monitor_real/.

Questions. `n_questions` short-answer questions drawn from the seed, and before them, as shots, one solved question
of each kind (the first of each kind in the same seeded order, never evaluated). The prompt is plain text, not the
chat template: "Question: …\\nAnswer: …" for each shot, a blank line after it, then the question and "Answer:". In
the chat template SmolLM2-135M-Instruct answers in sentences ("The capital of The Gambia is Banjeria."), which no
stated match scores fairly; after plain shots it answers in the shots' form — a value, then a line break.

Answers. Greedy, with the monitor on, up to the set's longest answer in tokens and two more (at most
`qa_max_new_tokens`); the answer is the continuation up to its first line break (or a special token such as
<|im_end|>). It is right when its key equals the answer's key (`answer_key`: folded to ASCII, lower case, every run
of characters other than letters and digits one space, a leading "the" dropped) — "the Euro." matches "Euro", "Yen"
does not match "Japanese Yen". The sampling baselines draw k answers per question at T = 1, cut and keyed alike
(self-consistency: the share equal to the greedy answer's key; semantic entropy over the classes of equal keys).

Prompts of one token length run as one batch (no padding). The probe and P(IK) read the residual streams on the
greedy passes themselves (hooks that only read: the positions that produced each answer token, and the prompt's
last), and are cross-fitted over folds of questions as in the CSV mode (`experiments.monitor.qa`). The samples run
on the shots' keys and values, computed once. Questions are drawn into fit / calibration / test (`qa_splits`);
signals are judged as there (`judge_questions`), and conformal risk control is checked on held-out questions for
every signal and α (`crc_check`).
"""

import os
import random
import re
import resource
import time
import unicodedata
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from experiments import peak_rss_gb
from experiments.monitor.config import REAL_MODELS, TRAINED, Config
from experiments.monitor.figures import write_figures
from experiments.monitor.judging import crc_check
from experiments.monitor.qa import cross_fit_readouts, judge_questions, qa_prompt, qa_splits
from experiments.monitor.summary import headlines
from lab.analysis.monitor import Monitor
from lab.data.questions import KINDS as QUESTION_KINDS
from lab.data.questions import Question, load_questions
from lab.metrics.selective import answer_agreement, crc_min_calibration, discrete_semantic_entropy
from lab.model.decoding import Sampling, sample_tokens, seeded_generator
from lab.model.kv_cache import KVCache
from lab.runs import save_table

# Prompts per batch: a batch's first pass holds logits over the whole vocabulary (49,152 tokens) at every position
# of every prompt, several times over (log-softmax, the lens), so memory goes with the batch; the 300 questions'
# runs of equal length, uncut, took the default run past 9 GB.
MAX_BATCH = 8
REAL_THREADS = 2  # a 135M model's matmuls gain from a second thread, where the toy world's tiny ones lose
QUESTION_SET = "Forma's real question set (lab.data.questions: countryinfo 1.0.1 and CLDR), short-answer form"


# --------------------------------------------------------------------------------------------
# Questions, prompts and the match
# --------------------------------------------------------------------------------------------
def real_questions(n: int, seed: int) -> tuple[list[Question], list[Question]]:
    """(evaluated, shots): one shot of each kind, then `n` other short-answer questions, all in one seeded order."""
    order = random.Random(seed).sample(load_questions(form="short"), k=len(load_questions(form="short")))
    shots = [next(q for q in order if q.kind == kind) for kind in QUESTION_KINDS]
    rest = [q for q in order if q not in shots]
    if n > len(rest):
        raise ValueError(f"n_questions is {n}, but the real question set holds {len(rest)} short-answer questions")
    return rest[:n], shots


def real_prompt(question: Question, shots: list[Question]) -> str:
    """The plain few-shot prompt: each shot "Question: …\\nAnswer: value" and a blank line, then the question."""
    solved = "".join(f"{qa_prompt(shot.text)} {shot.answer}\n\n" for shot in shots)
    return solved + qa_prompt(question.text)


def answer_key(text: str) -> str:
    """What an answer is matched on: folded to ASCII (NFKD, combining marks dropped), lower case, each run of
    characters other than letters and digits one space, surrounding spaces and a leading "the" dropped."""
    folded = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    key = re.sub(r"[^a-z0-9]+", " ", folded.lower()).strip()
    return key[4:] if key.startswith("the ") else key


def is_right(generated: str, answer: str) -> bool:
    """The generated answer is right when its key equals the answer's (an empty answer is never right)."""
    return answer_key(generated) != "" and answer_key(generated) == answer_key(answer)


def cut_answer(tokenizer: Any, new: list[int], stops: set[int]) -> tuple[str, int]:
    """The answer: the continuation up to its first line break or special token, and how many tokens made it (at
    least one: the token that decided an empty answer is still its only token)."""
    for k, token in enumerate(new):
        if token in stops:
            return tokenizer.decode(new[:k]), max(1, k)
        text = tokenizer.decode(new[: k + 1])
        if "\n" in text:
            return text.split("\n")[0], max(1, k)
    return tokenizer.decode(new), len(new)


# --------------------------------------------------------------------------------------------
# Reading the model and the questions
# --------------------------------------------------------------------------------------------
@dataclass
class RealInputs:
    """The model and its tokenizer, the evaluated questions (ordered by prompt length: one batch per length), the
    shots, each question's prompt ids, and how long loading took."""

    model: Any
    tokenizer: Any
    questions: list[Question]
    shots: list[Question]
    prompts: list[list[int]]
    load_s: float
    max_new_tokens: int


def read_real_inputs(cfg: Config) -> RealInputs:
    """The pretrained model (a zoo name of REAL_MODELS) and the prompts: what `forma run` reads before it makes the
    run folder."""
    from lab.model.transformer import HookedTransformer

    began = time.perf_counter()
    model = HookedTransformer.from_pretrained(cfg.model).eval()
    load_s = time.perf_counter() - began
    evaluated, shots = real_questions(cfg.n_questions, cfg.seed)
    encoded = [list(model.tokenizer.encode(real_prompt(q, shots))) for q in evaluated]
    order = sorted(range(len(evaluated)), key=lambda i: (len(encoded[i]), i))
    # room for the set's longest answer, its line break and one token more (an answer tokenized otherwise):
    # no right answer is cut short, and no step is spent on what could only be wrong
    longest = max(len(model.tokenizer.encode(" " + q.answer)) for q in load_questions(form="short"))
    return RealInputs(
        model,
        model.tokenizer,
        [evaluated[i] for i in order],
        shots,
        [encoded[i] for i in order],
        load_s,
        min(cfg.qa_max_new_tokens, longest + 2),
    )


def stop_tokens(tokenizer: Any) -> tuple[int | None, set[int]]:
    """(the line break's id, where decoding may stop early; every id that ends an answer: the special ones)."""
    newline = tokenizer.encode("\n", add_special_tokens=False)
    return (newline[0] if len(newline) == 1 else None), set(getattr(tokenizer, "all_special_ids", []))


def length_batches(prompts: list[list[int]], most: int = MAX_BATCH) -> list[slice]:
    """Runs of equal length in `prompts` (ordered by length), cut into batches of at most `most` prompts."""
    cuts = [0] + [i for i in range(1, len(prompts)) if len(prompts[i]) != len(prompts[i - 1])] + [len(prompts)]
    return [slice(s, min(s + most, b)) for a, b in zip(cuts[:-1], cuts[1:]) for s in range(a, b, most)]


# --------------------------------------------------------------------------------------------
# Generating with the monitor on, the readouts, the sampling baselines
# --------------------------------------------------------------------------------------------
def monitored_real(inputs: RealInputs, cfg: Config) -> dict[str, Any]:
    """Each question's greedy answer under the monitor, batch by batch: its row (id, kind, question, answer,
    generated, false), its token signals over the answer, its length; and, read by hooks on the same passes, the
    residual streams the probe and P(IK) are fitted on (`read_activations`); each batch's suffix after the shots."""
    from lab.progress import bar

    model = inputs.model
    monitor = Monitor(model, attention=False)
    newline, stops = stop_tokens(inputs.tokenizer)
    hooks = (monitor.middle_hook, f"blocks.{model.cfg.n_layers - 1}.hook_resid_post")
    rows, series, lengths, probe_rows, pik_rows = [], {name: [] for name in monitor.token_signals}, [], [], []
    with bar(len(inputs.questions), "monitored generation", unit="question") as counter:
        for part in length_batches(inputs.prompts):
            tokens = torch.tensor(inputs.prompts[part])
            with read_activations(model, hooks) as seen:
                result = monitor.generate(tokens, inputs.max_new_tokens, eos_token_id=newline)
            middle = torch.cat(seen[hooks[0]], dim=1)  # [batch, prompt + steps, d_model]
            p = tokens.shape[1]
            for row, question in enumerate(inputs.questions[part]):
                answer, length = cut_answer(inputs.tokenizer, result.new_tokens[row].tolist(), stops)
                rows.append(answer_row(question, answer, length))
                for name in monitor.token_signals:
                    series[name].append(result.signals[name][row, :length])
                lengths.append(length)
                probe_rows.append(middle[row, p - 1 : p - 1 + length].float())
                pik_rows.append(seen[hooks[1]][0][row, p - 1].float())
            counter.update(len(tokens))
    return {
        "rows": rows,
        "series": series,
        "lengths": lengths,
        "readout_rows": (probe_rows, torch.stack(pik_rows), hooks),
        "monitor": monitor,
    }


def answer_row(question: Question, answer: str, length: int) -> dict[str, Any]:
    return {
        "id": question.id,
        "kind": question.kind,
        "question": question.text,
        "answer": question.answer,
        "generated": answer,
        "n_answer_tokens": length,
        "false": not is_right(answer, question.answer),
    }


@contextmanager
def read_activations(model: Any, hooks: tuple[str, ...]) -> Iterator[dict[str, list[Tensor]]]:
    """{hook: [what it saw on each pass]} while the block runs: the prompt's pass [batch, pos, d_model], then one
    [batch, 1, d_model] per decoding step — the positions that produced each new token, which a forward pass over
    the prompt and its answer would give again. The hooks only read, and are removed when the block ends."""
    seen: dict[str, list[Tensor]] = {h: [] for h in hooks}

    def keep(activation: Tensor, hook: Any) -> None:
        seen[hook.name].append(activation.detach().clone())

    with model.hooks(fwd_hooks=[(h, keep) for h in hooks]):
        yield seen


def prefix_cache(model: Any, prefix: list[int]) -> KVCache:
    """The keys and values of the shots (`prefix`, one row): every prompt begins with them."""
    cache = KVCache.empty(model.cfg.n_layers)
    with torch.inference_mode():
        model(torch.tensor([prefix]), kv_cache=cache)
    return cache


def real_sampling(inputs: RealInputs, generated: dict[str, Any], cfg: Config) -> dict[str, np.ndarray]:
    """Self-consistency and semantic entropy (`lab.metrics.selective`): k answers per question at T = 1 from the
    full softmax, cut and keyed like the greedy one. The shots' keys and values are computed once and shared by
    every row (`expanded_cache`), each batch's own tokens run on them; each batch is seeded with the seed plus the
    number of questions before it."""
    from experiments.calibration.kadavath import expanded_cache, shared_prefix
    from lab.progress import bar

    model = inputs.model
    newline, stops = stop_tokens(inputs.tokenizer)
    shared = shared_prefix(inputs.prompts)
    cache = prefix_cache(model, inputs.prompts[0][:shared])
    greedy = [answer_key(row["generated"]) for row in generated["rows"]]
    agreement, entropy = [], []
    with bar(len(inputs.questions), f"{cfg.k_samples} answers sampled per question", unit="question") as counter:
        for part in length_batches(inputs.prompts):
            own = torch.tensor([ids[shared:] for ids in inputs.prompts[part]]).repeat_interleave(cfg.k_samples, dim=0)
            with torch.inference_mode():
                out = sample_tokens(
                    model.next_token_logits,
                    own,
                    inputs.max_new_tokens,
                    model.cfg.d_vocab_out,
                    expanded_cache(cache, len(own)),
                    Sampling(generator=seeded_generator(cfg.seed + 31 + part.start, own.device)),
                    eos_token_id=newline,
                    keep_logits=False,
                ).tokens[:, own.shape[1] :]
            for row, answer in enumerate(greedy[part]):
                keys = [
                    answer_key(cut_answer(inputs.tokenizer, s.tolist(), stops)[0])
                    for s in out[row * cfg.k_samples : (row + 1) * cfg.k_samples]
                ]
                agreement.append(answer_agreement(keys, answer))
                entropy.append(discrete_semantic_entropy(keys))
            counter.update(part.stop - part.start)
    return {"self_consistency": np.array(agreement), "semantic_entropy": np.array(entropy)}


# --------------------------------------------------------------------------------------------
# The run's two long parts, kept in its folder as each ends: a run continued into the folder (`--out`) reads them
# back, bit for bit, instead of generating again
# --------------------------------------------------------------------------------------------
PARTS = "parts"


def kept_arrays(path: Path, compute: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """`compute()`'s arrays, or those an earlier attempt wrote to `path` (safetensors, written atomically)."""
    from safetensors.numpy import load_file, save_file

    from lab.files import atomic_write
    from lab.outside_files import regular_file

    if path.is_file():
        return load_file(str(regular_file(path, path.parent)))
    arrays = compute()
    path.parent.mkdir(exist_ok=True)
    atomic_write(path, lambda tmp: save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(tmp)))
    return arrays


def kept_generation(folder: Path, compute: Callable[[], dict[str, Any]], model: Any) -> dict[str, Any]:
    """`monitored_real`'s answers, signals and readout rows, or those an earlier attempt kept in `folder`: the
    tensors in generation.safetensors (each question's rows one after another), then the rows, lengths and hooks in
    generation.json, written last, so that it is there only when both are whole."""
    from safetensors.torch import load_file, save_file

    from lab.files import atomic_write
    from lab.outside_files import read_json, regular_file
    from lab.runs import write_json

    tensors_path, record_path = folder / "generation.safetensors", folder / "generation.json"
    if record_path.is_file():
        record, tensors = read_json(record_path, folder), load_file(str(regular_file(tensors_path, folder)))
        lengths = record["lengths"]
        return {
            "rows": record["rows"],
            "series": {name: list(torch.split(tensors[f"series.{name}"], lengths)) for name in record["signals"]},
            "lengths": lengths,
            "readout_rows": (list(torch.split(tensors["probe"], lengths)), tensors["pik"], tuple(record["hooks"])),
            "monitor": Monitor(model, attention=False),
        }
    generated = compute()
    probe_rows, pik_rows, hooks = generated["readout_rows"]
    tensors = {f"series.{name}": torch.cat(rows) for name, rows in generated["series"].items()}
    tensors |= {"probe": torch.cat(probe_rows), "pik": pik_rows}
    folder.mkdir(exist_ok=True)
    atomic_write(tensors_path, lambda tmp: save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp)))
    order = {"signals": list(generated["series"]), "hooks": list(hooks)}  # safetensors keeps its keys sorted
    write_json(record_path, {"rows": generated["rows"], "lengths": generated["lengths"]} | order)
    return generated


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------
def held_out_checks(frame: pd.DataFrame, split: np.ndarray, alphas: list[float], cfg: Config) -> list[dict[str, Any]]:
    """`crc_check` for every signal (its risk column in `frame`) and every α the calibration split supports."""
    false = frame["false"].to_numpy()
    names = [c.removeprefix("risk_") for c in frame.columns if c.startswith("risk_")]
    return [
        {"signal": name, **crc_check(frame[f"risk_{name}"].to_numpy(), false, split, alpha, cfg.n_resplits, cfg.seed)}
        for name in names
        for alpha in alphas
    ]


def real_source(cfg: Config, inputs: RealInputs, split: np.ndarray) -> dict[str, Any]:
    """results["source"]: the model, the question set, the prompt, the match, the split."""
    return {
        "model": cfg.model,
        "model_label": REAL_MODELS[cfg.model],
        "questions": QUESTION_SET,
        "n_items": len(inputs.questions),
        "by_kind": {kind: sum(q.kind == kind for q in inputs.questions) for kind in QUESTION_KINDS},
        "shots": [q.id for q in inputs.shots],
        "prompt_format": "plain text, one solved question of each kind before the question (not the chat "
        "template: there the model answers in sentences)",
        "prompt_example": real_prompt(inputs.questions[0], inputs.shots),
        "decoding": f"greedy, up to {inputs.max_new_tokens} tokens, the answer cut at its first line break",
        "scoring": "the answer's key equals the question's answer's key: folded to ASCII, lower case, every run "
        "of characters other than letters and digits one space, a leading 'the' dropped",
        "n_by_split": {s: int((split == s).sum()) for s in ("fit", "calibration", "test")},
        "split": "questions drawn into fit / calibration / test, disjoint; fit chooses the signs of the "
        "untrained signals and LTT's grid, calibration the thresholds, test reports; the probe and P(IK) are "
        "cross-fitted over folds of all the questions",
    }


def run_real(cfg: Config, out: Path, inputs: RealInputs | None = None) -> dict[str, Any]:
    """The real-model track (the module's docstring); `inputs`: what `read_real_inputs(cfg)` read."""
    began_run = time.perf_counter()
    loaded_before = inputs is not None  # `forma run` reads the model before it makes the run folder
    inputs = inputs or read_real_inputs(cfg)
    timing: dict[str, float] = {"load_s": inputs.load_s, "load_average_1min_at_start": os.getloadavg()[0]}
    began = time.perf_counter()
    generated = kept_generation(out / PARTS, lambda: monitored_real(inputs, cfg), inputs.model)
    timing["monitored_generation_s"] = time.perf_counter() - began
    frame = pd.DataFrame(generated["rows"])
    false = frame["false"].to_numpy()
    split = qa_splits(len(frame), cfg)
    frame["split"] = split
    monitor, series = generated["monitor"], generated["series"]
    unavailable = dict(monitor.unavailable) | {"subject_attention": "a question has no marked subject"}

    began = time.perf_counter()
    values = kept_arrays(out / PARTS / "sampling.safetensors", lambda: real_sampling(inputs, generated, cfg))
    timing["sampling_s"] = time.perf_counter() - began
    began = time.perf_counter()
    probe_rows, pik_rows, hooks = generated["readout_rows"]
    fitted, missing = cross_fit_readouts(probe_rows, pik_rows, hooks, generated["lengths"], false, cfg)
    timing["readouts_s"] = time.perf_counter() - began
    unavailable = {k: v for k, v in unavailable.items() if k not in TRAINED} | missing
    if "probe" in fitted:
        series["probe"] = fitted["probe"]
    if "p_ik" in fitted:
        values["p_ik"] = fitted["p_ik"]

    judged, curves = judge_questions(series, values, generated["lengths"], frame, split, cfg)
    # CRC alone is checked wherever its calibration split can answer anything (n ≥ ⌈1/α⌉ − 1), LTT's need aside
    n_cal, n_test = int((split == "calibration").sum()), int((split == "test").sum())
    scored = [a for a in cfg.alphas if n_cal >= crc_min_calibration(a) and n_test > 0]
    results: dict[str, Any] = {
        "source": real_source(cfg, inputs, split),
        "answers": {"qa": {"n": len(frame), "false_rate": float(false.mean())}},
        "accuracy_by_kind": {k: float(1 - frame.loc[frame["kind"] == k, "false"].mean()) for k in QUESTION_KINDS},
        "readouts": fitted["info"],
        "k_samples": cfg.k_samples,
        "unavailable": unavailable,
        **judged,
        "crc_check": held_out_checks(frame, split, scored, cfg),
    }
    results["headlines"] = headlines(results)
    timing["total_s"] = time.perf_counter() - began_run + (inputs.load_s if loaded_before else 0.0)
    results["timing"] = timing
    usage = resource.getrusage(resource.RUSAGE_SELF)
    timing["process_cpu_s"] = usage.ru_utime + usage.ru_stime  # the model's load included: the machine's load aside
    results["peak_rss_gb"] = peak_rss_gb()
    save_table(frame, out, "prompts")
    save_table(curves, out, "curves")
    write_figures(out, results, curves)
    return results
