"""How `from_pretrained` finds what loads a model by name: the loader an installed package declares under the entry
point group `forma.pretrained` (Forma's own is `lab.load.from_pretrained`: a zoo name, a Forma folder or a local
Hugging Face folder, declared in pyproject.toml). The model package imports no loader: what reads the zoo and
converts Hugging Face folders lives above it, and plugs in here."""

from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

LOADERS = "forma.pretrained"  # the entry point group


def load_pretrained(cls: type, name_or_path: str | Path, device: Any = "cpu", **options: Any) -> Any:
    """`cls` loaded from `name_or_path` by the installed loader (the first of the group by name); a ValueError that
    says how to load a folder without one when none is installed."""
    found = sorted(entry_points(group=LOADERS), key=lambda point: point.name)
    if not found:
        raise ValueError(
            f"no loader of models by name is installed (entry point group {LOADERS!r}): install Forma with "
            f"`pip install -e .`, or read a folder written by save() with {cls.__name__}.load(folder)"
        )
    return found[0].load()(cls, name_or_path, device, **options)
