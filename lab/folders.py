"""Where Forma keeps its models: the zoo folder and its recipes' names.

Kept apart from lab.zoo (which builds worlds and trains, and so loads torch) so that the command line
can list the zoo for `forma train --help` and check a name without loading torch.
"""

import os
from pathlib import Path

DEFAULT_ZOO_DIR = Path(__file__).resolve().parents[1] / "models"
RECIPE_FILE = "model.toml"


def zoo_dir() -> Path:
    """models/ of the checkout, or $FORMA_ZOO_DIR (a private zoo: tests, or models kept elsewhere)."""
    return Path(os.environ.get("FORMA_ZOO_DIR") or DEFAULT_ZOO_DIR)


def zoo_names() -> list[str]:
    """Every model the zoo has a recipe for."""
    return sorted(p.parent.name for p in zoo_dir().glob(f"*/{RECIPE_FILE}"))
