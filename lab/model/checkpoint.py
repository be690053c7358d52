"""A model folder: `model.safetensors` (the weights), `config.json` (the architecture) and the tokenizers
attached to the model (`tokenizer.json`, or an encoder–decoder's `src_tokenizer.json` and `tgt_tokenizer.json`).

Every file is written atomically (`lab.files.atomic_write`), so a crash leaves the old file or the new one;
nothing is pickled. Reading goes through `lab.outside_files` (regular files inside the folder, of bounded size) and
names the part that is missing or malformed. Loading by name
(a zoo name, a Hugging Face folder) is above the model package, in `lab.load`.
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from lab.files import atomic_write
from lab.model.offload import read_weight
from lab.outside_files import MAX_JSON_BYTES, InputError, read_json, read_text, regular_file

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"


def write_checkpoint(model: nn.Module, directory: str | Path, tokenizers: Mapping[str, Any]) -> Path:
    """Write the model's weights and `model.cfg.to_json()`, and each `tokenizers.Tokenizer` of {file name:
    tokenizer} (others, such as a transformers tokenizer, are not Forma's to save), atomically."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: read_weight(model, k).detach().contiguous().cpu() for k in model.state_dict()}  # offloaded too
    atomic_write(directory / WEIGHTS_FILE, lambda path: save_file(state, str(path), metadata={"format": "pt"}))
    atomic_write(directory / CONFIG_FILE, lambda path: path.write_text(model.cfg.to_json()))
    for name, tokenizer in tokenizers.items():
        if tokenizer is not None and hasattr(tokenizer, "to_str"):  # a tokenizers.Tokenizer
            atomic_write(directory / name, lambda path, t=tokenizer: path.write_text(t.to_str()))
    return directory


def read_checkpoint(directory: Path, config_cls: Any) -> tuple[Any, dict[str, Tensor]]:
    """(config, weights) of a Forma model folder; a missing or malformed part is an error naming it."""
    if not directory.is_dir():
        raise FileNotFoundError(f"no model folder at {directory}")
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (directory / name).exists():
            raise FileNotFoundError(f"{directory} has no {name}: not a Forma model folder")
    data = read_json(directory / CONFIG_FILE, directory, what="model config")
    try:
        cfg = config_cls.from_dict(data)
    except ValueError as err:
        raise ValueError(f"malformed config {directory / CONFIG_FILE}: {err}") from err
    weights = regular_file(directory / WEIGHTS_FILE, directory, what="weights file")
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"malformed or truncated checkpoint {directory / WEIGHTS_FILE}: {err}") from err
    return cfg, state


def read_tokenizer(path: Path, folder: Path | None = None) -> Any:
    """A `tokenizers.Tokenizer` saved as JSON (a regular file inside `folder` when given); a ValueError naming the
    file when it cannot be read."""
    from tokenizers import Tokenizer  # only a folder with a tokenizer needs the library

    text = read_text(path, folder, what="tokenizer")
    try:
        return Tokenizer.from_str(text)
    except Exception as err:  # the Rust library raises plain Exception for malformed JSON or an unknown model
        raise InputError(f"malformed tokenizer {path}: {err}") from err


def read_tokenizers(directory: Path, names: tuple[str, ...]) -> list[Any]:
    """The tokenizer saved under each name in the folder, None where there is none."""
    return [read_tokenizer(directory / name, directory) if (directory / name).exists() else None for name in names]


def load_weights(model: nn.Module, state: Mapping[str, Tensor], source: str = "state dict") -> None:
    """Copy weights in, after checking that names and shapes match the model's config exactly."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in state.items()}
    problems = describe_weight_problems(expected, got)
    if problems:
        raise ValueError(f"weights in {source} do not match the config: {problems}")
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            tensor.copy_(state[name])


def describe_weight_problems(
    expected: Mapping[str, tuple[int, ...]], got: Mapping[str, tuple[int, ...]], shown: int = 6
) -> str:
    """'missing [...]; unexpected [...]; mis-shaped k: weights (…), config (…)' between the shapes a config
    describes (`expected`) and those of the weights (`got`), each list cut at `shown` names; empty when all agree.
    The one wording of every weights-against-config check (Forma folders, Hugging Face folders and models)."""

    def names(keys: list[str]) -> str:
        return f"{keys[:shown]}{f' and {len(keys) - shown} more' if len(keys) > shown else ''}"

    missing, unexpected = sorted(expected.keys() - got.keys()), sorted(got.keys() - expected.keys())
    mismatched = sorted(k for k in expected.keys() & got.keys() if tuple(expected[k]) != tuple(got[k]))
    parts = [f"missing {names(missing)}"] if missing else []
    if unexpected:
        parts.append(f"unexpected {names(unexpected)}")
    if mismatched:
        parts.append(
            "mis-shaped "
            + ", ".join(f"{k}: weights {tuple(got[k])}, config {tuple(expected[k])}" for k in mismatched[:shown])
            + (f" and {len(mismatched) - shown} more" if len(mismatched) > shown else "")
        )
    return "; ".join(parts)


def read_config_json(path: Path) -> dict:
    """A folder's config.json as a dict ({} when it holds something else); a ValueError naming a malformed one,
    one that is no regular file inside its folder, or one of more than MAX_JSON_BYTES."""
    data = read_json(path, path.parent, MAX_JSON_BYTES, what="model config")
    return data if isinstance(data, dict) else {}
