"""The model zoo: `models/<name>/model.toml` holds a recipe; `forma train NAME` builds its weights there."""

from pathlib import Path

ZOO_DIR = Path(__file__).resolve().parents[1] / "models"


def zoo_names() -> list[str]:
    """Every model the zoo has a recipe for."""
    return sorted(p.parent.name for p in ZOO_DIR.glob("*/model.toml"))


def zoo_model_dir(name: str) -> Path:
    """The folder of a trained zoo model; a clear error for an unknown or untrained one."""
    names = zoo_names()
    if name not in names:
        known = ", ".join(names) if names else "none yet"
        raise ValueError(f"unknown model {name!r}: not a folder and not a zoo name (zoo models: {known})")
    directory = ZOO_DIR / name
    if not (directory / "model.safetensors").is_file():
        raise FileNotFoundError(f"zoo model {name!r} is not trained yet: run `forma train {name}`")
    return directory
