"""Methods against the truth: every interpretability method graded on worlds whose law and mechanism are known —
the table first (method × world × readout × grade, with intervals and controls), then each method's figures."""

from pathlib import Path

import streamlit as st

from dashboards.charts import draw, relabel
from dashboards.display import figures, read_table, show_headlines, show_run, show_table
from lab.names import NAMES, name

COLUMNS = [
    "method",
    "world",
    "readout",
    "grade",
    "value",
    "low",
    "high",
    "chance",
    "control",
    "control_low",
    "control_high",
    "control_at_chance",
    "control_means",
    "beats_control",
    "n",
]
SEED_COLUMNS = ["seeds", "seed_min", "seed_max"]  # a run that trained several seeds per world (older runs: one)
LABELS = {
    "method": "method",
    "world": "world",
    "readout": "read at",
    "grade": "grade",
    "value": "grade's value",
    "low": "95% interval, low",
    "high": "95% interval, high",
    "chance": "chance",
    "control": "control",
    "control_low": "control's interval, low",
    "control_high": "control's interval, high",
    "control_at_chance": "control no better than chance",
    "control_means": "the control",
    "beats_control": "beats its control",
    "n": "prompts",
    "seeds": "training seeds",
    "seed_min": "lowest seed's value",
    "seed_max": "highest seed's value",
}
FIGURES_BY_METHOD = (
    ("Lenses", ["lenses"]),
    ("Input attribution", ["attribution"]),
    ("Probes", ["belief_simplex", "probes"]),
    ("Heads and patching", ["heads", "attribution_patching"]),
)


def render(folder: Path, results: dict) -> None:
    st.caption(
        "Each grade is a mean over held-out prompts and over the models of several training seeds; its 95% "
        "interval spans every seed's bootstrap interval over prompts, so it covers the spread between the trained "
        "models as well as over prompts, and the lowest and highest seed's values show the seeds' spread alone. "
        "Beside it a control. Some controls know nothing (shuffled targets for a probe, permuted cells for "
        'patching) and are judged against chance: "control no better than chance" is yes where the control\'s '
        "interval does not clear chance on the grade's good side, no where it clears it: such a grade rewards "
        "something other than the truth. A lens shows instead what it gains over another prompt's reading, which "
        "must lie above 0. An attribution method's control is the same method where the mechanism is absent (an "
        'untrained model, a model trained on another world, untrained transcoders for the graph; "the control" '
        'names the hardest of them): "beats its control" is yes where the grade\'s interval lies above it. The '
        "trivial baselines (recency, last token only, uniform, random scores) are rows of their own: a method "
        "finds the mechanism only where it beats the best of them and its control."
    )
    show_headlines(results)
    table = read_table(folder / "scoreboard.parquet", "scoreboard")
    if table is None:
        st.info("This run has no scoreboard.parquet: run `forma run scoreboard` again.")
        return
    present = [c for c in COLUMNS if c in table.columns]  # a run made before a column was added lacks it
    table = table[present[:7] + [c for c in SEED_COLUMNS if c in table.columns] + present[7:]]
    st.subheader("The scoreboard")
    for column in ("method", "world", "readout", "grade"):  # each key in its one display name (lab.names)
        table[column] = table[column].map(name)
    methods = sorted(table["method"].unique())
    worlds = sorted(table["world"].unique())
    left, right = st.columns(2)
    with left:
        chosen_methods = st.multiselect("Methods", methods, default=methods, key="scoreboard_methods")
    with right:
        chosen_worlds = st.multiselect("Worlds", worlds, default=worlds, key="scoreboard_worlds")
    shown = table[table["method"].isin(chosen_methods) & table["world"].isin(chosen_worlds)]
    show_table(shown.reset_index(drop=True), LABELS, download="scoreboard")
    unreadable: list[str] = []
    drawn = dict(figures(folder, unreadable))
    for title, files in FIGURES_BY_METHOD:
        st.subheader(title)
        for file in files:
            if file in drawn:
                draw(relabel(drawn[file], NAMES), key=f"fig-{folder.parent.name}-{folder.name}-{file}")
    if unreadable:
        st.warning(
            f"Figures that are not readable plotly JSON, left out: {', '.join(unreadable)}. Run `forma run "
            "scoreboard` again."
        )


show_run("scoreboard", render, fields={"table": list, "headlines": list, "worlds": dict}, required=("table",))
