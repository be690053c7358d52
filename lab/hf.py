"""Hugging Face interop: weights in and out for the GPT-2, LLaMA, GPT-NeoX / Pythia, Qwen2 and Mistral families,
and a bridge for the rest.

`from_hf(hf_model)` rewrites an HF causal LM's weights into Forma's per-head layout
(W_Q [head, d_model, d_head], W_O [head, d_head, d_model], ...); `to_hf(model)` does the inverse.
Both are exact: logits agree to float32 round-off (tested, per family and direction). Each family is
one entry of `FAMILIES`: how its config reads as a ModelConfig, which of its tensors make each Forma
module, and which of its modules holds each Forma module (for device maps). Any other architecture
goes through TransformerLens's TransformerBridge (`bridge(path)`), which hooks the HF module tree
directly.

Nothing is fetched from a hub: `load_hf` and `bridge` read a local `save_pretrained` folder only, and only if
its safetensors hold exactly the tensors its config.json describes.

Big models: `load_hf(path, device_map=...)` converts one block at a time into a model whose parameters
start on the meta device, puts each block where the map says (a device, the CPU, or an offload folder
on disk) and lets accelerate move the offloaded ones in around their forward pass. The folder's
weights are read straight from its safetensors (transformers indexes them without loading anything),
so memory holds the placed model plus one block being converted, never a second copy of the model.
"""

import json
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import einops
import torch
from torch import Tensor, nn

from lab.model import HookedTransformer, ModelConfig
from lab.model.components import Rotary, SinusoidalPositions
from lab.model.offload import read_weight

SUPPORTED = ("gpt2", "llama", "gpt_neox", "qwen2", "mistral")  # Hugging Face model_type of each family
FAMILY_NAMES = {"gpt2": "GPT-2", "llama": "LLaMA", "gpt_neox": "GPT-NeoX / Pythia", "qwen2": "Qwen2",
                "mistral": "Mistral"}


class UnsupportedArchitecture(ValueError):
    pass


def _unsupported(model_type: str) -> UnsupportedArchitecture:
    return UnsupportedArchitecture(
        f"Forma converts {', '.join(FAMILY_NAMES.values())} models ({SUPPORTED}) into its own HookedTransformer; "
        f"{model_type!r} is not one of them. Wrap it instead with lab.hf.bridge(path), which uses TransformerLens's "
        "TransformerBridge and exposes the same hook names on the Hugging Face module tree.")


def _variant(what: str) -> UnsupportedArchitecture:
    """A family Forma converts, in a variant it does not."""
    return UnsupportedArchitecture(f"{what} is not supported by Forma's conversion; wrap the model with "
                                   "lab.hf.bridge(path) (TransformerLens's TransformerBridge) instead")


Reader = Callable[[str], Tensor]  # a Hugging Face tensor by its state-dict name


@dataclass(frozen=True)
class Family:
    """How one Hugging Face architecture maps onto Forma's HookedTransformer."""

    config: Callable[[Any], ModelConfig]  # the HF config as a ModelConfig; UnsupportedArchitecture for a variant
    outer: Callable[[Any, ModelConfig, Reader], dict[str, Tensor]]  # embed, positions, final norm, unembed
    layer: Callable[[Any, ModelConfig, Reader, int], dict[str, Tensor]]  # blocks.{layer}
    modules: dict[str, str]  # Forma module -> the HF module holding its weights; "{l}" stands for the layer
    export: Callable[[HookedTransformer], Any]  # the same network as this family's HF class


# --------------------------------------------------------------------------------------------
# Hugging Face → Forma
# --------------------------------------------------------------------------------------------
def from_hf(hf_model: Any, tokenizer: Any = None, dtype: torch.dtype = torch.float32) -> HookedTransformer:
    """A HookedTransformer (on the CPU, eval mode, weights in `dtype`) with the weights of an HF causal LM of
    a family in SUPPORTED. The HF model may itself be spread over devices or offloaded by accelerate.

    The model's tensors are first checked against what its config describes (the same class built on the
    meta device): a missing, unexpected or mis-shaped one is a ValueError naming it."""
    model_type = getattr(hf_model.config, "model_type", type(hf_model).__name__)
    family = _family(model_type)
    with _quiet_transformers():
        _check_against_config(hf_model)
    model = empty_model(_config(family, model_type, hf_model.config), tokenizer)
    _convert_into(model, family, hf_model, lambda name, tensor: _assign(model, name, tensor, "cpu", dtype))
    return model.eval()


def _family(model_type: str) -> Family:
    if model_type not in FAMILIES:
        raise _unsupported(model_type)
    return FAMILIES[model_type]


def _config(family: Family, model_type: str, hf_config: Any) -> ModelConfig:
    try:
        return family.config(hf_config)
    except UnsupportedArchitecture:
        raise
    except ValueError as err:
        raise ValueError(f"the Hugging Face {model_type} config does not describe a Forma model: {err}") from err


def empty_model(cfg: ModelConfig, tokenizer: Any = None) -> HookedTransformer:
    """HookedTransformer(cfg) with its parameters on the meta device (no memory, no random initialisation) and
    its fixed tables (rotary cos/sin, sinusoidal positions) computed on the CPU: a frame to load weights into."""
    with torch.device("meta"):
        model = HookedTransformer(cfg, tokenizer=tokenizer)
    # The tables depend on the config only, so one CPU instance of each owner serves every layer.
    owners: dict[type, Callable[[], nn.Module]] = {Rotary: lambda: Rotary(cfg),
                                                   SinusoidalPositions: lambda: SinusoidalPositions(cfg, None)}
    built: dict[type, nn.Module] = {}
    for module in model.modules():
        for name, buffer in list(module.named_buffers(recurse=False)):
            if buffer.is_meta:
                kind = type(module)
                if kind not in owners:
                    raise TypeError(f"{kind.__name__}.{name} is a fixed table that empty_model cannot compute")
                built.setdefault(kind, owners[kind]())
                module.register_buffer(name, getattr(built[kind], name), persistent=False)
    return model


def _assign(model: nn.Module, name: str, tensor: Tensor, device: Any, dtype: torch.dtype) -> None:
    """Make `tensor` (copied, contiguous, in `dtype` on `device`) the model's parameter `name`."""
    module_name, _, attr = name.rpartition(".")
    module = model.get_submodule(module_name)
    value = torch.empty(tensor.shape, dtype=dtype, device=device)
    if value.device.type != "meta":
        value.copy_(tensor)  # a copy: the HF model's tensors are never shared
    module._parameters[attr] = nn.Parameter(value, requires_grad=module._parameters[attr].requires_grad)


def _reader(hf_model: Any) -> Reader:
    """Read an HF tensor by name, from the module (or, for an offloaded one, from accelerate's weights map)."""
    state = hf_model.state_dict()

    def read(name: str) -> Tensor:
        tensor = state[name]
        return (read_weight(hf_model, name) if tensor.device.type == "meta" else tensor).detach()

    return read


def _convert_into(model: HookedTransformer, family: Family, hf_model: Any,
                  place: Callable[[str, Tensor], None]) -> None:
    """Convert the HF weights part by part (the outer modules, then one block at a time) and hand each Forma
    tensor to `place`; every tensor of `model` must come out exactly once, with its shape."""
    c, cfg, read = hf_model.config, model.cfg, _reader(hf_model)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    seen: set[str] = set()
    parts = [lambda: family.outer(c, cfg, read)] + [
        (lambda layer=layer: family.layer(c, cfg, read, layer)) for layer in range(cfg.n_layers)]
    for part in parts:
        for name, tensor in part().items():
            if expected.get(name) != tuple(tensor.shape):
                raise ValueError(f"conversion made {name} of shape {tuple(tensor.shape)}; the model has "
                                 f"{expected.get(name, 'no such tensor')}")
            place(name, tensor)
            seen.add(name)
    if expected.keys() - seen:
        raise ValueError(f"conversion left Forma weights unset: {sorted(expected.keys() - seen)[:5]}")


def _check_against_config(hf_model: Any) -> None:
    """ValueError naming every tensor of `hf_model` that its config does not describe, or describes with
    another shape, and every one it describes that is missing (e.g. layers removed from the module tree)."""
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in type(hf_model)(hf_model.config).state_dict().items()}
    got = {k: tuple(v.shape) for k, v in hf_model.state_dict().items()}
    mismatched = [(k, got[k], expected[k]) for k in sorted(expected.keys() & got.keys()) if got[k] != expected[k]]
    problems = _describe_problems(expected.keys() - got.keys(), got.keys() - expected.keys(), mismatched)
    if problems:
        raise ValueError(f"the Hugging Face model's tensors do not match its config: {problems}")


def _describe_problems(missing: Any, unexpected: Any, mismatched: Any, shown: int = 6) -> str:
    """'missing [...]; unexpected [...]; mis-shaped k: weights (…), config (…)' — empty when all agree."""
    def names(keys: Any) -> str:
        keys = sorted(keys)
        return f"{keys[:shown]}{f' and {len(keys) - shown} more' if len(keys) > shown else ''}"

    parts = []
    if missing:
        parts.append(f"missing {names(missing)}")
    if unexpected:
        parts.append(f"unexpected {names(unexpected)}")
    if mismatched:
        mismatched = sorted(mismatched)
        parts.append("mis-shaped " + ", ".join(f"{k}: weights {tuple(have)}, config {tuple(want)}"
                                               for k, have, want in mismatched[:shown])
                     + (f" and {len(mismatched) - shown} more" if len(mismatched) > shown else ""))
    return "; ".join(parts)


# Hugging Face activation names (transformers' ACT2FN) and Forma's MLP for each; GPT-2 calls tanh-GELU "gelu_new".
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu",
                  "silu": "silu"}
EXPORT_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}


def _activation(name: str, family: str) -> str:
    if name not in HF_ACTIVATIONS:
        raise _variant(f"{family} activation {name!r}")
    return HF_ACTIVATIONS[name]


def _rope(c: Any, family: str) -> tuple[float, float]:
    """(θ base, fraction of each head's dimensions that rotate) of a default (unscaled) rotary embedding."""
    params = getattr(c, "rope_parameters", None) or {}
    if params.get("rope_type", "default") != "default":
        raise _variant(f"{family} rope scaling {params.get('rope_type')!r}")
    return (float(params.get("rope_theta", getattr(c, "rope_theta", 10000.0))),
            float(params.get("partial_rotary_factor", 1.0)))


def _heads(W: Tensor, pattern: str, n_heads: int) -> Tensor:
    return einops.rearrange(W, pattern, head=n_heads)


def _outer(embed: str, final_norm: str, cfg: ModelConfig, read: Reader, positions: str | None = None
           ) -> dict[str, Tensor]:
    """W_E, the final norm, b_U (zero: Hugging Face's heads have none), W_U unless tied, W_pos if learned."""
    state = {"embed.W_E": read(embed + ".weight"), "ln_final.w": read(final_norm + ".weight"),
             "unembed.b_U": torch.zeros(cfg.d_vocab)}
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
        d_vocab=c.vocab_size, d_model=c.n_embd, n_layers=c.n_layer, n_heads=c.n_head, n_ctx=c.n_positions,
        d_mlp=c.n_inner or 4 * c.n_embd, positions="learned", norm="layernorm", norm_eps=c.layer_norm_epsilon,
        mlp=mlp, block="pre_ln", tied_embeddings=c.tie_word_embeddings, bias=True)


def _gpt2_outer(c: Any, cfg: ModelConfig, read: Reader) -> dict[str, Tensor]:
    return _outer("transformer.wte", "transformer.ln_f", cfg, read, positions="transformer.wpe")


def _gpt2_layer(c: Any, cfg: ModelConfig, read: Reader, layer: int) -> dict[str, Tensor]:
    h, b, H = f"transformer.h.{layer}.", f"blocks.{layer}.", cfg.n_heads
    W_Q, W_K, W_V = read(h + "attn.c_attn.weight").chunk(3, dim=1)  # Conv1D: y = x W + b
    b_Q, b_K, b_V = read(h + "attn.c_attn.bias").chunk(3)
    split, split_bias = "d_model (head d_head) -> head d_model d_head", "(head d_head) -> head d_head"
    return _norms(b, h, "ln_1", "ln_2", True, read) | {
        b + "attn.W_Q": _heads(W_Q, split, H), b + "attn.W_K": _heads(W_K, split, H),
        b + "attn.W_V": _heads(W_V, split, H),
        b + "attn.b_Q": _heads(b_Q, split_bias, H), b + "attn.b_K": _heads(b_K, split_bias, H),
        b + "attn.b_V": _heads(b_V, split_bias, H),
        b + "attn.W_O": _heads(read(h + "attn.c_proj.weight"), "(head d_head) d_model -> head d_head d_model", H),
        b + "attn.b_O": read(h + "attn.c_proj.bias"),
        b + "mlp.W_in": read(h + "mlp.c_fc.weight"), b + "mlp.b_in": read(h + "mlp.c_fc.bias"),
        b + "mlp.W_out": read(h + "mlp.c_proj.weight"), b + "mlp.b_out": read(h + "mlp.c_proj.bias"),
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
        d_vocab=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers, n_heads=c.num_attention_heads,
        n_ctx=c.max_position_embeddings, d_head=d_head, d_mlp=c.intermediate_size, positions="rotary",
        rotary_dim=rotary_dim, rotary_base=base, norm="layernorm", norm_eps=c.layer_norm_eps,
        mlp=_activation(c.hidden_act, "GPT-NeoX"), block="parallel" if c.use_parallel_residual else "pre_ln",
        tied_embeddings=c.tie_word_embeddings, bias=True)


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
        b + "attn.W_Q": W_Q, b + "attn.W_K": W_K, b + "attn.W_V": W_V,
        b + "attn.b_Q": b_Q, b + "attn.b_K": b_K, b + "attn.b_V": b_V,
        b + "attn.W_O": _heads(read(h + "attention.dense.weight"), "d_model (head d_head) -> head d_head d_model", H),
        b + "attn.b_O": read(h + "attention.dense.bias"),
        b + "mlp.W_in": read(h + "mlp.dense_h_to_4h.weight").T, b + "mlp.b_in": read(h + "mlp.dense_h_to_4h.bias"),
        b + "mlp.W_out": read(h + "mlp.dense_4h_to_h.weight").T, b + "mlp.b_out": read(h + "mlp.dense_4h_to_h.bias"),
    }


# --- LLaMA, Qwen2, Mistral: one layout, with Q/K/V biases (Qwen2) or a sliding window (Mistral, Qwen2) ---------
def _llama_like_config(c: Any, family: str, qkv_bias: bool = False, sliding_window: int = 0) -> ModelConfig:
    if c.hidden_act != "silu":
        raise _variant(f"{family} with a {c.hidden_act!r} gate (only SiLU: SwiGLU)")
    base, fraction = _rope(c, family)
    if fraction != 1.0:
        raise _variant(f"{family} with partial rotary embeddings")
    return ModelConfig(
        d_vocab=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers, n_heads=c.num_attention_heads,
        n_ctx=c.max_position_embeddings, d_head=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
        d_mlp=c.intermediate_size, n_kv_heads=c.num_key_value_heads or c.num_attention_heads, positions="rotary",
        rotary_base=base, norm="rmsnorm", norm_eps=c.rms_norm_eps, mlp="swiglu", block="pre_ln",
        tied_embeddings=c.tie_word_embeddings, bias=False, qkv_bias=qkv_bias, sliding_window=sliding_window)


def _llama_config(c: Any) -> ModelConfig:
    if getattr(c, "attention_bias", False) or getattr(c, "mlp_bias", False):
        raise _variant("LLaMA with attention or MLP biases")
    return _llama_like_config(c, "LLaMA")


def _qwen2_config(c: Any) -> ModelConfig:
    kinds = set(getattr(c, "layer_types", None) or ["full_attention"])
    if kinds - {"full_attention", "sliding_attention"} or len(kinds) > 1:
        raise _variant(f"Qwen2 with a sliding window in some layers only (layer_types {sorted(kinds)}; Forma's "
                       "sliding_window applies to every layer)")
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
            state[b + f"attn.b_{x.upper()}"] = _heads(read(h + f"self_attn.{x}_proj.bias"), "(head d_head) -> head d_head", n)
    return state


# --------------------------------------------------------------------------------------------
# Forma → Hugging Face
# --------------------------------------------------------------------------------------------
EXPORT_SHAPES = (
    "to_hf exports these shapes only: GPT-2 (learned positions, LayerNorm, biases, pre-LN, d_head · n_heads = "
    "d_model, no sliding window); GPT-NeoX (rotary positions, LayerNorm, biases, pre-LN or parallel blocks, "
    "d_head · n_heads = d_model, no sliding window); LLaMA (rotary on every dimension, RMSNorm, SwiGLU, no biases, "
    "pre-LN); Mistral (LLaMA with a sliding window); Qwen2 (LLaMA with qkv_bias, with or without a sliding window)")


def export_family(cfg: ModelConfig) -> str:
    """The Hugging Face model_type that `to_hf` writes a model of this config as; UnsupportedArchitecture when
    no family has its shape."""
    llama_like = (cfg.positions == "rotary" and cfg.rotary_dim == cfg.d_head and cfg.norm == "rmsnorm"
                  and cfg.block == "pre_ln" and cfg.mlp == "swiglu" and not cfg.bias)
    if llama_like:
        return "qwen2" if cfg.qkv_bias else "mistral" if cfg.sliding_window else "llama"
    plain_heads = cfg.n_kv_heads == cfg.n_heads and cfg.d_head * cfg.n_heads == cfg.d_model
    if cfg.norm == "layernorm" and cfg.bias and plain_heads and cfg.mlp in EXPORT_ACTIVATIONS and not cfg.sliding_window:
        if cfg.positions == "learned" and cfg.block == "pre_ln":
            return "gpt2"
        if cfg.positions == "rotary" and cfg.block in ("pre_ln", "parallel"):
            return "gpt_neox"
    raise UnsupportedArchitecture(EXPORT_SHAPES)


def to_hf(model: HookedTransformer) -> Any:
    """The same network as a Hugging Face model of the family its shape matches (see `export_family`), in
    eval mode, float32."""
    family = export_family(model.cfg)
    if float(model.b_U.detach().abs().max()) != 0.0:
        raise UnsupportedArchitecture("Hugging Face's causal-LM heads have no unembedding bias; b_U is not zero")
    return FAMILIES[family].export(model)


def _forma_state(model: HookedTransformer) -> dict[str, Tensor]:
    """Every weight as float32 on the CPU (an offloaded block's read from its store)."""
    return {k: read_weight(model, k).detach().float().cpu() for k in model.state_dict()}


def _export_outer(sd: dict[str, Tensor], cfg: ModelConfig, embed: str, final_norm: str) -> dict[str, Tensor]:
    out = {embed + ".weight": sd["embed.W_E"], final_norm + ".weight": sd["ln_final.w"],
           "lm_head.weight": sd["embed.W_E"] if cfg.tied_embeddings else sd["unembed.W_U"].T}
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
    hf_cfg = GPT2Config(vocab_size=cfg.d_vocab, n_positions=cfg.n_ctx, n_embd=cfg.d_model, n_layer=cfg.n_layers,
                        n_head=cfg.n_heads, n_inner=cfg.d_mlp, activation_function=EXPORT_ACTIVATIONS[cfg.mlp],
                        layer_norm_epsilon=cfg.norm_eps, tie_word_embeddings=cfg.tied_embeddings,
                        bos_token_id=None, eos_token_id=None)
    sd = _forma_state(model)
    out = _export_outer(sd, cfg, "transformer.wte", "transformer.ln_f") | {"transformer.wpe.weight": sd["pos_embed.W_pos"]}
    merge = "head d_model d_head -> d_model (head d_head)"
    for l in range(cfg.n_layers):
        h, b = f"transformer.h.{l}.", f"blocks.{l}."
        out |= _export_norms(sd, b, h, "ln_1", "ln_2", True) | {
            h + "attn.c_attn.weight": torch.cat([einops.rearrange(sd[b + f"attn.W_{x}"], merge) for x in "QKV"], dim=1),
            h + "attn.c_attn.bias": torch.cat([sd[b + f"attn.b_{x}"].flatten() for x in "QKV"]),
            h + "attn.c_proj.weight": einops.rearrange(sd[b + "attn.W_O"], "head d_head d_model -> (head d_head) d_model"),
            h + "attn.c_proj.bias": sd[b + "attn.b_O"],
            h + "mlp.c_fc.weight": sd[b + "mlp.W_in"], h + "mlp.c_fc.bias": sd[b + "mlp.b_in"],
            h + "mlp.c_proj.weight": sd[b + "mlp.W_out"], h + "mlp.c_proj.bias": sd[b + "mlp.b_out"],
        }
    return _load_hf_state(GPT2LMHeadModel(hf_cfg), out)


def _forma_to_neox(model: HookedTransformer) -> Any:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = model.cfg
    hf_cfg = GPTNeoXConfig(
        vocab_size=cfg.d_vocab, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads, intermediate_size=cfg.d_mlp, hidden_act=EXPORT_ACTIVATIONS[cfg.mlp],
        max_position_embeddings=cfg.n_ctx, layer_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tied_embeddings,
        use_parallel_residual=cfg.block == "parallel", attention_bias=True, bos_token_id=None, eos_token_id=None,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rotary_base,
                         "partial_rotary_factor": cfg.rotary_dim / cfg.d_head})
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
            h + "attention.query_key_value.weight": einops.rearrange(W, "three head d_model d_head -> (head three d_head) d_model"),
            h + "attention.query_key_value.bias": einops.rearrange(bias, "three head d_head -> (head three d_head)"),
            h + "attention.dense.weight": einops.rearrange(sd[b + "attn.W_O"], "head d_head d_model -> d_model (head d_head)"),
            h + "attention.dense.bias": sd[b + "attn.b_O"],
            h + "mlp.dense_h_to_4h.weight": sd[b + "mlp.W_in"].T, h + "mlp.dense_h_to_4h.bias": sd[b + "mlp.b_in"],
            h + "mlp.dense_4h_to_h.weight": sd[b + "mlp.W_out"].T, h + "mlp.dense_4h_to_h.bias": sd[b + "mlp.b_out"],
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
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"use_sliding_window": window is not None,
                                                      "sliding_window": window, "max_window_layers": 0}),
    }[family]
    hf_cfg = getattr(transformers, config_class)(
        vocab_size=cfg.d_vocab, hidden_size=cfg.d_model, intermediate_size=cfg.d_mlp, num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.d_head,
        max_position_embeddings=cfg.n_ctx, rms_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tied_embeddings,
        rope_parameters={"rope_theta": cfg.rotary_base, "rope_type": "default"},
        bos_token_id=None, eos_token_id=None, pad_token_id=None, **extra)
    sd = _forma_state(model)
    out = _export_outer(sd, cfg, "model.embed_tokens", "model.norm")
    merge = "head d_model d_head -> (head d_head) d_model"
    for l in range(cfg.n_layers):
        h, b = f"model.layers.{l}.", f"blocks.{l}."
        out |= _export_norms(sd, b, h, "input_layernorm", "post_attention_layernorm", False) | {
            h + "self_attn.q_proj.weight": einops.rearrange(sd[b + "attn.W_Q"], merge),
            h + "self_attn.k_proj.weight": einops.rearrange(sd[b + "attn.W_K"], merge),
            h + "self_attn.v_proj.weight": einops.rearrange(sd[b + "attn.W_V"], merge),
            h + "self_attn.o_proj.weight": einops.rearrange(sd[b + "attn.W_O"], "head d_head d_model -> d_model (head d_head)"),
            h + "mlp.gate_proj.weight": sd[b + "mlp.W_gate"].T, h + "mlp.up_proj.weight": sd[b + "mlp.W_in"].T,
            h + "mlp.down_proj.weight": sd[b + "mlp.W_out"].T,
        }
        if cfg.qkv_bias:
            out |= {h + f"self_attn.{x.lower()}_proj.bias": sd[b + f"attn.b_{x}"].flatten() for x in "QKV"}
    return _load_hf_state(getattr(transformers, model_class)(hf_cfg), out)


def _load_hf_state(hf: Any, state: dict[str, Tensor]) -> Any:
    """Load the exported weights (every one the HF model has, or a ValueError naming those left unset)."""
    expected = set(hf.state_dict())
    missing = sorted(k for k in expected - state.keys() if not k.endswith("attn.bias") and not k.endswith("masked_bias"))
    unexpected = sorted(state.keys() - expected)
    if missing or unexpected:
        raise ValueError(f"export does not match the Hugging Face model: unset {missing[:5]}, unknown {unexpected[:5]}")
    hf.load_state_dict({k: v.contiguous() for k, v in state.items()}, strict=False)
    return hf.eval()


FAMILIES: dict[str, Family] = {
    "gpt2": Family(_gpt2_config, _gpt2_outer, _gpt2_layer, {
        "embed": "transformer.wte", "pos_embed": "transformer.wpe", "blocks.{l}": "transformer.h.{l}",
        "ln_final": "transformer.ln_f", "unembed": "lm_head"}, _forma_to_gpt2),
    "gpt_neox": Family(_neox_config, _neox_outer, _neox_layer, {
        "embed": "gpt_neox.embed_in", "blocks.{l}": "gpt_neox.layers.{l}", "ln_final": "gpt_neox.final_layer_norm",
        "unembed": "lm_head"}, _forma_to_neox),
    **{model_type: Family(config, _llama_outer, _llama_layer, {
        "embed": "model.embed_tokens", "blocks.{l}": "model.layers.{l}", "ln_final": "model.norm",
        "unembed": "lm_head"}, _forma_to_llama_like)
       for model_type, config in (("llama", _llama_config), ("qwen2", _qwen2_config), ("mistral", _mistral_config))},
}


# --------------------------------------------------------------------------------------------
# Device maps: where each Forma module lives
# --------------------------------------------------------------------------------------------
AUTO_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")  # accelerate computes these from free memory


def forma_device_map(model: HookedTransformer, family: Family, hf_model: Any, device_map: Any,
                     max_memory: dict | None = None, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """Each Forma module that holds weights (embed, pos_embed, blocks.{l}, ln_final, unembed) and its place:
    a device, "cpu" or "disk".

    `device_map` is what Hugging Face's from_pretrained takes: one of AUTO_MAPS (computed by accelerate on
    the Forma model, whole blocks never split), one device for everything, or a dict from module names to
    places. A dict's keys name Hugging Face modules ("model.layers.3", "lm_head", "" for the rest) or
    Forma's ("blocks.3"); a module takes the place of the longest key that names it or a module above it."""
    if isinstance(device_map, str) and device_map in AUTO_MAPS:
        device_map = _infer_device_map(model, device_map, max_memory, dtype)
    elif max_memory is not None:
        raise ValueError(f"max_memory goes with device_map {' | '.join(AUTO_MAPS)}; a given map places every module")
    elif isinstance(device_map, dict):
        known = {name for name, _ in hf_model.named_modules()} | {name for name, _ in model.named_modules()}
        unknown = sorted(str(key) for key in device_map if key not in known)
        if unknown:
            raise ValueError(f"device_map names modules that neither the Hugging Face model nor Forma's has: "
                             f"{unknown[:5]}")
    else:
        device_map = {"": device_map}
    owners = {}
    for forma, hf_name in family.modules.items():
        for layer in range(model.cfg.n_layers) if "{l}" in forma else [None]:
            name = forma.format(l=layer)
            if any(True for _ in model.get_submodule(name).parameters()):
                owners[name] = hf_name.format(l=layer)
    return {forma: _place_of(device_map, (forma, hf_name)) for forma, hf_name in owners.items()}


def _infer_device_map(model: HookedTransformer, how: str, max_memory: dict | None, dtype: torch.dtype) -> dict:
    from accelerate.utils import get_balanced_memory, infer_auto_device_map

    no_split = sorted({type(block).__name__ for block in model.blocks})
    if how != "sequential":
        max_memory = get_balanced_memory(model, max_memory=max_memory, no_split_module_classes=no_split,
                                         dtype=dtype, low_zero=how == "balanced_low_0")
    return infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split, dtype=dtype)


def _place_of(device_map: dict, names: tuple[str, str]) -> Any:
    """The place the map gives a module known by either of `names` (Forma's, Hugging Face's)."""
    def covers(key: str, name: str) -> bool:
        return key == "" or key == name or name.startswith(key + ".")

    keys = [key for key in device_map if any(covers(key, name) for name in names)]
    inside = [key for key in device_map if any(key.startswith(name + ".") for name in names)]
    chosen = ([max(keys, key=len)] if keys else []) + inside  # the covering key, and any for parts of the module
    if not chosen:
        raise ValueError(f"device_map gives no place for {names[1]} (Forma's {names[0]})")
    places = {_place_name(device_map[key]) for key in chosen}
    if len(places) > 1:
        raise ValueError(f"device_map puts parts of {names[1]} on {sorted(places)}: Forma keeps each block (and "
                         "the embedding, final norm and unembedding) whole on one device")
    return device_map[chosen[0]]


def _place_name(place: Any) -> str:
    if place == "disk":
        return place
    try:
        return str(torch.device(place))
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device_map place {place!r} is not a device, 'cpu' or 'disk'") from err


def check_placement(placement: dict[str, Any], cfg: ModelConfig, offload_folder: Any) -> str:
    """The execution (main) device of a placement, after checking that Forma can run it: ValueError naming
    what cannot be."""
    places = {name: _place_name(place) for name, place in placement.items()}
    if "meta" in places.values():
        raise ValueError("device_map puts modules on the meta device, which holds no values: use 'cpu' or 'disk' "
                         "to offload them")
    accelerators = [place for place in places.values() if place not in ("cpu", "disk")]
    main = places["embed"] if places["embed"] not in ("cpu", "disk") else (accelerators or ["cpu"])[0]
    offloaded = ("disk",) if main == "cpu" else ("cpu", "disk")
    if places["embed"] in offloaded:
        raise ValueError(f"device_map offloads the token embedding to {places['embed']!r}: Forma puts the token ids "
                         "where the embedding is, so it must live on a device (give its module one, or more memory "
                         "with max_memory)")
    if cfg.tied_embeddings and (main if places["unembed"] in offloaded else places["unembed"]) != places["embed"]:
        raise ValueError("the unembedding is tied to the token embedding: device_map must run lm_head on the "
                         f"embedding's device ({places['embed']}), not {places['unembed']!r}")
    if "disk" in places.values() and offload_folder is None:
        disk = [name for name, place in places.items() if place == "disk"]
        raise ValueError(f"device_map puts {disk[:4]} on disk: pass offload_folder= (a folder for their weights)")
    return main


# --------------------------------------------------------------------------------------------
# Local folders
# --------------------------------------------------------------------------------------------
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
# Weights in formats Forma never reads: a pickle (torch.load can run code) or another framework's.
OTHER_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack",
                 "model.ckpt.index")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def load_hf(path: str | Path, device: str | torch.device | None = None, *, dtype: torch.dtype | str = torch.float32,
            device_map: Any = None, max_memory: dict | None = None,
            offload_folder: str | Path | None = None) -> HookedTransformer:
    """A HookedTransformer from a local Hugging Face `save_pretrained` folder (with its tokenizer if present),
    in eval mode, its weights in `dtype` ("auto": the folder's own, as config.json records it).

    Either on one `device` (default the CPU), or spread by `device_map` (see `forma_device_map`): blocks on
    devices, on the CPU, or on disk in `offload_folder`, where accelerate loads each offloaded block's weights
    in around its forward pass. The folder must hold exactly what its config.json describes (see
    `read_hf_folder`)."""
    path = Path(path)
    config = _hf_config(path)
    family = _family(config.model_type)
    if device_map is not None and device is not None:
        raise ValueError("give load_hf a device or a device_map, not both")
    dtype = _loaded_dtype(config, dtype)
    tokenizer = _local_tokenizer(path)
    try:
        if device_map is None:
            return from_hf(read_hf_folder(path, dtype=dtype), tokenizer=tokenizer, dtype=dtype).to(device or "cpu")
        return _load_dispatched(path, family, tokenizer, dtype, device_map, max_memory, offload_folder)
    except UnsupportedArchitecture:
        raise
    except ValueError as err:
        raise ValueError(f"{path / 'config.json'}: {err}") from err


def _loaded_dtype(config: Any, dtype: torch.dtype | str) -> torch.dtype:
    """`dtype`, or for "auto" the one the folder's config.json records (float32 when it records none)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype != "auto":
        raise ValueError(f"dtype must be a torch.dtype (torch.bfloat16, ...) or 'auto', got {dtype!r}")
    recorded = getattr(config, "dtype", None) or torch.float32
    return recorded if isinstance(recorded, torch.dtype) else getattr(torch, str(recorded))


def _load_dispatched(path: Path, family: Family, tokenizer: Any, dtype: torch.dtype, device_map: Any,
                     max_memory: dict | None, offload_folder: str | Path | None) -> HookedTransformer:
    """Convert block by block into an empty model, placing each tensor as the map says, then dispatch."""
    from accelerate import dispatch_model
    from accelerate.utils import offload_weight, save_offload_index

    with tempfile.TemporaryDirectory(prefix="forma-hf-") as staging:
        # Everything "on disk": transformers checks the folder and indexes its safetensors, loading nothing.
        hf = read_hf_folder(path, dtype=dtype, device_map={"": "disk"}, offload_folder=staging)
        with _quiet_transformers():
            _check_against_config(hf)
        model = empty_model(_config(family, hf.config.model_type, hf.config), tokenizer)
        placement = forma_device_map(model, family, hf, device_map, max_memory, dtype)
        main = check_placement(placement, model.cfg, offload_folder)
        if offload_folder is not None:
            Path(offload_folder).mkdir(parents=True, exist_ok=True)
        index: dict[str, Any] = {}

        def place(name: str, tensor: Tensor) -> None:
            where = _place_of(placement, (name, name))
            if where == "disk":  # written to the offload folder; the parameter stays a shape, in its dtype
                offload_weight(tensor.to(dtype).contiguous(), name, str(offload_folder), index)
                _assign(model, name, tensor, "meta", dtype)
            else:
                _assign(model, name, tensor, where, dtype)

        _convert_into(model, family, hf, place)
        save_offload_index(index, str(offload_folder))
    dispatch_model(model, device_map=placement, main_device=main,
                   offload_dir=None if offload_folder is None else str(offload_folder))
    model.hf_device_map = placement  # accelerate's name for where a dispatched model's modules live
    return model.eval()


def bridge(path: str | Path, device: str | None = None, *, dtype: torch.dtype | str | None = None,
           device_map: Any = None, max_memory: dict | None = None, offload_folder: str | Path | None = None) -> Any:
    """Any local HF causal LM wrapped by TransformerLens's TransformerBridge (hooked, not converted).

    `dtype`, `device_map`, `max_memory` and `offload_folder` go to Hugging Face's from_pretrained (accelerate
    places the model); without a device_map the model goes to `device` (default the CPU). The folder must
    hold its tokenizer: without one TransformerBridge would look the model's name up on a model hub, and
    nothing in Forma reaches the network."""
    from transformer_lens.model_bridge import TransformerBridge

    path = Path(path)
    config = _hf_config(path)
    tokenizer = _local_tokenizer(path)
    if tokenizer is None:
        raise FileNotFoundError(
            f"{path} holds no tokenizer ({' or '.join(TOKENIZER_FILES)}): TransformerBridge needs one, and would "
            "otherwise fetch it from a model hub. Save it beside the model: tokenizer.save_pretrained(folder)")
    if device_map is not None and device is not None:
        raise ValueError("give bridge a device or a device_map, not both")
    options: dict[str, Any] = {} if dtype is None else {"dtype": dtype}
    if device_map is not None:
        options |= {"device_map": device_map, "max_memory": max_memory,
                    "offload_folder": None if offload_folder is None else str(offload_folder)}
    hf = read_hf_folder(path, **options)
    if device_map is None:
        hf = hf.to(device or "cpu")
    name = config.architectures[0] if config.architectures else config.model_type
    # With a device_map the bridge reads the devices from the model; without one, it is told the device.
    return TransformerBridge.boot_transformers(name, hf_model=hf, tokenizer=tokenizer,
                                               device=None if device_map is not None else device or "cpu")


def read_hf_folder(path: str | Path, **options: Any) -> Any:
    """The Hugging Face causal LM in a local folder, loaded only if its safetensors hold exactly the tensors
    its config.json describes.

    Checked before anything is loaded: the weights are safetensors (a pickle is never opened), every shard the
    index names exists, and every file's header is whole (a truncated file is named). Checked while loading,
    from transformers' own report (`output_loading_info`): no tensor missing, none unexpected, none of
    another shape. What transformers itself documents as derived is not counted: a tied lm_head, and each
    class's `_keys_to_ignore_on_load_*` (GPT-2's attn.bias causal-mask buffers).
    """
    from transformers import AutoModelForCausalLM

    path = Path(path)
    _hf_config(path)
    check_safetensors(path)
    with _quiet_transformers():
        hf, info = AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, use_safetensors=True, output_loading_info=True, ignore_mismatched_sizes=True,
            **options)
    problems = _describe_problems(info["missing_keys"], info["unexpected_keys"], info["mismatched_keys"])
    problems = "; ".join([problems, *info.get("error_msgs", [])]).strip("; ")
    if problems:
        raise ValueError(f"the weights in {path} do not match its config.json: {problems}")
    return hf


def check_safetensors(path: Path) -> list[Path]:
    """The safetensors files of a HF folder (one, or the shards its index names), each with a whole header;
    FileNotFoundError or ValueError naming what is missing, pickled, malformed or truncated."""
    from safetensors import SafetensorError, safe_open

    index = path / SAFETENSORS_INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            shards = sorted({path / name for name in weight_map.values()})
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"malformed {index}: {err!r}") from err
        absent = [shard.name for shard in shards if not shard.is_file()]
        if absent:
            raise FileNotFoundError(f"{index} names shards that are not in {path}: {absent}")
    elif (path / SAFETENSORS_FILE).is_file():
        shards = [path / SAFETENSORS_FILE]
    else:
        other = [name for name in OTHER_WEIGHTS if (path / name).exists()]
        if other:
            raise ValueError(
                f"{path} holds {other[0]}, and Forma reads safetensors only: a pickle checkpoint can run code when "
                "it is loaded, so it is never opened. Convert it once, where you trust the file: "
                "AutoModelForCausalLM.from_pretrained(folder).save_pretrained(folder) writes model.safetensors")
        raise FileNotFoundError(f"{path} has no {SAFETENSORS_FILE} (nor {SAFETENSORS_INDEX}): no weights to load")
    for shard in shards:
        try:
            with safe_open(str(shard), framework="pt") as handle:
                handle.keys()
        except (SafetensorError, OSError, ValueError) as err:
            raise ValueError(f"malformed or truncated weights {shard}: {err}") from err
    return shards


def _hf_config(path: Path) -> Any:
    """The folder's transformers config; FileNotFoundError or ValueError naming config.json."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a Hugging Face model folder (no config.json)")
    try:
        with _quiet_transformers():
            return AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError, StrictDataclassError) as err:
        # what transformers raises for a config it cannot read, or one whose fields have the wrong type
        raise ValueError(f"malformed {path / 'config.json'}: {err}") from err


def _local_tokenizer(path: Path) -> Any:
    """The folder's tokenizer, or None when it has none; a ValueError naming a file that cannot be read."""
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    try:
        with _quiet_transformers():
            return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as err:  # the Rust tokenizers library raises plain Exception for a malformed tokenizer.json
        raise ValueError(f"malformed tokenizer in {path} ({', '.join(f for f in TOKENIZER_FILES if (path / f).is_file())}): "
                         f"{err}") from err


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' warnings and load report off for a call whose problems Forma reports itself."""
    from transformers.utils import logging

    before = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(before)
