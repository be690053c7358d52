"""What every Hugging Face family Forma converts has in common: the families' names (`SUPPORTED`), the error
for an architecture or a variant Forma does not convert (`UnsupportedArchitecture`), and `Family`, the record
of how one architecture maps onto Forma's HookedTransformer (the table of them is `lab.hf.convert.FAMILIES`)."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from lab.model import HookedTransformer, ModelConfig
from lab.model.tokenization import has_bos

SUPPORTED = ("gpt2", "llama", "gpt_neox", "qwen2", "mistral")  # Hugging Face model_type of each family
FAMILY_NAMES = {
    "gpt2": "GPT-2",
    "llama": "LLaMA",
    "gpt_neox": "GPT-NeoX / Pythia",
    "qwen2": "Qwen2",
    "mistral": "Mistral",
}


class UnsupportedArchitecture(ValueError):
    pass


def _unsupported(model_type: str) -> UnsupportedArchitecture:
    return UnsupportedArchitecture(
        f"Forma converts {', '.join(FAMILY_NAMES.values())} models ({SUPPORTED}) into its own HookedTransformer; "
        f"{model_type!r} is not one of them. Wrap it instead with lab.hf.bridge(path), which uses TransformerLens's "
        "TransformerBridge and exposes the same hook names on the Hugging Face module tree."
    )


def _variant(what: str) -> UnsupportedArchitecture:
    """A family Forma converts, in a variant it does not."""
    return UnsupportedArchitecture(
        f"{what} is not supported by Forma's conversion; wrap the model with "
        "lab.hf.bridge(path) (TransformerLens's TransformerBridge) instead"
    )


Reader = Callable[[str], Tensor]  # a Hugging Face tensor by its state-dict name


@dataclass(frozen=True)
class Family:
    """How one Hugging Face architecture maps onto Forma's HookedTransformer."""

    config: Callable[[Any], ModelConfig]  # the HF config as a ModelConfig; UnsupportedArchitecture for a variant
    outer: Callable[[Any, ModelConfig, Reader], dict[str, Tensor]]  # embed, positions, final norm, unembed
    layer: Callable[[Any, ModelConfig, Reader, int], dict[str, Tensor]]  # blocks.{layer}
    modules: dict[str, str]  # Forma module -> the HF module holding its weights; "{l}" stands for the layer
    export: Callable[[HookedTransformer], Any]  # the same network as this family's HF class
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
