"""Hugging Face → Forma, per family: how each architecture's config reads as a ModelConfig (a variant Forma
does not convert is an UnsupportedArchitecture), and which of its tensors make each Forma module — the outer
ones (embedding, positions, final norm, unembedding) and one block — rewritten into Forma's per-head layout
(W_Q [head, d_model, d_head], W_O [head, d_head, d_model], ...). `lab.hf.convert.FAMILIES` puts them together."""

from typing import Any

import einops
import torch
from torch import Tensor

from lab.hf.family import Reader, _variant
from lab.model import ModelConfig

# Hugging Face activation names (transformers' ACT2FN) and Forma's MLP for each; GPT-2 calls tanh-GELU "gelu_new".
HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
}


def _activation(name: str, family: str) -> str:
    if name not in HF_ACTIVATIONS:
        raise _variant(f"{family} activation {name!r}")
    return HF_ACTIVATIONS[name]


def _rope(c: Any, family: str) -> tuple[float, float]:
    """(θ base, fraction of each head's dimensions that rotate) of a default (unscaled) rotary embedding."""
    params = getattr(c, "rope_parameters", None) or {}
    if params.get("rope_type", "default") != "default":
        raise _variant(f"{family} rope scaling {params.get('rope_type')!r}")
    return (
        float(params.get("rope_theta", getattr(c, "rope_theta", 10000.0))),
        float(params.get("partial_rotary_factor", 1.0)),
    )


def _heads(W: Tensor, pattern: str, n_heads: int) -> Tensor:
    return einops.rearrange(W, pattern, head=n_heads)


def _outer(
    embed: str, final_norm: str, cfg: ModelConfig, read: Reader, positions: str | None = None
) -> dict[str, Tensor]:
    """W_E, the final norm, b_U (zero: Hugging Face's heads have none), W_U unless tied, W_pos if learned."""
    state = {
        "embed.W_E": read(embed + ".weight"),
        "ln_final.w": read(final_norm + ".weight"),
        "unembed.b_U": torch.zeros(cfg.d_vocab),
    }
    if cfg.norm == "layernorm":
        state["ln_final.b"] = read(final_norm + ".bias")
    if not cfg.tied_embeddings:
        state["unembed.W_U"] = read("lm_head.weight").T
    if positions is not None:
        state["pos_embed.W_pos"] = read(positions + ".weight")
    return state


def _norms(b: str, h: str, first: str, second: str, layernorm: bool, read: Reader) -> dict[str, Tensor]:
    state = {b + "ln1.w": read(h + first + ".weight"), b + "ln2.w": read(h + second + ".weight")}
    if layernorm:
        state |= {b + "ln1.b": read(h + first + ".bias"), b + "ln2.b": read(h + second + ".bias")}
    return state


# --- GPT-2 -----------------------------------------------------------------------------------
def _gpt2_config(c: Any) -> ModelConfig:
    mlp = _activation(c.activation_function, "GPT-2")
    if not c.scale_attn_weights or c.scale_attn_by_inverse_layer_idx or c.reorder_and_upcast_attn:
        raise _variant("GPT-2 with non-standard attention scaling")
    return ModelConfig(
        d_vocab=c.vocab_size,
        d_model=c.n_embd,
        n_layers=c.n_layer,
        n_heads=c.n_head,
        n_ctx=c.n_positions,
        d_mlp=c.n_inner or 4 * c.n_embd,
        positions="learned",
        norm="layernorm",
        norm_eps=c.layer_norm_epsilon,
        mlp=mlp,
        block="pre_ln",
        tied_embeddings=c.tie_word_embeddings,
        bias=True,
    )


def _gpt2_outer(c: Any, cfg: ModelConfig, read: Reader) -> dict[str, Tensor]:
    return _outer("transformer.wte", "transformer.ln_f", cfg, read, positions="transformer.wpe")


def _gpt2_layer(c: Any, cfg: ModelConfig, read: Reader, layer: int) -> dict[str, Tensor]:
    h, b, H = f"transformer.h.{layer}.", f"blocks.{layer}.", cfg.n_heads
    W_Q, W_K, W_V = read(h + "attn.c_attn.weight").chunk(3, dim=1)  # Conv1D: y = x W + b
    b_Q, b_K, b_V = read(h + "attn.c_attn.bias").chunk(3)
    split, split_bias = "d_model (head d_head) -> head d_model d_head", "(head d_head) -> head d_head"
    return _norms(b, h, "ln_1", "ln_2", True, read) | {
        b + "attn.W_Q": _heads(W_Q, split, H),
        b + "attn.W_K": _heads(W_K, split, H),
        b + "attn.W_V": _heads(W_V, split, H),
        b + "attn.b_Q": _heads(b_Q, split_bias, H),
        b + "attn.b_K": _heads(b_K, split_bias, H),
        b + "attn.b_V": _heads(b_V, split_bias, H),
        b + "attn.W_O": _heads(read(h + "attn.c_proj.weight"), "(head d_head) d_model -> head d_head d_model", H),
        b + "attn.b_O": read(h + "attn.c_proj.bias"),
        b + "mlp.W_in": read(h + "mlp.c_fc.weight"),
        b + "mlp.b_in": read(h + "mlp.c_fc.bias"),
        b + "mlp.W_out": read(h + "mlp.c_proj.weight"),
        b + "mlp.b_out": read(h + "mlp.c_proj.bias"),
    }


# --- GPT-NeoX / Pythia -----------------------------------------------------------------------
def _neox_config(c: Any) -> ModelConfig:
    if not c.attention_bias:
        raise _variant("GPT-NeoX without attention biases (attention_bias = false)")
    base, fraction = _rope(c, "GPT-NeoX")
    d_head = c.hidden_size // c.num_attention_heads
    rotary_dim = int(d_head * fraction)  # as transformers computes it (GPTNeoXAttention.rotary_ndims)
    if rotary_dim == 0:
        raise _variant(f"GPT-NeoX with no rotating dimension (partial_rotary_factor {fraction})")
    return ModelConfig(
        d_vocab=c.vocab_size,
        d_model=c.hidden_size,
        n_layers=c.num_hidden_layers,
        n_heads=c.num_attention_heads,
        n_ctx=c.max_position_embeddings,
        d_head=d_head,
        d_mlp=c.intermediate_size,
        positions="rotary",
        rotary_dim=rotary_dim,
        rotary_base=base,
        norm="layernorm",
        norm_eps=c.layer_norm_eps,
        mlp=_activation(c.hidden_act, "GPT-NeoX"),
        block="parallel" if c.use_parallel_residual else "pre_ln",
        tied_embeddings=c.tie_word_embeddings,
        bias=True,
    )


def _neox_outer(c: Any, cfg: ModelConfig, read: Reader) -> dict[str, Tensor]:
    return _outer("gpt_neox.embed_in", "gpt_neox.final_layer_norm", cfg, read)


# GPT-NeoX lays its fused QKV projection out head by head: rows [q_h; k_h; v_h] for each head h.
NEOX_QKV = "(head three d_head) d_model -> three head d_model d_head"
NEOX_QKV_BIAS = "(head three d_head) -> three head d_head"


def _neox_layer(c: Any, cfg: ModelConfig, read: Reader, layer: int) -> dict[str, Tensor]:
    h, b, H = f"gpt_neox.layers.{layer}.", f"blocks.{layer}.", cfg.n_heads
    W_Q, W_K, W_V = einops.rearrange(read(h + "attention.query_key_value.weight"), NEOX_QKV, head=H, three=3)
    b_Q, b_K, b_V = einops.rearrange(read(h + "attention.query_key_value.bias"), NEOX_QKV_BIAS, head=H, three=3)
    return _norms(b, h, "input_layernorm", "post_attention_layernorm", True, read) | {
        b + "attn.W_Q": W_Q,
        b + "attn.W_K": W_K,
        b + "attn.W_V": W_V,
        b + "attn.b_Q": b_Q,
        b + "attn.b_K": b_K,
        b + "attn.b_V": b_V,
        b + "attn.W_O": _heads(read(h + "attention.dense.weight"), "d_model (head d_head) -> head d_head d_model", H),
        b + "attn.b_O": read(h + "attention.dense.bias"),
        b + "mlp.W_in": read(h + "mlp.dense_h_to_4h.weight").T,
        b + "mlp.b_in": read(h + "mlp.dense_h_to_4h.bias"),
        b + "mlp.W_out": read(h + "mlp.dense_4h_to_h.weight").T,
        b + "mlp.b_out": read(h + "mlp.dense_4h_to_h.bias"),
    }


# --- LLaMA, Qwen2, Mistral: one layout, with Q/K/V biases (Qwen2) or a sliding window (Mistral, Qwen2) ---------
def _llama_like_config(c: Any, family: str, qkv_bias: bool = False, sliding_window: int = 0) -> ModelConfig:
    if c.hidden_act != "silu":
        raise _variant(f"{family} with a {c.hidden_act!r} gate (only SiLU: SwiGLU)")
    base, fraction = _rope(c, family)
    if fraction != 1.0:
        raise _variant(f"{family} with partial rotary embeddings")
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


def _llama_config(c: Any) -> ModelConfig:
    if getattr(c, "attention_bias", False) or getattr(c, "mlp_bias", False):
        raise _variant("LLaMA with attention or MLP biases")
    return _llama_like_config(c, "LLaMA")


def _qwen2_config(c: Any) -> ModelConfig:
    kinds = set(getattr(c, "layer_types", None) or ["full_attention"])
    if kinds - {"full_attention", "sliding_attention"} or len(kinds) > 1:
        raise _variant(
            f"Qwen2 with a sliding window in some layers only (layer_types {sorted(kinds)}; Forma's "
            "sliding_window applies to every layer)"
        )
    window = c.sliding_window if kinds == {"sliding_attention"} else 0
    return _llama_like_config(c, "Qwen2", qkv_bias=True, sliding_window=window)


def _mistral_config(c: Any) -> ModelConfig:
    return _llama_like_config(c, "Mistral", sliding_window=c.sliding_window or 0)


def _llama_outer(c: Any, cfg: ModelConfig, read: Reader) -> dict[str, Tensor]:
    return _outer("model.embed_tokens", "model.norm", cfg, read)


def _llama_layer(c: Any, cfg: ModelConfig, read: Reader, layer: int) -> dict[str, Tensor]:
    h, b, H, kv = f"model.layers.{layer}.", f"blocks.{layer}.", cfg.n_heads, cfg.n_kv_heads
    split = "(head d_head) d_model -> head d_model d_head"  # nn.Linear: y = x Wᵀ
    state = _norms(b, h, "input_layernorm", "post_attention_layernorm", False, read) | {
        b + "attn.W_Q": _heads(read(h + "self_attn.q_proj.weight"), split, H),
        b + "attn.W_K": _heads(read(h + "self_attn.k_proj.weight"), split, kv),
        b + "attn.W_V": _heads(read(h + "self_attn.v_proj.weight"), split, kv),
        b + "attn.W_O": _heads(read(h + "self_attn.o_proj.weight"), "d_model (head d_head) -> head d_head d_model", H),
        b + "mlp.W_gate": read(h + "mlp.gate_proj.weight").T,
        b + "mlp.W_in": read(h + "mlp.up_proj.weight").T,
        b + "mlp.W_out": read(h + "mlp.down_proj.weight").T,
    }
    if cfg.qkv_bias:
        for x, n in (("q", H), ("k", kv), ("v", kv)):
            state[b + f"attn.b_{x.upper()}"] = _heads(
                read(h + f"self_attn.{x}_proj.bias"), "(head d_head) -> head d_head", n
            )
    return state
