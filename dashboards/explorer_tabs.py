"""The explorer's views (dashboards/explorer.py is the page): each tab's drawing — attention, residual norms,
the logit lens, the ground-truth lens, direct logit attribution, activation patching, head detectors — and the
trust report beside them, each calling the library function it shows; and the prompt helpers they share
(token ids from a prompt and back, sliders over layers, heads and positions)."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import plotly.express as px
import plotly.graph_objects as go
import streamlit as st
import torch
from plotly.subplots import make_subplots

from dashboards.charts import draw
from lab.names import name


@dataclass
class Opened:
    """A model the explorer reads, and how it was read."""

    model: Any  # a HookedTransformer, or a TransformerLens TransformerBridge
    route: str  # in words: a zoo model, a Forma folder, a converted HF folder, or the bridge
    forma: bool  # a HookedTransformer: every view; a bridge: the views that read hooks only
    folder: Path | None  # where it was read from (a zoo model's folder, or the local folder)


def pick(label: str, n: int, default: int, key: str) -> int:
    """A slider over 0 … n − 1; with one choice there is nothing to slide (Streamlit refuses min = max)."""
    if n == 1:
        st.caption(f"{label}: 0 (the only one)")
        return 0
    return st.slider(label, 0, n - 1, default, key=key)


def to_ids(model, text: str) -> torch.Tensor:
    """[1, pos] token ids of `text`: through the model's tokenizer, or space-separated ids when it has none; a
    ValueError that says what is wrong with the prompt."""
    if model.tokenizer is None:
        try:
            tokens = torch.tensor([[int(t) for t in text.split()]], dtype=torch.long)
        except ValueError as err:
            raise ValueError(f"this model reads space-separated token ids ({err})") from err
    elif hasattr(model, "check_tokens"):
        tokens = model.to_tokens(text, truncate=False)  # never cut: one longer than the context is refused below
    else:  # a bridge: the text as its tokenizer encodes it, with no BOS added (as Forma encodes a prompt)
        tokens = model.to_tokens(text, prepend_bos=False, truncate=False)
    if hasattr(model, "check_tokens"):
        return model.check_tokens(tokens)
    if not 0 < tokens.shape[1] <= model.cfg.n_ctx:  # a bridge checks nothing itself
        raise ValueError(f"the prompt is {tokens.shape[1]} tokens; this model reads 1 to {model.cfg.n_ctx}")
    return tokens


def encode(model, text: str) -> torch.Tensor | None:
    """The prompt's token ids, or None after a message saying why it cannot be used."""
    try:
        return to_ids(model, text)
    except ValueError as err:
        st.error(f"Cannot use this prompt: {err}")
        return None


def text_of(model, tokens: torch.Tensor) -> str:
    """[1, pos] ids as the text a prompt box holds (special tokens written out, so that the text encodes back;
    without the BOS that to_ids prepends again for a model that adds one, as a Hugging Face model does)."""
    ids = tokens[0].tolist()
    if model.tokenizer is None:
        return " ".join(str(i) for i in ids)
    adds_bos = hasattr(model, "check_tokens") and getattr(model.cfg, "default_prepend_bos", False)
    if adds_bos and ids and ids[0] == model.tokenizer.bos_token_id:
        ids = ids[1:]
    return model.tokenizer.decode(ids, skip_special_tokens=False)


def token_text(model, i: int) -> str:
    """Token `i` as a reader reads it: its id for a model without a tokenizer, else its text, with the bytes of
    a byte-level piece of a UTF-8 character written ⟨0xE2⟩ (lab.data.tokenizers.readable_token), never '�'."""
    from lab.data.tokenizers import readable_token

    if model.tokenizer is None:
        return str(i)
    tokenizer = model.tokenizer
    piece = (
        tokenizer.id_to_token(i) if hasattr(tokenizer, "id_to_token") else tokenizer.convert_ids_to_tokens(i)
    )  # a Hugging Face tokenizer (a bridged model)
    return readable_token(model.to_string([i]), piece)


def token_labels(model, tokens: torch.Tensor) -> list[str]:
    ids = tokens[0].tolist()
    words = [str(i) for i in ids] if model.tokenizer is None else [token_text(model, i) for i in ids]
    return [f"{p}:{w!r}"[:24] for p, w in enumerate(words)]


def word_of(model):
    return (lambda i: str(i)) if model.tokenizer is None else (lambda i: repr(token_text(model, i)))


OVERVIEW_MOST = 64  # heads the all-heads overview draws at most (beyond: the chosen layer's heads only)


def pattern_figure(
    pattern, keys: list[str], queries: list[str], title: str, *, key: str = "key", query: str = "query", **axes
) -> go.Figure:
    """One attention pattern as a query × key heatmap (weights 0 to 1, the first query on top); `key` and `query`
    name the axes in the hover text, `axes` (xaxis_title, yaxis_title) name them on the figure."""
    fig = go.Figure(
        go.Heatmap(
            z=pattern,
            x=keys,
            y=queries,
            colorscale="Blues",
            zmin=0,
            zmax=1,
            hovertemplate=f"{query} %{{y}}<br>{key} %{{x}}<br>weight %{{z:.3f}}<extra></extra>",
        )
    )
    fig.update_layout(title=title, yaxis_autorange="reversed", height=600, **axes)
    return fig


def show_attention(model, tokens, labels) -> None:
    """One head's pattern (query × key, the tokens named), beside every head's pattern at a glance, the chosen
    one outlined: a grid of small patterns up to OVERVIEW_MOST heads, beyond that (a real model's 270) every
    head's pattern tiled into one picture, layer by row and head by column, each tile named on hover."""
    layer = pick("Layer", model.cfg.n_layers, 0, key="attn_layer")
    head = pick("Head", model.cfg.n_heads, 0, key="attn_head")
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    hooks = [f"blocks.{l}.attn.hook_pattern" for l in range(n_layers)]
    with torch.inference_mode():
        _, cache = model.run_with_cache(tokens, names_filter=hooks)
    one, every = st.columns([3, 2])
    with one:
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"][0, head].numpy()
        title = f"Attention pattern, layer {layer} head {head}"
        fig = pattern_figure(pattern, labels, labels, title, xaxis_title="key", yaxis_title="query")
        draw(fig, "attention", title_chars=55)
    with every:
        if n_layers * n_heads <= OVERVIEW_MOST:
            fig = _every_head_figure(cache, list(range(n_layers)), n_heads, chosen=(layer, head))
            fig.update_layout(title="Every head, query × key (the chosen one outlined)")
        else:
            fig = tiled_heads_figure(cache, n_layers, n_heads, chosen=(layer, head))
            fig.update_layout(title=f"All {n_layers * n_heads} heads: a row per layer, a column per head")
        draw(fig, "attention_heads", title_chars=40)


def tiled_heads_figure(cache, n_layers: int, n_heads: int, chosen: tuple[int, int]) -> go.Figure:
    """Every head's pattern in one heatmap: tile (layer, head) holds that head's query × key pattern, tiles
    parted by a blank row and column; hovering names the layer, head, query and key. One trace, so hundreds of
    heads draw at once."""
    patterns = torch.stack([cache[f"blocks.{l}.attn.hook_pattern"][0] for l in range(n_layers)]).numpy()
    pos = patterns.shape[-1]
    step = pos + 1  # a tile and its blank separator
    z = np.full((n_layers * step, n_heads * step), np.nan, dtype=np.float32)
    where = np.full(z.shape + (4,), -1, dtype=np.int64)
    query, key = np.meshgrid(np.arange(pos), np.arange(pos), indexing="ij")
    for l in range(n_layers):
        for h in range(n_heads):
            rows, cols = slice(l * step, l * step + pos), slice(h * step, h * step + pos)
            z[rows, cols] = patterns[l, h]
            where[rows, cols] = np.stack([np.full_like(query, l), np.full_like(query, h), query, key], axis=-1)
    fig = go.Figure(
        go.Heatmap(
            z=z,
            customdata=where,
            colorscale="Blues",
            zmin=0,
            zmax=1,
            showscale=False,
            hoverongaps=False,
            hovertemplate="layer %{customdata[0]} head %{customdata[1]}<br>query %{customdata[2]} · key "
            "%{customdata[3]}<br>weight %{z:.3f}<extra></extra>",
        )
    )
    l, h = chosen
    fig.add_shape(
        type="rect",
        x0=h * step - 0.5,
        x1=h * step + pos - 0.5,
        y0=l * step - 0.5,
        y1=l * step + pos - 0.5,
        line=dict(color="red", width=2),
    )
    fig.update_xaxes(
        tickvals=[h * step + (pos - 1) / 2 for h in range(n_heads)], ticktext=[f"H{h}" for h in range(n_heads)]
    )
    fig.update_yaxes(
        autorange="reversed",
        tickvals=[l * step + (pos - 1) / 2 for l in range(n_layers)],
        ticktext=[f"L{l}" for l in range(n_layers)],
    )
    fig.update_layout(height=max(400, min(2400, 28 * n_layers + 4 * n_layers * pos)))
    return fig


def _every_head_figure(cache, layers: list[int], n_heads: int, chosen: tuple[int, int]) -> go.Figure:
    """A grid of small patterns, one row per layer in `layers` and one column per head, the chosen head outlined."""
    fig = make_subplots(
        rows=len(layers),
        cols=n_heads,
        horizontal_spacing=0.02,
        vertical_spacing=min(0.1, 0.3 / len(layers)),
        subplot_titles=[f"L{l} H{h}" for l in layers for h in range(n_heads)],
    )
    for row, l in enumerate(layers, start=1):
        patterns = cache[f"blocks.{l}.attn.hook_pattern"][0].numpy()
        for h in range(n_heads):
            fig.add_trace(
                go.Heatmap(
                    z=patterns[h],
                    coloraxis="coloraxis",
                    name=f"layer {l} head {h}",
                    hovertemplate=f"layer {l} head {h}<br>query %{{y}}<br>key %{{x}}<br>"
                    "weight %{z:.3f}<extra></extra>",
                ),
                row=row,
                col=h + 1,
            )
            if (l, h) == chosen:
                fig.add_shape(
                    type="rect",
                    xref="x domain",
                    yref="y domain",
                    x0=0,
                    x1=1,
                    y0=0,
                    y1=1,
                    line=dict(color="red", width=2),
                    row=row,
                    col=h + 1,
                )
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False, autorange="reversed")
    fig.update_annotations(font_size=10)
    fig.update_layout(
        coloraxis=dict(colorscale="Blues", cmin=0, cmax=1, showscale=False),
        height=max(300, 120 + 600 // max(1, n_heads) * len(layers)),
    )
    return fig


def show_residual_norms(model, tokens, labels) -> None:
    from lab.analysis.lens import residual_norms

    norms = residual_norms(model, tokens)[:, 0]  # [layer + 1, pos]
    rows = [
        {"layer": l, "position": labels[p], "norm": float(norms[l, p])}
        for l in range(norms.shape[0])
        for p in range(norms.shape[1])
    ]
    fig = px.line(
        rows,
        x="layer",
        y="norm",
        color="position",
        markers=True,
        title="‖residual stream‖₂ entering each layer (last point: after the final block)",
    )
    draw(fig, "norms")


LENSES = {"logit": "Logit lens", "tuned": "Tuned lens", "jacobian": "Jacobian lens"}
LENS_PROMPTS = 32  # sequences a tuned or Jacobian lens is fitted on in the explorer


def lens_corpus(model, folder: Path | None) -> torch.Tensor:
    """What the explorer fits a tuned or Jacobian lens on: LENS_PROMPTS draws from the model's world when its folder
    records a source (world.json), else LENS_PROMPTS sequences the model writes itself (temperature 1, seeded),
    each as long as its context allows, at most 32 tokens."""
    from lab.zoo.worlds import world_source

    length = min(model.cfg.n_ctx, 32)
    source = world_source(folder) if folder is not None else None
    if source is not None and source.vocab_size == model.cfg.d_vocab:
        return torch.from_numpy(source.sample(LENS_PROMPTS, length, seed=0))
    bos = model.tokenizer.token_to_id("<bos>") if model.tokenizer is not None else None
    first = (
        torch.full((LENS_PROMPTS, 1), bos)
        if bos is not None
        else torch.randint(0, model.cfg.d_vocab, (LENS_PROMPTS, 1), generator=torch.Generator().manual_seed(0))
    )
    return model.generate(first, length - 1, temperature=1.0, seed=0)


@st.cache_resource(show_spinner="Fitting the lens on the model's own text (once per model)…")
def fitted_lens(name: str, version: tuple, kind: str):
    """A tuned (lab.analysis.tuned_lens) or Jacobian (lab.analysis.jacobian_lens) lens of the explorer's model,
    fitted on `lens_corpus`."""
    from dashboards.display import load_model
    from lab.analysis.jacobian_lens import fit_jacobian_lens
    from lab.analysis.tuned_lens import fit_tuned_lens

    model = load_model(name, version)
    folder = Path(name) if Path(name).is_dir() else None
    if folder is None:
        from lab.folders import zoo_dir

        folder = zoo_dir() / name
    corpus = lens_corpus(model, folder)
    return fit_tuned_lens(model, corpus) if kind == "tuned" else fit_jacobian_lens(model, corpus)


def show_logit_lens(model, tokens, labels, name: str | None = None) -> None:
    """The top next token and its probability at each layer and position, read through the chosen lens: the logit
    lens, or (for a model the explorer opened by name) a tuned or Jacobian lens fitted on its own text."""
    from dashboards.display import model_version
    from lab.analysis.lens import logit_lens

    kinds = list(LENSES) if name is not None else ["logit"]
    kind = st.radio("Lens", kinds, format_func=LENSES.get, horizontal=True, key="lens_kind")
    if kind == "logit":
        log_probs = logit_lens(model, tokens)[:, 0]  # [layer + 1, pos, vocab]
    else:
        lens = fitted_lens(name, model_version(name), kind)
        log_probs = lens.log_probs(model, tokens)[:, 0]
        st.caption(
            f"Fitted on {LENS_PROMPTS} sequences of the model's world, or of its own sampled text when its folder "
            "records no world (lab.analysis." + ("tuned_lens" if kind == "tuned" else "jacobian_lens") + ")."
        )
    top_p, top_id = log_probs.exp().max(dim=-1)
    word = word_of(model)
    text = [[word(int(top_id[l, p])) for p in range(top_id.shape[1])] for l in range(top_id.shape[0])]
    layers = [f"layer {l}'s input" for l in range(model.cfg.n_layers)] + ["the model's output"]
    fig = go.Figure(
        go.Heatmap(
            z=top_p.numpy(),
            x=labels,
            y=layers,
            text=text,
            texttemplate="%{text}",
            colorscale="Viridis",
            zmin=0,
            zmax=1,
            colorbar={"title": "probability"},
            hovertemplate="%{y} at %{x}<br>top token %{text}<br>p = %{z:.3f}<extra></extra>",
        )
    )
    fig.update_layout(
        title=f"{LENSES[kind]}: the top next token and its probability at each layer and position",
        height=150 + 40 * len(layers),
    )
    draw(fig, "lens")


EXHAUSTIVE_LIMIT = 20_000  # forward passes (positions × vocabulary) the explorer runs for the exhaustive effects


def show_input_attribution(model, tokens, labels) -> None:
    """lab.analysis.input_attribution: every method's credit to each position for the model's top next token after
    the prompt, each row scaled by its largest |score|; with the model's exhaustive causal effects beside them."""
    from lab.analysis.input_attribution import (
        METHODS,
        input_attributions,
        resample_effects,
        top_tokens,
    )

    target = int(top_tokens(model, tokens)[0])
    methods = st.multiselect("Methods", METHODS, default=list(METHODS), format_func=name, key="attribution_methods")
    if not methods:
        st.info("Choose at least one method.")
        return
    scores = input_attributions(model, tokens, target, methods)
    rows = {method: scores[method][0] for method in methods}
    passes = tokens.shape[1] * model.cfg.d_vocab
    if passes <= EXHAUSTIVE_LIMIT:
        rows["exhaustive effect"] = resample_effects(model, tokens, target)[0]
    else:
        st.caption(
            f"The exhaustive effects would take {passes:,} forward passes (every position × every token); "
            f"the explorer runs them up to {EXHAUSTIVE_LIMIT:,}."
        )
    z = torch.stack([v / v.abs().max().clamp_min(1e-12) for v in rows.values()]).numpy()
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=labels,
            y=[name(row) for row in rows],
            colorscale="RdBu",
            zmid=0,
            zmin=-1,
            zmax=1,
            hovertemplate="%{y}<br>%{x}<br>score / max |score| = %{z:.3f}<extra></extra>",
        )
    )
    fig.update_layout(
        title=f"Input attribution of the next token {word_of(model)(target)} after the prompt (each row "
        "scaled by its largest |score|)",
        height=200 + 35 * len(rows),
        yaxis_autorange="reversed",
    )
    draw(fig, key="input_attribution")


def show_attribution(model, tokens, labels) -> None:
    from lab.analysis.lens import direct_logit_attribution

    if model.cfg.block == "post_ln":
        st.info("Direct logit attribution needs a pre-LN or parallel model.")
        return
    position = pick("Position", tokens.shape[1], tokens.shape[1] - 1, key="dla_pos")
    with torch.inference_mode():
        predicted = int(model(tokens)[0, position].argmax())
    default = predicted if model.tokenizer is None else model.to_string([predicted])
    target_text = st.text_input(
        "Target token (default: the model's top prediction)", value=str(default), key="dla_target"
    )
    try:
        target = int(target_text) if model.tokenizer is None else model.to_single_token(target_text)
        attribution = direct_logit_attribution(model, tokens[0], target, position)
    except ValueError as err:
        st.error(f"{err}")
        return
    fig = px.bar(
        x=attribution.labels,
        y=attribution.values.numpy(),
        labels={"x": "component", "y": "logit contribution"},
        title=(
            f"Direct logit attribution of {target_text!r} at {labels[position]} (sum = logit {attribution.logit:.3f})"
        ),
    )
    draw(fig, "dla")


def default_corruption(model, tokens) -> str | None:
    """The corrupted prompt the patching tab starts from: the first one-token substitution that changes the
    model's prediction (lab.analysis.counterfactual.corruptions, a fixed order) and whose text encodes back to
    the same ids; None when there is none."""
    from lab.analysis.counterfactual import corruptions

    for corrupted in corruptions(model, tokens):
        text = text_of(model, corrupted)
        try:
            if torch.equal(to_ids(model, text), corrupted):
                return text
        except ValueError:
            continue
    return None


def show_patching(model, tokens, labels) -> None:
    """Activation patching (lab.analysis.patching): clean prompt → corrupted prompt, one (layer, position) of a
    component, or one head's output, at a time; the share of the clean logit difference each restores."""
    from lab.analysis.patching import patch_heads, patch_positions

    _offer_corruption(model, tokens)
    corrupted_text = st.text_input(
        "Corrupted prompt (same number of tokens; by default one token of the clean "
        "prompt swapped for one the model finds likely there, so that its prediction "
        "changes)",
        key="corrupted",
    )
    corrupted = encode(model, corrupted_text)
    if corrupted is None:
        return
    if corrupted.shape != tokens.shape:
        st.warning(
            f"The corrupted prompt has {corrupted.shape[1]} tokens and the clean one {tokens.shape[1]}: "
            "patching needs the same length."
        )
        return
    with torch.inference_mode():
        answer = int(model(tokens)[0, -1].argmax())
        wrong = int(model(corrupted)[0, -1].argmax())
    if answer == wrong:
        st.info(
            "Both prompts predict the same next token, so there is no logit difference to restore; "
            "change the corrupted prompt."
        )
        return
    word = word_of(model)
    difference = f"logit({word(answer)}) − logit({word(wrong)})"
    st.markdown(
        f"The clean prompt predicts {word(answer)}, the corrupted one {word(wrong)}: each cell is the share "
        f"of {difference} that patching its clean value into the corrupted "
        "run restores (1: all of it, 0: none)."
    )
    component = st.selectbox(
        "Component", ["resid_pre", "attn_out", "mlp_out", "resid_post"], format_func=name, key="patch_component"
    )
    result = patch_positions(model, tokens, corrupted, component, answer=answer, wrong=wrong)
    title = (
        f"Share of {difference} restored by patching {name(component)} "
        f"(clean {result.clean:.3f}, corrupted {result.corrupted:.3f})"
    )
    draw(_restored_figure(result, labels, "%{y} at %{x}", title, "position"), "patching")
    by_head = patch_heads(model, tokens, corrupted, answer=answer, wrong=wrong)
    heads = [f"head {h}" for h in by_head.cells]
    title = f"Share restored by patching one head's output z at every position ({difference})"
    draw(_restored_figure(by_head, heads, "%{y} %{x}", title, "head"), "patching_heads")


def _offer_corruption(model, tokens) -> None:
    """Put the default corrupted prompt in the patching tab's box, found once per clean prompt (the reader's own
    edit kept until the clean prompt changes), and say so when no one-token change moves the prediction."""
    prompt = st.session_state.get("prompt", "")
    if st.session_state.get("corrupted_for") != prompt:  # a new clean prompt: a new default corruption
        st.session_state.pop("corrupted", None)
        st.session_state.pop("corruption_found", None)
        st.session_state["corrupted_for"] = prompt
    if "corrupted" not in st.session_state:
        found = default_corruption(model, tokens)
        st.session_state["corrupted"] = text_of(model, tokens) if found is None else found
        st.session_state["corruption_found"] = found is not None
    if not st.session_state.get("corruption_found", True):
        st.info(
            "No one-token change of this prompt (among the 32 tokens the model finds likeliest at each position, "
            "written as text that reads back as the same tokens) changes the model's prediction; write a "
            "corrupted prompt that does, or try another prompt."
        )


def _restored_figure(result, cells: list[str], where: str, title: str, xaxis_title: str) -> go.Figure:
    """A patching result as a layer × cell heatmap of the share restored (red to blue, 0 white)."""
    restored = result.normalized().numpy()
    fig = go.Figure(
        go.Heatmap(
            z=restored,
            x=cells,
            y=[f"layer {l}" for l in range(restored.shape[0])],
            colorscale="RdBu",
            zmid=0,
            hovertemplate=where + "<br>restored %{z:.3f}<extra></extra>",
        )
    )
    fig.update_layout(title=title, xaxis_title=xaxis_title, height=200 + 40 * restored.shape[0])
    return fig


HEAD_TITLES = {"previous_token": "previous token", "duplicate_token": "duplicate token", "induction": "induction"}


def show_head_detectors(model) -> None:
    """lab.analysis.heads.detect_heads: each head's previous-token, duplicate-token and induction score on
    repeated random sequences."""
    from lab.analysis.heads import detect_heads

    if model.cfg.n_ctx < 4:
        st.info(f"A context of {model.cfg.n_ctx} tokens is too short for a repeated sequence.")
        return
    scores = detect_heads(model)
    length = scores.tokens.shape[1] // 2
    st.markdown(
        f"Scores on {scores.tokens.shape[0]} random sequences of {length} tokens, each repeated once "
        "(seed 0). A head's score is the share of its attention on the keys of its kind, averaged over the "
        "queries that have one: the previous token; an earlier copy of the same token (duplicate); the "
        "token after an earlier copy (induction, which predicts the repeat). 1: all of it, 0: none."
    )
    fig = make_subplots(rows=1, cols=3, subplot_titles=list(HEAD_TITLES.values()), shared_yaxes=True)
    heads = [f"head {h}" for h in range(model.cfg.n_heads)]
    layers = [f"layer {l}" for l in range(model.cfg.n_layers)]
    for column, kind in enumerate(HEAD_TITLES, start=1):
        fig.add_trace(
            go.Heatmap(
                z=getattr(scores, kind).numpy(),
                x=heads,
                y=layers,
                zmin=0,
                zmax=1,
                colorscale="Viridis",
                showscale=column == 3,
                name=HEAD_TITLES[kind],
                hovertemplate=f"{HEAD_TITLES[kind]}<br>%{{y}} %{{x}}<br>score %{{z:.3f}}<extra></extra>",
            ),
            row=1,
            col=column,
        )
    fig.update_layout(
        title="Head detectors: previous-token, duplicate-token and induction scores per head",
        height=220 + 40 * model.cfg.n_layers,
    )
    draw(fig, "heads")


def _known_world(opened: Opened):
    """The source world the model was trained on (its folder's world.json), or None after a message saying why
    there is none to read the model against."""
    from lab.zoo.worlds import world_source

    try:
        source = world_source(opened.folder) if opened.folder is not None else None
    except ValueError as err:
        st.warning(f"{err}")
        return None
    if source is None:
        st.info(
            "The ground-truth lens needs a model trained on a world whose next-token law is known (the zoo's "
            "Markov and hidden-Markov worlds: `forma build markov`); this one's folder records none."
        )
        return None
    if source.vocab_size != opened.model.cfg.d_vocab:
        st.warning(f"The world's {source.vocab_size} symbols are not this model's {opened.model.cfg.d_vocab} tokens.")
        return None
    return source


def show_ground_truth_lens(opened: Opened, tokens, labels) -> None:
    """lab.analysis.lens.ground_truth_lens on a model trained on a source world (its folder's world.json): each
    layer's logit lens beside the true next-token law, and KL(p ‖ P^(l)) per layer."""
    from lab.analysis.lens import ground_truth_lens

    model = opened.model
    source = _known_world(opened)
    if source is None:
        return
    lens = ground_truth_lens(model, tokens, source.conditionals(tokens.cpu().numpy()))
    position = pick("Position (the law of the token after it)", tokens.shape[1], tokens.shape[1] - 1, key="truth_pos")
    kl_here = lens.kl_nats[:, 0, position].numpy()
    kl_mean = lens.kl_nats[:, 0].mean(dim=-1).numpy()
    st.markdown(
        f"At {labels[position]}, the model's output is {kl_here[-1]:.3g} nats from the true law "
        f"(KL(p ‖ P)); the lens at the first layer's input is {kl_here[0]:.3g} nats from it."
    )
    rows = [
        {"layer": label, "KL(p ‖ lens) (nats)": float(value), "where": where}
        for where, values in ((f"at {labels[position]}", kl_here), ("mean over the prompt", kl_mean))
        for label, value in zip(lens.labels, values)
    ]
    fig = px.line(
        rows,
        x="layer",
        y="KL(p ‖ lens) (nats)",
        color="where",
        markers=True,
        title="KL(p ‖ P^(l)): how far each layer's logit lens is from the true next-token law",
    )
    draw(fig, "truth_kl")
    probs = torch.cat([lens.p[0, position][None], lens.log_probs[:, 0, position].exp()]).numpy()
    symbols = [str(i) for i in range(model.cfg.d_vocab)]
    fig = go.Figure(
        go.Heatmap(
            z=probs,
            x=symbols,
            y=["true p"] + lens.labels,
            colorscale="Viridis",
            zmin=0,
            hovertemplate="%{y}<br>next token %{x}<br>p = %{z:.3f}<extra></extra>",
        )
    )
    fig.update_layout(
        title=f"The true law of the next token after {labels[position]} (top row) beside the logit lens at each layer",
        yaxis_autorange="reversed",
        xaxis_title="next token",
        height=200 + 40 * len(lens.labels),
    )
    draw(fig, "truth_lens")


def show_trust(opened: Opened, name: str) -> None:
    """The model's trust report (lab.trust): its trust.json (`forma trust NAME`) if one was written, or the checks
    run here on request."""
    from lab.trust import summary_lines, trust_report

    st.markdown("**Trust report**")
    if not opened.forma:
        st.info(
            "The trust checks compare Forma's own computations with each other and with Hugging Face; a "
            "model read through the bridge is TransformerLens's, and is not checked."
        )
        return
    path = opened.folder / "trust.json" if opened.folder is not None else None
    report = None
    if path is not None and path.is_file():
        from lab.outside_files import read_json

        try:
            report = read_json(path, opened.folder)
            st.caption(f"From `{path}`")
        except ValueError as err:
            st.warning(f"{err}; run `forma trust {name}` again.")
    if report is None and "trust_checked" in st.session_state:  # checked here (forgotten with the model)
        report = st.session_state["trust_checked"]
        st.caption(f"Checked here; `forma trust {name}` writes it beside the model.")
    if report is None:
        st.info(f"No trust report yet: run `forma trust {name}`, or check it here.")
        if st.button("Run the trust checks", key="trust_button"):
            with st.spinner("Checking…"):
                st.session_state["trust_checked"] = trust_report(opened.model)
            st.rerun()
        return
    try:
        st.code("\n".join(summary_lines(report)), language=None)
    except (KeyError, TypeError, AttributeError) as err:
        st.warning(
            f"{path} is not a trust report this page reads ({type(err).__name__}: {err}); "
            f"run `forma trust {name}` again."
        )
