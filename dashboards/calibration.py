"""Calibration (Kadavath et al. 2022): does the model know what it knows? The run's headlines first (what it
supports, and what it cannot, in words), then ECE with intervals, noise floor and debiased estimate, temperature
scaling in both binnings, P(IK) and P(True) verdicts, and a temperature slider that recomputes ECE live from the
run's per-item table. Below, the real-model track (`forma run calibration --model smollm2`): multiple choice in four
settings with temperature scaling, P(True) without and with brainstormed samples, and P(IK) at every layer."""

from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dashboards.charts import draw
from dashboards.display import (
    number,
    plain,
    read_table,
    short,
    show_figures,
    show_headlines,
    show_real_track,
    show_run,
    show_table,
)
from lab.metrics.calibration import ece, noise_floor_ece, reliability, softmax


def checkpoints(results: dict) -> dict[str, tuple[str, dict]]:
    """The checkpoints a run measured, in the order the page offers them (the end of training first: what the
    headlines describe), each as (label in words, its blocks: mc, lettered, temperature, p_ik, ...). A `--model
    --mmlu` run has one, the model itself. (The one place this page reads where a run keeps each checkpoint.)"""
    if not isinstance(results.get("at_end"), dict):
        return {"model": ("the model", results)}
    training = results.get("training") if isinstance(results.get("training"), dict) else {}
    end, partial = results["at_end"].get("step"), training.get("partial_step")
    recall = training.get("partial_recall_seen")
    return {
        "end": (f"end of training (step {short(end)})", results["at_end"]),
        "partial": (
            f"partial checkpoint (step {short(partial)}"
            + (f", where seen persons' cloze recall is {recall:.2f})" if isinstance(recall, float) else ")"),
            results,
        ),
    }


def summary(name: str, block: dict) -> None:
    st.subheader(name)
    cols = st.columns(5)
    with cols[0]:
        number("n", block.get("n"), "{:.0f}")
    with cols[1]:
        number("Accuracy", block.get("accuracy"), "{:.3f}")
    with cols[2]:
        ci = block.get("ece_ci95") or [None, None]
        number(
            "ECE (15 equal-width)",
            block.get("ece_15_equal_width"),
            "{:.3f}",
            help=f"95% bootstrap interval {ci}; noise floor of a calibrated model {block.get('noise_floor_ece')}; "
            f"debiased (Kumar et al. 2019) {block.get('ece_15_equal_width_debiased')}. ECE is biased upward: "
            "noise alone gives the noise floor.",
        )
    with cols[3]:
        number(
            "Noise floor", block.get("noise_floor_ece"), "{:.3f}", help="ECE a perfectly calibrated model shows here"
        )
    with cols[4]:
        number("Brier", block.get("brier"), "{:.3f}")


TEMPERATURE_ROWS = (
    ("ece_15_equal_width", "ECE, 15 equal-width bins"),
    ("ece_10_equal_mass", "ECE, 10 equal-mass bins"),
    ("nll", "NLL (nats)"),
    ("brier", "Brier"),
    ("accuracy", "accuracy"),
    ("mean_confidence", "mean confidence"),
)


def temperature_table(block: dict) -> pd.DataFrame:
    """Before and after temperature scaling on the test split: both ECEs (with interval, noise floor and debiased
    estimate), NLL, Brier, accuracy, mean confidence."""
    rows = []
    for key, label in TEMPERATURE_ROWS:
        for when in ("before", "after"):
            name = f"{key}_{when}"
            if name not in block:
                continue
            interval = block.get(f"{name}_ci95")
            rows.append(
                {
                    "quantity": label,
                    "when": when,
                    "value": block[name],
                    "95% interval": "—" if not interval else f"[{interval[0]:.3f}, {interval[1]:.3f}]",
                    "noise floor": block.get(f"noise_floor_{name}"),
                    "debiased": block.get(f"{name}_debiased"),
                }
            )
    return pd.DataFrame(rows)


def show_temperature(block: dict, at: str) -> None:
    interval = block.get("T_ci95")
    st.subheader(f"Temperature scaling{at}: fitted on the calibration split, measured on the test split")
    st.write(
        f"T = {block['T']:.3f}"
        + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "")
        + f" · {block.get('n_calibration')} calibration items, {block.get('n_test')} test items"
    )
    show_table(temperature_table(block), download="temperature_scaling")


def show_verdicts(results: dict, block: dict, at: str) -> None:
    """P(IK)'s verdicts (over every candidate, then per family of readouts) and P(True)'s, as the run wrote them,
    but for a verdict that is a headline this run cannot support: the headlines above say why it is not shown."""
    unsupported = {
        h.get("sentence") for h in results.get("headlines") or [] if isinstance(h, dict) and not h.get("supported")
    }
    sentences = [s for s in block.get("p_ik_summary") or [] if s not in unsupported]
    if sentences:
        st.subheader(f"P(IK){at}: which readouts predict a correct answer")
        for sentence in sentences:
            st.text(f"• {sentence}")
    layers = (block.get("p_true") or {}).get("layers")
    if isinstance(layers, dict) and layers.get("verdict"):
        st.subheader(f"P(True) layer by layer{at}")
        st.text(f"• {layers['verdict']['sentence']}")


P_IK_LABELS = {
    "readout": "readout",
    "position": "position",
    "layer": "layer",
    "auroc": "AUROC (test split)",
    "auroc_ci95": "95% interval",
    "validation_auroc": "AUROC (validation)",
    "control_shuffled_auroc": "AUROC, shuffled labels",
    "control_untrained_auroc": "AUROC, untrained model",
    "auroc_n_pos": "right answers",
    "auroc_n_neg": "wrong answers",
    "constant": "constant scores",
}


def show_live_temperature(items) -> None:
    """A temperature slider over the checkpoint's per-item option logits: ECE, mean confidence and the reliability
    diagram at that T, recomputed here by lab.metrics.calibration."""
    option_columns = sorted(c for c in items.columns if c.startswith("option_logit_"))
    if not option_columns or "answer_index" not in items.columns or items.empty:
        return
    T = st.slider("Temperature T", 0.25, 4.0, 1.0, 0.05, key="temperature")
    probs = softmax(items[option_columns].to_numpy(), T)
    confidence = probs.max(axis=1)
    correct = probs.argmax(axis=1) == items["answer_index"].to_numpy()
    floor, _ = noise_floor_ece(confidence, n_sim=100)
    floor_mass, _ = noise_floor_ece(confidence, 10, "equal_mass", n_sim=100)
    st.write(
        f"At T = {T:.2f}: ECE **{ece(confidence, correct):.3f}** with 15 equal-width bins (noise floor "
        f"{floor:.3f}), **{ece(confidence, correct, 10, 'equal_mass'):.3f}** with 10 equal-mass bins (noise "
        f"floor {floor_mass:.3f}); mean confidence {confidence.mean():.3f}, accuracy {correct.mean():.3f} "
        "(unchanged by T)."
    )
    diagram = reliability(confidence, correct)
    fig = go.Figure(
        [
            go.Bar(x=diagram.confidence, y=diagram.accuracy, name="accuracy", width=1 / 15),
            go.Scatter(x=[0, 1], y=[0, 1], name="perfect calibration", mode="lines"),
        ]
    )
    fig.update_layout(
        title="Reliability diagram",
        xaxis_title="confidence",
        yaxis_title="accuracy",
        xaxis_range=[0, 1],
        yaxis_range=[0, 1],
    )
    draw(fig, "live_reliability")


def render(folder: Path, results: dict) -> None:
    show_headlines(results)
    measured = checkpoints(results)
    if len(measured) > 1:
        chosen = st.radio(
            "Checkpoint shown below (the headlines above speak of both, each naming its own)",
            list(measured),
            format_func=lambda key: measured[key][0],
            horizontal=True,
            key="checkpoint",
        )
    else:
        chosen = next(iter(measured))
    where, block = measured[chosen]
    at = f", {where}" if len(measured) > 1 else ""  # every section names its checkpoint, when there are two
    if at:
        st.caption(
            f"Every number and table below is at the {where}; the figures at the end show both checkpoints, "
            "each named in its legend."
        )

    for key, title in (
        ("mc", "Cloze multiple choice"),
        ("lettered", "Lettered multiple choice (knowledge extraction)"),
    ):
        if isinstance(block.get(key), dict):
            summary(f"{title}{at}", block[key])

    items = read_table(folder / "items.parquet", "calibration")
    if items is not None:
        if "checkpoint" in items and chosen in set(items["checkpoint"]):
            items = items[items["checkpoint"] == chosen]
        if "kind" in items and items["kind"].nunique() > 1:  # cloze and lettered items: pick one
            st.subheader(f"Temperature, live{at}")
            kind = st.selectbox("Items", list(items["kind"].unique()), key="items_kind")
            items = items[items["kind"] == kind]
        else:
            st.subheader(f"Temperature, live{at}")
        show_live_temperature(items)
    if isinstance(block.get("temperature"), dict) and "T" in block["temperature"]:
        show_temperature(block["temperature"], at)
    show_verdicts(results, block, at)
    if block.get("p_ik"):
        show_table(block["p_ik"], P_IK_LABELS, download=f"p_ik_{chosen}")
    show_figures(folder)


show_run(
    "calibration",
    render,
    fields={"mc": dict, "lettered": dict, "temperature": dict, "p_ik": (list, dict), "headlines": list},
    required=("mc",),
)


def interval(value: object, ci: object) -> str:
    """A number and its 95% interval in one cell ("—" when missing)."""
    if not isinstance(value, (int, float)):
        return "—"
    if isinstance(ci, list) and len(ci) == 2:
        return f"{value:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"
    return f"{value:.3f} (no interval)"


def real_mc_table(mc: dict) -> pd.DataFrame:
    """One row per multiple-choice setting: accuracy, ECE, Brier with intervals; temperature scaling's T and the
    test split's ECE before and after it."""
    rows = []
    for name, block in mc.items():
        t = block.get("temperature") or {}
        rows.append(
            {
                "setting": name,
                "accuracy": interval(block.get("accuracy"), block.get("accuracy_ci95")),
                "ECE (15 bins)": interval(block.get("ece"), block.get("ece_ci95")),
                "noise floor": block.get("noise_floor_ece"),
                "Brier": interval(block.get("brier"), block.get("brier_ci95")),
                "letters' mass": block.get("label_mass"),
                "T (calibration split)": t.get("T"),
                "test ECE before T": interval(
                    t.get("ece_15_equal_width_before"), t.get("ece_15_equal_width_before_ci95")
                ),
                "test ECE after T": interval(t.get("ece_15_equal_width_after"), t.get("ece_15_equal_width_after_ci95")),
            }
        )
    return pd.DataFrame(rows)


def p_ik_layers_figure(p_ik: dict) -> go.Figure:
    """P(IK)'s test AUROC at every layer, its interval as error bars, beside the model's own confidence."""
    layers = [r for r in p_ik.get("layers") or [] if isinstance(r.get("auroc"), (int, float))]
    low = [r["auroc"] - r["auroc_ci95"][0] if r.get("auroc_ci95") else 0 for r in layers]
    high = [r["auroc_ci95"][1] - r["auroc"] if r.get("auroc_ci95") else 0 for r in layers]
    fig = go.Figure(
        go.Scatter(
            x=[r["layer"] for r in layers],
            y=[r["auroc"] for r in layers],
            mode="lines+markers",
            name="probe (test questions)",
            error_y=dict(type="data", array=high, arrayminus=low),
        )
    )
    if isinstance(p_ik.get("baseline_auroc"), (int, float)):
        fig.add_hline(y=p_ik["baseline_auroc"], line_dash="dash", annotation_text="the model's own confidence")
    fig.add_hline(y=0.5, line_dash="dot", line_color="gray")
    fig.update_layout(title="P(IK) by layer", xaxis_title="layer (residual stream entering it)", yaxis_title="AUROC")
    return fig


def render_real(folder: Path, results: dict) -> None:
    """The real-model track: which model on which questions, its headlines, then each part."""
    st.caption(f"{plain(results.get('model_label', results.get('model')))} · {plain(results.get('question_set'))}")
    st.info(plain(results.get("facts_model", "")))
    show_headlines(results)
    st.subheader("Multiple choice: zero- and 5-shot, plain and in the chat template")
    show_table(real_mc_table(results["mc"]), download="real_mc")
    show_figures(folder, only=["reliability_real"])
    answers = results.get("short_answers") or {}
    st.subheader("Short answers, sampled")
    st.write(
        f"{plain(answers.get('n_questions'))} questions: greedy answers right {answers.get('greedy_accuracy', 0):.3f}, "
        f"samples at T = 1 right {answers.get('sample_accuracy', 0):.3f}. "
        f"Right means: {plain(answers.get('correctness_rule'))}."
    )
    show_table(answers.get("examples") or [], download="real_short_answers")
    st.subheader("P(True): the model judges its own sampled answers")
    rows = [
        {
            "context": "with brainstormed samples" if name == "brainstorm" else "the answer alone",
            "AUROC": interval(block.get("auroc"), block.get("auroc_ci95")),
            "samples": block.get("n"),
            "mean P(True)": block.get("mean_p_true"),
            "share right": block.get("share_correct"),
        }
        for name, block in (results.get("p_true") or {}).items()
    ]
    show_table(rows, download="real_p_true")
    p_ik = results.get("p_ik") or {}
    st.subheader("P(IK): a probe on the residual stream at every layer, held out by question")
    st.write(
        f"Chosen on validation: layer {plain(p_ik.get('chosen_layer'))}, test AUROC "
        f"{interval(p_ik.get('auroc'), p_ik.get('auroc_ci95'))}; shuffled labels "
        f"{interval(p_ik.get('control_shuffled_auroc'), p_ik.get('control_shuffled_auroc_ci95'))}; the model's own "
        f"confidence {interval(p_ik.get('baseline_auroc'), p_ik.get('baseline_auroc_ci95'))}."
    )
    draw(p_ik_layers_figure(p_ik), "real_p_ik_layers")


show_real_track(
    "calibration",
    render_real,
    fields={"mc": dict, "p_true": dict, "p_ik": dict, "short_answers": dict, "headlines": list},
    required=("mc",),
)
