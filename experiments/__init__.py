"""Scripted experiments: one package per experiment, each exporting a `Config` dataclass, `run(cfg, out) -> dict`
and `headlines(results)` (CONTRACT), and the registry that names them for the rest of Forma.

`forma run NAME [--quick] [--out DIR] [--seed N] [--model M]` builds the Config, creates the run
folder (lab.runs), calls run(cfg, out) — which writes its tables and figures into `out` — and writes the
returned dict as results.json, last and atomically.

REGISTRY is the one list of experiments: `forma run`'s choices, the dashboard's pages (dashboards/<name>.py,
in this order, under these titles), the dashboard benchmark's pages and the tests that go through every
experiment all read it. How to add one — a package experiments/<name>/, a page dashboards/<name>.py and one entry
below — is docs/design.md, "Add an experiment" (tests/experiments/test_experiments_registry.py builds its example
and holds package, entry and page together). This module imports only the standard library and lab.configs (which
imports only the standard library): the CLI's `--help` and the dashboard read it without loading torch.
"""

import dataclasses
import importlib
import resource
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

from lab.configs import check_fields, need, torch_threads

CONTRACT = ("Config", "run", "headlines")  # what an experiment's package exports


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One experiment as the rest of Forma names it."""

    name: str  # the module experiments/<name>, `forma run <name>`, runs/<name>/, the page dashboards/<name>.py
    title: str  # the heading of its dashboard page
    nav: str  # its entry in the dashboard's navigation
    options: tuple[str, ...] = ()  # the `forma run` options it takes beyond --seed and --quick: its Config's fields
    files: tuple[tuple[str, str], ...] = ()  # (option, what its file is): a missing one is named before torch loads


REGISTRY = (
    Experiment("kl", "KL decomposition", "KL decomposition", ("workers", "model")),
    Experiment("hallucination", "Hallucination on arbitrary facts", "Hallucination", ("workers", "model")),
    Experiment("calibration", "Calibration", "Calibration", ("model", "mmlu"), (("mmlu", "MMLU file"),)),
    Experiment(
        "monitor",
        "Catching hallucinations while they are generated",
        "Hallucination monitor",
        ("model", "qa"),
        (("qa", "question–answer file"),),
    ),
    Experiment("equations", "The seeds' equations", "Equations"),
    Experiment("scoreboard", "Methods against the truth", "Methods against the truth", ("workers", "model", "corpus")),
)


REAL_TRACK = "_real"  # runs/<name>_real/: an experiment's real-model track, beside runs/<name>/ (the toy worlds)


REAL_MODEL = "smollm2"  # the pretrained model a real-model track is run on in the docs and in what a page says to run


def real_run_name(name: str) -> str:
    """The run folder's experiment name of experiment `name`'s real-model track: `<name>_real` (runs/<name>_real/)."""
    return f"{name}{REAL_TRACK}"


def run_name(name: str, config: Any) -> str:
    """The run folder's experiment name: `real_run_name(name)` when the Config says it measures a pretrained language
    model on the experiment's real-model track (its `real_track` is true: `forma run NAME --model smollm2`), else
    `name`. The dashboard's page shows the newest run of each, side by side (dashboards.display.show_real_track)."""
    return real_run_name(name) if getattr(config, "real_track", False) else name


def run_command(run: str) -> str:
    """The `forma run` command that makes a run of runs/<run>/: `forma run NAME` for an experiment's own runs,
    `forma run NAME --model smollm2` for its real-model track's (`run` is `real_run_name(NAME)`)."""
    name = run.removesuffix(REAL_TRACK)
    if name != run and name in experiment_names():
        return f"forma run {name} --model {REAL_MODEL}"
    return f"forma run {run}"


def peak_rss_gb() -> float:
    """This process's peak resident memory so far, in GB: what a real-model track records as `peak_rss_gb` (the
    issue's bound is 4 GB). ru_maxrss is in kB on Linux, in bytes on macOS."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1e9 if sys.platform == "darwin" else 1e6)


def quick_changes(config_class: type) -> dict[str, list[str]]:
    """What `--quick` changes in an experiment, read from its Config's profiles (ProfileConfig): for "" (the
    experiment) its PROFILES and, where it has a real-model track, for "real" its REAL_PROFILES, one line per
    entry the default and quick profiles differ in ("steps: 720 → 240"), a dict's keys one by one. Read by
    `forma run NAME --help`."""

    def flat(value: Any, prefix: str = "") -> dict[str, Any]:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        if isinstance(value, dict):
            out: dict[str, Any] = {}
            for key, item in value.items():
                out |= flat(item, f"{prefix}{key}.") if isinstance(item, dict) else {f"{prefix}{key}": item}
            return out
        return {prefix.rstrip("."): value}

    def said(table: dict[str, Any], key: str) -> str:
        return repr(table[key]) if key in table else "as the recipe has it"

    def changes(profiles: tuple[Any, Any]) -> list[str]:
        before, after = flat(profiles[0]), flat(profiles[1])
        changed = [key for key in before | after if before.get(key) != after.get(key)]
        return [f"{key}: {said(before, key)} → {said(after, key)}" for key in changed]

    tracks = {"": config_class.PROFILES}
    if config_class.REAL_PROFILES is not None:
        tracks["real"] = config_class.REAL_PROFILES
    return {track: changes(profiles) for track, profiles in tracks.items()}


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
    """The registered experiment `name`'s package, once it holds the contract (docs/design.md, "Add an experiment");
    a ValueError for a name the registry does not hold, a TypeError for a plain module or a missing export."""
    experiment(name)
    module = importlib.import_module(f"experiments.{name}")
    if not hasattr(module, "__path__"):
        raise TypeError(f"experiments.{name} must be a package experiments/{name}/, not a module {name}.py")
    missing = [attr for attr in CONTRACT if not hasattr(module, attr)]
    config = getattr(module, "Config", None)
    if missing or not (isinstance(config, type) and issubclass(config, ProfileConfig)):
        raise TypeError(
            f"experiments.{name} must export a Config (a dataclass ProfileConfig), run(cfg, out) and "
            f"headlines(results); missing {', '.join(missing) or 'a Config that is a ProfileConfig'}"
        )
    return module


def local_or_synthetic(
    synthetic: Callable[[Any, Path], dict[str, Any]],
    local: Callable[[Any, Path, Any], dict[str, Any]],
    read_local: Callable[[Any], Any],
) -> tuple[Callable[[Any], Any], Callable[..., dict[str, Any]]]:
    """(read_inputs, run) of an experiment that trains its own model or, given `cfg.model`, measures a local one on a
    file (calibration with --mmlu, monitor with --qa). read_inputs(cfg) is `read_local(cfg)` — the model and the file,
    read and checked before `forma run` makes the run folder — and None for the synthetic experiment;
    run(cfg, out, inputs=None) makes `out` and runs `local(cfg, out, inputs)` or `synthetic(cfg, out)`. Both run
    torch on cfg.threads threads."""

    def read_inputs(cfg: Any) -> Any:
        if cfg.model is None:
            return None
        with torch_threads(cfg.threads):
            return read_local(cfg)

    def run(cfg: Any, out: Path, inputs: Any = None) -> dict[str, Any]:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        with torch_threads(cfg.threads):
            return synthetic(cfg, out) if cfg.model is None else local(cfg, out, inputs)

    return read_inputs, run


@dataclasses.dataclass
class ModelTraining:
    """The model and its training in the experiments that train a transformer on a fact world (calibration, monitor,
    hallucination): its width, depth and heads, the batch, and AdamW's peak and final learning rates after a linear
    warm-up. Their Config subclasses it: the fields stay flat (`cfg.d_model`, config.json's keys)."""

    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    batch_size: int = 64
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 50

    def check_model_training(self) -> None:
        """What every such model and training needs, said with lab.configs.need (after check_fields)."""
        for name in ("d_model", "n_layers", "n_heads", "batch_size"):
            need(self, getattr(self, name) > 0, f"{name} must be a positive integer, got {getattr(self, name)!r}")
        need(self, self.warmup_steps >= 0, f"warmup_steps must be ≥ 0, got {self.warmup_steps!r}")
        need(self, 0 < self.min_lr <= self.lr, "need 0 < min_lr ≤ lr")
        need(self, self.d_model % self.n_heads == 0, "d_model must be a multiple of n_heads")


@dataclasses.dataclass
class ProfileConfig:
    """Every experiment's Config: `seed` seeds its models and draws; `quick` picks the small of its two profiles
    (tests and the demo). The one place an experiment says what --quick changes is its config.py: a frozen
    dataclass Profile with two instances, DEFAULT and QUICK, named here in PROFILES, (DEFAULT, QUICK); with a
    real-model track (`--model`), a RealProfile and its REAL_DEFAULT and REAL_QUICK in REAL_PROFILES.
    `forma run NAME --help` lists what each pair differs in (quick_changes); no size is chosen by `quick` elsewhere.

    A run reads its sizes as `cfg.profile.steps` and `cfg.real_profile.steps`; or, for a pair FIELDS marks, as the
    Config's own fields of the profile's names (`cfg.steps`, config.json's keys: hallucination, calibration and
    monitor), whose defaults are DEFAULT's (REAL_DEFAULT's) values and which quick sets to QUICK's (REAL_QUICK's)
    unless the caller gave another value (`Config(quick=True, steps=10)` keeps 10)."""

    PROFILES: ClassVar[tuple[Any, Any]]
    REAL_PROFILES: ClassVar[tuple[Any, Any] | None] = None
    # (PROFILES, REAL_PROFILES): whether that pair's entries are the Config's own fields, set from it
    FIELDS: ClassVar[tuple[bool, bool]] = (False, False)

    seed: int = 0
    quick: bool = False

    def __post_init__(self) -> None:
        check_fields(self)
        need(self, self.seed >= 0, f"seed must be a non-negative integer, got {self.seed!r}")
        if self.quick:
            for profiles, fields in zip((self.PROFILES, self.REAL_PROFILES), self.FIELDS):
                if fields and profiles is not None:
                    self._take(*profiles)

    def _take(self, default: Any, quick: Any) -> None:
        """Each field named in the profile that still holds the DEFAULT profile's value takes the QUICK one's."""
        for field in dataclasses.fields(default):
            if getattr(self, field.name) == getattr(default, field.name):
                setattr(self, field.name, getattr(quick, field.name))

    @property
    def profile(self) -> Any:
        """The run's profile: QUICK when `quick`, else DEFAULT."""
        return self.PROFILES[self.quick]

    @property
    def real_profile(self) -> Any:
        """The real-model track's profile: REAL_QUICK when `quick`, else REAL_DEFAULT."""
        if self.REAL_PROFILES is None:
            raise AttributeError(f"{type(self).__name__} has no real-model track")
        return self.REAL_PROFILES[self.quick]
