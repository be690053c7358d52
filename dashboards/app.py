"""Forma's dashboard: `forma dashboard` (Streamlit, bound to 127.0.0.1, no usage statistics)."""

from pathlib import Path

import streamlit as st

HERE = Path(__file__).resolve().parent

st.set_page_config(page_title="Forma", layout="wide")
pages = [
    st.Page(HERE / "home.py", title="Home", default=True),
    st.Page(HERE / "explorer.py", title="Explorer"),
    st.Page(HERE / "kl.py", title="KL decomposition"),
    st.Page(HERE / "hallucination.py", title="Hallucination"),
    st.Page(HERE / "calibration.py", title="Calibration"),
    st.Page(HERE / "monitor.py", title="Hallucination monitor"),
    st.Page(HERE / "equations.py", title="Equations"),
    st.Page(HERE / "compare.py", title="Compare runs"),
    st.Page(HERE / "training.py", title="Training curves"),
]
st.navigation(pages).run()
