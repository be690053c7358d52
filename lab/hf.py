"""Hugging Face interop: weights in and out for the GPT-2 and LLaMA families, and a bridge for the rest.

`from_hf(hf_model)` rewrites an HF causal LM's weights into Forma's per-head layout
(W_Q [head, d_model, d_head], W_O [head, d_head, d_model], ...); `to_hf(model)` does the inverse.
Both are exact: logits agree to float32 round-off (tested). Any other architecture is out of scope
here and goes through TransformerLens's TransformerBridge (`bridge(path)`), which hooks the HF
module tree directly.

Nothing is fetched from a hub: `load_hf` and `bridge` read a local `save_pretrained` folder only, and only if
its safetensors hold exactly the tensors its config.json describes.
"""

import json
from collections.abc import Iterator
from contextlib import contextmanager
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
    """A HookedTransformer with the weights of a GPT-2- or LLaMA-family HF model (float32, eval mode).

    The model's tensors are first checked against what its config describes (the same class built on the
    meta device): a missing, unexpected or mis-shaped one is a ValueError naming it."""
    model_type = getattr(hf_model.config, "model_type", type(hf_model).__name__)
    converters = {"gpt2": _gpt2_to_forma, "llama": _llama_to_forma}
    if model_type not in converters:
        raise _unsupported(model_type)
    with _quiet_transformers():
        _check_against_config(hf_model)
    try:
        cfg, state = converters[model_type](hf_model.config, {k: v.detach().float().cpu()
                                                               for k, v in hf_model.state_dict().items()})
    except UnsupportedArchitecture:
        raise
    except ValueError as err:
        raise ValueError(f"the Hugging Face {model_type} config does not describe a Forma model: {err}") from err
    model = HookedTransformer(cfg, tokenizer=tokenizer)
    model.load_weights(state, source=f"Hugging Face {model_type} model")
    return model.eval()


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


def _gpt2_to_forma(c: Any, sd: dict[str, Tensor]) -> tuple[ModelConfig, dict[str, Tensor]]:
    if c.activation_function not in ("gelu_new", "gelu_pytorch_tanh", "gelu", "relu"):
        raise UnsupportedArchitecture(f"GPT-2 activation {c.activation_function!r} is not supported")
    if not c.scale_attn_weights or c.scale_attn_by_inverse_layer_idx or c.reorder_and_upcast_attn:
        raise UnsupportedArchitecture("GPT-2 variants with non-standard attention scaling are not supported")
    mlp = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}.get(c.activation_function, c.activation_function)
    cfg = ModelConfig(
        d_vocab=c.vocab_size, d_model=c.n_embd, n_layers=c.n_layer, n_heads=c.n_head, n_ctx=c.n_positions,
        d_mlp=c.n_inner or 4 * c.n_embd, positions="learned", norm="layernorm", norm_eps=c.layer_norm_epsilon,
        mlp=mlp, block="pre_ln", tied_embeddings=c.tie_word_embeddings, bias=True)
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
        block="pre_ln", tied_embeddings=c.tie_word_embeddings, bias=False)
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
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
# Weights in formats Forma never reads: a pickle (torch.load can run code) or another framework's.
OTHER_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack",
                 "model.ckpt.index")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def load_hf(path: str | Path, device: str | torch.device = "cpu") -> HookedTransformer:
    """A HookedTransformer from a local Hugging Face `save_pretrained` folder (with its tokenizer if present).

    The folder must hold exactly what its config.json describes (see `read_hf_folder`)."""
    path = Path(path)
    config = _hf_config(path)
    if config.model_type not in SUPPORTED:
        raise _unsupported(config.model_type)
    tokenizer = _local_tokenizer(path)
    hf = read_hf_folder(path, dtype=torch.float32)
    try:
        return from_hf(hf, tokenizer=tokenizer).to(device)
    except UnsupportedArchitecture:
        raise
    except ValueError as err:
        raise ValueError(f"{path / 'config.json'}: {err}") from err


def bridge(path: str | Path, device: str = "cpu") -> Any:
    """Any local HF causal LM wrapped by TransformerLens's TransformerBridge (hooked, not converted).

    The folder must hold its tokenizer: without one TransformerBridge would look the model's name up on a
    model hub, and nothing in Forma reaches the network."""
    from transformer_lens.model_bridge import TransformerBridge

    path = Path(path)
    config = _hf_config(path)
    tokenizer = _local_tokenizer(path)
    if tokenizer is None:
        raise FileNotFoundError(
            f"{path} holds no tokenizer ({' or '.join(TOKENIZER_FILES)}): TransformerBridge needs one, and would "
            "otherwise fetch it from a model hub. Save it beside the model: tokenizer.save_pretrained(folder)")
    hf = read_hf_folder(path)
    name = config.architectures[0] if config.architectures else config.model_type
    return TransformerBridge.boot_transformers(name, hf_model=hf, tokenizer=tokenizer, device=device)


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
