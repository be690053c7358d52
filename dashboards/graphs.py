"""Attribution graphs: a prompt's graph over a zoo model's transcoder features (lab.analysis.graphs), pruned by
influence, drawn as layers × positions — token embeddings at the bottom, features and error nodes (marked ✕) by
layer, the most probable next tokens on top, edges by weight (blue promotes, red suppresses). Click a feature for
its top activating contexts from the transcoders' harvest and the tokens it promotes; group nodes into supernodes
(saved with the graph); export the graph in circuit-tracer's JSON for its viewer and Neuronpedia.
"""

import json

import plotly.graph_objects as go
import streamlit as st
import torch

from dashboards.charts import readable
from dashboards.display import (
    code,
    feature_page,
    load_trained_model,
    model_version,
    open_transcoders,
    plain,
    show_table,
    transcoder_sets_or_stop,
    transcoders_version,
)
from dashboards.explorer_tabs import to_ids, token_text
from lab.analysis.graphs.attribute import attribute
from lab.analysis.graphs.graph import Graph, graph_folder, to_circuit_tracer
from lab.analysis.graphs.influence import graph_scores, prune
from lab.analysis.graphs.qk import qk_attribution
from lab.analysis.transcoders.measures import feature_logits
from lab.analysis.transcoders.model import Transcoders
from lab.data.tokenizers import readable_text
from lab.figure_text import as_text
from lab.folders import zoo_dir
from lab.zoo.transcoders import TRANSCODERS_DIR, load_contexts, load_quality

DEFAULT_PROMPTS = {
    "pydoc": "Return the number of items in the",
    "markov": "1 2 3 4 5 6 7 8",
    "smollm2": "The capital of Italy is",
}
# Widgets whose values belong to one model (its prompt: words, or token ids for a model without a tokenizer; its
# layers, heads, positions and nodes): they start again from the new model's defaults when the model changes.
MODEL_WIDGETS = ("graph_kind", "graph_prompt", "qk_layer", "qk_head", "qk_query", "qk_key", "supernode_nodes")
COLORS = {"feature": "#4c78a8", "error": "#e45756", "token": "#54a24b", "logit": "#b279a2"}


@st.cache_resource(show_spinner="Computing the attribution graph…", max_entries=8)
def graph_of(name: str, kind: str, prompt: str, version: tuple = ()) -> Graph:
    """The saved graph of this prompt, or a new one, saved (so its supernodes have a home) where there is none. A
    saved graph that cannot be read is a ValueError, and left as it is: its supernodes are a person's work."""
    model = load_trained_model(name, model_version(name))
    path = zoo_dir() / name / TRANSCODERS_DIR / kind
    tokens = to_ids(model, prompt)[0]  # a model without a tokenizer reads space-separated ids
    folder = graph_folder(path, tokens)
    try:
        return Graph.load(folder)
    except FileNotFoundError:
        pass
    except ValueError as err:
        raise ValueError(f"the saved graph in {folder} cannot be read, and is left as it is: {err}") from err
    transcoders = open_transcoders(str(path), name, transcoders_version(str(path), name))
    graph = attribute(model, transcoders, tokens)
    graph.save(folder)
    return graph


def figure(graph: Graph, keep: torch.Tensor, edges: torch.Tensor, labels: list[str], logits: list[str]) -> go.Figure:
    """Nodes in rows by layer, each position a column as wide as its fullest cell needs (`_placement`: the last
    position, where most features and every logit sit, gets room); the output tokens spread along the top row and
    named there; the kept edges as lines in three widths by weight; `labels` name the prompt's tokens."""
    kept = torch.nonzero(keep).flatten().tolist()
    records = [graph.node(i) for i in kept]
    where, centres = _placement(kept, records, graph.n_pos)
    fig = go.Figure(_edge_traces(graph, keep, edges, where))
    for kind, symbol in (("token", "square"), ("feature", "circle"), ("error", "x"), ("logit", "diamond")):
        mine = [i for i, r in zip(kept, records) if r["kind"] == kind]
        if not mine:
            continue
        text = [describe(graph.node(i), labels, logits, graph) for i in mine]
        named = kind == "logit"  # the output tokens are read off the chart, the rest on hover
        fig.add_trace(
            go.Scatter(
                x=[where[i][0] for i in mine],
                y=[where[i][1] for i in mine],
                mode="markers+text" if named else "markers",
                text=[_short(logits[_logit_index(graph, i)]) for i in mine] if named else None,
                textposition="top center",
                name=kind,
                marker={"symbol": symbol, "size": 11, "color": COLORS[kind]},
                customdata=mine,
                hovertext=text,
                hoverinfo="text",
            )
        )
    fig.update_layout(
        height=560,
        margin={"l": 10, "r": 10, "t": 30, "b": 10},
        clickmode="event+select",
        xaxis={"tickvals": centres, "ticktext": [_short(label) for label in labels], "title": "position"},
        yaxis={
            "tickvals": list(range(-1, graph.n_layers + 1)),
            "ticktext": ["tokens", *[f"layer {layer}" for layer in range(graph.n_layers)], "logits"],
            "range": [-1.5, graph.n_layers + 1.6],  # room above the logits for their names
        },
    )
    return fig


NODES_PER_COLUMN = 4  # nodes that share one column's width before the column widens
SHORT_LABEL = 10  # characters of a token's name drawn on the chart (all of it on hover)


def _short(label: str) -> str:
    return label if len(label) <= SHORT_LABEL else label[: SHORT_LABEL - 1] + "…"


def _logit_index(graph: Graph, i: int) -> int:
    return i - (graph.n_nodes - graph.n_logits)


def _placement(kept: list[int], records: list[dict], n_pos: int) -> tuple[dict[int, tuple[float, int]], list[float]]:
    """Each kept node's (x, y) and each position's centre. A position's column is one unit wide, or wider where a
    (position, layer) cell holds more than NODES_PER_COLUMN nodes, which spread evenly across it; the logits, a
    row of their own, spread across the whole width."""
    cells: dict[tuple[int, int], list[int]] = {}
    logit_nodes = []
    for i, r in zip(kept, records):
        if r["kind"] == "logit":
            logit_nodes.append(i)
        else:
            cells.setdefault((r["pos"], r["layer"]), []).append(i)
    widths = [1.0] * n_pos
    for (pos, _), members in cells.items():
        widths[pos] = max(widths[pos], len(members) / NODES_PER_COLUMN)
    starts = [sum(widths[:pos]) for pos in range(n_pos)]
    where = {}
    for (pos, layer), members in cells.items():
        for j, i in enumerate(members):
            where[i] = (starts[pos] + widths[pos] * (j + 0.5) / len(members) - 0.5, layer)
    total = sum(widths)
    for j, i in enumerate(logit_nodes):
        where[i] = (total * (j + 0.5) / len(logit_nodes) - 0.5, records[kept.index(i)]["layer"])
    return where, [start + width / 2 - 0.5 for start, width in zip(starts, widths)]


def _edge_traces(graph: Graph, keep: torch.Tensor, edges: torch.Tensor, where: dict) -> list[go.Scatter]:
    """The kept edges between kept nodes as lines, one trace per sign (blue +, red −) and weight band (below the
    median |weight|, to the 90th percentile, above), wider and darker by band."""
    targets, sources = torch.nonzero(edges & keep[:, None] & keep[None, :], as_tuple=True)
    weights = graph.adjacency[targets, sources]
    if not len(weights):
        return []
    traces = []
    cut = weights.abs().quantile(torch.tensor([0.5, 0.9])).tolist()
    for sign, color in ((1, "rgba(76,120,168,{a})"), (-1, "rgba(228,87,86,{a})")):
        for band, (lo, hi, width) in enumerate(((0, cut[0], 0.6), (cut[0], cut[1], 1.5), (cut[1], 1e30, 3))):
            xs, ys = [], []
            for t, s, w in zip(targets.tolist(), sources.tolist(), weights.tolist()):
                if (w > 0) == (sign > 0) and lo <= abs(w) < hi:
                    xs += [where[s][0], where[t][0], None]
                    ys += [where[s][1], where[t][1], None]
            if xs:
                traces.append(
                    go.Scatter(
                        x=xs,
                        y=ys,
                        mode="lines",
                        hoverinfo="skip",
                        showlegend=False,
                        line={"width": width, "color": color.format(a=0.25 + 0.25 * band)},
                    )
                )
    return traces


def describe(node: dict, labels: list[str], logits: list[str], graph: Graph) -> str:
    if node["kind"] == "feature":
        return f"feature {node['feature']} at layer {node['layer']}, {labels[node['pos']]!r}: {node['activation']:.3f}"
    if node["kind"] == "error":
        return f"error node, layer {node['layer']}, {labels[node['pos']]!r}"
    if node["kind"] == "token":
        return f"token {labels[node['pos']]!r} at {node['pos']}"
    k = _logit_index(graph, graph.node_ids().index(node["id"]))
    return f"logit {logits[k]!r}: p = {node['probability']:.3f}"


def show_feature(model, transcoders: Transcoders, contexts: dict | None, node: dict, page: str) -> None:
    """A clicked feature: its top contexts from the harvest, its top logits, and a link to its own page (`page`:
    the features page's address with the query parameters that name it)."""
    st.subheader(f"Feature {node['feature']} of layer {node['layer']}")
    st.markdown(
        f"[Open this feature's page: its histogram, contexts by quantile, and the features it reads and writes]({page})"
    )

    def decode(ids: list[int]) -> str:  # a window as text, never '�' (a cut through a character: its bytes)
        return readable_text(model.tokenizer, ids) if getattr(model, "tokenizer", None) else " ".join(map(str, ids))

    if contexts is None:
        st.info("These transcoders have no top contexts (contexts.safetensors); `forma transcoders` writes them.")
    else:
        rows = []
        for value, seq, pos in zip(
            *(contexts[k][node["layer"], node["feature"]].tolist() for k in ("values", "seq", "pos"))
        ):
            if seq < 0:
                continue
            window = contexts["windows"][seq].tolist()
            rows.append(
                {
                    "activation": round(value, 3),
                    "before": decode(window[max(0, pos - 12) : pos]),
                    "token": decode(window[pos : pos + 1]),
                    "after": decode(window[pos + 1 : pos + 4]),
                }
            )
        st.markdown("**Top activating contexts** (from the transcoders' harvest)")
        if rows:
            show_table(
                rows,
                {"activation": "activation", "before": "before", "token": "token (where it fires)", "after": "after"},
            )
        else:
            st.info("It never fired on the harvest.")
    promoted, suppressed = feature_logits(model, transcoders, node["layer"], node["feature"])
    st.markdown(
        "**Top logits** (its decoder through the unembedding): promotes "
        + ", ".join(f"{code(token_text(model, int(t)))} {v:+.2f}" for t, v in promoted[:8])
        + "; suppresses "
        + ", ".join(f"{code(token_text(model, int(t)))} {v:+.2f}" for t, v in suppressed[:8])
    )


def show_qk(model, transcoders: Transcoders, graph: Graph, labels: list[str]) -> None:
    """Which source nodes make a head attend from one position to another: its score split over (query node, key
    node) pairs (lab.analysis.graphs.qk), on request."""
    with st.expander("Attention explained (QK): which features make a head attend where it does"):
        cols = st.columns(4)
        layer = cols[0].number_input("Layer", 0, graph.n_layers - 1, graph.n_layers - 1, key="qk_layer")
        head = cols[1].number_input("Head", 0, model.cfg.n_heads - 1, 0, key="qk_head")
        query = cols[2].number_input("Query position", 0, graph.n_pos - 1, graph.n_pos - 1, key="qk_query")
        key = cols[3].number_input("Key position", 0, int(query), 0, key="qk_key")
        if st.button("Split the score", key="qk_go"):
            result = qk_attribution(model, transcoders, graph, int(layer), int(head), int(query), int(key))
            st.markdown(
                f"Score {result['score']:.4f} from {labels[int(query)]!r} to {labels[int(key)]!r} = "
                f"{result['pairs_sum']:.4f} over node pairs + {result['bias_terms']:.4f} from biases."
            )
            show_table(
                result["top_pairs"],
                {"query": "query-side node", "key": "key-side node", "score": "its part of the score"},
            )


def supernodes(graph: Graph, folder, ids: list[str]) -> None:
    st.markdown("**Supernodes** (saved with the graph)")
    for s in graph.supernodes:
        st.text(f"- {s['name']}: {', '.join(map(str, s['nodes']))}")  # a name from a shared folder: text, not Markdown
    members = st.multiselect("Nodes", ids, key="supernode_nodes")
    name = st.text_input("Supernode name", key="supernode_name")
    if st.button("Save supernode", key="supernode_save"):
        graph.supernodes = [s for s in graph.supernodes if s["name"] != name.strip()]
        graph.supernodes.append({"name": name.strip(), "nodes": members})
        try:
            graph.save_supernodes(folder)
            st.success(f"Saved supernode {name.strip()!r} ({len(members)} nodes).")
        except ValueError as err:
            graph.supernodes.pop()
            st.warning(plain(str(err)))


st.title("Attribution graphs")
available = transcoder_sets_or_stop(graphs=True)
names = sorted({name for name, _ in available})
name = st.sidebar.selectbox("Model", names, index=names.index("pydoc") if "pydoc" in names else 0, key="graph_model")
if st.session_state.get("graph_model_shown") != name:  # another model's prompt and positions mean nothing here
    for key in MODEL_WIDGETS:
        st.session_state.pop(key, None)
    st.session_state["graph_model_shown"] = name
kind = st.sidebar.selectbox("Transcoders", [k for n, k in available if n == name], key="graph_kind")
node_threshold = st.sidebar.slider("Node threshold (share of influence kept)", 0.1, 1.0, 0.8, 0.05)
edge_threshold = st.sidebar.slider("Edge threshold", 0.5, 1.0, 0.98, 0.01)
model = load_trained_model(name, model_version(name))
path = zoo_dir() / name / TRANSCODERS_DIR / kind
try:
    transcoders = open_transcoders(str(path), name, transcoders_version(str(path), name))
except ValueError as err:
    st.warning(plain(str(err)))
    st.stop()
try:
    quality = load_quality(path)
    fvu = ", ".join(f"{float(v):.3f}" for v in quality["held_out"]["fvu"]) if quality else None
    recovered = float(quality["loss"]["recovered"]) if quality else None
except (ValueError, OSError, KeyError, TypeError) as err:
    st.sidebar.warning(plain(f"The transcoders' quality.json cannot be read ({type(err).__name__}: {err})."))
    fvu = None
if fvu is not None:
    st.sidebar.caption(f"held-out FVU by layer {fvu}; loss recovered {recovered:.1%}")
prompt = st.text_input("Prompt", DEFAULT_PROMPTS.get(name, "1 2 3 4"), key="graph_prompt")
try:
    graph = graph_of(name, kind, prompt, model_version(str(path)))
except ValueError as err:
    st.warning(plain(f"No graph for this prompt: {err}"))
    st.stop()
labels = [token_text(model, int(t)) for t in graph.tokens]  # byte-level pieces as ⟨0xE2⟩, never '�'
logit_labels = [token_text(model, int(t)) for t in graph.logit_tokens]
pruned = prune(graph, node_threshold, edge_threshold)
scores = graph_scores(graph)
st.caption(
    f"{graph.n_features} active features, {int(pruned.node_mask.sum())} nodes and "
    f"{int(pruned.edge_mask.sum())} edges kept, holding {pruned.node_share:.1%} of the node influence and "
    f"{pruned.edge_share:.1%} of the edge influence; replacement score {scores['replacement']:.2f}, "
    f"completeness {scores['completeness']:.2f}."
)
drawn = as_text(readable(figure(graph, pruned.node_mask, pruned.edge_mask, labels, logit_labels)))
event = st.plotly_chart(drawn, key="graph_chart", on_select="rerun", selection_mode="points")
points = (event.selection.points if event and event.selection else []) or []
chosen = [p["customdata"] for p in points if "customdata" in p]
if chosen and graph.node(int(chosen[0]))["kind"] == "feature":
    node = graph.node(int(chosen[0]))
    link = feature_page(name, kind, node["layer"], node["feature"])
    show_feature(model, transcoders, load_contexts(path), node, link)
elif chosen:
    st.info(describe(graph.node(int(chosen[0])), labels, logit_labels, graph))
else:
    st.caption("Click a feature node for its top contexts and logits.")
show_qk(model, transcoders, graph, labels)
kept_ids = [graph.node(i)["id"] for i in torch.nonzero(pruned.node_mask).flatten().tolist()]
supernodes(graph, graph_folder(path, graph.tokens), kept_ids)
export = to_circuit_tracer(
    graph,
    pruned.node_mask,
    pruned.edge_mask,
    pruned.cumulative,
    slug=f"{name}-{kind}",
    scan=f"forma-{name}-{kind}",
    token_strings=graph.meta.get("token_strings"),
    node_threshold=node_threshold,
)
st.download_button(
    "Export (circuit-tracer graph JSON)",
    json.dumps(export),
    file_name=f"{name}-{kind}.json",
    mime="application/json",
    key="graph_export",
)
