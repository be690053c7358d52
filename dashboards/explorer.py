"""Explorer: a prompt's tokens, attention patterns, residual norms, the logit, tuned and Jacobian lenses (and the
logit lens beside the true law on a source world), direct logit attribution, input attribution, activation
patching and head detectors, for any zoo model or local folder — a Forma model, a Hugging Face model Forma
converts (lab.hf.convert.from_hf), or any other Hugging Face causal LM through TransformerLens's TransformerBridge
(lab.hf.loading.bridge) — with its trust report beside it; for an
encoder–decoder model, its translation and cross-attention patterns.

The page: choosing and opening the model, its prompt, and the tabs (drawn by dashboards/explorer_tabs.py). Only the
open tab is computed; choosing another reruns the page for it.
"""

from pathlib import Path

import streamlit as st
import torch

from dashboards.charts import draw
from dashboards.display import code, load_model, model_version, show_progress
from dashboards.explorer_tabs import (
    Opened,
    encode,
    pattern_figure,
    pick,
    show_attention,
    show_attribution,
    show_ground_truth_lens,
    show_head_detectors,
    show_input_attribution,
    show_logit_lens,
    show_patching,
    show_residual_norms,
    show_trust,
    text_of,
    token_labels,
)
from lab.folders import is_trained, zoo_dir, zoo_names
from lab.load import is_encoder_decoder

DEFAULT_PROMPTS = {
    "pydoc": "Return the number of items in the list.",
    "markov": "1 2 3 4 5 6 7 8",
    "dates": "the third of march two thousand and five",
    "smollm2": "The capital of France is Paris. The capital of Italy is",
}
FIRST_CHOICE = ("smollm2", "pydoc")  # the model the page opens on: the real one when it is built
TEXT_PROMPT = "The quick brown fox jumps over the lazy dog."  # a model with a tokenizer and no prompt of its own
ID_PROMPT = "1 2 3 4 5 6 7 8"  # a model without a tokenizer reads token ids


def choose_model() -> str:
    names = zoo_names()
    options = names + ["local folder…"]
    first = next((name for name in FIRST_CHOICE if name in names and is_trained(name)), None)  # a real model first
    index = options.index(first or ("pydoc" if "pydoc" in options else options[0]))
    choice = st.sidebar.selectbox("Model", options, index=index, key="model_choice")
    if choice == "local folder…":
        return st.sidebar.text_input(
            "Folder (a Forma model, or a Hugging Face save_pretrained folder)",
            key="model_path",
            placeholder="/path/to/model",
        ).strip()
    return choice


def model_folder(name: str) -> Path:
    return Path(name) if Path(name).is_dir() else zoo_dir() / name


@st.cache_resource(show_spinner="Wrapping the model in a TransformerBridge…")
def load_bridge(path: str, version: tuple = ()):
    from lab.hf.loading import bridge

    return bridge(path).eval()


def open_model(name: str) -> Opened | None:
    """The model, or None after a message that names what is wrong (never a traceback): a zoo name, a Forma
    folder, a Hugging Face folder Forma converts, or through the bridge one it does not."""
    from lab.hf.families import SUPPORTED
    from lab.hf.family import UnsupportedArchitecture
    from lab.hf.folder import hf_model_type

    folder = model_folder(name)
    model_type = hf_model_type(folder) if Path(name).is_dir() else None
    try:
        model = load_model(name, model_version(name))
    except UnsupportedArchitecture as unsupported:
        try:
            wrapped = load_bridge(str(folder), model_version(name))
        except (FileNotFoundError, ValueError, KeyError, OSError, RuntimeError, NotImplementedError) as err:
            st.error(
                f"Forma does not convert `{name}` ({unsupported}), and TransformerBridge could not wrap it "
                f"either: {err}"
            )
            return None
        return Opened(
            wrapped,
            f"a Hugging Face {model_type} folder (Forma converts {', '.join(SUPPORTED)}), "
            "hooked in place by TransformerLens's TransformerBridge (lab.hf.loading.bridge)",
            False,
            folder,
        )
    except FileNotFoundError as err:
        st.warning(f"{err}")
        return None
    except (ValueError, KeyError, OSError, RuntimeError) as err:
        st.error(f"Could not load `{name}`: {err}")
        return None
    if model_type is not None:
        route = f"a Hugging Face {model_type} folder, converted to a Forma model by lab.hf.convert.from_hf"
    else:
        route = "a Forma model folder" if Path(name).is_dir() else f"the zoo model `{name}`"
    return Opened(model, route, True, folder)


# Widgets whose values belong to one model: a prompt in its tokenizer's words (or its token ids), a layer, head or
# position that exists in it, a target token of its vocabulary.
MODEL_WIDGETS = (
    "prompt",
    "corrupted",
    "corrupted_for",
    "dla_target",
    "dla_pos",
    "attn_layer",
    "attn_head",
    "patch_component",
    "corruption_found",
    "source",
    "cross_layer",
    "cross_head",
    "truth_pos",
    "trust_checked",
)


def forget_another_models_widgets(name: str) -> None:
    """When the model changes, its widgets start again from the new model's defaults (a pydoc prompt kept for
    markov, whose prompts are token ids, would read as "invalid literal for int()")."""
    if st.session_state.get("explorer_model") != name:
        for key in MODEL_WIDGETS:
            st.session_state.pop(key, None)
        st.session_state["explorer_model"] = name


def default_prompt(name: str, model) -> str:
    """The model's own default prompt: one per zoo world; for the facts world the first statement the model
    itself writes after <bos> (a person and an attribute, whose value it predicts next)."""
    if name == "facts" and model.tokenizer is not None and hasattr(model, "check_tokens"):
        from lab.model.decoding import decode

        try:
            start = model.to_tokens("<bos>")
            return text_of(model, decode(model, start, 3, temperature=0).tokens)
        except ValueError:
            pass
    return DEFAULT_PROMPTS.get(name, ID_PROMPT if model.tokenizer is None else TEXT_PROMPT)


@st.cache_resource(show_spinner="Loading model…")
def load_encoder_decoder(name_or_path: str, version: tuple = ()):
    from lab.model.encoder_decoder import EncoderDecoder

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
    st.caption(
        f"encoder–decoder · {cfg.n_encoder_layers} + {cfg.n_decoder_layers} layers · a residual stream of "
        f"{cfg.d_model} · {cfg.n_heads} heads · {cfg.positions} positions · "
        f"{ARCHITECTURE_WORDS.get(cfg.block, cfg.block)} · {ARCHITECTURE_WORDS.get(cfg.mlp, cfg.mlp)} MLPs"
    )
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
    st.write("Translation (greedy): " + " ".join(code(t) for t in outputs))
    layer = pick("Decoder layer", cfg.n_decoder_layers, cfg.n_decoder_layers - 1, key="cross_layer")
    head = pick("Head", cfg.n_heads, 0, key="cross_head")
    hook = f"decoder.{layer}.cross_attn.hook_pattern"
    with torch.inference_mode():
        _, cache = model.run_with_cache(src, tgt[:, :-1], names_filter=hook)
    source_labels = [f"{p}:{model.src_tokenizer.id_to_token(i)}" for p, i in enumerate(src[0].tolist())]
    target_labels = [f"{p}:→{t}" for p, t in enumerate(outputs)]
    fig = pattern_figure(
        cache[hook][0, head].numpy(),
        source_labels,
        target_labels,
        f"Cross-attention, decoder layer {layer} head {head}",
        key="source",
        query="output",
        xaxis_title="source token (key)",
        yaxis_title="target token produced (query)",
    )
    draw(fig, "cross_attention")


# The config's choices as a reader names them (the describe line above each model's views).
ARCHITECTURE_WORDS = {
    "layernorm": "LayerNorm",
    "rmsnorm": "RMSNorm",
    "layernorm_pre": "LayerNorm (gains folded in)",
    "rmsnorm_pre": "RMSNorm (gains folded in)",
    "relu": "ReLU",
    "gelu": "GELU",
    "gelu_tanh": "GELU (tanh)",
    "silu": "SiLU",
    "swiglu": "SwiGLU",
    "pre_ln": "norm before each sublayer",
    "post_ln": "norm after each sublayer",
}


def describe(opened: Opened) -> str:
    cfg = opened.model.cfg
    parts = [f"{cfg.n_layers} layers", f"a residual stream of {cfg.d_model}", f"{cfg.n_heads} heads"]
    if opened.forma:
        parts += [
            f"{cfg.positions} positions",
            ARCHITECTURE_WORDS.get(cfg.norm, cfg.norm),
            f"{ARCHITECTURE_WORDS.get(cfg.mlp, cfg.mlp)} MLPs",
        ]
    return " · ".join(parts + [f"{cfg.d_vocab:,} tokens", f"a context of {cfg.n_ctx:,}"])


FORMA_ONLY = (
    "This view reads Forma's own model (its residual stream and unembedding); a bridged model shows "
    "attention, patching and head detectors."
)

st.title("Explorer")
name = choose_model()
forget_another_models_widgets(name)
if not name:
    st.info(
        "Give the path of a local model folder in the sidebar: a Forma model (`model.save`) or a Hugging Face "
        "`save_pretrained` folder with its tokenizer."
    )
    st.stop()

if is_encoder_decoder(name):
    show_cross_attention(name)
    st.stop()
if name in zoo_names() and not is_trained(name) and show_progress("model", name):
    st.stop()  # its training is queued or under way: the progress says so, and the page fills in when it ends
opened = open_model(name)
if opened is None:
    st.stop()
model = opened.model
about, trust = st.columns([3, 2])
with about:
    st.markdown(f"Reading {opened.route}.")
    st.caption(describe(opened))
with trust:
    show_trust(opened, name)
prompt = st.text_input(
    "Prompt" + (" (space-separated token ids)" if model.tokenizer is None else ""),
    value=default_prompt(name, model),
    key="prompt",
)
tokens = encode(model, prompt)
if tokens is None:
    st.stop()
labels = token_labels(model, tokens)
st.write("Tokens: " + " ".join(code(label) for label in labels))
# The tab open is the one computed (each view of a 30-layer model takes seconds): switching tabs reruns the page.
VIEWS = {
    "Attention": lambda: show_attention(model, tokens, labels),
    "Residual stream": lambda: show_residual_norms(model, tokens, labels),
    "Lenses": lambda: show_logit_lens(model, tokens, labels, name),
    "Ground-truth lens": lambda: show_ground_truth_lens(opened, tokens, labels),
    "Attribution": lambda: show_attribution(model, tokens, labels),
    "Input attribution": lambda: show_input_attribution(model, tokens, labels),
    "Patching": lambda: show_patching(model, tokens, labels),
    "Head detectors": lambda: show_head_detectors(model),
}
EVERY_MODEL = ("Attention", "Patching", "Head detectors")  # the views a bridged (not converted) model has too
for (title, view), tab in zip(VIEWS.items(), st.tabs(list(VIEWS), key="explorer_tab", on_change="rerun"), strict=True):
    with tab:
        if not tab.open:
            continue
        if opened.forma or title in EVERY_MODEL:
            view()
        else:
            st.info(FORMA_ONLY)
