"""Where Forma keeps its models: the zoo folder and its recipes' names.

Kept apart from lab.zoo (which builds worlds and trains, and so loads torch) so that the command line
can list the zoo for `forma train --help` and check a name without loading torch.
"""

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_ZOO_DIR = Path(__file__).resolve().parents[1] / "models"
RECIPE_FILE = "model.toml"


def zoo_dir() -> Path:
    """models/ of the checkout, or $FORMA_ZOO_DIR (a private zoo: tests, or models kept elsewhere)."""
    return Path(os.environ.get("FORMA_ZOO_DIR") or DEFAULT_ZOO_DIR)


def zoo_names() -> list[str]:
    """Every model the zoo has a recipe for."""
    return sorted(p.parent.name for p in zoo_dir().glob(f"*/{RECIPE_FILE}"))


CARD_FILE = "card.json"
WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class ZooEntry:
    """One zoo model as its folder describes it: the recipe's description, whether it is trained, and the card
    `forma train NAME` measured (None before then)."""

    name: str
    description: str
    trained: bool
    card: dict[str, Any] | None
    problem: str | None = None  # why the recipe or the card could not be read, in words


def zoo_entry(name: str) -> ZooEntry:
    """The zoo model `name`'s entry; an unreadable model.toml or card.json is a `problem`, never an exception."""
    import tomllib

    folder = zoo_dir() / name
    problems = []
    try:
        description = str(tomllib.loads((folder / RECIPE_FILE).read_text(encoding="utf-8")).get("description", ""))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        description, problems = "", [f"{folder / RECIPE_FILE} is unreadable ({err})"]
    card = None
    if (folder / CARD_FILE).is_file():
        try:
            card = json.loads((folder / CARD_FILE).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            problems.append(f"{folder / CARD_FILE} is unreadable ({err}): run `forma train {name}` again")
        if card is not None and not isinstance(card, dict):
            card = None
            problems.append(f"{folder / CARD_FILE} is not a JSON object: run `forma train {name}` again")
    return ZooEntry(name, description, (folder / WEIGHTS_FILE).is_file(), card, "; ".join(problems) or None)


def zoo_entries() -> list[ZooEntry]:
    """`zoo_entry` of every model the zoo has a recipe for."""
    return [zoo_entry(name) for name in zoo_names()]
