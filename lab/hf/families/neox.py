"""GPT-NeoX / Pythia: rotary positions on the first rotary_dim dimensions of each head, LayerNorm, biases, and
parallel (x + attn(ln1(x)) + mlp(ln2(x))) or pre-LN blocks; one fused Q/K/V projection laid out head by head."""

from typing import Any

import einops
import torch

from lab.hf.family import (
    EXPORT_ACTIVATIONS,
    Family,
    Reader,
    State,
    UnsupportedArchitecture,
    Weights,
    activation,
    heads,
    read_norms,
    read_outer,
    rope,
    variant,
    write_norms,
    write_outer,
)
from lab.model.config import ModelConfig


def config(c: Any) -> ModelConfig:
    if not c.attention_bias:
        raise variant("GPT-NeoX without attention biases (attention_bias = false)")
    base, fraction = rope(c, "GPT-NeoX")
    d_head = c.hidden_size // c.num_attention_heads
    rotary_dim = int(d_head * fraction)  # as transformers computes it (GPTNeoXAttention.rotary_ndims)
    if rotary_dim == 0:
        raise variant(f"GPT-NeoX with no rotating dimension (partial_rotary_factor {fraction})")
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
        mlp=activation(c.hidden_act, "GPT-NeoX"),
        block="parallel" if c.use_parallel_residual else "pre_ln",
        tied_embeddings=c.tie_word_embeddings,
        bias=True,
    )


def shape(cfg: ModelConfig) -> bool:
    return (
        cfg.positions == "rotary"
        and cfg.norm == "layernorm"
        and cfg.block in ("pre_ln", "parallel")
        and cfg.bias
        and cfg.mlp in EXPORT_ACTIVATIONS
        and cfg.n_kv_heads == cfg.n_heads
        and cfg.d_head * cfg.n_heads == cfg.d_model
        and not cfg.sliding_window
    )


def hf_config(cfg: ModelConfig) -> Any:
    from transformers import GPTNeoXConfig

    fraction = cfg.rotary_dim / cfg.d_head
    if int(cfg.d_head * fraction) != cfg.rotary_dim:  # transformers truncates d_head · fraction
        raise UnsupportedArchitecture(f"GPT-NeoX cannot express rotary_dim {cfg.rotary_dim} of d_head {cfg.d_head}")
    return GPTNeoXConfig(
        vocab_size=cfg.d_vocab,
        hidden_size=cfg.d_model,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        intermediate_size=cfg.d_mlp,
        hidden_act=EXPORT_ACTIVATIONS[cfg.mlp],
        max_position_embeddings=cfg.n_ctx,
        layer_norm_eps=cfg.norm_eps,
        tie_word_embeddings=cfg.tied_embeddings,
        use_parallel_residual=cfg.block == "parallel",
        attention_bias=True,
        bos_token_id=None,
        eos_token_id=None,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rotary_base, "partial_rotary_factor": fraction},
    )


# GPT-NeoX lays its fused QKV projection out head by head: rows [q_h; k_h; v_h] for each head h.
QKV = "(head three d_head) d_model -> three head d_model d_head"
QKV_BIAS = "(head three d_head) -> three head d_head"


def outer(c: Any, cfg: ModelConfig, read: Reader) -> State:
    return read_outer("gpt_neox.embed_in", "gpt_neox.final_layer_norm", cfg, read)


def outer_out(sd: State, cfg: ModelConfig) -> State:
    return write_outer(sd, cfg, "gpt_neox.embed_in", "gpt_neox.final_layer_norm")


def layer(c: Any, cfg: ModelConfig, read: Reader, layer: int) -> State:
    h, b, H = f"gpt_neox.layers.{layer}.", f"blocks.{layer}.", cfg.n_heads
    W_Q, W_K, W_V = einops.rearrange(read(h + "attention.query_key_value.weight"), QKV, head=H, three=3)
    b_Q, b_K, b_V = einops.rearrange(read(h + "attention.query_key_value.bias"), QKV_BIAS, head=H, three=3)
    return read_norms(b, h, "input_layernorm", "post_attention_layernorm", True, read) | {
        b + "attn.W_Q": W_Q,
        b + "attn.W_K": W_K,
        b + "attn.W_V": W_V,
        b + "attn.b_Q": b_Q,
        b + "attn.b_K": b_K,
        b + "attn.b_V": b_V,
        b + "attn.W_O": heads(read(h + "attention.dense.weight"), "d_model (head d_head) -> head d_head d_model", H),
        b + "attn.b_O": read(h + "attention.dense.bias"),
        b + "mlp.W_in": read(h + "mlp.dense_h_to_4h.weight").T,
        b + "mlp.b_in": read(h + "mlp.dense_h_to_4h.bias"),
        b + "mlp.W_out": read(h + "mlp.dense_4h_to_h.weight").T,
        b + "mlp.b_out": read(h + "mlp.dense_4h_to_h.bias"),
    }


def layer_out(sd: State, cfg: ModelConfig, layer: int) -> State:
    h, b = f"gpt_neox.layers.{layer}.", f"blocks.{layer}."
    W = torch.stack([sd[b + f"attn.W_{x}"] for x in "QKV"])
    bias = torch.stack([sd[b + f"attn.b_{x}"] for x in "QKV"])
    return write_norms(sd, b, h, "input_layernorm", "post_attention_layernorm", True) | {
        h + "attention.query_key_value.weight": einops.rearrange(
            W, "three head d_model d_head -> (head three d_head) d_model"
        ),
        h + "attention.query_key_value.bias": einops.rearrange(bias, "three head d_head -> (head three d_head)"),
        h + "attention.dense.weight": einops.rearrange(
            sd[b + "attn.W_O"], "head d_head d_model -> d_model (head d_head)"
        ),
        h + "attention.dense.bias": sd[b + "attn.b_O"],
        h + "mlp.dense_h_to_4h.weight": sd[b + "mlp.W_in"].T,
        h + "mlp.dense_h_to_4h.bias": sd[b + "mlp.b_in"],
        h + "mlp.dense_4h_to_h.weight": sd[b + "mlp.W_out"].T,
        h + "mlp.dense_4h_to_h.bias": sd[b + "mlp.b_out"],
    }


def tiny(vocab: int, parallel: bool = True, rotary_pct: float = 0.25, tie: bool = False, act: str = "gelu") -> Any:
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=vocab,
        max_position_embeddings=64,
        rotary_pct=rotary_pct,
        hidden_act=act,
        use_parallel_residual=parallel,
        tie_word_embeddings=tie,
        bos_token_id=None,
        eos_token_id=None,
    )


NEOX = Family(
    model_type="gpt_neox",
    name="GPT-NeoX / Pythia",
    config=config,
    shape=shape,
    shape_text=(
        "rotary positions, LayerNorm, biases, pre-LN or parallel blocks, d_head · n_heads = d_model, no sliding window"
    ),
    hf_config=hf_config,
    weights=Weights(outer, layer, outer_out, layer_out),
    modules={
        "embed": "gpt_neox.embed_in",
        "blocks.{l}": "gpt_neox.layers.{l}",
        "ln_final": "gpt_neox.final_layer_norm",
        "unembed": "lm_head",
    },
    tiny=tiny,
    variants={
        "neox-parallel": {},
        "neox-sequential-tied": {"parallel": False, "rotary_pct": 0.5, "tie": True, "act": "gelu_new"},
        "neox-full-rotary": {"rotary_pct": 1.0, "act": "relu"},
    },
    prepend_bos=False,
)
