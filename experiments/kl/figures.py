"""The kl experiment's figures, drawn from results.json's dict: the decomposition over training (Markov and
hidden-Markov sources), the ground-truth lens, KL by position, KL against temperature and the scaling fit."""

from pathlib import Path
from typing import Any

import numpy as np

from experiments.kl.config import FIGURES
from lab.runs import save_figure


def _cross_entropy_traces(tokens: list[int], rows: list[dict[str, Any]]) -> list[Any]:
    """The left panel: CE and H exact over training, and CE sampled."""
    import plotly.graph_objects as go

    traces = [
        go.Scatter(x=tokens, y=[r[key] for r in rows], name=name, mode="lines+markers", line={"dash": dash})
        for key, name, dash in (("cross_entropy_nats", "CE exact", None), ("entropy_nats", "H exact", "dot"))
    ]
    sampled = go.Scatter(
        x=tokens,
        y=[r["sampled_cross_entropy_nats"] for r in rows],
        name="CE sampled",
        mode="markers",
        marker={"symbol": "x"},
    )
    return [*traces, sampled]


def _kl_traces(tokens: list[int], rows: list[dict[str, Any]]) -> list[Any]:
    """The right panel: KL exact over training, and KL sampled with its 95% interval."""
    import plotly.graph_objects as go

    return [
        go.Scatter(x=tokens, y=[r["kl_nats"] for r in rows], name="KL exact", mode="lines+markers"),
        go.Scatter(
            x=tokens,
            y=[r["sampled_kl_nats"] for r in rows],
            name="KL sampled ± 1.96 SE",
            mode="markers",
            marker={"symbol": "x"},
            error_y={"type": "data", "array": [1.96 * r["sampled_kl_se"] for r in rows]},
        ),
    ]


def decomposition_figure(checkpoints: list[dict[str, Any]], region: str, title: str, rate: float | None = None) -> Any:
    """CE, H and KL over training, exact and sampled, averaged over one region's prefixes; the entropy rate
    as a line where it is E[H_t] of that region (complete contexts)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rows = [r[region] for r in checkpoints]
    tokens = [r["tokens_seen"] for r in checkpoints]
    figure = make_subplots(rows=1, cols=2, subplot_titles=("CE = H + KL (nats/token)", "KL(p ‖ P_θ) (nats/token)"))
    for trace in _cross_entropy_traces(tokens, rows):
        figure.add_trace(trace, row=1, col=1)
    for trace in _kl_traces(tokens, rows):
        figure.add_trace(trace, row=1, col=2)
    if rate is not None:  # a line named in the legend: a label on the plot would sit on the H curve it meets
        figure.add_trace(
            go.Scatter(
                x=[min(tokens), max(tokens)],
                y=[rate, rate],
                name=f"entropy rate {rate:.4f}",
                mode="lines",
                line={"dash": "dash", "color": "gray"},
            ),
            row=1,
            col=1,
        )
    figure.update_xaxes(type="log", title_text="tokens seen")
    figure.update_yaxes(type="log", row=1, col=2)
    figure.update_layout(title=title)
    return figure


def _lens_figure(lens: list[dict[str, Any]]) -> Any:
    """The ground-truth lens: KL to p of each layer's logit-lens distribution."""
    import plotly.graph_objects as go

    # where the lens reads, in words: each layer's input, then the model's output (after the last layer)
    where = [f"layer {r['layer']}'s input" for r in lens[:-1]] + ["the model's output"]
    figure = go.Figure(go.Scatter(x=where, y=[r["kl_nats"] for r in lens], mode="lines+markers", name="KL(p ‖ P^(l))"))
    figure.update_layout(
        title="Ground-truth lens: KL of each layer's logit-lens distribution to p (complete contexts)",
        xaxis_title="where the lens reads the residual stream",
        yaxis_title="KL (nats/token)",
        yaxis_type="log",
    )
    return figure


def _position_figure(position: list[dict[str, Any]]) -> Any:
    """KL and entropy by prefix length, on two axes."""
    import plotly.graph_objects as go

    lengths = [r["prefix_length"] for r in position]
    figure = go.Figure(
        [
            go.Scatter(x=lengths, y=[r["kl_nats"] for r in position], name="KL_t (left axis)"),
            go.Scatter(
                x=lengths,
                y=[r["entropy_nats"] for r in position],
                name="H_t (right axis)",
                yaxis="y2",
                line={"dash": "dot"},
            ),
        ]
    )
    figure.update_layout(
        title="KL and entropy by prefix length (final checkpoint)",
        xaxis_title="prefix length",
        yaxis={"title": "KL (nats/token)"},
        yaxis2={"title": "H (nats/token)", "overlaying": "y", "side": "right"},
    )
    return figure


def _temperature_figure(temperature: list[dict[str, Any]], best: dict[str, Any]) -> Any:
    """KL to the truth against sampling temperature, its minimum starred."""
    import plotly.graph_objects as go

    figure = go.Figure(
        [
            go.Scatter(
                x=[r["T"] for r in temperature],
                y=[r["kl_nats"] for r in temperature],
                mode="lines+markers",
                name="KL(p ‖ P_θ,T)",
            ),
            go.Scatter(
                x=[best["T"]],
                y=[best["kl_nats"]],
                mode="markers",
                marker={"size": 12, "symbol": "star"},
                name=f"minimum: T = {best['T']:.3f}, KL = {best['kl_nats']:.4f}",
            ),
        ]
    )
    figure.update_layout(
        title="KL to the truth against sampling temperature (complete contexts)",
        xaxis_type="log",
        xaxis_title="T",
        yaxis_title="KL (nats/token)",
    )
    return figure


def _scaling_figure(scaling: dict[str, Any]) -> Any:
    """Loss against parameters: the points, the fitted E + A·N^(−α) with E's interval, and the two entropies."""
    import plotly.graph_objects as go

    n = [p["n_params"] for p in scaling["points"]]
    curve_n = np.geomspace(min(n) / 2, max(n) * 4, 100)
    low, high = scaling["E_ci95"]
    figure = go.Figure(
        [
            go.Scatter(x=n, y=[p["loss_nats"] for p in scaling["points"]], mode="markers", name="held-out CE (exact)"),
            go.Scatter(
                x=curve_n,
                y=scaling["E_nats"] + scaling["A"] * curve_n ** (-scaling["alpha"]),
                line={"color": "crimson"},
                name=(f"E + A·N^(−α): E = {scaling['E_nats']:.4f} [{low:.4f}, {high:.4f}], α = {scaling['alpha']:.3f}"),
            ),
        ]
    )
    span = [float(curve_n[0]), float(curve_n[-1])]
    figure.add_scatter(
        x=[span[0], span[1], span[1], span[0]],
        y=[low, low, high, high],
        fill="toself",
        mode="lines",
        line={"width": 0, "color": "rgba(0,0,255,0.15)"},
        fillcolor="rgba(0,0,255,0.15)",
        hoverinfo="skip",
        name="95% interval of E",
    )
    # The two entropies lie close together: named in the legend, where their labels cannot overlap.
    for key, label, dash in (
        ("true_entropy_nats", "true entropy rate", "dot"),
        ("heldout_entropy_nats", "held-out entropy", "dash"),
    ):
        figure.add_scatter(
            x=span,
            y=[scaling[key]] * 2,
            mode="lines",
            name=f"{label} {scaling[key]:.4f}",
            line={"dash": dash, "color": "gray"},
        )
    figure.update_layout(
        title=f"Loss against parameters at {scaling['tokens']:,} tokens",
        xaxis_type="log",
        xaxis_title="parameters N",
        yaxis_title="nats/token",
    )
    return figure


def write_figures(out: Path, results: dict[str, Any]) -> list[str]:
    rate = results["source"]["entropy_rate_nats"]
    order = results["source"]["order"]
    hmm_rate = results["hmm_source"]["entropy_rate_estimate_nats"]
    figures = {
        "kl_decomposition": decomposition_figure(
            results["checkpoints"],
            "complete",
            f"Markov source, complete contexts (prefix length ≥ {order}): exact and sampled, over training",
            rate,
        ),
        "lens": _lens_figure(results["lens"]),
        "kl_by_position": _position_figure(results["kl_by_position"]),
        "temperature": _temperature_figure(results["temperature"], results["temperature_min"]),
        "scaling": _scaling_figure(results["scaling"]),
        "hmm": decomposition_figure(
            results["hmm"],
            "all",
            f"Hidden-Markov source, every position (its entropy rate ≈ {hmm_rate:.3f} nats is a "
            f"limit the short prefixes do not reach): exact and sampled",
        ),
    }
    for name in FIGURES:
        save_figure(figures[name], out, name)
    return list(FIGURES)
