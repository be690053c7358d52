"""GPT-2: learned positions, LayerNorm, biases everywhere, pre-LN blocks; Conv1D layers (y = x W + b) and one fused
Q/K/V projection."""

from typing import Any

import einops
import torch

from lab.hf.family import (
    EXPORT_ACTIVATIONS,
    Family,
    Reader,
    State,
    Weights,
    activation,
    heads,
    read_norms,
    read_outer,
    variant,
    write_norms,
    write_outer,
)
from lab.model.config import ModelConfig


def config(c: Any) -> ModelConfig:
    mlp = activation(c.activation_function, "GPT-2")
    if not c.scale_attn_weights or c.scale_attn_by_inverse_layer_idx or c.reorder_and_upcast_attn:
        raise variant("GPT-2 with non-standard attention scaling")
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


def shape(cfg: ModelConfig) -> bool:
    return (
        cfg.positions == "learned"
        and cfg.norm == "layernorm"
        and cfg.block == "pre_ln"
        and cfg.bias
        and cfg.mlp in EXPORT_ACTIVATIONS
        and cfg.n_kv_heads == cfg.n_heads
        and cfg.d_head * cfg.n_heads == cfg.d_model
        and not cfg.sliding_window
    )


def hf_config(cfg: ModelConfig) -> Any:
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=cfg.d_vocab,
        n_positions=cfg.n_ctx,
        n_embd=cfg.d_model,
        n_layer=cfg.n_layers,
        n_head=cfg.n_heads,
        n_inner=cfg.d_mlp,
        activation_function=EXPORT_ACTIVATIONS[cfg.mlp],
        layer_norm_epsilon=cfg.norm_eps,
        tie_word_embeddings=cfg.tied_embeddings,
        bos_token_id=None,
        eos_token_id=None,
    )


SPLIT = "d_model (head d_head) -> head d_model d_head"
SPLIT_BIAS = "(head d_head) -> head d_head"
SPLIT_OUT = "(head d_head) d_model -> head d_head d_model"


def outer(c: Any, cfg: ModelConfig, read: Reader) -> State:
    return read_outer("transformer.wte", "transformer.ln_f", cfg, read, positions="transformer.wpe")


def outer_out(sd: State, cfg: ModelConfig) -> State:
    return write_outer(sd, cfg, "transformer.wte", "transformer.ln_f") | {
        "transformer.wpe.weight": sd["pos_embed.W_pos"]
    }


def layer(c: Any, cfg: ModelConfig, read: Reader, layer: int) -> State:
    h, b, H = f"transformer.h.{layer}.", f"blocks.{layer}.", cfg.n_heads
    W_Q, W_K, W_V = read(h + "attn.c_attn.weight").chunk(3, dim=1)
    b_Q, b_K, b_V = read(h + "attn.c_attn.bias").chunk(3)
    return read_norms(b, h, "ln_1", "ln_2", True, read) | {
        b + "attn.W_Q": heads(W_Q, SPLIT, H),
        b + "attn.W_K": heads(W_K, SPLIT, H),
        b + "attn.W_V": heads(W_V, SPLIT, H),
        b + "attn.b_Q": heads(b_Q, SPLIT_BIAS, H),
        b + "attn.b_K": heads(b_K, SPLIT_BIAS, H),
        b + "attn.b_V": heads(b_V, SPLIT_BIAS, H),
        b + "attn.W_O": heads(read(h + "attn.c_proj.weight"), SPLIT_OUT, H),
        b + "attn.b_O": read(h + "attn.c_proj.bias"),
        b + "mlp.W_in": read(h + "mlp.c_fc.weight"),
        b + "mlp.b_in": read(h + "mlp.c_fc.bias"),
        b + "mlp.W_out": read(h + "mlp.c_proj.weight"),
        b + "mlp.b_out": read(h + "mlp.c_proj.bias"),
    }


def layer_out(sd: State, cfg: ModelConfig, layer: int) -> State:
    h, b = f"transformer.h.{layer}.", f"blocks.{layer}."
    merge = "head d_model d_head -> d_model (head d_head)"
    return write_norms(sd, b, h, "ln_1", "ln_2", True) | {
        h + "attn.c_attn.weight": torch.cat([einops.rearrange(sd[b + f"attn.W_{x}"], merge) for x in "QKV"], dim=1),
        h + "attn.c_attn.bias": torch.cat([sd[b + f"attn.b_{x}"].flatten() for x in "QKV"]),
        h + "attn.c_proj.weight": einops.rearrange(sd[b + "attn.W_O"], "head d_head d_model -> (head d_head) d_model"),
        h + "attn.c_proj.bias": sd[b + "attn.b_O"],
        h + "mlp.c_fc.weight": sd[b + "mlp.W_in"],
        h + "mlp.c_fc.bias": sd[b + "mlp.b_in"],
        h + "mlp.c_proj.weight": sd[b + "mlp.W_out"],
        h + "mlp.c_proj.bias": sd[b + "mlp.b_out"],
    }


def tiny(vocab: int, tie: bool = True) -> Any:
    from transformers import GPT2Config

    return GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        vocab_size=vocab,
        n_positions=64,
        tie_word_embeddings=tie,
        bos_token_id=None,
        eos_token_id=None,
    )


GPT2 = Family(
    model_type="gpt2",
    name="GPT-2",
    config=config,
    shape=shape,
    shape_text="learned positions, LayerNorm, biases, pre-LN, d_head · n_heads = d_model, no sliding window",
    hf_config=hf_config,
    weights=Weights(outer, layer, outer_out, layer_out),
    modules={
        "embed": "transformer.wte",
        "pos_embed": "transformer.wpe",
        "blocks.{l}": "transformer.h.{l}",
        "ln_final": "transformer.ln_f",
        "unembed": "lm_head",
    },
    tiny=tiny,
    variants={"gpt2": {}, "gpt2-untied": {"tie": False}},
)
