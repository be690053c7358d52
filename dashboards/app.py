"""Forma's dashboard: `forma dashboard` (Streamlit, bound to 127.0.0.1, no usage statistics); its pages are
dashboards.pages.pages()."""

import streamlit as st

from dashboards.pages import page_file, pages

st.set_page_config(page_title="Forma", layout="wide")
st.navigation([st.Page(page_file(name), title=title, default=name == "home") for name, title in pages()]).run()
