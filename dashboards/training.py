"""Training curves of the zoo's models, read from models/<name>/train/metrics.jsonl (lab.train's reader)."""

from pathlib import Path

import plotly.graph_objects as go
import streamlit as st

from dashboards.charts import draw
from dashboards.display import made_at, plain, show_progress, zoo_dir
from lab.folders import zoo_entry, zoo_names
from lab.train.checkpoint import METRICS_FILE, read_metrics

st.title("Training curves")
for model_name in zoo_names():
    show_progress("model", model_name)
available = [n for n in zoo_names() if (zoo_dir() / n / "train" / METRICS_FILE).is_file()]
if not available:
    st.info("No trained zoo model yet. Train one with `forma build pydoc` (or `make demo`).")
    st.stop()
name = st.selectbox("Model", available, key="curve_model")
try:
    records = [
        r for r in read_metrics(zoo_dir() / name / "train" / METRICS_FILE) if isinstance(r, dict) and "step" in r
    ]
except (OSError, UnicodeDecodeError, ValueError) as err:
    st.warning(f"{err}; retrain with `forma build {name}`.")
    st.stop()
if not records:
    st.warning(f"models/{name}/train/{METRICS_FILE} holds no readable records; retrain with `forma build {name}`.")
    st.stop()
card = zoo_entry(name).card or {}
if card:  # which model the curves are of: its recipe's profile, its size, when it was trained
    provenance = card.get("provenance") if isinstance(card.get("provenance"), dict) else {}
    made = made_at(Path(str(provenance["started_utc"]))) if provenance.get("started_utc") else "(time not recorded)"
    st.caption(
        f"{plain(name)}: the {'quick' if card.get('quick') else 'full'} recipe, {plain(card.get('steps', '?'))} "
        f"steps, trained {plain(made)}; its recipe models/{plain(name)}/model.toml, its numbers "
        f"models/{plain(name)}/card.json"
        + (f" (a quick model: `forma build {name}` builds the full one)." if card.get("quick") else ".")
    )
fig = go.Figure()
fig.add_scatter(
    x=[r["step"] for r in records], y=[r.get("train_loss_nats") for r in records], name="train", mode="lines"
)
val = [r for r in records if r.get("val_loss_nats") is not None]
fig.add_scatter(x=[r["step"] for r in val], y=[r["val_loss_nats"] for r in val], name="held-out", mode="lines+markers")
floors = [
    (key, label, dash)
    for key, label, dash in (
        ("entropy_rate_nats", "entropy rate H(p)", "dash"),
        ("val_entropy_nats", "mean H(p), held-out prefixes", "dot"),
    )
    if isinstance(card.get(key), (int, float))
]  # a world whose law is known (lab.zoo's card measures it)
for key, label, dash in floors:
    steps = [r["step"] for r in records]
    fig.add_scatter(
        x=[min(steps), max(steps)],
        y=[card[key]] * 2,
        name=f"{label} {card[key]:.3f}",
        mode="lines",
        line={"dash": dash, "color": "gray"},
    )
fig.update_layout(title=f"{name}: cross-entropy (nats/token)", xaxis_title="step", yaxis_title="nats")
draw(fig, "curves")
if floors:
    st.caption(
        "The entropy rate is the least loss any model reaches over complete contexts; the mean H(p) over the "
        f"held-out prefixes, the first positions included, is the least held-out loss (models/{name}/card.json)."
    )
