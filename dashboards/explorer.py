"""Explorer: a prompt's tokens, attention patterns, residual norms, the logit lens, direct logit attribution
and activation patching, for any zoo model or local Hugging Face folder; for an encoder–decoder model,
its translation and cross-attention patterns."""

import plotly.express as px
import plotly.graph_objects as go
import streamlit as st
import torch

from dashboards.common import model_version, try_load_model
from lab.zoo import zoo_names

DEFAULT_PROMPTS = {"pydoc": "Return the number of items in the list.", "facts": "<bos> ", "markov": "1 2 3 4 5 6 7 8",
                   "dates": "the third of march two thousand and five"}


def choose_model() -> str:
    names = zoo_names()
    options = names + ["local folder…"]
    choice = st.sidebar.selectbox("Model", options, index=options.index("pydoc") if "pydoc" in options else 0,
                                  key="model_choice")
    if choice == "local folder…":
        return st.sidebar.text_input("Folder (Forma or Hugging Face)", key="model_path").strip()
    return choice


# Widgets whose values belong to one model: a prompt in its tokenizer's words (or its token ids), a layer, head or
# position that exists in it, a target token of its vocabulary.
MODEL_WIDGETS = ("prompt", "corrupted", "dla_target", "dla_pos", "attn_layer", "attn_head", "patch_component",
                 "source", "cross_layer", "cross_head")


def forget_another_models_widgets(name: str) -> None:
    """When the model changes, its widgets start again from the new model's defaults (a pydoc prompt kept for
    markov, whose prompts are token ids, would read as "invalid literal for int()")."""
    if st.session_state.get("explorer_model") != name:
        for key in MODEL_WIDGETS:
            st.session_state.pop(key, None)
        st.session_state["explorer_model"] = name


def pick(label: str, n: int, default: int, key: str) -> int:
    """A slider over 0 … n − 1; with one choice there is nothing to slide (Streamlit refuses min = max)."""
    if n == 1:
        st.caption(f"{label}: 0 (the only one)")
        return 0
    return st.slider(label, 0, n - 1, default, key=key)


def encode(model, text: str) -> torch.Tensor | None:
    """Token ids of the prompt: through the model's tokenizer, or space-separated ids when it has none."""
    try:
        if model.tokenizer is None:
            ids = [int(t) for t in text.split()]
            return model.check_tokens(torch.tensor(ids, dtype=torch.long))
        return model.check_tokens(model.to_tokens(text))
    except ValueError as err:
        st.error(f"Cannot use this prompt: {err}")
        return None


def token_labels(model, tokens: torch.Tensor) -> list[str]:
    ids = tokens[0].tolist()
    words = [str(i) for i in ids] if model.tokenizer is None else [model.to_string([i]) for i in ids]
    return [f"{p}:{w!r}"[:24] for p, w in enumerate(words)]


def show_attention(model, tokens, labels) -> None:
    layer = pick("Layer", model.cfg.n_layers, 0, key="attn_layer")
    head = pick("Head", model.cfg.n_heads, 0, key="attn_head")
    with torch.inference_mode():
        _, cache = model.run_with_cache(tokens, names_filter=f"blocks.{layer}.attn.hook_pattern")
    pattern = cache[f"blocks.{layer}.attn.hook_pattern"][0, head].numpy()
    fig = go.Figure(go.Heatmap(z=pattern, x=labels, y=labels, colorscale="Blues", zmin=0, zmax=1,
                               hovertemplate="query %{y}<br>key %{x}<br>weight %{z:.3f}<extra></extra>"))
    fig.update_layout(title=f"Attention pattern, layer {layer} head {head}", yaxis_autorange="reversed",
                      xaxis_title="key", yaxis_title="query", height=600)
    st.plotly_chart(fig, key="attention")


def show_residual_norms(model, tokens, labels) -> None:
    from lab.analysis.lens import residual_norms

    norms = residual_norms(model, tokens)[:, 0]  # [layer + 1, pos]
    rows = [{"layer": l, "position": labels[p], "norm": float(norms[l, p])}
            for l in range(norms.shape[0]) for p in range(norms.shape[1])]
    fig = px.line(rows, x="layer", y="norm", color="position", markers=True,
                  title="‖residual stream‖₂ entering each layer (last point: after the final block)")
    st.plotly_chart(fig, key="norms")


def show_logit_lens(model, tokens, labels) -> None:
    from lab.analysis.lens import logit_lens

    log_probs = logit_lens(model, tokens)[:, 0]  # [layer + 1, pos, vocab]
    top_p, top_id = log_probs.exp().max(dim=-1)
    names = ([str(i) for i in range(model.cfg.d_vocab)] if model.tokenizer is None else None)

    def word(i: int) -> str:
        return names[i] if names else repr(model.to_string([i]))

    text = [[word(int(top_id[l, p])) for p in range(top_id.shape[1])] for l in range(top_id.shape[0])]
    layers = [f"resid_pre {l}" for l in range(model.cfg.n_layers)] + ["final"]
    fig = go.Figure(go.Heatmap(z=top_p.numpy(), x=labels, y=layers, text=text, texttemplate="%{text}",
                               colorscale="Viridis", zmin=0, zmax=1,
                               hovertemplate="%{y} at %{x}<br>top token %{text}<br>p = %{z:.3f}<extra></extra>"))
    fig.update_layout(title="Logit lens: the top next token and its probability at each layer and position",
                      height=150 + 40 * len(layers))
    st.plotly_chart(fig, key="lens")


def show_attribution(model, tokens, labels) -> None:
    from lab.analysis.lens import direct_logit_attribution

    if model.cfg.block == "post_ln":
        st.info("Direct logit attribution needs a pre-LN or parallel model.")
        return
    position = pick("Position", tokens.shape[1], tokens.shape[1] - 1, key="dla_pos")
    with torch.inference_mode():
        predicted = int(model(tokens)[0, position].argmax())
    default = predicted if model.tokenizer is None else model.to_string([predicted])
    target_text = st.text_input("Target token (default: the model's top prediction)", value=str(default), key="dla_target")
    try:
        target = int(target_text) if model.tokenizer is None else model.to_single_token(target_text)
        attribution = direct_logit_attribution(model, tokens[0], target, position)
    except ValueError as err:
        st.error(f"{err}")
        return
    fig = px.bar(x=attribution.labels, y=attribution.values.numpy(), labels={"x": "component", "y": "logit contribution"},
                 title=f"Direct logit attribution of {target_text!r} at {labels[position]} (sum = logit {attribution.logit:.3f})")
    st.plotly_chart(fig, key="dla")


CORRUPTIONS = {"pydoc": ("list", "file"), "markov": ("1", "2")}


def show_patching(model, name: str, tokens, labels) -> None:
    """Activation patching (lab.analysis.patching): clean prompt → corrupted prompt, one (layer, position)
    of the residual stream at a time; the share of the clean logit difference each cell restores."""
    from lab.analysis.patching import patch_positions

    old, new = CORRUPTIONS.get(name, ("", ""))
    prompt = st.session_state.get("prompt", "")
    default = prompt.replace(old, new, 1) if old and old in prompt else prompt
    corrupted_text = st.text_input("Corrupted prompt (same number of tokens)", value=default, key="corrupted")
    corrupted = encode(model, corrupted_text)
    if corrupted is None:
        return
    if corrupted.shape != tokens.shape:
        st.warning(f"The corrupted prompt has {corrupted.shape[1]} tokens and the clean one {tokens.shape[1]}: "
                   "patching needs the same length.")
        return
    with torch.inference_mode():
        answer = int(model(tokens)[0, -1].argmax())
        wrong = int(model(corrupted)[0, -1].argmax())
    if answer == wrong:
        st.info("Both prompts predict the same next token, so there is no logit difference to restore; "
                "change the corrupted prompt.")
        return
    component = st.selectbox("Component", ["resid_pre", "attn_out", "mlp_out", "resid_post"], key="patch_component")
    result = patch_positions(model, tokens, corrupted, component, answer=answer, wrong=wrong)
    restored = result.normalized().numpy()
    word = (lambda i: str(i)) if model.tokenizer is None else (lambda i: repr(model.to_string([i])))
    fig = go.Figure(go.Heatmap(z=restored, x=labels, y=[f"layer {l}" for l in range(restored.shape[0])],
                               colorscale="RdBu", zmid=0,
                               hovertemplate="%{y} at %{x}<br>restored %{z:.3f}<extra></extra>"))
    fig.update_layout(title=f"Share of logit({word(answer)}) − logit({word(wrong)}) restored by patching {component} "
                            f"(clean {result.clean:.3f}, corrupted {result.corrupted:.3f})",
                      height=200 + 40 * restored.shape[0])
    st.plotly_chart(fig, key="patching")


def show_trust(name: str) -> None:
    """The model's trust.json (`forma trust NAME`), if one was written."""
    import json
    from pathlib import Path

    from lab.zoo import zoo_dir

    folder = Path(name) if Path(name).is_dir() else zoo_dir() / name
    path = folder / "trust.json"
    with st.expander("Trust report", expanded=False):
        if not path.is_file():
            st.info(f"No trust report yet: run `forma trust {name}`.")
            return
        try:
            from lab.trust import summary_lines

            st.code("\n".join(summary_lines(json.loads(path.read_text()))))
        except (ValueError, KeyError, TypeError) as err:
            st.warning(f"{path} is unreadable ({err}); run `forma trust {name}` again.")


@st.cache_resource(show_spinner="Loading model…")
def load_encoder_decoder(name_or_path: str, version: tuple = ()):
    from lab.model import EncoderDecoder

    return EncoderDecoder.from_pretrained(name_or_path)


def show_cross_attention(name: str) -> None:
    """An encoder–decoder model: the greedy translation of a source and one cross-attention head as a
    target × source heatmap (row t: the query that produced output token t)."""
    try:
        model = load_encoder_decoder(name, model_version(name))
    except (ValueError, KeyError, OSError) as err:
        st.error(f"Could not load `{name}`: {err}")
        return
    cfg = model.cfg
    st.caption(f"encoder–decoder · {cfg.n_encoder_layers} + {cfg.n_decoder_layers} layers · d_model {cfg.d_model} · "
               f"{cfg.n_heads} heads · positions {cfg.positions} · {cfg.block} · {cfg.mlp}")
    if model.src_tokenizer is None or model.tgt_tokenizer is None:
        st.warning(f"`{name}` has no tokenizers (src_tokenizer.json, tgt_tokenizer.json) to read a source with.")
        return
    text = st.text_input("Source", value=DEFAULT_PROMPTS.get(name, ""), key="source")
    vocab = model.tgt_tokenizer
    try:
        src = torch.tensor([model.src_tokenizer.encode(text).ids], dtype=torch.long)
        tgt = model.generate(src, cfg.n_ctx - 1, vocab.token_to_id("<bos>"), vocab.token_to_id("<eos>"))
    except ValueError as err:
        st.error(f"Cannot use this source: {err}")
        return
    outputs = [vocab.id_to_token(i) for i in tgt[0, 1:].tolist()]
    st.write("Translation (greedy): " + " ".join(f"`{t}`" for t in outputs))
    layer = pick("Decoder layer", cfg.n_decoder_layers, cfg.n_decoder_layers - 1, key="cross_layer")
    head = pick("Head", cfg.n_heads, 0, key="cross_head")
    hook = f"decoder.{layer}.cross_attn.hook_pattern"
    with torch.inference_mode():
        _, cache = model.run_with_cache(src, tgt[:, :-1], names_filter=hook)
    source_labels = [f"{p}:{model.src_tokenizer.id_to_token(i)}" for p, i in enumerate(src[0].tolist())]
    target_labels = [f"{p}:→{t}" for p, t in enumerate(outputs)]
    fig = go.Figure(go.Heatmap(z=cache[hook][0, head].numpy(), x=source_labels, y=target_labels, colorscale="Blues",
                               zmin=0, zmax=1, hovertemplate="output %{y}<br>source %{x}<br>weight %{z:.3f}<extra></extra>"))
    fig.update_layout(title=f"Cross-attention, decoder layer {layer} head {head}", yaxis_autorange="reversed",
                      xaxis_title="source token (key)", yaxis_title="target token produced (query)", height=600)
    st.plotly_chart(fig, key="cross_attention")


st.title("Explorer")
name = choose_model()
forget_another_models_widgets(name)
if name:
    from lab.model.encoder_decoder import is_encoder_decoder

    if is_encoder_decoder(name):
        show_cross_attention(name)
        st.stop()
model = try_load_model(name) if name else None
if model is None:
    st.stop()
st.caption(f"{model.cfg.n_layers} layers · d_model {model.cfg.d_model} · {model.cfg.n_heads} heads · "
           f"positions {model.cfg.positions} · {model.cfg.norm} · {model.cfg.mlp} · vocab {model.cfg.d_vocab}")
show_trust(name)
prompt = st.text_input("Prompt" + (" (space-separated token ids)" if model.tokenizer is None else ""),
                       value=DEFAULT_PROMPTS.get(name, "1 2 3"), key="prompt")
tokens = encode(model, prompt)
if tokens is None:
    st.stop()
labels = token_labels(model, tokens)
st.write("Tokens: " + " ".join(f"`{label}`" for label in labels))
tabs = st.tabs(["Attention", "Residual stream", "Logit lens", "Attribution", "Patching"])
with tabs[0]:
    show_attention(model, tokens, labels)
with tabs[1]:
    show_residual_norms(model, tokens, labels)
with tabs[2]:
    show_logit_lens(model, tokens, labels)
with tabs[3]:
    show_attribution(model, tokens, labels)
with tabs[4]:
    show_patching(model, name, tokens, labels)
