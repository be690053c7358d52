"""The experiment's figures: AUROC by signal and error kind, risk–coverage curves, abstention by α."""

from pathlib import Path
from typing import Any

from experiments.monitor.config import ERROR_KINDS, KINDS
from lab.runs import save_figure


# --------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------
def _auroc_figure(results: dict[str, Any]) -> Any:
    """AUROC for a false claim by signal, over all false claims and by error kind, with 95% intervals."""
    import plotly.graph_objects as go

    fig = go.Figure()
    names = [row["signal"] for row in results["signals"]]
    groups = [("all false claims", lambda row: row)] + [
        (ERROR_KINDS[k], lambda row, k=k: row["by_kind"].get(k, {})) for k in KINDS
    ]
    for label, pick in groups:
        blocks = [pick(row) for row in results["signals"]]
        if not any(b.get("auroc") is not None for b in blocks):
            continue
        values = [b.get("auroc") for b in blocks]
        low = [v - b["auroc_ci95"][0] if b.get("auroc_ci95") else 0 for v, b in zip(values, blocks)]
        high = [b["auroc_ci95"][1] - v if b.get("auroc_ci95") else 0 for v, b in zip(values, blocks)]
        fig.add_bar(x=names, y=values, name=label, error_y=dict(type="data", array=high, arrayminus=low))
    fig.add_hline(y=0.5, line_dash="dash", line_color="gray")
    fig.update_layout(
        title="AUROC for a false claim, test split (95% stratified bootstrap)",
        barmode="group",
        yaxis=dict(title="AUROC", range=[0, 1]),
    )
    return fig


def _risk_coverage_figure(names: list[str], curves: list[dict[str, Any]]) -> Any:
    """Each signal's risk–coverage curve on the test split."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for name in names:
        points = [c for c in curves if c["signal"] == name]
        fig.add_scatter(x=[c["coverage"] for c in points], y=[c["risk"] for c in points], mode="lines", name=name)
    fig.update_layout(
        title="Risk–coverage on the test split: error rate among the answered prompts",
        xaxis=dict(title="coverage", range=[0, 1]),
        yaxis=dict(title="error rate among answered"),
    )
    return fig


def _resplit_series(key: str, entries: list[dict[str, Any]], **style: Any) -> dict[str, Any]:
    """A scatter's arguments: `key`'s mean over the re-draws at each α, bars at the draws' 5th–95th percentiles."""
    ys = [a["resplits"][key] for a in entries]
    spread = [a["resplits"][f"{key}_range90"] for a in entries]
    return dict(
        x=[a["alpha"] for a in entries],
        y=ys,
        mode="lines+markers",
        error_y=dict(
            type="data",
            array=[r[1] - y for r, y in zip(spread, ys)],
            arrayminus=[y - r[0] for r, y in zip(spread, ys)],
        ),
        **style,
    )


def _abstention_figure(chosen: list[dict[str, Any]], signal: str) -> Any:
    """CRC's and LTT's risks and coverages by α on the abstention signal."""
    import plotly.graph_objects as go

    fig = go.Figure()
    # What the headlines state: means over the re-draws of the calibration subjects, with the draws' own spread.
    n = chosen[0]["resplits"]["n_resplits"]
    fig.add_scatter(**_resplit_series("crc_joint_risk", chosen, name="CRC: answered and false"))
    fig.add_scatter(**_resplit_series("crc_coverage", chosen, name="CRC coverage", yaxis="y2", line=dict(dash="dot")))
    answering = [a for a in chosen if a["resplits"]["ltt_n_answering"]]
    if answering:
        fig.add_scatter(
            **_resplit_series(
                "ltt_selective_risk",
                answering,
                name="LTT: false among answered, in the draws "
                "that answer ("
                + ", ".join(f"{a['resplits']['ltt_n_answering']} at α = {a['alpha']:g}" for a in answering)
                + f" of {n})",
            )
        )
    fig.add_scatter(
        **_resplit_series("ltt_coverage", chosen, name="LTT coverage (all draws)", yaxis="y2", line=dict(dash="dot"))
    )
    silent = [a["alpha"] for a in chosen if not a["resplits"]["ltt_n_answering"]]
    if silent:
        fig.add_annotation(
            text="LTT answers in no draw at α = " + ", ".join(f"{x:g}" for x in silent),
            xref="paper",
            yref="paper",
            x=0.02,
            y=0.98,
            showarrow=False,
            xanchor="left",
        )
    alphas = [a["alpha"] for a in chosen]
    fig.add_scatter(
        x=[0, max(alphas)], y=[0, max(alphas)], mode="lines", name="α", line=dict(dash="dash", color="gray")
    )
    fig.update_layout(
        title=f"Abstention on {signal}: means over {n} draws of the calibration "
        "subjects (bars: the draws' 5th–95th percentiles), rates on the test prompts",
        xaxis=dict(title="α"),
        yaxis=dict(title="error rate"),
        yaxis2=dict(title="coverage", overlaying="y", side="right", range=[0, 1]),
    )
    return fig


def write_figures(out: Path, results: dict[str, Any], curves: list[dict[str, Any]]) -> None:
    save_figure(_auroc_figure(results), out, "auroc_by_signal")
    save_figure(_risk_coverage_figure([row["signal"] for row in results["signals"]], curves), out, "risk_coverage")
    chosen = [a for a in results["abstention"] if a["signal"] == results["abstention_signal"]]
    if chosen:  # else no α the calibration split could support (results' abstention_unavailable says why)
        save_figure(_abstention_figure(chosen, results["abstention_signal"]), out, "abstention")
