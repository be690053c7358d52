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
def write_figures(
    out: Path, sweep: list[dict[str, Any]], runs: list[SweepRun], upweighting: list[dict[str, Any]], cfg: Config
) -> None:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    # g(H) against the monofact rate, one line per checkpoint.
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
    save_figure(fig, out, "hallucination_vs_monofact")

    # Both sides of the bound at every checkpoint: points above the diagonal satisfy it.
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
    save_figure(fig, out, "bound")

    # Training: held-out NLL per epoch, and g(H), recall and miscalibration at each checkpoint.
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
    save_figure(fig, out, "training")

    if upweighting:
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
        save_figure(fig, out, "upweighting")

    # Calibration per ε-bin at the held-out optimum of each γ.
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
    save_figure(fig, out, "calibration_bins")
