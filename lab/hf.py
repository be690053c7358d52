"""Hugging Face interop: weights in and out for the GPT-2 and LLaMA families, and a bridge for the rest.

`from_hf(hf_model)` rewrites an HF causal LM's weights into Forma's per-head layout
(W_Q [head, d_model, d_head], W_O [head, d_head, d_model], ...); `to_hf(model)` does the inverse.
Both are exact: logits agree to float32 round-off (tested). Any other architecture is out of scope
here and goes through TransformerLens's TransformerBridge (`bridge(path)`), which hooks the HF
module tree directly.

Nothing is fetched from a hub: `load_hf` reads a local `save_pretrained` folder only.
"""

from pathlib import Path
from typing import Any

import einops
import torch
from torch import Tensor

from lab.model import HookedTransformer, ModelConfig

SUPPORTED = ("gpt2", "llama")


class UnsupportedArchitecture(ValueError):
    pass


def _unsupported(model_type: str) -> UnsupportedArchitecture:
    return UnsupportedArchitecture(
        f"Forma converts {SUPPORTED} models into its own HookedTransformer; {model_type!r} is not one of "
        "them. Wrap it instead with lab.hf.bridge(path), which uses TransformerLens's TransformerBridge "
        "and exposes the same hook names on the Hugging Face module tree.")


# --------------------------------------------------------------------------------------------
# Hugging Face → Forma
# --------------------------------------------------------------------------------------------
def from_hf(hf_model: Any, tokenizer: Any = None) -> HookedTransformer:
    """A HookedTransformer with the weights of a GPT-2- or LLaMA-family HF model (float32, eval mode)."""
    model_type = getattr(hf_model.config, "model_type", type(hf_model).__name__)
    converters = {"gpt2": _gpt2_to_forma, "llama": _llama_to_forma}
    if model_type not in converters:
        raise _unsupported(model_type)
    cfg, state = converters[model_type](hf_model.config, {k: v.detach().float().cpu() for k, v in hf_model.state_dict().items()})
    model = HookedTransformer(cfg, tokenizer=tokenizer)
    model.load_weights(state, source=f"Hugging Face {model_type} model")
    return model.eval()


def _gpt2_to_forma(c: Any, sd: dict[str, Tensor]) -> tuple[ModelConfig, dict[str, Tensor]]:
    if c.activation_function not in ("gelu_new", "gelu_pytorch_tanh", "gelu", "relu"):
        raise UnsupportedArchitecture(f"GPT-2 activation {c.activation_function!r} is not supported")
    if not c.scale_attn_weights or c.scale_attn_by_inverse_layer_idx or c.reorder_and_upcast_attn:
        raise UnsupportedArchitecture("GPT-2 variants with non-standard attention scaling are not supported")
    mlp = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}.get(c.activation_function, c.activation_function)
    cfg = ModelConfig(
        d_vocab=c.vocab_size, d_model=c.n_embd, n_layers=c.n_layer, n_heads=c.n_head, n_ctx=c.n_positions,
        d_mlp=c.n_inner or 4 * c.n_embd, positions="learned", norm="layernorm", norm_eps=c.layer_norm_epsilon,
        mlp=mlp, block="pre_ln", tied_embeddings=bool(c.tie_word_embeddings), bias=True)
    p = "transformer."
    state = {"embed.W_E": sd[p + "wte.weight"], "pos_embed.W_pos": sd[p + "wpe.weight"],
             "ln_final.w": sd[p + "ln_f.weight"], "ln_final.b": sd[p + "ln_f.bias"],
             "unembed.b_U": torch.zeros(c.vocab_size)}
    if not cfg.tied_embeddings:
        state["unembed.W_U"] = sd["lm_head.weight"].T
    split = "d_model (head d_head) -> head d_model d_head"
    for l in range(c.n_layer):
        h, b = f"{p}h.{l}.", f"blocks.{l}."
        W_Q, W_K, W_V = sd[h + "attn.c_attn.weight"].chunk(3, dim=1)  # Conv1D: y = x W + b
        b_Q, b_K, b_V = sd[h + "attn.c_attn.bias"].chunk(3)
        state |= {
            b + "ln1.w": sd[h + "ln_1.weight"], b + "ln1.b": sd[h + "ln_1.bias"],
            b + "ln2.w": sd[h + "ln_2.weight"], b + "ln2.b": sd[h + "ln_2.bias"],
            b + "attn.W_Q": einops.rearrange(W_Q, split, head=c.n_head),
            b + "attn.W_K": einops.rearrange(W_K, split, head=c.n_head),
            b + "attn.W_V": einops.rearrange(W_V, split, head=c.n_head),
            b + "attn.b_Q": einops.rearrange(b_Q, "(head d_head) -> head d_head", head=c.n_head),
            b + "attn.b_K": einops.rearrange(b_K, "(head d_head) -> head d_head", head=c.n_head),
            b + "attn.b_V": einops.rearrange(b_V, "(head d_head) -> head d_head", head=c.n_head),
            b + "attn.W_O": einops.rearrange(sd[h + "attn.c_proj.weight"], "(head d_head) d_model -> head d_head d_model",
                                             head=c.n_head),
            b + "attn.b_O": sd[h + "attn.c_proj.bias"],
            b + "mlp.W_in": sd[h + "mlp.c_fc.weight"], b + "mlp.b_in": sd[h + "mlp.c_fc.bias"],
            b + "mlp.W_out": sd[h + "mlp.c_proj.weight"], b + "mlp.b_out": sd[h + "mlp.c_proj.bias"],
        }
    return cfg, state


def _rope_theta(c: Any) -> float:
    params = getattr(c, "rope_parameters", None) or {}
    if params.get("rope_type", "default") != "default":
        raise UnsupportedArchitecture(f"LLaMA rope scaling {params.get('rope_type')!r} is not supported")
    return float(params.get("rope_theta", getattr(c, "rope_theta", 10000.0)))


def _llama_to_forma(c: Any, sd: dict[str, Tensor]) -> tuple[ModelConfig, dict[str, Tensor]]:
    if c.hidden_act != "silu" or getattr(c, "attention_bias", False) or getattr(c, "mlp_bias", False):
        raise UnsupportedArchitecture("only LLaMA models with SiLU gates and no biases are supported")
    d_head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv = c.num_key_value_heads or c.num_attention_heads
    cfg = ModelConfig(
        d_vocab=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers, n_heads=c.num_attention_heads,
        n_ctx=c.max_position_embeddings, d_head=d_head, d_mlp=c.intermediate_size, n_kv_heads=kv,
        positions="rotary", rotary_base=_rope_theta(c), norm="rmsnorm", norm_eps=c.rms_norm_eps, mlp="swiglu",
        block="pre_ln", tied_embeddings=bool(c.tie_word_embeddings), bias=False)
    p = "model."
    state = {"embed.W_E": sd[p + "embed_tokens.weight"], "ln_final.w": sd[p + "norm.weight"],
             "unembed.b_U": torch.zeros(c.vocab_size)}
    if not cfg.tied_embeddings:
        state["unembed.W_U"] = sd["lm_head.weight"].T
    split = "(head d_head) d_model -> head d_model d_head"  # nn.Linear: y = x Wᵀ
    for l in range(c.num_hidden_layers):
        h, b = f"{p}layers.{l}.", f"blocks.{l}."
        state |= {
            b + "ln1.w": sd[h + "input_layernorm.weight"], b + "ln2.w": sd[h + "post_attention_layernorm.weight"],
            b + "attn.W_Q": einops.rearrange(sd[h + "self_attn.q_proj.weight"], split, head=c.num_attention_heads),
            b + "attn.W_K": einops.rearrange(sd[h + "self_attn.k_proj.weight"], split, head=kv),
            b + "attn.W_V": einops.rearrange(sd[h + "self_attn.v_proj.weight"], split, head=kv),
            b + "attn.W_O": einops.rearrange(sd[h + "self_attn.o_proj.weight"], "d_model (head d_head) -> head d_head d_model",
                                             head=c.num_attention_heads),
            b + "mlp.W_gate": sd[h + "mlp.gate_proj.weight"].T,
            b + "mlp.W_in": sd[h + "mlp.up_proj.weight"].T,
            b + "mlp.W_out": sd[h + "mlp.down_proj.weight"].T,
        }
    return cfg, state


# --------------------------------------------------------------------------------------------
# Forma → Hugging Face
# --------------------------------------------------------------------------------------------
def to_hf(model: HookedTransformer) -> Any:
    """The same network as a Hugging Face GPT2LMHeadModel or LlamaForCausalLM (eval mode)."""
    cfg = model.cfg
    if float(model.b_U.detach().abs().max()) != 0.0:
        raise UnsupportedArchitecture("Hugging Face's GPT-2 and LLaMA heads have no unembedding bias; b_U is not zero")
    gpt2 = dict(positions="learned", norm="layernorm", block="pre_ln", bias=True, n_kv_heads=cfg.n_heads)
    llama = dict(positions="rotary", norm="rmsnorm", block="pre_ln", bias=False, mlp="swiglu", rotary_dim=cfg.d_head)
    if all(getattr(cfg, k) == v for k, v in gpt2.items()) and cfg.mlp in ("gelu_tanh", "gelu", "relu"):
        return _forma_to_gpt2(model)
    if all(getattr(cfg, k) == v for k, v in llama.items()):
        return _forma_to_llama(model)
    raise UnsupportedArchitecture(
        "to_hf exports GPT-2-shaped (learned positions, LayerNorm, biases, pre-LN) or LLaMA-shaped (rotary, "
        "RMSNorm, SwiGLU, no biases, pre-LN) models only")


def _forma_to_gpt2(model: HookedTransformer) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = model.cfg
    act = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}[cfg.mlp]
    hf_cfg = GPT2Config(vocab_size=cfg.d_vocab, n_positions=cfg.n_ctx, n_embd=cfg.d_model, n_layer=cfg.n_layers,
                        n_head=cfg.n_heads, n_inner=cfg.d_mlp, activation_function=act,
                        layer_norm_epsilon=cfg.norm_eps, tie_word_embeddings=cfg.tied_embeddings,
                        bos_token_id=None, eos_token_id=None)
    if cfg.d_head * cfg.n_heads != cfg.d_model:
        raise UnsupportedArchitecture("GPT-2 needs d_head · n_heads = d_model")
    sd = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    p = "transformer."
    out = {p + "wte.weight": sd["embed.W_E"], p + "wpe.weight": sd["pos_embed.W_pos"],
           p + "ln_f.weight": sd["ln_final.w"], p + "ln_f.bias": sd["ln_final.b"],
           "lm_head.weight": sd["embed.W_E"] if cfg.tied_embeddings else sd["unembed.W_U"].T}
    merge = "head d_model d_head -> d_model (head d_head)"
    for l in range(cfg.n_layers):
        h, b = f"{p}h.{l}.", f"blocks.{l}."
        out |= {
            h + "ln_1.weight": sd[b + "ln1.w"], h + "ln_1.bias": sd[b + "ln1.b"],
            h + "ln_2.weight": sd[b + "ln2.w"], h + "ln_2.bias": sd[b + "ln2.b"],
            h + "attn.c_attn.weight": torch.cat([einops.rearrange(sd[b + f"attn.W_{x}"], merge) for x in "QKV"], dim=1),
            h + "attn.c_attn.bias": torch.cat([sd[b + f"attn.b_{x}"].flatten() for x in "QKV"]),
            h + "attn.c_proj.weight": einops.rearrange(sd[b + "attn.W_O"], "head d_head d_model -> (head d_head) d_model"),
            h + "attn.c_proj.bias": sd[b + "attn.b_O"],
            h + "mlp.c_fc.weight": sd[b + "mlp.W_in"], h + "mlp.c_fc.bias": sd[b + "mlp.b_in"],
            h + "mlp.c_proj.weight": sd[b + "mlp.W_out"], h + "mlp.c_proj.bias": sd[b + "mlp.b_out"],
        }
    hf = GPT2LMHeadModel(hf_cfg)
    _load_hf_state(hf, out)
    return hf.eval()


def _forma_to_llama(model: HookedTransformer) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = model.cfg
    hf_cfg = LlamaConfig(vocab_size=cfg.d_vocab, hidden_size=cfg.d_model, intermediate_size=cfg.d_mlp,
                         num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                         num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.d_head, max_position_embeddings=cfg.n_ctx,
                         rms_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tied_embeddings,
                         rope_parameters={"rope_theta": cfg.rotary_base, "rope_type": "default"},
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    sd = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    p = "model."
    out = {p + "embed_tokens.weight": sd["embed.W_E"], p + "norm.weight": sd["ln_final.w"],
           "lm_head.weight": sd["embed.W_E"] if cfg.tied_embeddings else sd["unembed.W_U"].T}
    merge = "head d_model d_head -> (head d_head) d_model"
    for l in range(cfg.n_layers):
        h, b = f"{p}layers.{l}.", f"blocks.{l}."
        out |= {
            h + "input_layernorm.weight": sd[b + "ln1.w"], h + "post_attention_layernorm.weight": sd[b + "ln2.w"],
            h + "self_attn.q_proj.weight": einops.rearrange(sd[b + "attn.W_Q"], merge),
            h + "self_attn.k_proj.weight": einops.rearrange(sd[b + "attn.W_K"], merge),
            h + "self_attn.v_proj.weight": einops.rearrange(sd[b + "attn.W_V"], merge),
            h + "self_attn.o_proj.weight": einops.rearrange(sd[b + "attn.W_O"], "head d_head d_model -> d_model (head d_head)"),
            h + "mlp.gate_proj.weight": sd[b + "mlp.W_gate"].T, h + "mlp.up_proj.weight": sd[b + "mlp.W_in"].T,
            h + "mlp.down_proj.weight": sd[b + "mlp.W_out"].T,
        }
    hf = LlamaForCausalLM(hf_cfg)
    _load_hf_state(hf, out)
    return hf.eval()


def _load_hf_state(hf: Any, state: dict[str, Tensor]) -> None:
    expected = set(hf.state_dict())
    missing = sorted(k for k in expected - state.keys() if not k.endswith("attn.bias") and not k.endswith("masked_bias"))
    if missing:
        raise ValueError(f"export left Hugging Face weights unset: {missing[:5]}")
    hf.load_state_dict({k: v.contiguous() for k, v in state.items()}, strict=False)


# --------------------------------------------------------------------------------------------
# Local folders
# --------------------------------------------------------------------------------------------
def load_hf(path: str | Path, device: str | torch.device = "cpu") -> HookedTransformer:
    """A HookedTransformer from a local Hugging Face `save_pretrained` folder (with its tokenizer if present)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a Hugging Face model folder (no config.json)")
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    if config.model_type not in SUPPORTED:
        raise _unsupported(config.model_type)
    hf = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    return from_hf(hf, tokenizer=_local_tokenizer(path)).to(device)


def _local_tokenizer(path: Path) -> Any:
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def bridge(path: str | Path, device: str = "cpu") -> Any:
    """Any local HF causal LM wrapped by TransformerLens's TransformerBridge (hooked, not converted)."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a Hugging Face model folder (no config.json)")
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    hf = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    return TransformerBridge.boot_transformers(config.architectures[0] if config.architectures else config.model_type,
                                               hf_model=hf, tokenizer=_local_tokenizer(path), device=device)
