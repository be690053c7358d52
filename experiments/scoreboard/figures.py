"""The scoreboard's figures, drawn from results.json's dict (and the belief simplex's points): each method's grades
on each world with their intervals and their controls."""

import math
from pathlib import Path
from typing import Any

import numpy as np

from experiments.scoreboard.config import FIGURES, LENSES, LOOKUP
from lab.metrics.grades import BASELINES
from lab.names import name as display
from lab.runs import save_figure, save_table

COLOURS = {"logit": "#1f77b4", "tuned": "#2ca02c", "jacobian": "#d62728", "same-position jacobian": "#ff9896"}


def _errors(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Plotly asymmetric error bars from rows with value, low and high (none where there is no interval)."""

    def gap(a: Any, b: Any) -> float:
        return float(a - b) if a is not None and b is not None and math.isfinite(a) and math.isfinite(b) else 0.0

    return {
        "type": "data",
        "symmetric": False,
        "array": [gap(r["high"], r["value"]) for r in rows],
        "arrayminus": [gap(r["value"], r["low"]) for r in rows],
    }


def _lens_traces(table: list[dict[str, Any]], world: str, lens: str, grade: str, first: bool) -> list[Any]:
    """One lens's line in one panel (a world's grade over the readouts, with its intervals), and beside the logit
    lens's KLs the chance line (the best prompt-blind law); the output readout has no KL to the model."""
    import plotly.graph_objects as go

    rows = [
        r
        for r in table
        if r["method"] == f"{lens} lens"
        and r["world"] == world
        and r["grade"] == grade
        and not (grade == "kl_model" and r["readout"] == "output")
    ]
    traces = [
        go.Scatter(
            x=[r["readout"] for r in rows],
            y=[r["value"] for r in rows],
            error_y=_errors(rows),
            mode="lines+markers",
            name=display(f"{lens} lens"),
            legendgroup=lens,
            showlegend=first,
            line={"color": COLOURS[lens]},
        )
    ]
    if lens == "logit" and grade != "prompt_gain":
        traces.append(
            go.Scatter(
                x=[r["readout"] for r in rows],
                y=[r["chance"] for r in rows],
                mode="lines",
                line={"dash": "dot", "color": "grey"},
                name="chance (best prompt-blind law)",
                legendgroup="chance",
                showlegend=first,
            )
        )
    return traces


def lenses_figure(results: dict[str, Any]) -> Any:
    """Each lens against the truth (KL to p), against the model (KL to P_θ) and its gain over another prompt's
    reading, every readout of every world, one column per world."""
    from plotly.subplots import make_subplots

    worlds = [w for w in ("markov", "mess3", "induction") if w in results["worlds"]]
    figure = make_subplots(
        rows=3,
        cols=len(worlds),
        shared_xaxes=True,
        vertical_spacing=0.07,
        subplot_titles=[f"{w}: KL(p ‖ lens)" for w in worlds]
        + [f"{w}: KL(P_θ ‖ lens)" for w in worlds]
        + [f"{w}: gain over another prompt's reading" for w in worlds],
    )
    for col, world in enumerate(worlds, start=1):
        figure.add_hline(y=0.0, line_dash="dot", line_color="grey", row=3, col=col)
        for lens in LENSES:
            for row_index, grade in ((1, "kl_true"), (2, "kl_model"), (3, "prompt_gain")):
                first = col == 1 and row_index == 1
                for trace in _lens_traces(results["table"], world, lens, grade, first):
                    figure.add_trace(trace, row=row_index, col=col)
    for row_index in (1, 2):
        figure.update_yaxes(type="log", title_text="nats/token", row=row_index)
    figure.update_yaxes(title_text="nats/token gained", row=3)
    figure.update_layout(
        title="Lenses against the truth and against the model, every layer, and what each gains by reading its own "
        "prompt<br>rather than another's (95% intervals over held-out prompts; the output row is the model itself)",
        height=960,
    )
    return figure


ATTRIBUTION_COLUMNS = (
    ("markov", "last prediction"),
    ("induction", "all sources"),
    ("facts", "last prediction"),
    ("induction", "unique source"),
    ("repeated_tokens", "copy source"),  # the real-model track's tasks (experiments.scoreboard.real)
    ("ioi", "indirect object"),
    ("capitals", "subject"),
)


def _attribution_traces(rows: list[dict[str, Any]], first: bool) -> list[Any]:
    """One panel's traces, as horizontal bars (a method's name reads along its bar): the methods' bars, the
    trivial baselines' bars, and each row's control."""
    import plotly.graph_objects as go

    methods = [r for r in rows if r["method"] not in BASELINES]
    baselines = [r for r in rows if r["method"] in BASELINES]
    controls = [r for r in rows if r["control"] is not None]
    return [
        go.Bar(
            y=[display(r["method"]) for r in methods],
            x=[r["value"] for r in methods],
            error_x=_errors(methods),
            orientation="h",
            name="method",
            marker_color="#1f77b4",
            showlegend=first,
            legendgroup="method",
        ),
        go.Bar(
            y=[display(r["method"]) for r in baselines],
            x=[r["value"] for r in baselines],
            error_x=_errors(baselines),
            orientation="h",
            name="trivial baseline",
            marker_color="#ff7f0e",
            showlegend=first,
            legendgroup="baseline",
        ),
        go.Scatter(
            y=[display(r["method"]) for r in controls],
            x=[r["control"] for r in controls],
            error_x=_errors(
                [{"value": r["control"], "low": r["control_low"], "high": r["control_high"]} for r in controls]
            ),
            mode="markers",
            marker={"color": "grey", "symbol": "x"},
            name="control: the same method without the mechanism (untrained model, other world's model, untrained "
            "transcoders: the hardest)",
            showlegend=first,
            legendgroup="control",
        ),
    ]


def attribution_figure(results: dict[str, Any]) -> Any:
    """One panel per truth and grade, stacked (each as wide as the chart, so that no title or name meets
    another's), the methods and baselines as horizontal bars with their controls, chance a dotted line."""
    from plotly.subplots import make_subplots

    columns = [(w, r) for w, r in ATTRIBUTION_COLUMNS if w in results["worlds"]]
    grades = ("auroc", "relevant_mass", "rank_correlation")
    panels = [(world, readout, grade) for world, readout in columns for grade in grades]
    figure = make_subplots(
        rows=len(panels),
        cols=1,
        vertical_spacing=0.25 / len(panels),
        subplot_titles=[f"{display(w)}, {r}: {display(g)}" for w, r, g in panels],
    )
    for index, (world, readout, grade) in enumerate(panels, start=1):
        rows = [r for r in results["table"] if r["world"] == world and r["grade"] == grade and r["readout"] == readout]
        for trace in _attribution_traces(rows, index == 1):
            figure.add_trace(trace, row=index, col=1)
        if rows:
            figure.add_vline(x=rows[0]["chance"], line_dash="dot", row=index, col=1)
    figure.update_layout(
        title="Input attribution of the prediction after the last token: AUROC and share of the mass on the truly "
        "relevant positions,<br>and Spearman ρ with the model's exhaustive causal effects, beside the trivial "
        "baselines (95% intervals over prompts; grey: each one's control)",
        height=300 * len(panels),
        barmode="group",
    )
    return figure


def simplex_figure(simplex: dict[str, Any]) -> Any:
    """Shai et al. 2024, Fig. 1: the belief states in the 2-simplex, coloured by belief, beside the linear probe's
    reading of the residual stream (every layer) for the same test positions, in the same colours."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    true, predicted = np.asarray(simplex["true"]), np.asarray(simplex["predicted"])
    colours = [f"rgb({int(255 * r)},{int(255 * g)},{int(255 * b)})" for r, g, b in np.clip(true, 0, 1)]

    def plane(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # barycentric → the equilateral triangle
        return points[:, 1] + 0.5 * points[:, 2], np.sqrt(3) / 2 * points[:, 2]

    figure = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=(
            "true belief states η_t (forward filtering)",
            "read from the residual stream (linear probe, all layers)",
        ),
    )
    for col, points in ((1, true), (2, predicted)):
        x, y = plane(points)
        figure.add_trace(
            go.Scattergl(x=x, y=y, mode="markers", marker={"color": colours, "size": 3}, showlegend=False),
            row=1,
            col=col,
        )
        figure.add_trace(
            go.Scatter(
                x=[0, 1, 0.5, 0],
                y=[0, 0, np.sqrt(3) / 2, 0],
                mode="lines",
                line={"color": "black", "width": 1},
                showlegend=False,
            ),
            row=1,
            col=col,
        )
    figure.update_xaxes(visible=False)
    figure.update_yaxes(visible=False, scaleanchor="x")
    figure.update_layout(
        title="Mess3: the belief simplex and the residual stream's linear image of it (held-out prompts)", height=500
    )
    return figure


def _probe_traces(results: dict[str, Any], world: str, grade: str, untrained: str, task: str, first: bool) -> list[Any]:
    """One world's panel: the linear probe's bars over the readouts, beside its three controls (shuffled targets,
    the untrained model, the control task)."""
    import plotly.graph_objects as go

    rows = [
        r for r in results["table"] if r["method"] == "linear probe" and r["world"] == world and r["grade"] == grade
    ]
    readouts = [r["readout"] for r in rows]
    traces = [
        go.Bar(
            x=readouts,
            y=[r["value"] for r in rows],
            error_y=_errors(rows),
            name="probe",
            marker_color="#1f77b4",
            showlegend=first,
            legendgroup="probe",
        )
    ]
    shuffled = [{"value": r["control"], "low": r["control_low"], "high": r["control_high"]} for r in rows]
    for name, values, colour in (
        ("shuffled targets", shuffled, "grey"),
        ("untrained model", [_row(results, world, x, untrained) for x in readouts], "#ff7f0e"),
        ("control task", [_row(results, world, x, task) for x in readouts], "#9467bd"),
    ):
        traces.append(
            go.Bar(
                x=readouts,
                y=[v["value"] for v in values],
                error_y=_errors(values),
                name=name,
                marker_color=colour,
                showlegend=first,
                legendgroup=name,
            )
        )
    return traces


def probes_figure(results: dict[str, Any]) -> Any:
    """The linear probes of each world against their controls, every readout; the lookups of the last k tokens
    beside the belief probe."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    panels = (
        ("mess3", "r2 belief state", "r2 untrained", "r2 control task", "R²"),
        ("facts", "accuracy fact value", "accuracy untrained", "accuracy control task", "accuracy"),
    )
    figure = make_subplots(rows=1, cols=2, subplot_titles=("Mess3: belief state (R²)", "facts: the value (accuracy)"))
    for col, (world, grade, untrained, task, _) in enumerate(panels, start=1):
        for trace in _probe_traces(results, world, grade, untrained, task, col == 1):
            figure.add_trace(trace, row=1, col=col)
    lookups = [r for r in results["table"] if r["method"] == LOOKUP]
    figure.add_trace(
        go.Bar(
            x=[r["readout"] for r in lookups],
            y=[r["value"] for r in lookups],
            error_y=_errors(lookups),
            name=display(LOOKUP),
            marker_color="#8c564b",
        ),
        row=1,
        col=1,
    )
    figure.update_layout(
        title="Linear probes from the residual stream against their controls, and the belief probe beside the "
        "lookups of the last k tokens<br>(95% intervals over held-out prompts or persons)",
        barmode="group",
        height=500,
    )
    return figure


def _row(results: dict[str, Any], world: str, readout: str, grade: str) -> dict[str, Any]:
    for r in results["table"]:
        if r["world"] == world and r["readout"] == readout and r["grade"] == grade:
            return r
    return {"value": None, "low": None, "high": None}


SEED_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
HEAD_PANELS = (
    ("induction", "induction score against the head's Shapley value on the prediction (direct path)"),
    ("previous_token", "previous-token score against its Shapley value through the later keys"),
)


def _heads_by_seed(results: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(seed, the heads block of the long-span induction world) for every training seed, the first one first."""
    seeds = [str(s) for s in results.get("seeds", [0])]
    blocks = [results["worlds"]["long_induction"]["heads"]]
    blocks += [results["seed_worlds"][s]["long_induction"]["heads"] for s in seeds[1:]]
    return list(zip(seeds, blocks))


def _seed_traces(seed: str, heads: dict[str, Any], colour: str) -> list[tuple[int, Any]]:
    """(column, trace) of one seed's model: each detector's score against each head's Shapley value (columns 1
    and 2), and its margins with their intervals (column 3)."""
    import plotly.graph_objects as go

    shape = np.asarray(heads["values"]["induction"]).shape
    labels = [f"L{layer}H{head}" for layer in range(shape[0]) for head in range(shape[1])]
    traces = [
        (
            col,
            go.Scatter(
                x=np.asarray(heads["scores"][kind]).ravel(),
                y=np.asarray(heads["values"][kind]).ravel(),
                hovertext=[f"{label}, seed {seed}" for label in labels],  # on hover: 24 names would overlap
                hoverinfo="text+x+y",
                mode="markers",
                name=f"seed {seed}",
                legendgroup=seed,
                showlegend=col == 1,
                marker={"color": colour, "size": 9},
            ),
        )
        for col, (kind, _) in enumerate(HEAD_PANELS, start=1)
    ]
    margins = [heads["grades"][f"margin_{kind}"] for kind, _ in HEAD_PANELS]
    margin = go.Scatter(
        x=[display(kind) for kind, _ in HEAD_PANELS],
        y=[m["value"] for m in margins],
        error_y=_errors(margins),
        mode="markers",
        name=f"seed {seed}",
        legendgroup=seed,
        showlegend=False,
        marker={"color": colour, "size": 10},
    )
    return [*traces, (3, margin)]


def heads_figure(results: dict[str, Any]) -> Any:
    """Each detector's score against each head's Shapley value on the detector's path, every head of every seed's
    model; and each seed's margin (the least flagged head's value over the best other's) with its interval."""
    from plotly.subplots import make_subplots

    figure = make_subplots(
        rows=1, cols=3, subplot_titles=[title for _, title in HEAD_PANELS] + ["margin of the flagged heads, per seed"]
    )
    for k, (seed, heads) in enumerate(_heads_by_seed(results)):
        for col, trace in _seed_traces(seed, heads, SEED_COLOURS[k % len(SEED_COLOURS)]):
            figure.add_trace(trace, row=1, col=col)
    for col in range(1, len(HEAD_PANELS) + 1):
        figure.update_xaxes(title_text="detector score", range=[0, 1.05], row=1, col=col)
    figure.add_hline(y=0, line_dash="dot", row=1, col=3)
    figure.update_yaxes(title_text="Shapley value (nats of copying)", row=1, col=1)
    figure.update_yaxes(title_text="margin (nats; above 0: the flagged heads do the work)", row=1, col=3)
    figure.update_layout(
        title="Head detectors against every set of heads ablated together (exact Shapley values, mean ablation) on "
        "the long-span induction world,<br>every training seed (95% intervals over prompts)",
        height=520,
    )
    return figure


def patching_figure(points: dict[str, Any]) -> Any:
    """Every cell of every prompt: attribution patching's estimate against the exhaustive patch."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    figure = make_subplots(
        rows=1, cols=2, subplot_titles=("heads [layer, head]", "residual stream before each block [layer, position]")
    )
    for col, sweep in enumerate(("heads", "resid_pre"), start=1):
        estimate, exhaustive = points[sweep]["estimate"], points[sweep]["exhaustive"]
        low, high = min(exhaustive + estimate), max(exhaustive + estimate)
        figure.add_trace(
            go.Scattergl(x=exhaustive, y=estimate, mode="markers", marker={"size": 4}, showlegend=False), row=1, col=col
        )
        figure.add_trace(
            go.Scatter(
                x=[low, high], y=[low, high], mode="lines", line={"dash": "dot", "color": "grey"}, showlegend=False
            ),
            row=1,
            col=col,
        )
        figure.update_xaxes(title_text="exhaustive patch (logit difference)", row=1, col=col)
        figure.update_yaxes(title_text="attribution patching estimate", row=1, col=col)
    figure.update_layout(
        title="Attribution patching against the exhaustive sweep, every cell of every prompt (induction world)",
        height=500,
    )
    return figure


def write_figures(out: Path, results: dict[str, Any], simplex: dict[str, Any], points: dict[str, Any]) -> list[str]:
    true, predicted = np.asarray(simplex["true"]), np.asarray(simplex["predicted"])
    save_table(
        [
            {"true_0": a[0], "true_1": a[1], "true_2": a[2], "read_0": b[0], "read_1": b[1], "read_2": b[2]}
            for a, b in zip(true, predicted)
        ],
        out,
        "belief_simplex",
    )
    figures = {
        "lenses": lenses_figure(results),
        "attribution": attribution_figure(results),
        "belief_simplex": simplex_figure(simplex),
        "probes": probes_figure(results),
        "heads": heads_figure(results),
        "attribution_patching": patching_figure(points),
    }
    for name in FIGURES:
        save_figure(figures[name], out, name)
    return list(FIGURES)


def write_real_figures(out: Path, results: dict[str, Any]) -> list[str]:
    """The real-model track's figure: the attribution panels of its tasks."""
    save_figure(attribution_figure(results), out, "attribution")
    return ["attribution"]
