"""The seeds' equations, each checked by running it: measured against expected, with the tolerance."""

from pathlib import Path

import streamlit as st

from dashboards.common import plain, show_figures, show_headlines, show_run, shorts, warn_shape


CHECK_FIELDS = ("name", "measured", "expected", "tolerance", "passed")  # what experiments.equations.Check writes


def render(folder: Path, results: dict) -> None:
    checks = results.get("checks") or []
    malformed = [i for i, c in enumerate(checks) if not isinstance(c, dict) or not set(CHECK_FIELDS) <= set(c)]
    if malformed:
        warn_shape(folder, "equations",
                   f"checks {malformed} are not objects with the fields {', '.join(CHECK_FIELDS)}; they are left out")
        checks = [c for i, c in enumerate(checks) if i not in malformed]
    passed = sum(bool(c.get("passed")) for c in checks)
    st.write(f"**{passed} of {len(checks)} checks pass.**")
    show_headlines(results)
    for check in checks:
        st.subheader(f"{plain(check.get('name'))}: {'passes' if check.get('passed') else 'FAILS'}")
        if check.get("equation"):
            st.latex(check["equation"])
        st.markdown(f"measured **{plain(shorts(check.get('measured')))}** · expected "
                    f"**{plain(shorts(check.get('expected')))}** · tolerance {plain(shorts(check.get('tolerance')))}",
                    help=f"exact: measured {check.get('measured')}, expected {check.get('expected')}, "
                         f"tolerance {check.get('tolerance')}")
        if check.get("note"):
            st.caption(plain(check["note"]))
    show_figures(folder)


show_run("equations", render, fields={"checks": list}, required=("checks",))
