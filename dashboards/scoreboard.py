"""Methods against the truth: every interpretability method graded on worlds whose law and mechanism are known —
the table first (method × world × readout × grade, with intervals and controls), then each method's figures. Below,
the real-model track (`forma run scoreboard --model smollm2`, runs/scoreboard_real/): what it graded and left out,
what it took, and its table — the same table and filters (show_scoreboard), its tasks for the worlds."""

from pathlib import Path

import streamlit as st

from dashboards.charts import draw, relabel
from dashboards.display import (
    figures,
    plain,
    read_table,
    rerun,
    short,
    show_figures,
    show_headlines,
    show_real_track,
    show_run,
    show_table,
)
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


def show_scoreboard(folder: Path, key: str, worlds: str) -> bool:
    """The run's table (scoreboard.parquet), as both tracks show it: each key in its one display name (lab.names),
    the methods and the `worlds` (what the track calls them: the toy worlds, the real track's tasks) to choose,
    widgets keyed by `key`, and the rows chosen, every digit a download away; False, after saying what to run, for a
    run without the table."""
    table = read_table(folder / "scoreboard.parquet", folder.parent.name)
    if table is None:
        st.info("This run has no scoreboard.parquet. " + rerun(folder.parent.name))
        return False
    present = [c for c in COLUMNS if c in table.columns]  # a run made before a column was added lacks it
    table = table[present[:7] + [c for c in SEED_COLUMNS if c in table.columns] + present[7:]]
    st.subheader("The scoreboard")
    for column in ("method", "world", "readout", "grade"):
        table[column] = table[column].map(name)
    methods = sorted(table["method"].unique())
    places = sorted(table["world"].unique())
    left, right = st.columns(2)
    with left:
        chosen_methods = st.multiselect("Methods", methods, default=methods, key=f"{key}_methods")
    with right:
        chosen_places = st.multiselect(worlds, places, default=places, key=f"{key}_worlds")
    shown = table[table["method"].isin(chosen_methods) & table["world"].isin(chosen_places)]
    show_table(shown.reset_index(drop=True), LABELS, download=key)
    return True


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
    if not show_scoreboard(folder, "scoreboard", "Worlds"):
        return
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


TASK_LABELS = {
    "world": "task",
    "readout": "its truth",
    "tried": "prompts tried",
    "answered": "answered by the model",
    "prompts": "graded",
    "length": "tokens a prompt",
    "graph_prompts": "with an attribution graph",
}
PARTS = {"heads": "the head detectors", "lenses": "the lenses", "total": "the whole run"}  # the rest are tasks
# What results.json's "lenses" says of the head detectors and the lenses, for a run made before it said so.
BEFORE_LENSES = "not recorded: the run was made before the real track graded them"


def show_parts(results: dict) -> None:
    """What the real-model run graded and what it left out (results.json "graph" and "lenses", as the run words
    them), then each task's prompts: how many it tried, how many the model answers, how many it graded."""
    parts = results.get("lenses") or {}
    st.markdown("**What this run graded, and what it left out**")
    st.text(
        "\n".join(
            [
                "• input attribution: every method and trivial baseline, on each task below",
                f"• the attribution graph: {results.get('graph') or 'not recorded'}",
                f"• the head detectors: {parts.get('heads') or BEFORE_LENSES}",
                f"• the lenses: {parts.get('lenses') or BEFORE_LENSES}",
            ]
        )
    )
    tasks = [task | {"world": name(world)} for world, task in (results.get("worlds") or {}).items()]
    show_table(tasks, TASK_LABELS)


def show_cost(results: dict) -> None:
    """What the run cost: each part's seconds (results.json "seconds": each task, the head detectors, the lenses,
    the whole run), the load average it began under and its peak memory."""
    seconds = results.get("seconds") or {}
    st.markdown("**What it took**")
    rows = [{"part": PARTS.get(part, f"the {part} task"), "seconds": value} for part, value in seconds.items()]
    show_table(rows, {"part": "part", "seconds": "seconds"})
    load, peak = results.get("load_average"), results.get("peak_rss_gb")
    st.caption(
        f"The machine's load average (one minute) as the run began: {short(load)}; the run's peak memory: "
        f"{short(peak)} GB. Its seconds grow with the load: compare runs made under the same."
    )


def render_real(folder: Path, results: dict) -> None:
    """The real-model track (experiments.scoreboard.real): the headlines, what it graded and left out, its cost,
    then its table (the attribution methods', the lenses' and the head detectors' rows) and its figure."""
    st.caption(
        f"{plain(results.get('model') or 'A pretrained model')}, graded on tasks whose relevant positions are known "
        "by construction. Each grade is a mean over the prompts the model answers, with a bootstrap 95% interval "
        "over them; an attribution method's control is the same method on an untrained model of the same shape "
        "(the graph: untrained transcoders), which it must beat. Where the run grades them, the lenses are graded "
        "against the model itself on held-out documents of the corpus (their gain over another window's reading "
        "must lie above 0), the head detectors against each head's ablation, beside random scores."
    )
    show_headlines(results)
    show_parts(results)
    show_cost(results)
    if show_scoreboard(folder, "scoreboard_real", "Tasks"):
        show_figures(folder)


show_real_track(
    "scoreboard",
    render_real,
    fields={
        "table": list,
        "headlines": list,
        "worlds": dict,
        "graph": str,
        "lenses": dict,
        "seconds": dict,
        "load_average": (int, float),
        "peak_rss_gb": (int, float),
    },
    required=("table",),
)
