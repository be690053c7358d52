"""The experiment's plotly figures: reliability diagrams, ECE and accuracy by exposure, AUROC by layer,
token-level calibration by layer, the training stages."""

from pathlib import Path
from typing import Any

import numpy as np

from experiments.calibration.config import N_OPTIONS
from lab.metrics.calibration import reliability
from lab.runs import save_figure


# --------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------
def reliability_figure(out: Path, name: str, title: str, curves: dict[str, tuple[Any, Any]]) -> None:
    """Reliability diagrams (15 equal-width bins): accuracy against mean confidence per bin, marker area ∝ count."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for label, (confidence, correct) in curves.items():
        if len(confidence) == 0:
            continue
        r = reliability(np.asarray(confidence, dtype=float), np.asarray(correct, dtype=float))
        size = 6 + 24 * np.sqrt(r.count / r.count.max())
        fig.add_trace(
            go.Scatter(
                x=r.confidence,
                y=r.accuracy,
                mode="lines+markers",
                name=label,
                marker=dict(size=size),
                text=[f"n = {n}" for n in r.count],
            )
        )
    fig.add_trace(
        go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="perfect calibration", line=dict(dash="dash", color="gray"))
    )
    fig.update_layout(
        title=title,
        xaxis=dict(title="confidence (top option's probability)", range=[0, 1]),
        yaxis=dict(title="accuracy", range=[0, 1]),
    )
    save_figure(fig, out, name)


def _ece_bars(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Asymmetric error bars from each row's ece_ci95 (every row has one)."""
    return dict(
        type="data",
        symmetric=False,
        array=[r["ece_ci95"][1] - r["ece"] for r in rows],
        arrayminus=[r["ece"] - r["ece_ci95"][0] for r in rows],
    )


def _ece_by_exposure(blocks: dict[str, dict[str, Any]]) -> Any:
    """ECE by exposure, with its 95% interval and noise floor, one pair of series per block."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for label, block in blocks.items():
        rows = block["by_exposure"]
        fig.add_trace(
            go.Bar(
                x=[r["exposure"] for r in rows],
                y=[r["ece"] for r in rows],
                name=f"{label}: ECE",
                error_y=_ece_bars(rows),
            )
        )
        fig.add_trace(
            go.Scatter(
                x=[r["exposure"] for r in rows],
                y=[r["noise_floor_ece"] for r in rows],
                mode="markers",
                marker=dict(symbol="line-ew-open", size=24),
                name=f"{label}: noise floor",
            )
        )
    fig.update_layout(
        title="ECE (15 equal-width bins) by exposure, with 95% bootstrap intervals and the noise floor "
        "of a perfectly calibrated model",
        barmode="group",
        xaxis={"title": "training statements about the person", "type": "category"},
        yaxis_title="ECE",
    )
    return fig


def _accuracy_by_exposure(blocks: dict[str, dict[str, Any]]) -> Any:
    """Accuracy and mean confidence by exposure, one pair of series per block, and chance."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for label, block in blocks.items():
        rows = block["by_exposure"]
        x = [r["exposure"] for r in rows]
        fig.add_trace(go.Scatter(x=x, y=[r["accuracy"] for r in rows], mode="lines+markers", name=f"{label}: accuracy"))
        fig.add_trace(
            go.Scatter(
                x=x,
                y=[r["mean_confidence"] for r in rows],
                mode="lines+markers",
                line=dict(dash="dot"),
                name=f"{label}: mean confidence",
            )
        )
    exposures = [r["exposure"] for block in blocks.values() for r in block["by_exposure"]]
    fig.add_scatter(
        x=list(dict.fromkeys(exposures)),
        y=[1 / N_OPTIONS] * len(dict.fromkeys(exposures)),
        mode="lines",
        line=dict(dash="dash", color="gray"),
        name=f"chance ({1 / N_OPTIONS:.2f})",
    )
    fig.update_layout(
        title="Accuracy and confidence by exposure",
        xaxis={"title": "training statements about the person", "type": "category"},
        yaxis=dict(title="share", range=[0, 1.02]),
    )
    return fig


def exposure_figures(out: Path, blocks: dict[str, dict[str, Any]]) -> None:
    """ECE (with its 95% interval and noise floor) and accuracy against confidence, by exposure."""
    save_figure(_ece_by_exposure(blocks), out, "ece_by_exposure")
    save_figure(_accuracy_by_exposure(blocks), out, "accuracy_by_exposure")


def _error_bars(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Asymmetric error bars from each row's key_ci95 (none where the interval was refused)."""

    def span(r: dict[str, Any], side: int) -> float:
        interval = r.get(f"{key}_ci95")
        return float("nan") if not interval else abs(interval[side] - r[key])

    return dict(type="data", symmetric=False, array=[span(r, 1) for r in rows], arrayminus=[span(r, 0) for r in rows])


# A control's series: its key in a row, and how it is drawn and named.
_CONTROLS = {
    "untrained": ("control_untrained_auroc", "dot", "darkgray", "controls: untrained model"),
    "shuffled": ("control_shuffled_auroc", "dash", "lightgray", "controls: shuffled labels"),
}


def _control_trace(group: list[dict[str, Any]], control: str, label: str, showlegend: bool) -> Any:
    """One readout's control AUROC by layer: a grey series, hidden until its legend entry is clicked, and shared
    with every readout's same control (`showlegend` for the first only)."""
    import plotly.graph_objects as go

    key, dash, color, name = _CONTROLS[control]
    return go.Scatter(
        x=[r["layer"] for r in group],
        y=[r[key] for r in group],
        mode="lines",
        line=dict(dash=dash, color=color),
        name=name,
        legendgroup=name,
        hovertext=label,
        showlegend=showlegend,
        visible="legendonly",
    )


def _add_baselines(fig: Any, layers: list[int], baselines: dict[str, float | None]) -> None:
    """Each checkpoint's baseline (the model's own confidence) and chance, as flat lines over the layers, named in
    the legend, where their labels cannot overlap (the two baselines often lie close)."""
    span = [min(layers), max(layers)]
    for checkpoint, value in baselines.items():
        if value is not None:
            fig.add_scatter(
                x=span,
                y=[value] * 2,
                mode="lines",
                line=dict(dash="dashdot" if checkpoint == "end" else "dash", color="black"),
                name=f"{checkpoint}: baseline, the model's own confidence ({value:.3f})",
            )
    fig.add_scatter(x=span, y=[0.5] * 2, mode="lines", line=dict(color="gray"), name="chance (0.5)")


def p_ik_figure(
    out: Path,
    rows: list[dict[str, Any]],
    baselines: dict[str, float | None],
    name: str = "p_ik_auroc_by_layer",
    title: str = "P(IK)",
) -> None:
    """Test-split AUROC of every readout by layer (95% intervals; constant readouts left out) at each checkpoint,
    its controls (two grey series, one legend entry each, hidden until clicked), and the baseline: the model's own
    final confidence; a readout keeps its colour at both checkpoints (the dash tells them apart)."""
    import plotly.colors
    import plotly.graph_objects as go

    fig = go.Figure()
    rows = [r for r in rows if not r.get("constant")]
    # one colour per readout, at both checkpoints (the dash tells them apart); the controls of every readout are
    # two grey series, each one legend entry
    readouts = list(dict.fromkeys((r["readout"], r["position"]) for r in rows))
    palette = plotly.colors.qualitative.Plotly + plotly.colors.qualitative.D3
    colour = {readout: palette[i % len(palette)] for i, readout in enumerate(readouts)}
    shown_untrained = shown_shuffled = False
    for key in dict.fromkeys((r.get("checkpoint", "model"), r["readout"], r["position"]) for r in rows):
        group = [r for r in rows if (r.get("checkpoint", "model"), r["readout"], r["position"]) == key]
        label = f"{key[0]}: {key[1]} @ {key[2]}"
        x = [r["layer"] for r in group]
        fig.add_trace(
            go.Scatter(
                x=x,
                y=[r["auroc"] for r in group],
                mode="lines+markers",
                name=label,
                line=dict(dash="solid" if key[0] != "end" else "dashdot", color=colour[key[1:]]),
                error_y=_error_bars(group, "auroc"),
            )
        )
        if any(r["control_untrained_auroc"] is not None for r in group):
            fig.add_trace(_control_trace(group, "untrained", label, not shown_untrained))
            shown_untrained = True
        fig.add_trace(_control_trace(group, "shuffled", label, not shown_shuffled))
        shown_shuffled = True
    _add_baselines(fig, [r["layer"] for r in rows] or [0], baselines)
    fig.update_layout(
        title=f"{title}: test-split AUROC of each readout, by layer (entity-disjoint; readouts are "
        "chosen on a separate validation split)",
        xaxis_title="layer (residual stream entering it; the last is after the final block)",
        yaxis=dict(title="AUROC", range=[0, 1]),
    )
    save_figure(fig, out, name)


def token_level_figure(out: Path, block: dict[str, Any]) -> None:
    import plotly.graph_objects as go

    rows = block["by_layer"]
    x = [r["layer"] for r in rows]
    fig = go.Figure(
        [
            go.Scatter(
                x=x,
                y=[r["ece"] for r in rows],
                mode="lines+markers",
                name="ECE (15 equal-width)",
                error_y=_ece_bars(rows),
            ),
            go.Scatter(
                x=x, y=[r["noise_floor_ece"] for r in rows], mode="lines", line=dict(dash="dot"), name="noise floor"
            ),
            go.Scatter(x=x, y=[r["accuracy"] for r in rows], mode="lines+markers", name="top-1 accuracy"),
            go.Scatter(x=x, y=[r["mean_confidence"] for r in rows], mode="lines+markers", name="mean confidence"),
        ]
    )
    fig.update_layout(
        title=f"Token-level calibration through the logit lens ({block['model']})",
        xaxis_title="layer (the last is the model's own prediction)",
        yaxis_title="value",
    )
    save_figure(fig, out, "token_level_by_layer")


def stages_figure(out: Path, stages: list[dict[str, Any]], partial_step: int) -> None:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(specs=[[{"secondary_y": True}]])
    steps = [s["step"] for s in stages]
    for key, name, secondary in (
        ("heldout_nll", "held-out NLL (nats per statement)", False),
        ("recall_selection", "cloze recall of the format persons (chooses the partial checkpoint)", True),
        ("recall_seen", "cloze recall of seen evaluation persons (reported)", True),
    ):
        fig.add_trace(
            go.Scatter(x=steps, y=[s[key] for s in stages], mode="lines+markers", name=name), secondary_y=secondary
        )
    fig.add_vline(x=partial_step, line_dash="dash", annotation_text="partial checkpoint")
    fig.update_layout(title="Training: held-out NLL and recall by stage", xaxis_title="step")
    fig.update_yaxes(title_text="nats per statement", secondary_y=False)
    fig.update_yaxes(title_text="recall", range=[0, 1.02], secondary_y=True)
    save_figure(fig, out, "training_stages")
