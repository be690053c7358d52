"""The experiment's figures: universal approximation and softmax saturation."""

import math
from pathlib import Path
from typing import Any

from experiments.equations.attention import VANISHED, softmax_saturation
from experiments.equations.networks import target_function
from lab.runs import save_figure


# ============================================================================================
# Figures and the run
# ============================================================================================
def _universal_approximation(ua: dict[str, Any]) -> Any:
    """The sup error against width, and the target with a few widths' fits."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    figure = make_subplots(rows=1, cols=2, subplot_titles=("sup error against width", "fits"))
    figure.add_trace(
        go.Scatter(x=ua["widths"], y=ua["sup_errors"], mode="lines+markers", name="sup |f − f_N|"), row=1, col=1
    )
    every = 4  # 1001 of the 4001 test points are plenty for the eye
    x = ua["x"][::every].tolist()
    figure.add_trace(
        go.Scatter(
            x=x,
            y=target_function(ua["x"][::every]).tolist(),
            line={"color": "black", "width": 3},
            name="f(x) = sin 2πx + 0.3 cos 5πx",
        ),
        row=1,
        col=2,
    )
    for width, fit in zip(ua["widths"], ua["fits"]):
        if width in (1, 4, 16, 64):
            figure.add_trace(
                go.Scatter(x=x, y=fit[::every].tolist(), name=f"N = {width}", line={"dash": "dot"}), row=1, col=2
            )
    figure.update_xaxes(type="log", title_text="neurons N", row=1, col=1)
    figure.update_yaxes(type="log", title_text="sup error", row=1, col=1)
    figure.update_layout(title="Universal approximation: one hidden layer of sigmoids (Cybenko 1989)")
    return figure


def _softmax_saturation(seed: int) -> Any:
    """The last query's attention entropy and the share of vanished softmax gradients against d_k, with and without
    the 1/√d_k scale."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    d_ks = (8, 16, 32, 64, 128, 256)
    sweep = [softmax_saturation(None, d_k, 64, 128, seed) for d_k in d_ks]
    figure = make_subplots(
        rows=2,
        cols=1,
        vertical_spacing=0.18,
        subplot_titles=(  # stacked: titles never collide
            "entropy of the last query's pattern (nats)",
            f"share of queries with ‖∂softmax/∂s‖_F < {VANISHED}",
        ),
    )
    for key, name in (("scaled", "softmax(q·k/√d_k): Forma's Attention"), ("unscaled", "softmax(q·k)")):
        figure.add_trace(
            go.Scatter(
                x=list(d_ks), y=[s[f"entropy_{key}"] for s in sweep], name=name, mode="lines+markers", legendgroup=key
            ),
            row=1,
            col=1,
        )
        figure.add_trace(
            go.Scatter(
                x=list(d_ks),
                y=[s[f"vanished_{key}"] for s in sweep],
                name=name,
                mode="lines+markers",
                legendgroup=key,
                showlegend=False,
            ),
            row=2,
            col=1,
        )
    figure.add_hline(y=math.log(64), line_dash="dash", annotation_text="log 64 (uniform)", row=1, col=1)
    figure.update_xaxes(type="log", title_text="d_k")
    figure.update_layout(
        title="Without 1/√d_k the softmax saturates as d_k grows (last query over 64 keys, 128 sequences each)",
        height=720,
    )
    return figure


def write_figures(out: Path, ua: dict[str, Any], seed: int) -> list[str]:
    save_figure(_universal_approximation(ua), out, "universal_approximation")
    save_figure(_softmax_saturation(seed), out, "softmax_saturation")
    return ["universal_approximation.html", "softmax_saturation.html"]
