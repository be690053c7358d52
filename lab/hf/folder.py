"""A local Hugging Face `save_pretrained` folder, read strictly: its config (`read_hf_config`), its tokenizer, its
safetensors checked before anything is loaded (`check_safetensors`: never a pickle, every shard whole), and the
causal LM loaded only if its weights are exactly what config.json describes (`read_hf_folder`).
`hf_model_type` says which architecture a folder holds without loading transformers.

Nothing in the folder runs as code: every transformers loader is called with trust_remote_code=False, and a
config.json or tokenizer_config.json whose `auto_map` names Python code in the folder is refused before
transformers sees it (`refuse_code`). Every file of the folder is a regular file inside it (`check_folder_files`,
through `lab.outside_files`): transformers opens files by names of its own, and a FIFO among them would hang it."""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lab.model.checkpoint import describe_weight_problems
from lab.outside_files import MAX_JSON_BYTES, InputError, inside, read_json, read_json_object, regular_file

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
# Weights in formats Forma never reads: a pickle (torch.load can run code) or another framework's.
OTHER_WEIGHTS = (
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "tf_model.h5",
    "flax_model.msgpack",
    "model.ckpt.index",
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def hf_model_type(folder: str | Path) -> str | None:
    """The model_type a Hugging Face folder's config.json records; None for a folder that is not one (no
    readable config.json, or one that names no model_type, as a Forma model folder's). Read as plain JSON:
    nothing of transformers is loaded."""
    try:
        config = read_json(Path(folder) / "config.json", folder_root(Path(folder)), what="model config")
    except (OSError, ValueError):
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
    read_hf_config(path)
    check_safetensors(path)
    with quiet_transformers():
        hf, info = AutoModelForCausalLM.from_pretrained(
            path,
            local_files_only=True,
            trust_remote_code=False,
            use_safetensors=True,
            output_loading_info=True,
            ignore_mismatched_sizes=True,
            **options,
        )
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

    root = folder_root(path)
    index = path / SAFETENSORS_INDEX
    if index.exists():
        weight_map = read_json_object(index, root, what="weights index").get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(name, str) for name in weight_map.values()):
            raise InputError(f"malformed {index}: its weight_map must map tensor names to shard file names")
        shards = sorted({path / name for name in weight_map.values()})
        absent = [shard.name for shard in shards if not shard.exists()]
        if absent:
            raise FileNotFoundError(f"{index} names shards that are not in {path}: {absent}")
        for shard in shards:
            regular_file(shard, root, what="weights shard")
    elif (path / SAFETENSORS_FILE).exists():
        shards = [regular_file(path / SAFETENSORS_FILE, root, what="weights file")]
    else:
        other = [name for name in OTHER_WEIGHTS if (path / name).exists()]
        if other:
            raise ValueError(
                f"{path} holds {other[0]}, and Forma reads safetensors only: a pickle checkpoint can run code when "
                "it is loaded, so it is never opened. Convert it once, where you trust the file: "
                "AutoModelForCausalLM.from_pretrained(folder).save_pretrained(folder) writes model.safetensors"
            )
        raise FileNotFoundError(f"{path} has no {SAFETENSORS_FILE} (nor {SAFETENSORS_INDEX}): no weights to load")
    for shard in shards:
        try:
            with safe_open(str(shard), framework="pt") as handle:
                handle.keys()
        except (SafetensorError, OSError, ValueError) as err:
            raise ValueError(f"malformed or truncated weights {shard}: {err}") from err
    return shards


def folder_root(path: Path) -> Path:
    """The folder every file of a model folder must resolve inside: the folder itself, or for a Hugging Face cache
    snapshot (.../models--ORG--NAME/snapshots/REVISION/, whose files are links into the same model's blobs/) the
    model's cache folder, models--ORG--NAME."""
    path = Path(path)
    if path.parent.name == "snapshots" and path.parent.parent.name.startswith("models--"):
        return path.parent.parent
    return path


def check_folder_files(path: Path) -> None:
    """Every file of a model folder (links followed; subfolders aside) is a regular file that resolves inside it
    (`folder_root`), and its JSON files (config, tokenizer, generation config) are at most MAX_JSON_BYTES: an
    InputError naming the first that is not."""
    root = folder_root(path)
    for entry in sorted(path.iterdir()):
        if entry.is_dir():
            continue
        inside(entry, root)
        if not entry.exists():
            raise InputError(f"{entry} is a link to nothing")
        regular_file(entry, root, MAX_JSON_BYTES if entry.suffix == ".json" else None)


def refuse_code(path: Path, data: dict[str, Any]) -> None:
    """An InputError when a config (config.json, tokenizer_config.json) asks to run Python code from its folder."""
    if "auto_map" in data:
        code = data["auto_map"]
        named = ", ".join(f"{k} → {v}" for k, v in code.items()) if isinstance(code, dict) else repr(code)
        raise InputError(
            f"{path} asks to run Python code from its folder (auto_map: {named}); Forma never runs a "
            "model folder's code (trust_remote_code=False): use a model whose architecture transformers "
            "has built in"
        )


def _check_dtype(path: Path, data: dict[str, Any]) -> None:
    """The dtype a config records is one torch has (or "auto", or none); an InputError naming it otherwise."""
    import torch

    for key in ("dtype", "torch_dtype"):
        value = data.get(key)
        if value is None or value == "auto":
            continue
        name = value.removeprefix("torch.") if isinstance(value, str) else None
        if name is None or not name.isidentifier() or not isinstance(getattr(torch, name, None), torch.dtype):
            raise InputError(f"{path}: {key} {value!r} is not a torch dtype (float32, float16, bfloat16, ...)")


def read_hf_config(path: Path) -> Any:
    """The folder's transformers config; FileNotFoundError or ValueError naming config.json."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    config = path / "config.json"
    if not config.exists():
        raise FileNotFoundError(f"{path} is not a Hugging Face model folder (no config.json)")
    check_folder_files(path)
    data = read_json_object(config, folder_root(path), what="model config")
    refuse_code(config, data)
    _check_dtype(config, data)
    try:
        with quiet_transformers():
            return AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, StrictDataclassError) as err:
        # what transformers raises for a config it cannot read, or one whose fields have the wrong type
        raise InputError(f"malformed {config}: {err}") from err


def local_tokenizer(path: Path) -> Any:
    """A Hugging Face folder's tokenizer (transformers' AutoTokenizer, none of the folder's code run), or None when
    it has none; a ValueError naming a file that cannot be read."""
    path = Path(path)
    present = [f for f in TOKENIZER_FILES if (path / f).exists()]
    if not present:
        return None
    from transformers import AutoTokenizer

    check_folder_files(path)
    if (path / "tokenizer_config.json").exists():
        refuse_code(
            path / "tokenizer_config.json",
            read_json_object(path / "tokenizer_config.json", folder_root(path), what="tokenizer config"),
        )
    try:
        with quiet_transformers():
            return AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except Exception as err:  # the Rust tokenizers library raises plain Exception for a malformed tokenizer.json
        raise InputError(f"malformed tokenizer in {path} ({', '.join(present)}): {err}") from err


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' warnings and load report off for a call whose problems Forma reports itself."""
    from transformers.utils import logging

    before = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(before)
