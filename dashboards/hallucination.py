"""Hallucination on arbitrary facts: the Kalai–Vempala bound g(H) ≥ MF − Mis − …, and what moves it."""

import pandas as pd
import streamlit as st

from dashboards.common import show_figures, show_run_header

folder, results = show_run_header("hallucination")
if results is None:
    st.stop()
st.latex(r"g(\mathcal{H}) \;\ge\; \widehat{MF} - \mathrm{Mis}(g, p) - \frac{3e^{-s}}{\delta} - \sqrt{\frac{6\ln(6/\delta)}{n}}")
world = results.get("world") or {}
if world:
    st.write(" · ".join(f"{k}: **{v}**" for k, v in world.items() if isinstance(v, (int, float, str))))
rows = []
for entry in results.get("sweep") or []:
    for checkpoint in entry.get("checkpoints") or []:
        rows.append({"gamma": entry.get("gamma"), "monofact rate": entry.get("monofact_rate"),
                     "missing mass": entry.get("missing_mass"), **checkpoint})
if rows:
    st.subheader("Sweep over the popularity shape γ, at each checkpoint")
    st.dataframe(pd.DataFrame(rows), hide_index=True, key="sweep")
if results.get("upweighting"):
    st.subheader("Selective upweighting (matched compute)")
    st.dataframe(pd.DataFrame(results["upweighting"]), hide_index=True, key="upweighting")
if results.get("singleton"):
    st.subheader("Singleton-rate variant (Kalai, Nachum, Vempala & Zhang 2025)")
    st.json(results["singleton"])
show_figures(folder)
