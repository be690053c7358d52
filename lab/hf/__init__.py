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
its safetensors hold exactly the tensors its config.json describes. Nothing in the folder runs as code: every
transformers loader is called with trust_remote_code=False, and a folder that asks for its own code is refused.

The modules: `family` (SUPPORTED, UnsupportedArchitecture, the Family record), `hf_to_forma` and
`forma_to_hf` (each family's tensors, each way), `convert` (FAMILIES, from_hf, to_hf, empty_model),
`device_map` (where each module of a spread model lives), `folder` (reading and checking a local folder,
hf_model_type) and `loading` (load_hf, bridge).
"""

from lab.hf.convert import FAMILIES, empty_model, from_hf, to_hf
from lab.hf.device_map import AUTO_MAPS, check_placement, forma_device_map
from lab.hf.family import FAMILY_NAMES, SUPPORTED, Family, Reader, UnsupportedArchitecture
from lab.hf.folder import (
    OTHER_WEIGHTS,
    SAFETENSORS_FILE,
    SAFETENSORS_INDEX,
    TOKENIZER_FILES,
    check_safetensors,
    hf_model_type,
    local_tokenizer,
    read_hf_folder,
)
from lab.hf.forma_to_hf import EXPORT_ACTIVATIONS, EXPORT_SHAPES, export_family
from lab.hf.hf_to_forma import HF_ACTIVATIONS, NEOX_QKV, NEOX_QKV_BIAS
from lab.hf.loading import bridge, load_hf

# Every public name of the former lab/hf.py module stays importable from lab.hf.
__all__ = [
    "AUTO_MAPS",
    "EXPORT_ACTIVATIONS",
    "EXPORT_SHAPES",
    "FAMILIES",
    "FAMILY_NAMES",
    "HF_ACTIVATIONS",
    "NEOX_QKV",
    "NEOX_QKV_BIAS",
    "OTHER_WEIGHTS",
    "SAFETENSORS_FILE",
    "SAFETENSORS_INDEX",
    "SUPPORTED",
    "TOKENIZER_FILES",
    "Family",
    "Reader",
    "UnsupportedArchitecture",
    "bridge",
    "check_placement",
    "check_safetensors",
    "empty_model",
    "export_family",
    "forma_device_map",
    "from_hf",
    "hf_model_type",
    "load_hf",
    "local_tokenizer",
    "read_hf_folder",
    "to_hf",
]
