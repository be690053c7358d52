"""Loading a model by name: a zoo name, a Forma model folder, or a local Hugging Face folder.

This is above the model package: it reads the zoo (`lab.folders`) and converts Hugging Face folders
(`lab.hf`), neither of which lab/model may import. `HookedTransformer.from_pretrained` and
`EncoderDecoder.from_pretrained` are `from_pretrained` here, the loader pyproject.toml declares under the entry
point group `forma.pretrained` (lab.model.pretrained finds it): the classes keep the method and the model package
imports nothing above it.
"""

from pathlib import Path
from typing import Any

import torch

from lab.folders import model_folder, zoo_dir
from lab.hf.loading import load_hf
from lab.model.checkpoint import CONFIG_FILE, read_config_json
from lab.model.encoder_decoder import EncoderDecoder
from lab.model.transformer import HookedTransformer


def is_hf_folder(folder: Path) -> bool:
    """A Hugging Face `save_pretrained` folder: its config.json names a `model_type` (Forma's does not)."""
    config = folder / CONFIG_FILE
    return config.is_file() and "model_type" in read_config_json(config)


PROCESSING = ("fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases")


def from_pretrained(cls: type, name_or_path: str | Path, device: str | torch.device = "cpu", **options: Any) -> Any:
    """`cls` (a HookedTransformer or an EncoderDecoder) from a zoo name or a folder written by its `save`; a
    HookedTransformer also from a local Hugging Face folder (`lab.hf.loading.load_hf`).

    options (HookedTransformer.from_pretrained's): the processing flags, None meaning TransformerLens's default for
    a Hugging Face checkpoint (on) and off for a Forma folder (a checkpoint of the model itself);
    refactor_factored_attn_matrices; default_prepend_bos and default_padding_side; dtype."""
    folder = model_folder(name_or_path)
    if not issubclass(cls, HookedTransformer):
        if options:
            raise ValueError(f"{cls.__name__}.from_pretrained takes no options, got {sorted(options)}")
        return cls.load(folder, device=device)
    hf = is_hf_folder(folder)
    dtype = options.pop("dtype", None)
    if hf:
        model = load_hf(folder, device=device, **({} if dtype is None else {"dtype": dtype}))
    else:
        model = cls.load(folder, device=device)
        if dtype is not None:
            model = model.to(getattr(torch, dtype) if isinstance(dtype, str) else dtype)
    flags = {name: hf if options.get(name) is None else options[name] for name in PROCESSING}
    refactor = bool(options.get("refactor_factored_attn_matrices"))
    if any(flags.values()) or refactor:
        model.process_weights_(refactor_factored_attn_matrices=refactor, **flags)
    if options.get("default_prepend_bos") is not None:
        model.cfg.default_prepend_bos = options["default_prepend_bos"]
    if options.get("default_padding_side") is not None:
        if model.tokenizer is None or not hasattr(model.tokenizer, "padding_side"):
            raise ValueError("default_padding_side sets a Hugging Face tokenizer's padding side; this model has none")
        model.tokenizer.padding_side = model.padding_side(options["default_padding_side"])
    return model


def load_model(name_or_path: str | Path, device: str | torch.device = "cpu") -> HookedTransformer:
    """A decoder-only model by zoo name, Forma folder or Hugging Face folder, its weights as trained (what Forma's
    experiments, dashboard and commands read)."""
    return from_pretrained(HookedTransformer, name_or_path, device, **dict.fromkeys(PROCESSING, False))


def load_encoder_decoder(name_or_path: str | Path, device: str | torch.device = "cpu") -> EncoderDecoder:
    """An encoder–decoder by zoo name or Forma folder."""
    return from_pretrained(EncoderDecoder, name_or_path, device)


def is_encoder_decoder(name_or_path: str | Path) -> bool:
    """True when a model folder (or a trained zoo model's) holds an EncoderDecoder's config.json."""
    folder = Path(name_or_path)
    if not folder.is_dir():
        folder = zoo_dir() / str(name_or_path)
    try:
        return "n_encoder_layers" in read_config_json(folder / CONFIG_FILE)
    except (OSError, ValueError, TypeError):
        return False
