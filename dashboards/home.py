"""Home: what Forma is, the zoo, the latest run of each experiment and the commands that make the missing ones."""

import streamlit as st

from dashboards.common import EXPERIMENTS, latest_run, show_table, zoo_table

st.title("Forma")
st.markdown(
    "Forma writes the decoder-only transformer down equation by equation, exposes every activation "
    "through TransformerLens hooks, and measures where likelihood and truth part ways on worlds whose "
    "true distribution is known: the **KL decomposition** of the loss, **hallucination** on arbitrary "
    "facts (Kalai–Vempala), and **calibration** (Kadavath).")

st.header("Models")
show_table(zoo_table())

st.header("Experiments")
for experiment, title in EXPERIMENTS.items():
    folder, results, problem = latest_run(experiment)
    if problem:
        st.markdown(f"**{title}** — {problem}")
    else:
        st.markdown(f"**{title}** — latest run `{folder.name}`; open its page in the sidebar.")
