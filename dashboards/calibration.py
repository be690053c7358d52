"""Calibration (Kadavath et al. 2022): does the model know what it knows? ECE with intervals and noise floor,
and a temperature slider that recomputes ECE live from the run's per-item table."""

from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dashboards.common import number, read_table, show_figures, show_run
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
               help=f"95% bootstrap interval {ci}; noise floor of a calibrated model {block.get('noise_floor_ece')}")
    with cols[3]:
        number("Noise floor", block.get("noise_floor_ece"), "{:.3f}", help="ECE a perfectly calibrated model shows here")
    with cols[4]:
        number("Brier", block.get("brier"), "{:.3f}")


def render(folder: Path, results: dict) -> None:
    for key, title in (("mc", "Cloze multiple choice"),
                       ("lettered", "Lettered multiple choice (knowledge extraction)")):
        if isinstance(results.get(key), dict):
            summary(title, results[key])
    items = read_table(folder / "items.parquet", "calibration")
    if items is not None:
        for column in ("kind", "checkpoint"):  # a run may hold several item sets (cloze/lettered, checkpoints)
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
            st.write(f"At T = {T:.2f}: ECE **{ece(confidence, correct):.3f}** (noise floor {floor:.3f}), "
                     f"mean confidence {confidence.mean():.3f}, accuracy {correct.mean():.3f} (unchanged by T).")
            diagram = reliability(confidence, correct)
            fig = go.Figure([go.Bar(x=diagram.confidence, y=diagram.accuracy, name="accuracy", width=1 / 15),
                             go.Scatter(x=[0, 1], y=[0, 1], name="perfect calibration", mode="lines")])
            fig.update_layout(title="Reliability diagram", xaxis_title="confidence", yaxis_title="accuracy",
                              xaxis_range=[0, 1], yaxis_range=[0, 1])
            st.plotly_chart(fig, key="live_reliability")
    if isinstance(results.get("temperature"), dict):
        st.write("Fitted temperature: " + ", ".join(f"{k} = {v:.4g}" for k, v in results["temperature"].items()
                                                      if isinstance(v, (int, float))))
    if results.get("p_ik"):
        st.subheader("P(IK): which readouts predict a correct answer")
        st.dataframe(pd.DataFrame(results["p_ik"]), hide_index=True, key="p_ik")
    show_figures(folder)


show_run("calibration", render, fields={"mc": dict, "lettered": dict, "temperature": dict, "p_ik": (list, dict)},
         required=("mc",))
