"""What an activation set's index says, checked against its shards: the index's fields and the order of its
shards, each shard a regular file inside the set's folder whose safetensors header holds the rows, shapes and dtypes
the index says, and whose bytes match the SHA-256 recorded when it was written. Each failure is an InputError naming
the file that is wrong (`lab.analysis.activations.store` reads through these)."""

import hashlib
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open

from lab.outside_files import InputError, regular_file

DTYPE_NAMES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


def dtype_name(safetensors_dtype: str) -> str:
    """safetensors' dtype codes (F32, F16, BF16, I64) as the torch names index.json uses."""
    return DTYPE_NAMES[safetensors_dtype]


def is_row_spec(spec: Any) -> bool:
    """An index's description of one hook's rows: {"shape": [sizes ≥ 0], "dtype": one of DTYPE_NAMES' names}."""
    return (
        isinstance(spec, dict)
        and isinstance(spec.get("shape"), list)
        and all(type(n) is int and n >= 0 for n in spec["shape"])
        and spec.get("dtype") in DTYPE_NAMES.values()
    )


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, read a megabyte at a time."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def checked_shards(path: Path, shards: Any) -> list[dict[str, Any]]:
    """An index's (or harvest record's) list of shards, each with its fields of their types, the sequences in
    order (within each subfolder: a merged set's parts count their own) and no file named twice; an InputError
    naming `path` and the first entry that is not."""
    if not isinstance(shards, list):
        raise InputError(f"{path}: its shards are not a list")
    fields = {"file": str, "rows": int, "sequences": int, "tokens_sha256": str, "sha256": str}
    ends: dict[str, int] = {}
    for number, shard in enumerate(shards):
        wrong = [key for key, kind in fields.items() if not isinstance(shard, dict) or type(shard.get(key)) is not kind]
        if wrong:
            raise InputError(f"{path}: shard {number} has no {wrong[0]} of type {fields[wrong[0]].__name__}")
        part = shard["file"].rpartition("/")[0]
        end = ends.get(part, 0)
        if shard["rows"] < 1 or shard["sequences"] < end:
            raise InputError(
                f"{path}: shard {number} ({shard['file']}) holds {shard['rows']} rows ending at sequence "
                f"{shard['sequences']}, after one ending at {end}: not a harvest's order"
            )
        ends[part] = shard["sequences"]
    names = [shard["file"] for shard in shards]
    if len(set(names)) != len(names):
        raise InputError(f"{path} names one shard file twice")
    return shards


def verify_checksum(directory: Path, shard: dict[str, Any]) -> Path:
    """The shard's file, after checking that it is a regular file inside `directory` whose bytes are those its
    checksum was taken of when it was written; an InputError naming it otherwise."""
    path = regular_file(directory / shard["file"], directory, what="activation shard")
    if file_sha256(path) != shard["sha256"]:
        raise InputError(
            f"{path} is not the shard the index recorded (its SHA-256 differs from the one taken when "
            "it was written): the file was changed, cut short or swapped; harvest the set again"
        )
    return path


def check_header(directory: Path, hooks: dict[str, Any], shard: dict[str, Any]) -> None:
    """The shard's header holds every hook, seq and pos, with the index's row count, shapes and dtypes."""
    path = regular_file(directory / shard["file"], directory, what="activation shard")
    expected = {name: ([shard["rows"], *spec["shape"]], spec["dtype"]) for name, spec in hooks.items()}
    expected |= {name: ([shard["rows"]], "int64") for name in ("seq", "pos")}
    try:
        with safe_open(str(path), framework="pt") as f:
            found = {
                name: (list(f.get_slice(name).get_shape()), dtype_name(f.get_slice(name).get_dtype()))
                for name in f.keys()
            }
    except (SafetensorError, OSError, ValueError, KeyError) as err:
        raise InputError(f"malformed or truncated activation shard {path}: {err}") from err
    for name, (shape, dtype) in expected.items():
        if found.get(name) != (shape, dtype):
            have = "nothing" if name not in found else f"{found[name][0]} {found[name][1]}"
            raise InputError(f"{path} holds {have} for {name}, where the index says {shape} {dtype}")
    unlisted = sorted(found.keys() - expected.keys())
    if unlisted:
        raise InputError(f"{path} holds {unlisted[0]}, which the index does not list")
