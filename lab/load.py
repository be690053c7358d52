"""Loading a model by name: a zoo name, a Forma model folder, or a local Hugging Face folder.

This is above the model package: it reads the zoo (`lab.folders`) and converts Hugging Face folders
(`lab.hf`), neither of which lab/model may import. `HookedTransformer.from_pretrained` and
`EncoderDecoder.from_pretrained` are `from_pretrained` here, reached through `lab.folders.load_pretrained`,
which lab/__init__ points at it; so the classes keep the method and the model package imports nothing
above it.
"""

from pathlib import Path
from typing import Any

import torch

from lab.folders import model_folder
from lab.hf import load_hf
from lab.model import EncoderDecoder, HookedTransformer
from lab.model.checkpoint import CONFIG_FILE, read_config_json


def is_hf_folder(folder: Path) -> bool:
    """A Hugging Face `save_pretrained` folder: its config.json names a `model_type` (Forma's does not)."""
    config = folder / CONFIG_FILE
    return config.is_file() and "model_type" in read_config_json(config)


def from_pretrained(cls: type, name_or_path: str | Path, device: str | torch.device = "cpu") -> Any:
    """`cls` (a HookedTransformer or an EncoderDecoder) from a zoo name or a folder written by its `save`; a
    HookedTransformer also from a local Hugging Face folder (`lab.hf.load_hf`)."""
    folder = model_folder(name_or_path)
    if issubclass(cls, HookedTransformer) and is_hf_folder(folder):
        return load_hf(folder, device=device)
    return cls.load(folder, device=device)


def load_model(name_or_path: str | Path, device: str | torch.device = "cpu") -> HookedTransformer:
    """A decoder-only model by zoo name, Forma folder or Hugging Face folder."""
    return from_pretrained(HookedTransformer, name_or_path, device)


def load_encoder_decoder(name_or_path: str | Path, device: str | torch.device = "cpu") -> EncoderDecoder:
    """An encoder–decoder by zoo name or Forma folder."""
    return from_pretrained(EncoderDecoder, name_or_path, device)
