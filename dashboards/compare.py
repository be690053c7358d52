"""Two runs of one experiment side by side (two seeds, a quick run and a default one): the headlines each
supports, the number and interval behind every headline, and the figures each run saved."""

from typing import Any

import streamlit as st

from dashboards.charts import draw
from dashboards.display import code, describe_run, figures, plain, short, show_headlines, show_table
from experiments import experiment as registered
from experiments import experiment_names
from lab.headlines import title
from lab.runs import complete_runs, run_record

HALF_WIDTH_TITLE = 45  # a title line in one of two columns


def headline_value(entry: Any) -> str:
    """A headline's number with its interval, as the page shows numbers; "not supported" when the run cannot
    support it."""
    if not isinstance(entry, dict):
        return "—"
    if not entry.get("supported"):
        return "not supported"
    value = short(entry.get("value"))
    interval = entry.get("interval")
    if isinstance(interval, (list, tuple)) and len(interval) == 2:
        value += f" [{short(interval[0])}, {short(interval[1])}]"
    return value


def headline_rows(a: dict, b: dict, names: tuple[str, str]) -> list[dict[str, str]]:
    """One row per headline either run has: its value and interval in each run, and whether the two agree in
    direction (the quick-vs-default rule: a supported headline's direction must match)."""

    def by_name(results: dict) -> dict[str, dict]:
        entries = results.get("headlines") if isinstance(results.get("headlines"), list) else []
        return {str(h.get("name")): h for h in entries if isinstance(h, dict)}

    first, second = by_name(a), by_name(b)
    rows = []
    for name in dict.fromkeys([*first, *second]):
        x, y = first.get(name), second.get(name)
        both = isinstance(x, dict) and isinstance(y, dict) and x.get("supported") and y.get("supported")
        rows.append(
            {
                "headline": title(name),
                names[0]: headline_value(x),
                names[1]: headline_value(y),
                "same direction": ("yes" if x.get("direction") == y.get("direction") else "NO") if both else "—",
            }
        )
    return rows


st.title("Compare runs")
with_runs = [e for e in experiment_names() if complete_runs(e)]
if not with_runs:
    st.info(
        "No run yet. Make two to compare: `forma run kl --quick` and `forma run kl --quick --seed 1` "
        "(or without --quick for the full experiment)."
    )
    st.stop()
experiment = st.selectbox("Experiment", with_runs, format_func=lambda e: registered(e).title, key="compare_experiment")
runs = complete_runs(experiment)
if len(runs) < 2:
    st.info(
        f"`{experiment}` has one run ({code(runs[0].name)}). Make another to compare it with, e.g. "
        f"`forma run {experiment} --quick --seed 1`, or `forma run {experiment}` for the default profile."
    )
    st.stop()
records = {folder.name: (folder, run_record(folder)) for folder in runs}
names = list(records)
cols = st.columns(2)
with cols[0]:
    first = st.selectbox(
        "Run A", names, index=0, key="compare_a", format_func=lambda n: f"{n} — {describe_run(*records[n])}"
    )
with cols[1]:
    second = st.selectbox(
        "Run B", names, index=1, key="compare_b", format_func=lambda n: f"{n} — {describe_run(*records[n])}"
    )
if first == second:
    st.warning("Run A and run B are the same run: choose two.")
    st.stop()
chosen = (first, second)
for name in chosen:
    for problem in records[name][1]["problems"]:
        st.warning(f"{plain(problem)}: that part of run {code(name)} is left out.")

st.subheader("Headlines, number by number")
st.caption(
    "Each headline's value with its interval, in each run; a run that cannot support a headline says so "
    "(its reason is below). Two supported headlines must agree in direction."
)
show_table(
    headline_rows(records[first][1]["results"], records[second][1]["results"], chosen),
    download=f"{experiment}_headlines",
)

columns = st.columns(2)
for column, name in zip(columns, chosen):
    with column:
        st.subheader(f"Run {code(name)}")
        st.caption(plain(describe_run(*records[name])))
        show_headlines(records[name][1]["results"])

found = {name: dict(figures(records[name][0])) for name in chosen}
shared = [f for f in found[first] if f in found[second]]
if shared:
    st.subheader("Figures")
for figure in shared:
    columns = st.columns(2)
    for column, name in zip(columns, chosen):
        with column:
            draw(found[name][figure], f"compare-{name}-{figure}", title_chars=HALF_WIDTH_TITLE)
only = sorted(set(found[first]) ^ set(found[second]))
if only:
    st.caption(f"Figures only one of the two runs saved, left out here: {plain(', '.join(only))}.")
