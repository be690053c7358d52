"""A zoo recipe, `models/<name>/model.toml`, read strictly: its [world], [model] and [train] tables with the
[quick] overrides applied when asked (`load_recipe`), every key of every table checked when it is read (an
unknown key is an error that names it and the known ones, and so is a missing required one)."""

import dataclasses
import tomllib
from dataclasses import dataclass
from typing import Any

from lab.data.facts import FactWorldConfig
from lab.folders import RECIPE_FILE, check_zoo_name
from lab.outside_files import read_text

TABLES = ("world", "model", "train")
MODEL_KIND_NAMES = ("decoder_only", "encoder_decoder")
# The most documents a facts world may draw (the recipe's 5,000 are far below): each is a row of
# seq_len token ids, so 2^24 of them are already a gigabyte or more.
MAX_FACT_DOCUMENTS = 2**24


def load_recipe(name: str, quick: bool = False) -> dict[str, dict[str, Any]]:
    """The recipe's world, model and train tables, with the quick overrides applied when asked."""
    path = check_zoo_name(name) / RECIPE_FILE
    try:
        recipe = tomllib.loads(read_text(path, path.parent, max_bytes=2**20))
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"malformed recipe {path}: {err}") from err
    unknown = sorted(set(recipe) - {"description", *TABLES, "quick"})
    if unknown:
        raise ValueError(
            f"recipe {path} has unknown tables {unknown}; known tables are {sorted(['description', *TABLES, 'quick'])}"
        )
    for key in (*TABLES, "quick"):
        if not isinstance(recipe.get(key, {}), dict):
            raise ValueError(f"recipe {path}: [{key}] must be a table, got {recipe[key]!r}")
    tables = {key: dict(recipe.get(key, {})) for key in TABLES}
    overridden = {key: dict(tables[key]) for key in TABLES}
    for key, overrides in recipe.get("quick", {}).items():
        if key not in tables:
            raise ValueError(f"recipe {path}: unknown quick table {key!r}; known ones are {list(TABLES)}")
        if not isinstance(overrides, dict):
            raise ValueError(f"recipe {path}: [quick.{key}] must be a table, got {overrides!r}")
        overridden[key] |= overrides
    for profile in (tables, overridden):  # both profiles, whichever is asked for: a typo is found either way
        try:
            check_recipe_tables(profile)
        except ValueError as err:
            raise ValueError(f"recipe {path}: {err}") from err
    tables = overridden if quick else tables
    tables["description"] = recipe.get("description", "")
    return tables


def check_recipe_tables(tables: dict[str, dict[str, Any]]) -> None:
    """What a recipe needs before anything is built: a known world kind with known keys of the right
    types (`check_world`), and a [model] with a known kind and an n_ctx. The other [model] and
    [train] keys are checked by ModelConfig / EncoderDecoderConfig and TrainConfig, which reject
    unknown keys by name."""
    check_world(tables["world"])
    kind = tables["model"].get("kind", "decoder_only")
    if kind not in MODEL_KIND_NAMES:
        raise ValueError(f"[model] kind must be one of {list(MODEL_KIND_NAMES)}, got {kind!r}")
    if "n_ctx" not in tables["model"]:
        raise ValueError(
            "[model] needs n_ctx, the context length in tokens (it also sets the training "
            "sequences' length unless [train] seq_len does)"
        )


@dataclass(frozen=True)
class WorldKey:
    """One key a [world] table may hold: its type (an int is accepted where a float belongs) and whether
    the world needs it."""

    type: type
    required: bool = False


WORLD_KEYS: dict[str, dict[str, WorldKey]] = {
    "markov": {
        "vocab_size": WorldKey(int, True),
        "order": WorldKey(int),
        "concentration": WorldKey(float),
        "seed": WorldKey(int),
        "n_sequences": WorldKey(int, True),
        "val_sequences": WorldKey(int),
    },
    "hmm": {
        "n_states": WorldKey(int, True),
        "vocab_size": WorldKey(int, True),
        "concentration": WorldKey(float),
        "seed": WorldKey(int),
        "n_sequences": WorldKey(int, True),
        "val_sequences": WorldKey(int),
    },
    "pydoc": {"vocab_size": WorldKey(int), "held_out_fraction": WorldKey(float), "max_train_chars": WorldKey(int)},
    "dates": {"n_train": WorldKey(int, True), "n_held_out": WorldKey(int, True), "seed": WorldKey(int)},
    # facts: FactWorldConfig's fields (it checks their types and values) and the document form
}


TYPE_NAMES = {int: "an integer", float: "a number", str: "a string"}


def check_world(spec: dict[str, Any]) -> None:
    """A [world] table's kind, keys and types; sizes that would not fit in memory are refused by the
    world itself, before it allocates (lab.data.checks.MAX_TABLE_ENTRIES, MAX_SAMPLE_TOKENS)."""
    kinds = sorted([*WORLD_KEYS, "facts"])
    if not isinstance(spec, dict) or spec.get("kind") not in kinds:
        got = spec.get("kind") if isinstance(spec, dict) else spec
        raise ValueError(f"[world] needs kind = one of {kinds}, got {got!r}")
    kind = spec["kind"]
    if kind == "facts":
        keys = {f.name: WorldKey(object) for f in dataclasses.fields(FactWorldConfig)} | {"form": WorldKey(str)}
    else:
        keys = WORLD_KEYS[kind]
    unknown = sorted(set(spec) - set(keys) - {"kind"})
    if unknown:
        raise ValueError(
            f"[world] has unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
            f"for a {kind} world; known keys are {', '.join(sorted(keys))}"
        )
    missing = sorted(k for k, key in keys.items() if key.required and k not in spec)
    if missing:
        raise ValueError(f"[world] needs {', '.join(missing)} for a {kind} world")
    for k, key in keys.items():
        value = spec.get(k)
        if value is None or key.type is object:
            continue
        accepted = (int, float) if key.type is float else key.type
        if isinstance(value, bool) or not isinstance(value, accepted):
            raise ValueError(f"[world] {k} must be {TYPE_NAMES[key.type]}, got {value!r}")
    if kind == "facts" and isinstance(spec.get("n_train"), int) and spec["n_train"] > MAX_FACT_DOCUMENTS:
        raise ValueError(
            f"[world] n_train = {spec['n_train']:,} documents is more than a facts world may draw "
            f"({MAX_FACT_DOCUMENTS:,})"
        )
