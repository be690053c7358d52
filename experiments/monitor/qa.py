"""`--model PATH --qa FILE`: the monitor on any local model with a question–answer CSV, the answers scored by exact
match, the probe and P(IK) cross-fitted over folds of questions. The CSV, the model and the prompts are read and
checked first (`read_qa_inputs`), before the run writes anything."""

import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from experiments.monitor.config import ABSTENTION_SIGNAL, SPLITS, TRAINED, Config
from experiments.monitor.figures import write_figures
from experiments.monitor.judging import judge
from experiments.monitor.signals import choose_signs, claim_risks, residuals, sampling_risks
from experiments.monitor.summary import headlines
from lab.analysis.monitor import RISK_SIGN, Monitor
from lab.analysis.probes.cross_fit import cross_fit_probe
from lab.metrics.selective import crc_min_calibration, ltt_min_answered
from lab.model.transformer import HookedTransformer
from lab.runs import save_table

# --------------------------------------------------------------------------------------------
# Any local model on a question–answer CSV
# --------------------------------------------------------------------------------------------
# The questions are drawn into fit / calibration / test at random (split_fractions): with fewer than this many,
# a split is too often empty, and there is nothing to choose signs on, calibrate on or report.
MIN_QA_ITEMS = 10


def read_qa(path: str | Path) -> list[dict[str, Any]]:
    """question, answer rows; a header row naming those columns is skipped, blank rows too. One line naming the
    file and line for a row of another width, an empty question or answer, an answer holding a line break (the
    model's answer is its continuation up to its first line break, so it could never match), and for fewer than
    MIN_QA_ITEMS questions."""
    from experiments.calibration.mmlu import read_question_csv
    from lab.outside_files import InputError

    path = Path(path)
    rows = read_question_csv(path, "question–answer file")
    if rows and [c.strip().lower() for c in rows[0][1]] == ["question", "answer"]:
        rows = rows[1:]
    items = []
    for line, row in rows:
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != 2 or not row[0].strip() or not row[1].strip():
            shown = repr(row) if len(repr(row)) <= 200 else repr(row)[:200] + "…"
            raise InputError(f"{path}, line {line}: expected 2 non-empty columns (question, answer), got {shown}")
        if "\n" in row[1].strip() or "\r" in row[1].strip():
            raise InputError(
                f"{path}, line {line}: the answer holds a line break, and the model's answer is its "
                "continuation up to its first line break: it could never match"
            )
        items.append({"question": row[0].strip(), "answer": row[1].strip(), "line": line})
    if len(items) < MIN_QA_ITEMS:
        raise InputError(
            f"{path} holds {len(items)} question{'s' if len(items) != 1 else ''}; the monitor needs at "
            f"least {MIN_QA_ITEMS}, to have some in each of its fit, calibration and test splits"
        )
    return items


def qa_splits(n_items: int, cfg: Config) -> np.ndarray:
    """Each question's split (SPLITS: fit, calibration, test), drawn from the seed with split_fractions."""
    cuts = np.cumsum(cfg.split_fractions)[:-1]
    return np.array(SPLITS)[np.searchsorted(cuts, np.random.default_rng([cfg.seed, 23]).random(n_items), side="right")]


def read_qa_inputs(cfg: Config) -> Any:
    """The question–answer file, the model and the prompts, each checked (`read_qa`, `load_local_model`, the prompts
    with room for qa_max_new_tokens answer tokens in the model's context, the memory the run will take): what
    `forma run` reads before it makes the run folder."""
    from experiments.calibration.mmlu import (
        LocalInputs,
        check_memory,
        check_splits,
        context_length,
        encode_prompts,
        load_local_model,
    )

    items = read_qa(cfg.qa)
    check_splits(cfg.qa, qa_splits(len(items), cfg), ("test",), cfg.seed)  # fit and calibration may be empty
    model, tokenizer, route = load_local_model(cfg.model, cfg.hf_loader)
    prompts = encode_prompts(
        tokenizer,
        [(item["line"], qa_prompt(item["question"])) for item in items],
        context_length(model),
        cfg.qa,
        reserve=cfg.qa_max_new_tokens,
    )
    # Each question keeps its prompt and answer tokens, k sampled answers, and (a HookedTransformer) two residual
    # streams at each answer token for the readouts.
    longest = max(len(ids) for ids in prompts) + cfg.qa_max_new_tokens
    check_memory(
        cfg.qa,
        len(items),
        8 * longest * (cfg.k_samples + 2) + 8 * model.cfg.d_model * longest,
        "their tokens, samples and residual streams",
    )
    return LocalInputs(items, model, tokenizer, route, prompts)


def qa_prompt(question: str) -> str:
    return f"Question: {question}\nAnswer:"


def normalise(text: str) -> str:
    """Exact match up to case, surrounding spaces and full stops."""
    return re.sub(r"\s+", " ", text).strip().strip(".").strip().lower()


def qa_readouts(
    model: HookedTransformer,
    middle_hook: str,
    sequences: list[Tensor],
    prompt_lengths: list[int],
    lengths: list[int],
    false: np.ndarray,
    cfg: Config,
) -> tuple[dict[str, Any], dict[str, str]]:
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
        probe_rows.append(acts[middle_hook][0, p - 1 : p - 1 + n])
        pik_rows.append(acts[last_hook][0, p - 1])
    return cross_fit_readouts(probe_rows, torch.stack(pik_rows), (middle_hook, last_hook), lengths, false, cfg)


def cross_fit_readouts(
    probe_rows: list[Tensor],
    pik_rows: Tensor,
    hooks: tuple[str, str],
    lengths: list[int],
    false: np.ndarray,
    cfg: Config,
) -> tuple[dict[str, Any], dict[str, str]]:
    """`qa_readouts` once the activations are read: each question's middle-layer rows at its answer tokens
    (`probe_rows`, [length, d_model] each) and its last-layer row at its last prompt token (`pik_rows`, [n,
    d_model]), `hooks` = (middle, last)."""
    middle_hook, last_hook = hooks
    questions = np.arange(len(lengths))
    probe = cross_fit_probe(
        torch.cat(probe_rows), np.repeat(false, lengths), np.repeat(questions, lengths), cfg.qa_folds, seed=cfg.seed
    )
    p_ik = cross_fit_probe(pik_rows, ~false, questions, cfg.qa_folds, seed=cfg.seed)
    out: dict[str, Any] = {
        "info": {
            "scheme": f"cross-fitted: the questions dealt into {cfg.qa_folds} folds "
            "(independently of their answers), each "
            "fold scored by the probe fitted on the other folds",
            "folds": [f.tolist() for f in (probe.folds or p_ik.folds)],
            "probe": {
                "hook": middle_hook,
                "position": "every answer token",
                "label": "the answer is false",
                "regularization": probe.regularization,
                "why_not": probe.why,
            },
            "p_ik": {
                "hook": last_hook,
                "position": "the last prompt token",
                "label": "the answer is right",
                "regularization": p_ik.regularization,
                "why_not": p_ik.why,
            },
        }
    }
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


def abstention_alphas(
    alphas: tuple[float, ...], n_calibration: int, n_test: int, delta: float
) -> tuple[list[float], list[dict[str, Any]]]:
    """The α at which both abstention rules can answer anything with `n_calibration` calibration prompts — CRC needs
    n ≥ ⌈1/α⌉ − 1 (`crc_min_calibration`), LTT n ≥ ⌈ln δ / ln(1 − α)⌉ (`ltt_min_answered`) — and a test split to
    score them on; the others with the reason in words."""
    scored, skipped = [], []
    for alpha in alphas:
        need = {
            "conformal risk control": crc_min_calibration(alpha),
            f"Learn then Test (δ = {delta:g})": ltt_min_answered(alpha, delta),
        }
        short = [f"{rule} needs at least {n}" for rule, n in need.items() if n_calibration < n]
        if short:
            skipped.append(
                {
                    "alpha": alpha,
                    "why_not": f"the calibration split holds {n_calibration} questions and "
                    f"{' and '.join(short)} to answer anything at α = {alpha:g}",
                }
            )
        elif n_test == 0:
            skipped.append({"alpha": alpha, "why_not": "the test split holds no questions"})
        else:
            scored.append(alpha)
    return scored, skipped


def _qa_answer(tokenizer: Any, eos: int | None, new: list[int]) -> tuple[str, int]:
    """The answer: the continuation up to its first line break or end of text, and how many tokens made it."""

    def text_of(ids: list[int]) -> str:
        return tokenizer.decode(ids) if hasattr(tokenizer, "decode") else ""

    for k in range(1, len(new) + 1):
        if (eos is not None and new[k - 1] == eos) or "\n" in text_of(new[:k]):
            return text_of(new[: k - 1]).split("\n")[0], max(1, k - 1)
    return text_of(new), len(new)


def _monitored_answers(monitor: Monitor, inputs: Any, cfg: Config, eos: int | None) -> dict[str, Any]:
    """Each question's greedy answer under the monitor: its row (question, answer, generated, false), its token
    signals over the answer, its length, its prompt and its prompt + answer tokens."""
    from lab.progress import bar

    rows, series, lengths, prompts, sequences = [], {name: [] for name in monitor.token_signals}, [], [], []
    with bar(len(inputs.items), "monitored generation", unit="question") as counter:
        for item, ids in zip(inputs.items, inputs.prompts):
            tokens = torch.tensor([ids])
            result = monitor.generate(tokens, cfg.qa_max_new_tokens, eos_token_id=eos)
            answer, length = _qa_answer(inputs.tokenizer, eos, result.new_tokens[0].tolist())
            rows.append(
                {
                    "question": item["question"],
                    "answer": item["answer"],
                    "generated": answer,
                    "n_answer_tokens": length,
                    "false": normalise(answer) != normalise(item["answer"]),
                }
            )
            for name in monitor.token_signals:
                series[name].append(result.signals[name][0, :length])
            lengths.append(length)
            prompts.append(tokens)
            sequences.append(result.tokens[:, : len(ids) + length])
            counter.update()
    return {"rows": rows, "series": series, "lengths": lengths, "prompts": prompts, "sequences": sequences}


def _qa_sampling_risks(
    inputs: Any, prompts: list[Tensor], generated: list[str], eos: int | None, cfg: Config
) -> dict[str, np.ndarray]:
    """The sampling signals: k answers per question at T = 1, each cut like the greedy one and compared with it
    after exact match's normalisation."""
    return sampling_risks(
        inputs.model,
        prompts,
        [normalise(a) for a in generated],
        lambda ids: normalise(_qa_answer(inputs.tokenizer, eos, ids)[0]),
        cfg.k_samples,
        cfg.qa_max_new_tokens,
        cfg.seed + 31,
        eos,
    )


def signed_risks(
    series: dict[str, list[Tensor]], values: dict[str, Any], lengths: list[int], false: np.ndarray, fit: np.ndarray
) -> tuple[dict[str, int], dict[str, np.ndarray]]:
    """Each signal's sign, chosen on the fit split, and its claim risk per question: the token signals zero-padded
    to the longest answer and read over each answer's own length."""
    width = max(lengths)
    padded = {
        name: torch.stack([torch.nn.functional.pad(t, (0, width - len(t))) for t in ts]) for name, ts in series.items()
    }
    length_tensor = torch.tensor(lengths)
    signs = choose_signs(claim_risks(padded, values, length_tensor, RISK_SIGN), false, fit)
    return signs, claim_risks(padded, values, length_tensor, signs)


def _qa_source(cfg: Config, inputs: Any, hooked: bool, split: np.ndarray) -> dict[str, Any]:
    """results["source"]: the model, the CSV, how answers are scored and how the questions are split."""
    return {
        "model": str(cfg.model),
        "route": inputs.route,
        "qa": str(cfg.qa),
        "n_items": len(inputs.items),
        "prompt_example": qa_prompt(inputs.items[0]["question"]),
        "hooked": hooked,
        "scoring": "exact match of the continuation up to its first line break, case, surrounding spaces "
        "and full stops aside",
        "n_by_split": {s: int((split == s).sum()) for s in SPLITS},
        "split": "questions drawn into fit / calibration / test, disjoint; fit chooses the signs of the "
        "untrained signals and LTT's grid, calibration the thresholds, test reports; the probe "
        "and P(IK) are cross-fitted over folds of all the questions",
    }


def judge_qa(
    risks: dict[str, np.ndarray], false: np.ndarray, split: np.ndarray, signs: dict[str, int], cfg: Config
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """judge's rows, abstention and curves on questions (one kind, no error kinds), at the α's the split's sizes
    can support, and the α's skipped and why."""
    alphas, skipped = abstention_alphas(
        cfg.alphas, int((split == "calibration").sum()), int((split == "test").sum()), cfg.ltt_delta
    )
    rows, abstention, curves = judge(risks, false, np.array(["qa"] * len(false)), split, signs, cfg, alphas=alphas)
    for row in rows:
        row["by_kind"] = {}
    return rows, abstention, curves, skipped


def judge_questions(
    series: dict[str, list[Tensor]],
    values: dict[str, Any],
    lengths: list[int],
    frame: pd.DataFrame,
    split: np.ndarray,
    cfg: Config,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Each signal's sign (fit split), its claim risk per question (written into `frame` as risk_<signal>), and the
    judgement on the test split (`judge_qa`): (the results' signals, abstention and α entries, the curve points)."""
    false = frame["false"].to_numpy()
    signs, risks = signed_risks(series, values, lengths, false, split == "fit")
    for name, value in risks.items():
        frame[f"risk_{name}"] = value
    rows_out, abstention, curves, skipped = judge_qa(risks, false, split, signs, cfg)
    judged = {
        "signals": rows_out,
        "abstention": abstention,
        "abstention_unavailable": skipped,
        "abstention_signal": ABSTENTION_SIGNAL,
        "alphas": list(cfg.alphas),
    }
    return judged, curves


def run_qa(cfg: Config, out: Path, inputs: Any = None) -> dict[str, Any]:
    """The monitor's signals on a local model with a question–answer CSV, exact match against the answers. `inputs`:
    what `read_qa_inputs(cfg)` read (read here when not given)."""
    inputs = inputs or read_qa_inputs(cfg)
    model = inputs.model
    hooked = isinstance(model, HookedTransformer)
    eos = getattr(inputs.tokenizer, "eos_token_id", None)
    timing: dict[str, float] = {}
    began = time.perf_counter()
    monitor = Monitor(model, attention=False)
    generated = _monitored_answers(monitor, inputs, cfg, eos)
    series, lengths, prompts = generated["series"], generated["lengths"], generated["prompts"]
    timing["monitored_generation_s"] = time.perf_counter() - began
    frame = pd.DataFrame(generated["rows"])
    false = frame["false"].to_numpy()
    split = qa_splits(len(frame), cfg)
    frame["split"] = split
    unavailable = dict(monitor.unavailable) | {"subject_attention": "a question has no marked subject"}

    began = time.perf_counter()
    values = _qa_sampling_risks(inputs, prompts, list(frame["generated"]), eos, cfg)
    timing["sampling_s"] = time.perf_counter() - began

    readout_info: dict[str, Any] = {}
    if hooked:
        began = time.perf_counter()
        fitted, missing = qa_readouts(
            model, monitor.middle_hook, generated["sequences"], [p.shape[1] for p in prompts], lengths, false, cfg
        )
        timing["readouts_s"] = time.perf_counter() - began
        readout_info = fitted["info"]
        unavailable = {k: v for k, v in unavailable.items() if k not in TRAINED} | missing
        if "probe" in fitted:
            series["probe"] = fitted["probe"]
        if "p_ik" in fitted:
            values["p_ik"] = fitted["p_ik"]

    judged, curves = judge_questions(series, values, lengths, frame, split, cfg)
    results: dict[str, Any] = {
        "source": _qa_source(cfg, inputs, hooked, split),
        "answers": {"qa": {"n": len(frame), "false_rate": float(false.mean())}},
        "readouts": readout_info,
        "k_samples": cfg.k_samples,
        "unavailable": unavailable,
        **judged,
    }
    results["headlines"] = headlines(results)
    results["timing"] = timing
    save_table(frame, out, "prompts")
    save_table(curves, out, "curves")
    write_figures(out, results, curves)
    return results
