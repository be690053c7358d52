"""The experiment's figures: AUROC by signal and error kind, risk–coverage curves, abstention by α."""

from pathlib import Path
from typing import Any

from lab.runs import save_figure

from experiments.monitor.config import ERROR_KINDS, KINDS


# --------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------
def write_figures(out: Path, results: dict[str, Any], curves: list[dict[str, Any]]) -> None:
    import plotly.graph_objects as go

    fig = go.Figure()
    names = [row["signal"] for row in results["signals"]]
    groups = [("all false claims", lambda row: row)] + [
        (ERROR_KINDS[k], lambda row, k=k: row["by_kind"].get(k, {})) for k in KINDS]
    for label, pick in groups:
        blocks = [pick(row) for row in results["signals"]]
        if not any(b.get("auroc") is not None for b in blocks):
            continue
        values = [b.get("auroc") for b in blocks]
        low = [v - b["auroc_ci95"][0] if b.get("auroc_ci95") else 0 for v, b in zip(values, blocks)]
        high = [b["auroc_ci95"][1] - v if b.get("auroc_ci95") else 0 for v, b in zip(values, blocks)]
        fig.add_bar(x=names, y=values, name=label, error_y=dict(type="data", array=high, arrayminus=low))
    fig.add_hline(y=0.5, line_dash="dash", line_color="gray")
    fig.update_layout(title="AUROC for a false claim, test split (95% stratified bootstrap)", barmode="group",
                      yaxis=dict(title="AUROC", range=[0, 1]))
    save_figure(fig, out, "auroc_by_signal")

    fig = go.Figure()
    for name in names:
        points = [c for c in curves if c["signal"] == name]
        fig.add_scatter(x=[c["coverage"] for c in points], y=[c["risk"] for c in points], mode="lines", name=name)
    fig.update_layout(title="Risk–coverage on the test split: error rate among the answered prompts",
                      xaxis=dict(title="coverage", range=[0, 1]), yaxis=dict(title="error rate among answered"))
    save_figure(fig, out, "risk_coverage")

    chosen = [a for a in results["abstention"] if a["signal"] == results["abstention_signal"]]
    if not chosen:  # no α the calibration split could support (results' abstention_unavailable says why)
        return
    fig = go.Figure()
    alphas = [a["alpha"] for a in chosen]
    for rule, key, label in (("crc", "joint_risk", "CRC: answered and false"),
                             ("ltt", "selective_risk", "LTT: false among answered")):
        ys = [a[rule][key] for a in chosen]
        bands = [a[rule][f"{key}_ci95"] for a in chosen]
        fig.add_scatter(x=alphas, y=ys, mode="lines+markers", name=label, error_y=dict(
            type="data", array=[(b[1] - y) if b and y is not None else 0 for b, y in zip(bands, ys)],
            arrayminus=[(y - b[0]) if b and y is not None else 0 for b, y in zip(bands, ys)]))
        fig.add_scatter(x=alphas, y=[a[rule]["coverage"] for a in chosen], mode="lines+markers", yaxis="y2",
                        name=f"{rule.upper()} coverage", line=dict(dash="dot"))
    fig.add_scatter(x=[0, max(alphas)], y=[0, max(alphas)], mode="lines", name="α", line=dict(dash="dash",
                                                                                              color="gray"))
    fig.update_layout(title=f"Abstention on {results['abstention_signal']}: thresholds from the calibration split, "
                            "rates on the test split", xaxis=dict(title="α"), yaxis=dict(title="error rate"),
                      yaxis2=dict(title="coverage", overlaying="y", side="right", range=[0, 1]))
    save_figure(fig, out, "abstention")
