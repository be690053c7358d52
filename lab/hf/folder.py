"""A local Hugging Face `save_pretrained` folder, read strictly: its config (`_hf_config`), its tokenizer, its
safetensors checked before anything is loaded (`check_safetensors`: never a pickle, every shard whole), and the
causal LM loaded only if its weights are exactly what config.json describes (`read_hf_folder`).
`hf_model_type` says which architecture a folder holds without loading transformers."""

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lab.model.checkpoint import describe_weight_problems

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
# Weights in formats Forma never reads: a pickle (torch.load can run code) or another framework's.
OTHER_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack",
                 "model.ckpt.index")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def hf_model_type(folder: str | Path) -> str | None:
    """The model_type a Hugging Face folder's config.json records; None for a folder that is not one (no
    readable config.json, or one that names no model_type, as a Forma model folder's). Read as plain JSON:
    nothing of transformers is loaded."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return str(config["model_type"]) if isinstance(config, dict) and "model_type" in config else None


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
    described = {k: () for k in info["missing_keys"]} | {k: tuple(want) for k, _, want in info["mismatched_keys"]}
    found = {k: () for k in info["unexpected_keys"]} | {k: tuple(have) for k, have, _ in info["mismatched_keys"]}
    problems = describe_weight_problems(described, found)
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
