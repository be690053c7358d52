"""The synthetic experiment: train in stages, evaluate the partial and the final checkpoint, write the tables and
figures."""

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from experiments.calibration.config import EXPOSURE_BINS, N_OPTIONS, Config
from experiments.calibration.ece import calibration_summary, option_logits, temperature_summary
from experiments.calibration.english import token_level
from experiments.calibration.figures import (
    exposure_figures,
    p_ik_figure,
    reliability_figure,
    stages_figure,
    token_level_figure,
)
from experiments.calibration.p_true import p_true_layers, p_true_summary, p_true_table
from experiments.calibration.readouts import p_ik, p_ik_summary
from experiments.calibration.setting import (
    Setting,
    claim_text,
    cloze_table,
    exposure_bin,
    lettered_table,
    make_model,
    make_setting,
    train_in_stages,
)
from experiments.calibration.summary import acceptance, headlines
from lab.analysis.probes.readouts import random_model
from lab.data.facts import OPTION_LETTERS
from lab.metrics.calibration import softmax
from lab.model.transformer import HookedTransformer
from lab.runs import save_figure, save_table


@dataclass
class Evaluation:
    """Everything measured at one checkpoint: per-item tables and their summary blocks."""

    frames: dict[str, pd.DataFrame]  # kind (cloze, lettered) → items of the evaluation persons
    p_true_frame: pd.DataFrame
    p_ik_rows: list[dict[str, Any]]
    blocks: dict[str, Any]  # mc, lettered, temperature, p_true, p_ik, p_ik_baseline_auroc, ...
    timing: dict[str, float]


def _p_true(name: str, model: HookedTransformer, setting: Setting, cfg: Config) -> tuple[pd.DataFrame, dict[str, Any]]:
    """P(True) on sampled claims about the format and the evaluation persons: its per-claim table and its block
    (the summary, and the readouts by layer against a random model's)."""
    parts, claims = [], []
    for subset, persons in (("format", setting.format_persons), ("outside", setting.eval_persons)):
        part, part_claims = p_true_table(model, setting, persons, cfg.p_true_samples, seed=cfg.seed + 5)
        part["subset"] = subset
        parts.append(part)
        claims += part_claims
    p_true_frame = pd.concat(parts, ignore_index=True)
    p_true_frame["checkpoint"] = name
    block = p_true_summary(p_true_frame, cfg.n_boot, cfg.seed)
    block["layers"] = p_true_layers(model, random_model(model, seed=cfg.seed + 1), p_true_frame, claims, setting, cfg)
    for row in block["layers"]["by_layer"]:
        row["checkpoint"] = name
    return p_true_frame, block


def _p_ik(
    name: str, model: HookedTransformer, setting: Setting, items: list[dict[str, Any]], cloze: pd.DataFrame, cfg: Config
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """P(IK) on the cloze items: its rows (each marked with the checkpoint) and its blocks (the baseline, the
    setting, the verdicts and their sentences)."""
    rows, info = p_ik(model, setting, items, cloze, cfg)
    for row in rows:
        row["checkpoint"] = name
    verdicts = info.pop("verdicts")
    return rows, {
        "p_ik": rows,
        **{k: v for k, v in info.items() if k.startswith("p_ik_baseline_auroc")},
        "p_ik_info": info
        | {
            "checkpoint": name,
            "label": "the cloze answer is right",
            "split": "entity-disjoint (persons): train fits the probes, validation chooses "
            "the readout, test reports it",
        },
        "p_ik_verdict": verdicts["all readouts"],
        "p_ik_verdicts": verdicts,
        "p_ik_summary": p_ik_summary(verdicts),
    }


def evaluate(
    name: str, step: int, model: HookedTransformer, setting: Setting, items: list[dict[str, Any]], cfg: Config
) -> Evaluation:
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
        "mc": {"checkpoint": name, "step": step, **calibration_summary(frames["cloze"], cfg.n_boot, cfg.seed)},
        "lettered": {
            "checkpoint": name,
            "step": step,
            **calibration_summary(frames["lettered"], cfg.n_boot, cfg.seed),
            "format_subset_accuracy": float(lettered_table(model, setting, format_items)["correct"].mean()),
            "note": "knowledge extraction: the lettered format was trained on the format subset only; "
            "format_subset_accuracy is on fresh option sets for those persons (did the format "
            "itself generalise beyond the trained quizzes?)",
        },
        "temperature": temperature_summary(frames["cloze"], cfg.n_boot, cfg.seed),
        "format_subset_cloze_accuracy": float(cloze_table(model, setting, format_items)["correct"].mean()),
    }
    timing["multiple_choice_s"] = time.perf_counter() - began

    began = time.perf_counter()
    p_true_frame, blocks["p_true"] = _p_true(name, model, setting, cfg)
    timing["p_true_s"] = time.perf_counter() - began

    began = time.perf_counter()
    rows, p_ik_blocks = _p_ik(name, model, setting, items, frames["cloze"], cfg)
    blocks |= p_ik_blocks
    timing["p_ik_s"] = time.perf_counter() - began
    return Evaluation(frames, p_true_frame, rows, blocks, timing)


def _world_block(cfg: Config, setting: Setting, items: list[dict[str, Any]]) -> dict[str, Any]:
    """results["world"]: the world's sizes, its documents, and one statement, quiz and claim as examples."""
    world = setting.world
    eval_exposure = setting.exposure[setting.eval_persons]
    return {
        "n_persons": len(world.persons),
        "n_train_statements": cfg.n_train,
        "pareto_gamma": cfg.pareto_gamma,
        "monofact_rate": world.monofact_rate(),
        "n_values": len(world.value_spaces[setting.attribute]),
        "n_format_persons": len(setting.format_persons),
        "n_eval_persons": len(setting.eval_persons),
        "eval_persons_by_exposure": {
            label: int((exposure_bin(eval_exposure) == label).sum()) for *_, label in EXPOSURE_BINS
        },
        "documents": setting.doc_counts,
        "d_vocab": setting.tokenizer.get_vocab_size(),
        "statement": "<bos> First Last birthday Month day . <eos>",
        "quiz": "<bos> " + world.quiz_prompt(items[0]) + " " + OPTION_LETTERS[items[0]["answer_index"]],
        "claim": claim_text(
            world,
            int(items[0]["person"]),
            setting.attribute,
            world.true_value(int(items[0]["person"]), setting.attribute),
        )
        + " True",
    }


def _training_block(
    cfg: Config, setting: Setting, stages: list[dict[str, Any]], partial: dict[str, Any]
) -> dict[str, Any]:
    """results["training"]: the stages, and the partial checkpoint with the recall it was chosen on."""
    return {
        "steps": cfg.steps,
        "batch_size": cfg.batch_size,
        "stages": stages,
        "partial_step": partial["step"],
        "partial_recall_seen": partial["recall_seen"],
        "partial_recall_target": cfg.partial_recall,
        "partial_recall_selection": partial["recall_selection"],
        "partial_chosen_on": "the cloze recall of the format persons (seen, never evaluated): the "
        "stage before the last nearest the target",
        "heldout_optimum_step": min(stages, key=lambda s: s["heldout_nll"])["step"],
        "held_out": setting.held_out,
    }


def run_synthetic(cfg: Config, out: Path) -> dict[str, Any]:
    timing: dict[str, float] = {}
    began = time.perf_counter()
    setting = make_setting(cfg)
    model = make_model(cfg, setting)
    with tempfile.TemporaryDirectory(prefix="calibration-") as tmp:
        stages, partial = train_in_stages(cfg, setting, model, Path(tmp))
    partial_model = make_model(cfg, setting)
    partial_model.load_state_dict(partial["state"])
    timing["train_s"] = time.perf_counter() - began

    items = setting.world.quiz_items(setting.eval_persons, N_OPTIONS, seed=cfg.seed + 3)
    evaluations = {
        "partial": evaluate("partial", partial["step"], partial_model.eval(), setting, items, cfg),
        "end": evaluate("end", cfg.steps, model.eval(), setting, items, cfg),
    }
    for name, e in evaluations.items():
        timing |= {f"{name}_{k}": v for k, v in e.timing.items()}
    began = time.perf_counter()
    token_block, token_curve = token_level(cfg, out)
    timing["token_level_s"] = time.perf_counter() - began

    step = partial["step"]
    results: dict[str, Any] = {
        "world": _world_block(cfg, setting, items),
        "model": {
            "d_model": cfg.d_model,
            "n_layers": cfg.n_layers,
            "n_heads": cfg.n_heads,
            "n_params": model.cfg.n_params(),
            "n_ctx": model.cfg.n_ctx,
        },
        "training": _training_block(cfg, setting, stages, partial),
        "checkpoint": f"partial: step {step} of {cfg.steps}, chosen where the cloze recall of the format persons "
        f"(never evaluated) is nearest {cfg.partial_recall:g} ({partial['recall_selection']:.2f}); there "
        f"the cloze recall of the seen evaluation persons is {partial['recall_seen']:.2f}. `at_end` "
        f"holds the same blocks at the end of training",
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


def _reliability_curves(kind: str, evaluations: dict[str, Evaluation], results: dict[str, Any]) -> dict[str, Any]:
    """Name → (confidence, correct) of one kind's items at each checkpoint; for cloze also the partial checkpoint's
    test split after temperature scaling (T fitted on the calibration split)."""
    curves = {name: (e.frames[kind]["confidence"], e.frames[kind]["correct"]) for name, e in evaluations.items()}
    if kind == "cloze":
        test = evaluations["partial"].frames["cloze"]
        test = test[test["split"] == "test"]
        T = results["temperature"]["T"]
        probs = softmax(option_logits(test), T)
        curves[f"partial, test split, T = {T:.2f}"] = (
            probs.max(axis=1),
            probs.argmax(axis=1) == test["answer_index"],
        )
    return curves


def _token_reliability_figure(model: str, token_curve: list[dict[str, Any]]) -> Any:
    """The next token's reliability diagram (accuracy against confidence) beside perfect calibration."""
    import plotly.graph_objects as go

    fig = go.Figure(
        [
            go.Scatter(
                x=[r["confidence"] for r in token_curve],
                y=[r["accuracy"] for r in token_curve],
                mode="lines+markers",
                name="next token",
            ),
            go.Scatter(
                x=[0, 1], y=[0, 1], mode="lines", name="perfect calibration", line=dict(dash="dash", color="gray")
            ),
        ]
    )
    fig.update_layout(
        title=f"Token-level reliability diagram ({model})",
        xaxis=dict(title="confidence", range=[0, 1]),
        yaxis=dict(title="accuracy", range=[0, 1]),
    )
    return fig


def _figures(
    out: Path, evaluations: dict[str, Evaluation], results: dict[str, Any], token_curve: list[dict[str, Any]]
) -> None:
    for kind, title in (("cloze", "Cloze multiple choice"), ("lettered", "Lettered multiple choice")):
        curves = _reliability_curves(kind, evaluations, results)
        reliability_figure(out, f"reliability_{kind}", f"{title}: reliability diagram (evaluation persons)", curves)
    exposure_figures(
        out,
        {
            "cloze, partial": results["mc"],
            "cloze, end": results["at_end"]["mc"],
            "lettered, partial": results["lettered"],
        },
    )
    p_ik_figure(
        out,
        results["p_ik"] + results["at_end"]["p_ik"],
        {"partial": results["p_ik_baseline_auroc"], "end": results["at_end"]["p_ik_baseline_auroc"]},
    )
    p_ik_figure(
        out,
        results["p_true"]["layers"]["by_layer"] + results["at_end"]["p_true"]["layers"]["by_layer"],
        {},
        name="p_true_auroc_by_layer",
        title="P(True) by layer",
    )
    token_level_figure(out, results["token_level"])
    fig = _token_reliability_figure(results["token_level"]["model"], token_curve)
    save_figure(fig, out, "reliability_token_level")
    stages_figure(out, results["training"]["stages"], results["training"]["partial_step"])
