"""Where Forma keeps its models: the zoo folder, its recipes' names, and the door from a model class to loading
by name.

Kept apart from lab.zoo (which builds worlds and trains, and so loads torch) so that the command line
can list the zoo for `forma build --help` and check a name without loading torch. It imports only the
standard library, so that the model package, which must import nothing above it, can read it.
"""

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_ZOO_DIR = Path(__file__).resolve().parents[1] / "models"
RECIPE_FILE = "model.toml"


def zoo_dir() -> Path:
    """models/ of the checkout, or $FORMA_ZOO_DIR (a private zoo: tests, or models kept elsewhere)."""
    return Path(os.environ.get("FORMA_ZOO_DIR") or DEFAULT_ZOO_DIR)


# A recipe's kind: a model trained here on a world ([world], [model], [train]), or a pretrained one made from a file
# that a package ships ([source]: `lab.zoo.imports`).
TRAINED, PRETRAINED = "trained", "pretrained"
SOURCE_TABLE = "source"


def recipe_kind(folder: Path) -> str:
    """TRAINED or PRETRAINED, by whether the folder's model.toml has a [source] table (a line of TOML read, no
    more: an unreadable recipe counts as trained, whose loader names the problem)."""
    from lab.outside_files import read_text

    try:
        text = read_text(folder / RECIPE_FILE, folder, 2**20)
    except (OSError, ValueError):
        return TRAINED
    return PRETRAINED if any(line.strip() == f"[{SOURCE_TABLE}]" for line in text.splitlines()) else TRAINED


def zoo_names(kind: str | None = None) -> list[str]:
    """Every model the zoo has a recipe for; of one kind (TRAINED or PRETRAINED) when `kind` is given."""
    names = sorted(p.parent.name for p in zoo_dir().glob(f"*/{RECIPE_FILE}"))
    return names if kind is None else [name for name in names if recipe_kind(zoo_dir() / name) == kind]


CARD_FILE = "card.json"
WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class ZooEntry:
    """One zoo model as its folder describes it: the recipe's description, whether it is trained, and the card
    `forma build NAME` measured (None before then)."""

    name: str
    description: str
    trained: bool
    card: dict[str, Any] | None
    problem: str | None = None  # why the recipe or the card could not be read, in words


def zoo_entry(name: str) -> ZooEntry:
    """The zoo model `name`'s entry; an unreadable model.toml or card.json is a `problem`, never an exception."""
    from lab.outside_files import read_json, read_text

    folder = zoo_dir() / name
    problems = []
    try:
        description = str(tomllib.loads(read_text(folder / RECIPE_FILE, folder, 2**20)).get("description", ""))
    except (OSError, ValueError) as err:  # TOMLDecodeError is a ValueError
        description, problems = "", [f"{folder / RECIPE_FILE} is unreadable ({err})"]
    card = None
    if (folder / CARD_FILE).exists():
        try:
            card = read_json(folder / CARD_FILE, folder)
        except (OSError, ValueError) as err:
            problems.append(f"{folder / CARD_FILE} is unreadable ({err}): run `forma build {name}` again")
        if card is not None and not isinstance(card, dict):
            card = None
            problems.append(f"{folder / CARD_FILE} is not a JSON object: run `forma build {name}` again")
    return ZooEntry(name, description, (folder / WEIGHTS_FILE).is_file(), card, "; ".join(problems) or None)


def zoo_entries() -> list[ZooEntry]:
    """`zoo_entry` of every model the zoo has a recipe for."""
    return [zoo_entry(name) for name in zoo_names()]


def check_zoo_name(name: str) -> Path:
    """The zoo folder of a model the zoo has a recipe for; a ValueError listing the zoo for any other name."""
    names = zoo_names()
    if name not in names:
        known = ", ".join(names) if names else "none yet"
        raise ValueError(f"unknown model {name!r}: not a folder and not a zoo name (zoo models: {known})")
    return zoo_dir() / name


def zoo_model_dir(name: str) -> Path:
    """The folder of a trained zoo model; a clear error for an unknown or untrained one."""
    directory = check_zoo_name(name)
    if not (directory / "model.safetensors").is_file():
        raise FileNotFoundError(f"zoo model {name!r} is not trained yet: run `forma build {name}`")
    return directory


def model_folder(name_or_path: str | Path) -> Path:
    """The folder a name means: the folder itself when it is one, else a trained zoo model's folder (a
    ValueError for an unknown name, a FileNotFoundError for an untrained one), answered before torch loads."""
    if not str(name_or_path).strip():  # Path("") is the current folder: never what an empty name means
        raise ValueError("the model name is empty: give a zoo name or a model folder")
    path = Path(name_or_path)
    return path if path.is_dir() else zoo_model_dir(str(name_or_path))


def trust_report_path(name_or_path: str | Path, out: str | Path | None = None) -> tuple[Path, Path]:
    """(the model's folder, where `forma trust` writes its report: trust.json in that folder, or `out`), each
    checked before torch loads: an unknown or untrained model, and a folder the report cannot be written to (a
    read-only model folder: a ValueError naming it and the way out, --out), are refused here."""
    from lab.files import check_writable

    folder = model_folder(name_or_path)
    target = Path(out) if out is not None else folder / "trust.json"
    try:
        check_writable(target.parent, "folder of the trust report")
    except ValueError as err:
        raise ValueError(f"{err}; give --out FILE to write the report elsewhere" if out is None else str(err)) from None
    return folder, target


def is_trained(name: str) -> bool:
    return (check_zoo_name(name) / "model.safetensors").is_file()
