"""Scripted experiments: one module per experiment, each with a `Config` dataclass and `run(cfg, out) -> dict`.

`forma run NAME [--quick] [--out DIR] [--seed N] [--model M]` builds the Config, creates the run
folder (lab.runs), calls run(cfg, out) — which writes its tables and figures into `out` — and writes the
returned dict as results.json, last and atomically.
"""

import dataclasses
import importlib
import pkgutil
from types import ModuleType

CONTRACT = ("Config", "run")


def experiment_names() -> list[str]:
    """Every module in this package that follows the contract (a Config and a run function)."""
    names = []
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            names.append(info.name)
    return sorted(names)


def load(name: str) -> ModuleType:
    names = experiment_names()
    if name not in names:
        raise ValueError(f"unknown experiment {name!r}; experiments: {', '.join(names) or 'none'}")
    module = importlib.import_module(f"experiments.{name}")
    missing = [attr for attr in CONTRACT if not hasattr(module, attr)]
    if missing or not dataclasses.is_dataclass(module.Config):
        raise TypeError(f"experiments.{name} must define a dataclass Config and run(cfg, out); missing {missing}")
    return module
