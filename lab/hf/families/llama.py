"""LLaMA, and the two families that share its layout: rotary positions on every dimension, RMSNorm, SwiGLU, no
biases, pre-LN blocks, grouped K/V heads. Qwen2 adds biases on Q, K and V (and may slide a window in every layer);
Mistral slides a window."""

from typing import Any

import einops

from lab.hf.family import (
    Family,
    Reader,
    State,
    Weights,
    heads,
    read_norms,
    read_outer,
    rope,
    variant,
    write_norms,
    write_outer,
)
from lab.model.config import ModelConfig


def llama_like_config(c: Any, family: str, qkv_bias: bool = False, sliding_window: int = 0) -> ModelConfig:
    if c.hidden_act != "silu":
        raise variant(f"{family} with a {c.hidden_act!r} gate (only SiLU: SwiGLU)")
    base, fraction = rope(c, family)
    if fraction != 1.0:
        raise variant(f"{family} with partial rotary embeddings")
    return ModelConfig(
        d_vocab=c.vocab_size,
        d_model=c.hidden_size,
        n_layers=c.num_hidden_layers,
        n_heads=c.num_attention_heads,
        n_ctx=c.max_position_embeddings,
        d_head=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
        d_mlp=c.intermediate_size,
        n_kv_heads=c.num_key_value_heads or c.num_attention_heads,
        positions="rotary",
        rotary_base=base,
        norm="rmsnorm",
        norm_eps=c.rms_norm_eps,
        mlp="swiglu",
        block="pre_ln",
        tied_embeddings=c.tie_word_embeddings,
        bias=False,
        qkv_bias=qkv_bias,
        sliding_window=sliding_window,
    )


def llama_config(c: Any) -> ModelConfig:
    if getattr(c, "attention_bias", False) or getattr(c, "mlp_bias", False):
        raise variant("LLaMA with attention or MLP biases")
    return llama_like_config(c, "LLaMA")


def qwen2_config(c: Any) -> ModelConfig:
    kinds = set(getattr(c, "layer_types", None) or ["full_attention"])
    if kinds - {"full_attention", "sliding_attention"} or len(kinds) > 1:
        raise variant(
            f"Qwen2 with a sliding window in some layers only (layer_types {sorted(kinds)}; Forma's "
            "sliding_window applies to every layer)"
        )
    window = c.sliding_window if kinds == {"sliding_attention"} else 0
    return llama_like_config(c, "Qwen2", qkv_bias=True, sliding_window=window)


def mistral_config(c: Any) -> ModelConfig:
    return llama_like_config(c, "Mistral", sliding_window=c.sliding_window or 0)


def llama_like(cfg: ModelConfig) -> bool:
    return (
        cfg.positions == "rotary"
        and cfg.rotary_dim == cfg.d_head
        and cfg.norm == "rmsnorm"
        and cfg.block == "pre_ln"
        and cfg.mlp == "swiglu"
        and not cfg.bias
    )


def llama_shape(cfg: ModelConfig) -> bool:
    return llama_like(cfg) and not cfg.qkv_bias and not cfg.sliding_window


def qwen2_shape(cfg: ModelConfig) -> bool:
    return llama_like(cfg) and cfg.qkv_bias


def mistral_shape(cfg: ModelConfig) -> bool:
    return llama_like(cfg) and not cfg.qkv_bias and bool(cfg.sliding_window)


def llama_like_hf_config(cfg: ModelConfig, config_class: str, **extra: Any) -> Any:
    import transformers

    return getattr(transformers, config_class)(
        vocab_size=cfg.d_vocab,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_mlp,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.d_head,
        max_position_embeddings=cfg.n_ctx,
        rms_norm_eps=cfg.norm_eps,
        tie_word_embeddings=cfg.tied_embeddings,
        rope_parameters={"rope_theta": cfg.rotary_base, "rope_type": "default"},
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        **extra,
    )


def llama_hf_config(cfg: ModelConfig) -> Any:
    return llama_like_hf_config(cfg, "LlamaConfig")


def qwen2_hf_config(cfg: ModelConfig) -> Any:
    window = cfg.sliding_window or None
    return llama_like_hf_config(
        cfg, "Qwen2Config", use_sliding_window=window is not None, sliding_window=window, max_window_layers=0
    )


def mistral_hf_config(cfg: ModelConfig) -> Any:
    return llama_like_hf_config(cfg, "MistralConfig", sliding_window=cfg.sliding_window or None)


def outer(c: Any, cfg: ModelConfig, read: Reader) -> State:
    return read_outer("model.embed_tokens", "model.norm", cfg, read)


def outer_out(sd: State, cfg: ModelConfig) -> State:
    return write_outer(sd, cfg, "model.embed_tokens", "model.norm")


SPLIT = "(head d_head) d_model -> head d_model d_head"  # nn.Linear: y = x Wᵀ
SPLIT_OUT = "d_model (head d_head) -> head d_head d_model"


def layer(c: Any, cfg: ModelConfig, read: Reader, layer: int) -> State:
    h, b, H, kv = f"model.layers.{layer}.", f"blocks.{layer}.", cfg.n_heads, cfg.n_kv_heads
    state = read_norms(b, h, "input_layernorm", "post_attention_layernorm", False, read) | {
        b + "attn.W_Q": heads(read(h + "self_attn.q_proj.weight"), SPLIT, H),
        b + "attn.W_K": heads(read(h + "self_attn.k_proj.weight"), SPLIT, kv),
        b + "attn.W_V": heads(read(h + "self_attn.v_proj.weight"), SPLIT, kv),
        b + "attn.W_O": heads(read(h + "self_attn.o_proj.weight"), SPLIT_OUT, H),
        b + "mlp.W_gate": read(h + "mlp.gate_proj.weight").T,
        b + "mlp.W_in": read(h + "mlp.up_proj.weight").T,
        b + "mlp.W_out": read(h + "mlp.down_proj.weight").T,
    }
    if cfg.qkv_bias:
        for x, n in (("q", H), ("k", kv), ("v", kv)):
            state[b + f"attn.b_{x.upper()}"] = heads(
                read(h + f"self_attn.{x}_proj.bias"), "(head d_head) -> head d_head", n
            )
    return state


def layer_out(sd: State, cfg: ModelConfig, layer: int) -> State:
    h, b = f"model.layers.{layer}.", f"blocks.{layer}."
    merge = "head d_model d_head -> (head d_head) d_model"
    out = write_norms(sd, b, h, "input_layernorm", "post_attention_layernorm", False) | {
        h + "self_attn.q_proj.weight": einops.rearrange(sd[b + "attn.W_Q"], merge),
        h + "self_attn.k_proj.weight": einops.rearrange(sd[b + "attn.W_K"], merge),
        h + "self_attn.v_proj.weight": einops.rearrange(sd[b + "attn.W_V"], merge),
        h + "self_attn.o_proj.weight": einops.rearrange(
            sd[b + "attn.W_O"], "head d_head d_model -> d_model (head d_head)"
        ),
        h + "mlp.gate_proj.weight": sd[b + "mlp.W_gate"].T,
        h + "mlp.up_proj.weight": sd[b + "mlp.W_in"].T,
        h + "mlp.down_proj.weight": sd[b + "mlp.W_out"].T,
    }
    if cfg.qkv_bias:
        out |= {h + f"self_attn.{x.lower()}_proj.bias": sd[b + f"attn.b_{x}"].flatten() for x in "QKV"}
    return out


WEIGHTS = Weights(outer, layer, outer_out, layer_out)  # LLaMA's, Qwen2's and Mistral's
MODULES = {
    "embed": "model.embed_tokens",
    "blocks.{l}": "model.layers.{l}",
    "ln_final": "model.norm",
    "unembed": "lm_head",
}


def tiny(config_class: str, vocab: int, n_kv_heads: int = 2, tie: bool = False, **extra: Any) -> Any:
    import transformers

    return getattr(transformers, config_class)(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=n_kv_heads,
        vocab_size=vocab,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        **extra,
    )


def tiny_llama(vocab: int, n_kv_heads: int = 2, tie: bool = False) -> Any:
    return tiny("LlamaConfig", vocab, n_kv_heads, tie)


def tiny_qwen2(vocab: int, tie: bool = False, window: int = 0, n_kv_heads: int = 2) -> Any:
    """With `window`, sliding-window attention in every layer."""
    return tiny(
        "Qwen2Config",
        vocab,
        n_kv_heads,
        tie,
        use_sliding_window=window > 0,
        sliding_window=window or None,
        max_window_layers=0,
    )


def tiny_mistral(vocab: int, window: int | None = 5, n_kv_heads: int = 2, tie: bool = False) -> Any:
    """Each query sees itself and the window − 1 keys before it."""
    return tiny("MistralConfig", vocab, n_kv_heads, tie, sliding_window=window)


SHAPE = "rotary on every dimension, RMSNorm, SwiGLU, no biases, pre-LN"
LLAMA = Family(
    model_type="llama",
    name="LLaMA",
    config=llama_config,
    shape=llama_shape,
    shape_text=SHAPE + ", no sliding window",
    hf_config=llama_hf_config,
    weights=WEIGHTS,
    modules=MODULES,
    tiny=tiny_llama,
    variants={"llama-gqa": {}, "llama-tied": {"tie": True}},
)
QWEN2 = Family(
    model_type="qwen2",
    name="Qwen2",
    config=qwen2_config,
    shape=qwen2_shape,
    shape_text="LLaMA's with qkv_bias, with or without a sliding window",
    hf_config=qwen2_hf_config,
    weights=WEIGHTS,
    modules=MODULES,
    tiny=tiny_qwen2,
    variants={"qwen2": {}, "qwen2-tied-window": {"tie": True, "window": 6}},
    prepend_bos=False,
)
MISTRAL = Family(
    model_type="mistral",
    name="Mistral",
    config=mistral_config,
    shape=mistral_shape,
    shape_text="LLaMA's with a sliding window",
    hf_config=mistral_hf_config,
    weights=WEIGHTS,
    modules=MODULES,
    tiny=tiny_mistral,
    variants={"mistral-window": {"window": 5}, "mistral-no-window": {"window": None, "n_kv_heads": 4}},
)
