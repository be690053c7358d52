"""The seeds' equations, each checked by running it: every measured entry beside its rule, in words and in
symbols (experiments.equations.check.entries), and whether it holds."""

from pathlib import Path

import streamlit as st

from dashboards.display import plain, prose, show_figures, show_headlines, show_run, show_table, warn_shape
from experiments.equations.check import entries
from lab.headlines import title

CHECK_FIELDS = ("name", "measured", "expected", "tolerance", "passed")  # what experiments.equations.check.Check writes
HOLDS = {True: "yes", False: "NO", None: "see the note"}


def render(folder: Path, results: dict) -> None:
    checks = results.get("checks") or []
    malformed = [i for i, c in enumerate(checks) if not isinstance(c, dict) or not set(CHECK_FIELDS) <= set(c)]
    if malformed:
        warn_shape(
            folder,
            "equations",
            f"checks {malformed} are not objects with the fields {', '.join(CHECK_FIELDS)}; they are left out",
        )
        checks = [c for i, c in enumerate(checks) if i not in malformed]
    passed = sum(bool(c.get("passed")) for c in checks)
    st.write(f"**{passed} of {len(checks)} checks pass.**")
    show_headlines(results)
    for check in checks:
        st.subheader(
            f"{plain(title(check.get('name')))} (claim {plain(check.get('item'))}): "
            f"{'passes' if check.get('passed') else 'FAILS'}"
        )
        if check.get("equation"):
            st.latex(check["equation"])
        rows = [
            {
                "measured quantity": e["what"],
                "measured": e["measured"],
                "passes when": e["passes when"],
                "in symbols": e["in symbols"] or "—",
                "holds": HOLDS[e["holds"]],
            }
            for e in entries(check)
        ]
        show_table(rows, as_text=prose)
        if check.get("note"):
            st.caption(prose(check["note"]))
    show_figures(folder)


show_run("equations", render, fields={"checks": list}, required=("checks",))
