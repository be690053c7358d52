"""The experiment's figures: g(H) against the monofact rate, both sides of the bound, training, upweighting and
the per-bin calibration at the held-out optimum."""

from pathlib import Path
from typing import Any

from experiments.hallucination.config import DELTAS, Config, delta_key
from experiments.hallucination.training import SweepRun
from lab.runs import save_figure


# --------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------
def _monofact_figure(sweep: list[dict[str, Any]], cfg: Config) -> Any:
    """g(H) against the monofact rate, one line per checkpoint."""
    import plotly.graph_objects as go

    fig = go.Figure()
    order = sorted(range(len(sweep)), key=lambda i: sweep[i]["monofact_rate"])
    labels = [f"epoch {e}" for e in cfg.epochs] + ["optimum"]
    for label in labels:
        xs = [sweep[i]["monofact_rate"] for i in order]
        ys = [next(c["hallucination_rate"] for c in sweep[i]["checkpoints"] if c["checkpoint"] == label) for i in order]
        fig.add_trace(
            go.Scatter(x=xs, y=ys, mode="lines+markers", name=label, text=[f"γ = {sweep[i]['gamma']}" for i in order])
        )
    fig.update_layout(
        title="Hallucination rate g(H) against the monofact rate (exact enumeration)",
        xaxis_title="monofact rate MF (measured)",
        yaxis_title="g(H)",
    )
    return fig


def _bound_figure(sweep: list[dict[str, Any]]) -> Any:
    """Both sides of the bound at every checkpoint: points above the diagonal satisfy it."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for delta in DELTAS:
        xs, ys, texts = [], [], []
        for s in sweep:
            for c in s["checkpoints"]:
                xs.append(c[f"bound_rhs_delta_{delta_key(delta)}"])
                ys.append(c["hallucination_rate"])
                texts.append(f"γ = {s['gamma']}, {c['checkpoint']}")
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name=f"δ = {delta}", text=texts))
    lo = min(min(t.x) for t in fig.data)
    fig.add_trace(
        go.Scatter(x=[lo, 1], y=[lo, 1], mode="lines", name="g(H) = right side", line=dict(dash="dash", color="gray"))
    )
    fig.update_layout(
        title="Kalai–Vempala bound: g(H) against MF − Mis − 3e^(−s)/δ − √(6 ln(6/δ)/n)",
        xaxis_title="right side",
        yaxis_title="g(H) (left side)",
    )
    return fig


def _training_figure(sweep: list[dict[str, Any]], runs: list[SweepRun]) -> Any:
    """Training: held-out NLL per epoch, and g(H), recall and miscalibration at each checkpoint."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=3, subplot_titles=("held-out NLL (nats/document)", "g(H)", "Mis (ε bins)"))
    for run, s in zip(runs, sweep):
        name = f"γ = {s['gamma']} (MF {s['monofact_rate']:.3f})"
        fig.add_trace(
            go.Scatter(
                x=[h["epoch"] for h in run.heldout],
                y=[h["heldout_nll"] for h in run.heldout],
                name=name,
                legendgroup=name,
            ),
            row=1,
            col=1,
        )
        points = [c for c in s["checkpoints"] if c["checkpoint"] != "optimum"]
        for col, key in ((2, "hallucination_rate"), (3, "miscalibration_tv_eps")):
            fig.add_trace(
                go.Scatter(
                    x=[c["epoch"] for c in points],
                    y=[c[key] for c in points],
                    name=name,
                    legendgroup=name,
                    showlegend=False,
                ),
                row=1,
                col=col,
            )
    fig.update_xaxes(type="log", title_text="epoch")
    fig.update_layout(title="Training at each γ: held-out NLL by epoch, and g(H) and Mis at each checkpoint")
    return fig


def _upweighting_figure(upweighting: list[dict[str, Any]], cfg: Config) -> Any:
    """Each upweighting condition's g(H) (± 1 SE), miscalibration and recall on seen facts."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=3, subplot_titles=("g(H)", "Mis (ε bins)", "recall on seen facts"))
    names = [u["condition"] for u in upweighting]
    for col, key in ((1, "hallucination_rate"), (2, "miscalibration_tv_eps"), (3, "recall_seen")):
        errors = {"type": "data", "array": [u["hallucination_rate_se"] for u in upweighting]} if col == 1 else None
        fig.add_trace(
            go.Bar(x=names, y=[u[key] for u in upweighting], error_y=errors, showlegend=False), row=1, col=col
        )
    fig.update_layout(
        title=f"Selective upweighting at γ = {cfg.upweight_gamma}, matched compute: mean of "
        f"{cfg.upweight_draws} draws of each condition, the control's too (g(H) ± 1 SE)"
    )
    return fig


def _calibration_bins_figure(sweep: list[dict[str, Any]], runs: list[SweepRun]) -> Any:
    """Calibration per ε-bin at the held-out optimum of each γ."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for run, s in zip(runs, sweep):
        rows = [b for b in run.bins if b["checkpoint"] == "optimum" and b["scheme"] == "eps"]
        fig.add_trace(
            go.Scatter(
                x=[b["g_mass"] for b in rows],
                y=[b["p_mass"] for b in rows],
                mode="markers",
                name=f"γ = {s['gamma']}",
                text=[f"bin {b['bin']}, |B| = {b['n_factoids']}" for b in rows],
            )
        )
    fig.add_trace(
        go.Scatter(x=[1e-6, 1], y=[1e-6, 1], mode="lines", name="p(B) = g(B)", line=dict(dash="dash", color="gray"))
    )
    fig.update_layout(
        title="Per ε-bin mass at the held-out optimum: p(B) against g(B)",
        xaxis=dict(type="log", title="g(B)"),
        yaxis=dict(type="log", title="p(B)"),
    )
    return fig


def write_figures(
    out: Path, sweep: list[dict[str, Any]], runs: list[SweepRun], upweighting: list[dict[str, Any]], cfg: Config
) -> None:
    save_figure(_monofact_figure(sweep, cfg), out, "hallucination_vs_monofact")
    save_figure(_bound_figure(sweep), out, "bound")
    save_figure(_training_figure(sweep, runs), out, "training")
    if upweighting:
        save_figure(_upweighting_figure(upweighting, cfg), out, "upweighting")
    save_figure(_calibration_bins_figure(sweep, runs), out, "calibration_bins")
