"""What every Hugging Face family Forma converts has in common: `Family`, the record of how one architecture maps
onto Forma's HookedTransformer (each family's is in its own file under lab/hf/families/, and the table of them is
`lab.hf.families.FAMILIES`), the error for an architecture or a variant Forma does not convert
(`UnsupportedArchitecture`, `variant`), and the pieces the families' files share: activation names each way, the
rotary embedding's parameters, and the tensors every family lays out alike (the embedding, final norm and head;
a block's two norms)."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import einops
import torch
from torch import Tensor

from lab.model.config import ModelConfig
from lab.model.tokenization import has_bos
from lab.model.transformer import HookedTransformer


class UnsupportedArchitecture(ValueError):
    pass


def variant(what: str) -> UnsupportedArchitecture:
    """A family Forma converts, in a variant it does not."""
    return UnsupportedArchitecture(
        f"{what} is not supported by Forma's conversion; wrap the model with "
        "lab.hf.loading.bridge(path) (TransformerLens's TransformerBridge) instead"
    )


Reader = Callable[[str], Tensor]  # a Hugging Face tensor by its state-dict name
State = dict[str, Tensor]  # tensors by name: Forma's (`model.state_dict()`) or Hugging Face's


@dataclass(frozen=True)
class Weights:
    """How a family's weights map each way: in, Forma's embed, positions, final norm and unembed (`outer`) and
    blocks.{layer} (`layer`) from Hugging Face's tensors; out, the same from Forma's state to Hugging Face's."""

    outer: Callable[[Any, ModelConfig, Reader], State]
    layer: Callable[[Any, ModelConfig, Reader, int], State]
    outer_out: Callable[[State, ModelConfig], State]
    layer_out: Callable[[State, ModelConfig, int], State]


@dataclass(frozen=True)
class Family:
    """How one Hugging Face architecture maps onto Forma's HookedTransformer, each way."""

    model_type: str  # Hugging Face's config.model_type
    name: str  # as people write it: "GPT-2"
    # Config in: the HF config as a ModelConfig (UnsupportedArchitecture for a variant Forma lacks); and out: whether
    # a ModelConfig has this family's shape (`shape`, described for people by `shape_text`), and its HF config.
    config: Callable[[Any], ModelConfig]
    shape: Callable[[ModelConfig], bool]
    shape_text: str
    hf_config: Callable[[ModelConfig], Any]
    weights: Weights  # the weights, each way
    modules: dict[str, str]  # Forma module -> the HF module holding its weights; "{l}" stands for the layer
    # The tiny HF config tests build the family from (`tiny(vocab, **options)`), and the variants they run (at least
    # one): test id -> options.
    tiny: Callable[..., Any]
    variants: dict[str, dict[str, Any]]
    # Whether text gets the tokenizer's BOS by default (when it has one): TransformerLens's default for the family
    # (False for GPT-NeoX / Pythia and Qwen2, True for the others).
    prepend_bos: bool = True

    def set_defaults(self, model: HookedTransformer) -> HookedTransformer:
        """The converted model's run-time defaults as TransformerLens sets them: default_prepend_bos, and a tokenizer
        without a pad token padding with its EOS."""
        if model.tokenizer is not None:
            model.set_tokenizer(model.tokenizer)
        model.cfg.default_prepend_bos = self.prepend_bos and model.tokenizer is not None and has_bos(model.tokenizer)
        return model


# Hugging Face activation names (transformers' ACT2FN) and Forma's MLP for each; GPT-2 calls tanh-GELU "gelu_new".
HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
}
# Forma's MLP and the Hugging Face activation name it exports as (HF_ACTIVATIONS reads each back).
EXPORT_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}


def activation(name: str, family: str) -> str:
    """Forma's MLP for a Hugging Face activation name; UnsupportedArchitecture for one Forma lacks."""
    if name not in HF_ACTIVATIONS:
        raise variant(f"{family} activation {name!r}")
    return HF_ACTIVATIONS[name]


def rope(c: Any, family: str) -> tuple[float, float]:
    """(θ base, fraction of each head's dimensions that rotate) of a default (unscaled) rotary embedding."""
    params = getattr(c, "rope_parameters", None) or {}
    if params.get("rope_type", "default") != "default":
        raise variant(f"{family} rope scaling {params.get('rope_type')!r}")
    return (
        float(params.get("rope_theta", getattr(c, "rope_theta", 10000.0))),
        float(params.get("partial_rotary_factor", 1.0)),
    )


def heads(W: Tensor, pattern: str, n_heads: int) -> Tensor:
    """`W` rearranged by an einops `pattern` whose `head` axis has n_heads entries."""
    return einops.rearrange(W, pattern, head=n_heads)


def read_outer(embed: str, final_norm: str, cfg: ModelConfig, read: Reader, positions: str | None = None) -> State:
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


def write_outer(sd: State, cfg: ModelConfig, embed: str, final_norm: str) -> State:
    """The inverse of `read_outer` (but for the positions, which only GPT-2 has)."""
    out = {
        embed + ".weight": sd["embed.W_E"],
        final_norm + ".weight": sd["ln_final.w"],
        "lm_head.weight": sd["embed.W_E"] if cfg.tied_embeddings else sd["unembed.W_U"].T,
    }
    if cfg.norm == "layernorm":
        out[final_norm + ".bias"] = sd["ln_final.b"]
    return out


def read_norms(b: str, h: str, first: str, second: str, layernorm: bool, read: Reader) -> State:
    """A block's ln1 and ln2 (Forma's names under `b`) from Hugging Face's `first` and `second` under `h`."""
    state = {b + "ln1.w": read(h + first + ".weight"), b + "ln2.w": read(h + second + ".weight")}
    if layernorm:
        state |= {b + "ln1.b": read(h + first + ".bias"), b + "ln2.b": read(h + second + ".bias")}
    return state


def write_norms(sd: State, b: str, h: str, first: str, second: str, layernorm: bool) -> State:
    """The inverse of `read_norms`."""
    out = {h + first + ".weight": sd[b + "ln1.w"], h + second + ".weight": sd[b + "ln2.w"]}
    if layernorm:
        out |= {h + first + ".bias": sd[b + "ln1.b"], h + second + ".bias": sd[b + "ln2.b"]}
    return out
