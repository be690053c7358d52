"""The seeds' equations, each checked by running it: measured against expected, with the tolerance."""

import streamlit as st

from dashboards.common import show_figures, show_headlines, show_run_header

folder, results = show_run_header("equations")
if results is None:
    st.stop()
checks = results.get("checks") or []
passed = sum(bool(c.get("passed")) for c in checks)
st.write(f"**{passed} of {len(checks)} checks pass.**")
show_headlines(results)
for check in checks:
    mark = "✅" if check.get("passed") else "❌"
    st.subheader(f"{mark} {check.get('name')}")
    if check.get("equation"):
        st.latex(check["equation"])
    st.write(f"measured **{check.get('measured')}** · expected **{check.get('expected')}** · "
             f"tolerance {check.get('tolerance')}")
    if check.get("note"):
        st.caption(check["note"])
show_figures(folder)
