"""The conversion itself, for every family of `lab.hf.families.FAMILIES`: `from_hf` (an HF causal LM's weights
into a HookedTransformer, checked against its config first, converted part by part into a model built on the meta
device, `empty_model`) and `to_hf` (the inverse, as the family whose shape the model has: `export_family`). Both
are exact: logits agree to float32 round-off (tested, per family and direction)."""

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from lab.hf.families import FAMILIES
from lab.hf.family import Family, Reader, State, UnsupportedArchitecture
from lab.hf.folder import quiet_transformers
from lab.model.attention import Rotary
from lab.model.checkpoint import describe_weight_problems
from lab.model.config import ModelConfig
from lab.model.embeddings import SinusoidalPositions
from lab.model.offload import read_weight
from lab.model.transformer import HookedTransformer


def from_hf(hf_model: Any, tokenizer: Any = None, dtype: torch.dtype = torch.float32) -> HookedTransformer:
    """A HookedTransformer (on the CPU, eval mode, weights in `dtype`) with the weights of an HF causal LM of
    a family in SUPPORTED. The HF model may itself be spread over devices or offloaded by accelerate.

    The model's tensors are first checked against what its config describes (the same class built on the
    meta device): a missing, unexpected or mis-shaped one is a ValueError naming it."""
    model_type = getattr(hf_model.config, "model_type", type(hf_model).__name__)
    family = family_of(model_type)
    with quiet_transformers():
        check_against_config(hf_model)
    model = empty_model(model_config(family, hf_model.config), tokenizer)
    convert_into(model, family, hf_model, lambda name, tensor: assign(model, name, tensor, "cpu", dtype))
    return family.set_defaults(model).eval()


def family_of(model_type: str) -> Family:
    """The family of a Hugging Face model_type; UnsupportedArchitecture, pointing to the bridge, for any other."""
    if model_type not in FAMILIES:
        names = ", ".join(family.name for family in FAMILIES.values())
        raise UnsupportedArchitecture(
            f"Forma converts {names} models ({tuple(FAMILIES)}) into its own HookedTransformer; {model_type!r} is "
            "not one of them. Wrap it instead with lab.hf.loading.bridge(path), which uses TransformerLens's "
            "TransformerBridge and exposes the same hook names on the Hugging Face module tree."
        )
    return FAMILIES[model_type]


def model_config(family: Family, hf_config: Any) -> ModelConfig:
    """The family's reading of an HF config; a ValueError naming the family for one that is no Forma model."""
    try:
        return family.config(hf_config)
    except UnsupportedArchitecture:
        raise
    except ValueError as err:
        raise ValueError(f"the Hugging Face {family.model_type} config does not describe a Forma model: {err}") from err


def empty_model(cfg: ModelConfig, tokenizer: Any = None) -> HookedTransformer:
    """HookedTransformer(cfg) with its parameters on the meta device (no memory, no random initialisation) and
    its fixed tables (rotary cos/sin, sinusoidal positions) computed on the CPU: a frame to load weights into."""
    with torch.device("meta"):
        model = HookedTransformer(cfg, tokenizer=tokenizer)
    # The tables depend on the config only, so one CPU instance of each owner serves every layer.
    owners: dict[type, Callable[[], nn.Module]] = {
        Rotary: lambda: Rotary(cfg),
        SinusoidalPositions: lambda: SinusoidalPositions(cfg, None),
    }
    built: dict[type, nn.Module] = {}
    for module in model.modules():
        for name, buffer in list(module.named_buffers(recurse=False)):
            if buffer.is_meta:
                kind = type(module)
                if kind not in owners:
                    raise TypeError(f"{kind.__name__}.{name} is a fixed table that empty_model cannot compute")
                if kind not in built:  # computed once (setdefault would compute it anew for every buffer)
                    built[kind] = owners[kind]()
                module.register_buffer(name, getattr(built[kind], name), persistent=False)
    return model


def assign(model: nn.Module, name: str, tensor: Tensor, device: Any, dtype: torch.dtype) -> None:
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


def convert_into(model: HookedTransformer, family: Family, hf_model: Any, place: Callable[[str, Tensor], None]) -> None:
    """Convert the HF weights part by part (the outer modules, then one block at a time) and hand each Forma
    tensor to `place`; every tensor of `model` must come out exactly once, with its shape."""
    c, cfg, read = hf_model.config, model.cfg, _reader(hf_model)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    seen: set[str] = set()
    parts = [lambda: family.weights.outer(c, cfg, read)] + [
        (lambda layer=layer: family.weights.layer(c, cfg, read, layer)) for layer in range(cfg.n_layers)
    ]
    for part in parts:
        for name, tensor in part().items():
            if expected.get(name) != tuple(tensor.shape):
                raise ValueError(
                    f"conversion made {name} of shape {tuple(tensor.shape)}; the model has "
                    f"{expected.get(name, 'no such tensor')}"
                )
            place(name, tensor)
            seen.add(name)
    if expected.keys() - seen:
        raise ValueError(f"conversion left Forma weights unset: {sorted(expected.keys() - seen)[:5]}")


def check_against_config(hf_model: Any) -> None:
    """ValueError naming every tensor of `hf_model` that its config does not describe, or describes with
    another shape, and every one it describes that is missing (e.g. layers removed from the module tree); and
    naming an output head that the config ties to the token embedding but that is a tensor of its own."""
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in type(hf_model)(hf_model.config).state_dict().items()}
    problems = describe_weight_problems(expected, {k: tuple(v.shape) for k, v in hf_model.state_dict().items()})
    if problems:
        raise ValueError(f"the Hugging Face model's tensors do not match its config: {problems}")
    _check_tied_head(hf_model)


def _check_tied_head(hf_model: Any) -> None:
    """A config that ties the output head to the token embedding (tie_word_embeddings) describes one tensor; when
    the weights hold an lm_head that differs from the embedding, transformers keeps the two apart and Forma, reading
    the config, would tie them: logits that silently differ. A ValueError naming both instead."""
    if not getattr(hf_model.config, "tie_word_embeddings", False):
        return
    head, embedding = hf_model.get_output_embeddings(), hf_model.get_input_embeddings()
    if head is None or embedding is None or head.weight is embedding.weight:
        return
    names = {id(p): name for name, p in hf_model.named_parameters(remove_duplicate=False)}
    raise ValueError(
        f"config.json ties the output head to the token embedding (tie_word_embeddings: true), but the "
        f"weights hold {names.get(id(head.weight), 'an output head')}, which differs from "
        f"{names.get(id(embedding.weight), 'the embedding')}; transformers keeps the two apart. Set "
        "tie_word_embeddings to false in config.json to load both, or remove the head from the weights"
    )


def export_family(cfg: ModelConfig) -> str:
    """The Hugging Face model_type that `to_hf` writes a model of this config as (the family whose `shape` it has);
    UnsupportedArchitecture when no family has its shape."""
    if cfg.d_vocab_out != cfg.d_vocab:
        raise UnsupportedArchitecture(
            f"no Hugging Face family has d_vocab_out ({cfg.d_vocab_out}) other than d_vocab ({cfg.d_vocab})"
        )
    for model_type, family in FAMILIES.items():  # the families' shapes exclude each other (tested)
        if family.shape(cfg):
            return model_type
    shapes = "; ".join(f"{family.name} ({family.shape_text})" for family in FAMILIES.values())
    raise UnsupportedArchitecture(f"to_hf exports these shapes only: {shapes}")


def to_hf(model: HookedTransformer) -> Any:
    """The same network as a Hugging Face model of the family its shape matches (see `export_family`), in
    eval mode, float32."""
    from transformers import AutoModelForCausalLM

    family = FAMILIES[export_family(model.cfg)]
    if float(model.b_U.detach().abs().max()) != 0.0:
        raise UnsupportedArchitecture("Hugging Face's causal-LM heads have no unembedding bias; b_U is not zero")
    cfg = model.cfg
    hf_config = family.hf_config(cfg)
    sd = {k: read_weight(model, k).detach().float().cpu() for k in model.state_dict()}  # offloaded ones from store
    state = family.weights.outer_out(sd, cfg)
    for layer in range(cfg.n_layers):
        state |= family.weights.layer_out(sd, cfg, layer)
    with quiet_transformers():
        hf = AutoModelForCausalLM.from_config(hf_config, trust_remote_code=False)
    return _load_hf_state(hf, state)


def _load_hf_state(hf: Any, state: State) -> Any:
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
