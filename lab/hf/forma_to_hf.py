"""Forma → Hugging Face: which family a Forma model's shape exports as (`export_family`), and for each
family the same network as its transformers class, weights rewritten from Forma's per-head layout
(`lab.hf.convert.to_hf` chooses and checks; `FAMILIES` names each family's exporter)."""

from typing import Any

import einops
import torch
from torch import Tensor

from lab.hf.family import UnsupportedArchitecture
from lab.model import HookedTransformer, ModelConfig
from lab.model.offload import read_weight

# Forma's MLP and the Hugging Face activation name it exports as (lab.hf.hf_to_forma.HF_ACTIVATIONS reads them back).
EXPORT_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}
EXPORT_SHAPES = (
    "to_hf exports these shapes only: GPT-2 (learned positions, LayerNorm, biases, pre-LN, d_head · n_heads = "
    "d_model, no sliding window); GPT-NeoX (rotary positions, LayerNorm, biases, pre-LN or parallel blocks, "
    "d_head · n_heads = d_model, no sliding window); LLaMA (rotary on every dimension, RMSNorm, SwiGLU, no biases, "
    "pre-LN); Mistral (LLaMA with a sliding window); Qwen2 (LLaMA with qkv_bias, with or without a sliding window)"
)


def export_family(cfg: ModelConfig) -> str:
    """The Hugging Face model_type that `to_hf` writes a model of this config as; UnsupportedArchitecture when
    no family has its shape."""
    if cfg.d_vocab_out != cfg.d_vocab:
        raise UnsupportedArchitecture(
            f"no Hugging Face family has d_vocab_out ({cfg.d_vocab_out}) other than d_vocab ({cfg.d_vocab})"
        )
    llama_like = (
        cfg.positions == "rotary"
        and cfg.rotary_dim == cfg.d_head
        and cfg.norm == "rmsnorm"
        and cfg.block == "pre_ln"
        and cfg.mlp == "swiglu"
        and not cfg.bias
    )
    if llama_like:
        return "qwen2" if cfg.qkv_bias else "mistral" if cfg.sliding_window else "llama"
    plain_heads = cfg.n_kv_heads == cfg.n_heads and cfg.d_head * cfg.n_heads == cfg.d_model
    if (
        cfg.norm == "layernorm"
        and cfg.bias
        and plain_heads
        and cfg.mlp in EXPORT_ACTIVATIONS
        and not cfg.sliding_window
    ):
        if cfg.positions == "learned" and cfg.block == "pre_ln":
            return "gpt2"
        if cfg.positions == "rotary" and cfg.block in ("pre_ln", "parallel"):
            return "gpt_neox"
    raise UnsupportedArchitecture(EXPORT_SHAPES)


def _forma_state(model: HookedTransformer) -> dict[str, Tensor]:
    """Every weight as float32 on the CPU (an offloaded block's read from its store)."""
    return {k: read_weight(model, k).detach().float().cpu() for k in model.state_dict()}


def _export_outer(sd: dict[str, Tensor], cfg: ModelConfig, embed: str, final_norm: str) -> dict[str, Tensor]:
    out = {
        embed + ".weight": sd["embed.W_E"],
        final_norm + ".weight": sd["ln_final.w"],
        "lm_head.weight": sd["embed.W_E"] if cfg.tied_embeddings else sd["unembed.W_U"].T,
    }
    if cfg.norm == "layernorm":
        out[final_norm + ".bias"] = sd["ln_final.b"]
    return out


def _export_norms(sd: dict[str, Tensor], b: str, h: str, first: str, second: str, layernorm: bool) -> dict[str, Tensor]:
    out = {h + first + ".weight": sd[b + "ln1.w"], h + second + ".weight": sd[b + "ln2.w"]}
    if layernorm:
        out |= {h + first + ".bias": sd[b + "ln1.b"], h + second + ".bias": sd[b + "ln2.b"]}
    return out


def _forma_to_gpt2(model: HookedTransformer) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = model.cfg
    hf_cfg = GPT2Config(
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
    sd = _forma_state(model)
    out = _export_outer(sd, cfg, "transformer.wte", "transformer.ln_f") | {
        "transformer.wpe.weight": sd["pos_embed.W_pos"]
    }
    merge = "head d_model d_head -> d_model (head d_head)"
    for l in range(cfg.n_layers):
        h, b = f"transformer.h.{l}.", f"blocks.{l}."
        out |= _export_norms(sd, b, h, "ln_1", "ln_2", True) | {
            h + "attn.c_attn.weight": torch.cat([einops.rearrange(sd[b + f"attn.W_{x}"], merge) for x in "QKV"], dim=1),
            h + "attn.c_attn.bias": torch.cat([sd[b + f"attn.b_{x}"].flatten() for x in "QKV"]),
            h + "attn.c_proj.weight": einops.rearrange(
                sd[b + "attn.W_O"], "head d_head d_model -> (head d_head) d_model"
            ),
            h + "attn.c_proj.bias": sd[b + "attn.b_O"],
            h + "mlp.c_fc.weight": sd[b + "mlp.W_in"],
            h + "mlp.c_fc.bias": sd[b + "mlp.b_in"],
            h + "mlp.c_proj.weight": sd[b + "mlp.W_out"],
            h + "mlp.c_proj.bias": sd[b + "mlp.b_out"],
        }
    return _load_hf_state(GPT2LMHeadModel(hf_cfg), out)


def _forma_to_neox(model: HookedTransformer) -> Any:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = model.cfg
    hf_cfg = GPTNeoXConfig(
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
        rope_parameters={
            "rope_type": "default",
            "rope_theta": cfg.rotary_base,
            "partial_rotary_factor": cfg.rotary_dim / cfg.d_head,
        },
    )
    hf = GPTNeoXForCausalLM(hf_cfg)
    if hf.gpt_neox.layers[0].attention.rotary_ndims != cfg.rotary_dim:  # transformers truncates d_head · fraction
        raise UnsupportedArchitecture(f"GPT-NeoX cannot express rotary_dim {cfg.rotary_dim} of d_head {cfg.d_head}")
    sd = _forma_state(model)
    out = _export_outer(sd, cfg, "gpt_neox.embed_in", "gpt_neox.final_layer_norm")
    for l in range(cfg.n_layers):
        h, b = f"gpt_neox.layers.{l}.", f"blocks.{l}."
        W = torch.stack([sd[b + f"attn.W_{x}"] for x in "QKV"])
        bias = torch.stack([sd[b + f"attn.b_{x}"] for x in "QKV"])
        out |= _export_norms(sd, b, h, "input_layernorm", "post_attention_layernorm", True) | {
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
    return _load_hf_state(hf, out)


def _forma_to_llama_like(model: HookedTransformer) -> Any:
    import transformers

    cfg = model.cfg
    family = export_family(cfg)
    window = cfg.sliding_window or None
    config_class, model_class, extra = {
        "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
        "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": window}),
        "qwen2": (
            "Qwen2Config",
            "Qwen2ForCausalLM",
            {"use_sliding_window": window is not None, "sliding_window": window, "max_window_layers": 0},
        ),
    }[family]
    hf_cfg = getattr(transformers, config_class)(
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
    sd = _forma_state(model)
    out = _export_outer(sd, cfg, "model.embed_tokens", "model.norm")
    merge = "head d_model d_head -> (head d_head) d_model"
    for l in range(cfg.n_layers):
        h, b = f"model.layers.{l}.", f"blocks.{l}."
        out |= _export_norms(sd, b, h, "input_layernorm", "post_attention_layernorm", False) | {
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
    return _load_hf_state(getattr(transformers, model_class)(hf_cfg), out)


def _load_hf_state(hf: Any, state: dict[str, Tensor]) -> Any:
    """Load the exported weights (every one the HF model has, or a ValueError naming those left unset)."""
    expected = set(hf.state_dict())
    missing = sorted(
        k for k in expected - state.keys() if not k.endswith("attn.bias") and not k.endswith("masked_bias")
    )
    unexpected = sorted(state.keys() - expected)
    if missing or unexpected:
        raise ValueError(f"export does not match the Hugging Face model: unset {missing[:5]}, unknown {unexpected[:5]}")
    hf.load_state_dict({k: v.contiguous() for k, v in state.items()}, strict=False)
    return hf.eval()
