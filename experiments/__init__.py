"""Scripted experiments: one module (or package) per experiment, each with a `Config` dataclass and
`run(cfg, out) -> dict`, and the registry that names them for the rest of Forma.

`forma run NAME [--quick] [--out DIR] [--seed N] [--model M]` builds the Config, creates the run
folder (lab.runs), calls run(cfg, out) — which writes its tables and figures into `out` — and writes the
returned dict as results.json, last and atomically.

REGISTRY is the one list of experiments: `forma run`'s choices, the dashboard's pages (dashboards/<name>.py,
in this order, under these titles), the dashboard benchmark's pages and the tests that go through every
experiment all read it. A new experiment is a module here, a page dashboards/<name>.py and one entry below
(tests/experiments/test_experiments_registry.py holds the three together). This module imports only the standard
library: the CLI's `--help` and the dashboard read it without loading torch.
"""

import dataclasses
import importlib
from types import ModuleType

CONTRACT = ("Config", "run")


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One experiment as the rest of Forma names it."""

    name: str  # the module experiments/<name>, `forma run <name>`, runs/<name>/, the page dashboards/<name>.py
    title: str  # the heading of its dashboard page
    nav: str  # its entry in the dashboard's navigation
    options: tuple[str, ...] = ()  # the `forma run` options it takes beyond --seed and --quick: its Config's fields
    files: tuple[tuple[str, str], ...] = ()  # (option, what its file is): a missing one is named before torch loads


REGISTRY = (
    Experiment("kl", "KL decomposition", "KL decomposition", ("workers",)),
    Experiment("hallucination", "Hallucination on arbitrary facts", "Hallucination", ("workers",)),
    Experiment("calibration", "Calibration", "Calibration", ("model", "mmlu"), (("mmlu", "MMLU file"),)),
    Experiment(
        "monitor",
        "Catching hallucinations while they are generated",
        "Hallucination monitor",
        ("model", "qa"),
        (("qa", "question–answer file"),),
    ),
    Experiment("equations", "The seeds' equations", "Equations"),
    Experiment("scoreboard", "Methods against the truth", "Methods against the truth", ("workers",)),
)


def experiment_names() -> list[str]:
    """The registered experiments' names, in the registry's order."""
    return [e.name for e in REGISTRY]


def experiment(name: str) -> Experiment:
    """The registry's entry for `name`; a ValueError that lists the experiments for any other name."""
    for entry in REGISTRY:
        if entry.name == name:
            return entry
    raise ValueError(f"unknown experiment {name!r}; experiments: {', '.join(experiment_names()) or 'none'}")


def load(name: str) -> ModuleType:
    names = experiment_names()
    if name not in names:
        raise ValueError(f"unknown experiment {name!r}; experiments: {', '.join(names) or 'none'}")
    module = importlib.import_module(f"experiments.{name}")
    missing = [attr for attr in CONTRACT if not hasattr(module, attr)]
    if missing or not dataclasses.is_dataclass(module.Config):
        raise TypeError(f"experiments.{name} must define a dataclass Config and run(cfg, out); missing {missing}")
    return module
