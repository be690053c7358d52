"""Calibration (Kadavath et al. 2022): does the model know what it knows? The run's headlines first (what it
supports, and what it cannot, in words), then ECE with intervals, noise floor and debiased estimate, temperature
scaling in both binnings, P(IK) and P(True) verdicts, and a temperature slider that recomputes ECE live from the
run's per-item table."""

from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dashboards.common import number, plain, read_table, show_figures, show_headlines, show_run, show_table
from lab.metrics.calibration import ece, noise_floor_ece, reliability, softmax


def summary(name: str, block: dict) -> None:
    st.subheader(name)
    cols = st.columns(5)
    with cols[0]:
        number("n", block.get("n"), "{:.0f}")
    with cols[1]:
        number("Accuracy", block.get("accuracy"), "{:.3f}")
    with cols[2]:
        ci = block.get("ece_ci95") or [None, None]
        number("ECE (15 equal-width)", block.get("ece_15_equal_width"), "{:.3f}",
               help=f"95% bootstrap interval {ci}; noise floor of a calibrated model {block.get('noise_floor_ece')}; "
                    f"debiased (Kumar et al. 2019) {block.get('ece_15_equal_width_debiased')}. ECE is biased upward: "
                    "noise alone gives the noise floor.")
    with cols[3]:
        number("Noise floor", block.get("noise_floor_ece"), "{:.3f}", help="ECE a perfectly calibrated model shows here")
    with cols[4]:
        number("Brier", block.get("brier"), "{:.3f}")


TEMPERATURE_ROWS = (("ece_15_equal_width", "ECE, 15 equal-width bins"), ("ece_10_equal_mass", "ECE, 10 equal-mass bins"),
                    ("nll", "NLL (nats)"), ("brier", "Brier"), ("accuracy", "accuracy"),
                    ("mean_confidence", "mean confidence"))


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
            rows.append({"quantity": label, "when": when, "value": block[name],
                         "95% interval": "" if not interval else f"[{interval[0]:.3f}, {interval[1]:.3f}]",
                         "noise floor": block.get(f"noise_floor_{name}"), "debiased": block.get(f"{name}_debiased")})
    return pd.DataFrame(rows)


def show_temperature(block: dict) -> None:
    interval = block.get("T_ci95")
    st.subheader("Temperature scaling (fitted on the calibration split, measured on the test split)")
    st.write(f"T = {block['T']:.3f}" + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "")
             + f" · {block.get('n_calibration')} calibration items, {block.get('n_test')} test items")
    show_table(temperature_table(block))


def show_verdicts(results: dict) -> None:
    """P(IK)'s verdicts (over every candidate, then per family of readouts) and P(True)'s, as the run wrote them,
    but for a verdict that is a headline this run cannot support: the headlines above say why it is not shown."""
    unsupported = {h.get("sentence") for h in results.get("headlines") or [] if isinstance(h, dict) and not h.get("supported")}
    sentences = [s for s in results.get("p_ik_summary") or [] if s not in unsupported]
    if sentences:
        st.subheader("P(IK): which readouts predict a correct answer")
        for sentence in sentences:
            st.markdown(f"- {plain(sentence)}")
    layers = (results.get("p_true") or {}).get("layers")
    if isinstance(layers, dict) and layers.get("verdict"):
        st.subheader("P(True), layer by layer")
        st.markdown(f"- {plain(layers['verdict']['sentence'])}")


def render(folder: Path, results: dict) -> None:
    show_headlines(results)

    for key, title in (("mc", "Cloze multiple choice"), ("lettered", "Lettered multiple choice (knowledge extraction)")):
        if isinstance(results.get(key), dict):
            summary(title, results[key])

    items = read_table(folder / "items.parquet", "calibration")
    if items is not None:
        for column in ("kind", "checkpoint"):  # a run may hold several item sets (cloze/lettered, checkpoints): pick one
            if column in items and items[column].nunique() > 1:
                choice = st.selectbox(column.capitalize(), list(items[column].unique()), key=f"items_{column}")
                items = items[items[column] == choice]
        option_columns = sorted(c for c in items.columns if c.startswith("option_logit_"))
        if option_columns and "answer_index" in items.columns:
            st.subheader("Temperature, live")
            T = st.slider("Temperature T", 0.25, 4.0, 1.0, 0.05, key="temperature")
            probs = softmax(items[option_columns].to_numpy(), T)
            confidence = probs.max(axis=1)
            correct = probs.argmax(axis=1) == items["answer_index"].to_numpy()
            floor, _ = noise_floor_ece(confidence, n_sim=100)
            floor_mass, _ = noise_floor_ece(confidence, 10, "equal_mass", n_sim=100)
            st.write(f"At T = {T:.2f}: ECE **{ece(confidence, correct):.3f}** with 15 equal-width bins (noise floor "
                     f"{floor:.3f}), **{ece(confidence, correct, 10, 'equal_mass'):.3f}** with 10 equal-mass bins (noise "
                     f"floor {floor_mass:.3f}); mean confidence {confidence.mean():.3f}, accuracy {correct.mean():.3f} "
                     "(unchanged by T).")
            diagram = reliability(confidence, correct)
            fig = go.Figure([go.Bar(x=diagram.confidence, y=diagram.accuracy, name="accuracy", width=1 / 15),
                             go.Scatter(x=[0, 1], y=[0, 1], name="perfect calibration", mode="lines")])
            fig.update_layout(title="Reliability diagram", xaxis_title="confidence", yaxis_title="accuracy",
                              xaxis_range=[0, 1], yaxis_range=[0, 1])
            st.plotly_chart(fig, key="live_reliability")
    if isinstance(results.get("temperature"), dict) and "T" in results["temperature"]:
        show_temperature(results["temperature"])
    show_verdicts(results)
    if results.get("p_ik"):
        show_table(results["p_ik"])
    show_figures(folder)


show_run("calibration", render, fields={"mc": dict, "lettered": dict, "temperature": dict, "p_ik": (list, dict),
                                        "headlines": list}, required=("mc",))
