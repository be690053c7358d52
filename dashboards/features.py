"""A transcoder feature's page: one feature of one layer of a zoo model's transcoder set, over windows the set never
trained on (the model's world's held-out windows; a pretrained model's held-out corpus documents), as
lab.analysis.transcoders.features.feature_card measures it — its activation histogram, its top and quantile-binned
contexts with its token in bold, the tokens its decoder promotes and suppresses, and the features of other layers it
reads from and writes to. Reached from the sidebar, or from the attribution-graph page's feature (its query
parameters name the model, the set, the layer and the feature)."""

from pathlib import Path

import plotly.graph_objects as go
import streamlit as st

from dashboards.charts import draw
from dashboards.display import (
    load_trained_model,
    model_version,
    open_transcoders,
    plain,
    show_table,
    transcoder_sets_or_stop,
    transcoders_version,
)
from dashboards.explorer_tabs import token_text
from lab.analysis.transcoders.features import Context, FeatureCard, feature_card
from lab.data.tokenizers import readable_text
from lab.folders import PRETRAINED, recipe_kind, zoo_dir
from lab.zoo.transcoders import TRANSCODERS_DIR, model_windows

WINDOW = 64  # tokens per held-out window (at most the model's context)
READ_ERRORS = (ValueError, OSError, KeyError, TypeError, AttributeError, IndexError)


@st.cache_resource(show_spinner="Measuring the feature over the held-out windows…", max_entries=16)
def card_of(
    name: str, kind: str, layer: int, feature: int, n_windows: int, corpus: str | None, version: tuple = ()
) -> tuple[FeatureCard, list[list[int]]]:
    """The feature's card over n_windows held-out windows (`model_windows(..., split="val")`, seed 0), and the
    windows' tokens (the contexts' rows point into them)."""
    model = load_trained_model(name, model_version(name))
    path = zoo_dir() / name / TRANSCODERS_DIR / kind
    transcoders = open_transcoders(str(path), name, transcoders_version(str(path), name))
    length = min(WINDOW, int(model.cfg.n_ctx))
    windows = model_windows(zoo_dir() / name, n_windows, length, split="val", corpus=corpus)
    return feature_card(model, transcoders, layer, feature, windows), windows.tolist()


def decode(model, ids: list[int]) -> str:
    """Tokens as text, never '�' (a cut through a character: its bytes); a model without a tokenizer: its ids."""
    return readable_text(model.tokenizer, ids) if getattr(model, "tokenizer", None) else " ".join(map(str, ids))


def context_line(model, c: Context) -> str:
    """A context as one line of Markdown: its activation, the tokens before, the feature's token in bold, after."""
    at = c.pos - c.start
    before, token, after = c.tokens[:at], c.tokens[at : at + 1], c.tokens[at + 1 :]
    return (
        f"{c.activation:.3f} · window {c.window}, position {c.pos}: {plain(decode(model, before))} "
        f"**{plain(decode(model, token)) or ' '}** {plain(decode(model, after))}"
    )


def histogram(card: FeatureCard) -> go.Figure:
    centres = [(a + b) / 2 for a, b in zip(card.edges, card.edges[1:])]
    fig = go.Figure(go.Bar(x=centres, y=card.counts, name="positions", marker={"color": "#4c78a8"}))
    fig.update_layout(
        title="Its activation at every held-out position (zero where it does not fire)",
        xaxis={"title": "activation"},
        yaxis={"title": "positions", "type": "log"},
        bargap=0.05,
        showlegend=False,
    )
    return fig


def show_contexts(model, card: FeatureCard) -> None:
    st.subheader("Top activating contexts")
    if not card.top:
        st.info("It never fires on these windows.")
        return
    st.markdown("\n".join(f"- {context_line(model, c)}" for c in card.top))
    st.subheader("Contexts by quantile of its nonzero activations")
    st.caption("A few positions drawn (with seed 0) from each bin, from the weakest bin to the strongest.")
    for b in card.quantiles:
        st.markdown(f"**From {b.low:.3f} to {b.high:.3f}** ({b.count} positions)")
        st.markdown("\n".join(f"- {context_line(model, c)}" for c in b.contexts))


def show_logits(model, card: FeatureCard) -> None:
    st.subheader("Tokens its decoder promotes and suppresses")
    st.caption("Its decoder direction through the final norm's gain and the unembedding, less the mean over tokens.")
    left, right = st.columns(2)
    for column, rows, title in ((left, card.promoted, "Promotes"), (right, card.suppressed, "Suppresses")):
        with column:
            st.markdown(f"**{title}**")
            show_table([{"token": token_text(model, t), "logit": round(v, 3)} for t, v in rows])


def show_connections(card: FeatureCard, layers: list[int]) -> None:
    st.subheader("Features it reads from and writes to")
    st.caption(
        "Virtual weights: a decoder row of one feature dotted with the encoder column of another, the direct path "
        "through the residual stream (attention and the norm's scale left aside), largest in magnitude first."
    )
    left, right = st.columns(2)
    for column, rows, title in (
        (left, card.reads_from, "Reads from (earlier layers)"),
        (right, card.writes_to, "Writes to (later layers)"),
    ):
        with column:
            st.markdown(f"**{title}**")
            if not rows:
                st.caption("None: no layer of the set lies that way.")
            labels = {"layer": "layer", "feature": "feature", "weight": "virtual weight"}
            table = [{"layer": layers[c.layer], "feature": c.feature, "weight": round(c.weight, 4)} for c in rows]
            show_table(table, labels)


def chosen(options: list[str], key: str, param: str) -> int:
    """The index of the option the page's query parameter `param` names (from the graph page's link), else 0."""
    wanted = st.query_params.get(param)
    return options.index(wanted) if wanted in options and key not in st.session_state else 0


def number(param: str, default: int) -> int:
    try:
        return int(st.query_params.get(param, default))
    except ValueError:
        return default


st.title("Transcoder features")
available = transcoder_sets_or_stop()
names = sorted({name for name, _ in available})
name = st.sidebar.selectbox("Model", names, index=chosen(names, "feature_model", "model"), key="feature_model")
kinds = [k for n, k in available if n == name]
kind = st.sidebar.selectbox("Transcoders", kinds, index=chosen(kinds, "feature_set", "set"), key="feature_set")
path = zoo_dir() / name / TRANSCODERS_DIR / kind
try:
    transcoders = open_transcoders(str(path), name, transcoders_version(str(path), name))
except ValueError as err:
    st.warning(plain(str(err)))
    st.stop()
layers = transcoders.cfg.model_layers()
layer_options = [f"layer {layer}" for layer in layers]
start_layer = number("layer", layers[0])
layer_label = st.sidebar.selectbox(
    "Layer", layer_options, index=layers.index(start_layer) if start_layer in layers else 0, key="feature_layer"
)
layer = layer_options.index(layer_label)
last = transcoders.cfg.d_features - 1
feature = st.sidebar.number_input("Feature", 0, last, max(0, min(number("feature", 0), last)), key="feature_index")
n_windows = st.sidebar.slider("Held-out windows", 8, 256, 64, 8, key="feature_windows")
corpus = None
if recipe_kind(zoo_dir() / name) == PRETRAINED:
    corpus = st.sidebar.text_input("Corpus folder (from forma corpus real)", "corpus/real", key="feature_corpus")
    if not Path(corpus).is_dir():
        st.info(
            "A pretrained model's features are read on the real corpus's held-out documents: no folder "
            f"{plain(corpus)}. Write one with `forma corpus real --out corpus/real`, or name yours in the sidebar."
        )
        st.stop()
model = load_trained_model(name, model_version(name))
try:
    card, windows = card_of(name, kind, layer, int(feature), n_windows, corpus, model_version(str(path)))
except READ_ERRORS as err:
    st.warning(plain(f"No held-out windows for this feature: {err}"))
    st.stop()
st.header(f"Feature {card.feature} of layer {layers[card.layer]}")
source = "held-out documents of the corpus" if corpus else "held-out windows of the model's world"
st.caption(f"Over {card.positions} positions ({len(windows)} {source}): it fires at {card.firing_share:.2%} of them.")
draw(histogram(card), key="feature_histogram")
show_contexts(model, card)
show_logits(model, card)
show_connections(card, layers)
