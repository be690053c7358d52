"""Run folders: where every experiment writes, with its provenance, atomically.

    runs/<experiment>/<UTC timestamp>/config.json      the experiment's Config, as run
                                      provenance.json  seed, git commit, package versions, wall time
                                      results.json     written last, atomically: present ⇒ complete
                                      *.parquet, *.html tables and plotly figures
    runs/<experiment>/latest                           the newest complete run's folder name

A crashed run leaves no results.json, so readers (the dashboard) never mistake it for a finished one.
"""

import dataclasses
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lab.files import atomic_write_text

REPO = Path(__file__).resolve().parents[1]
DEFAULT_RUNS_DIR = REPO / "runs"
PACKAGES = ("forma-lab", "torch", "transformer-lens", "transformers", "numpy", "einops", "tokenizers", "plotly",
            "streamlit")


def write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(to_jsonable(data), indent=2, allow_nan=True) + "\n")


def read_json(path: Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no file at {path}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"malformed JSON in {path}: {err}") from err


def to_jsonable(value: Any) -> Any:
    """Dataclasses, paths, numpy and torch scalars/arrays → plain JSON types."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist"):  # numpy / torch
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    return value


def git_commit() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def package_versions() -> dict[str, str | None]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def provenance(seed: int | None, **extra: Any) -> dict[str, Any]:
    return {"seed": seed, "git": git_commit(), "packages": package_versions(), "python": platform.python_version(),
            "platform": platform.platform(), "argv": sys.argv, "started_utc": utc_now(), **extra}


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H-%M-%SZ")


def runs_dir() -> Path:
    """runs/ of the checkout, or $FORMA_RUNS_DIR."""
    return Path(os.environ.get("FORMA_RUNS_DIR") or DEFAULT_RUNS_DIR)


def new_run_dir(experiment: str, out: str | Path | None = None) -> Path:
    """`out` if given (created; must not already hold a results.json), else runs/<experiment>/<UTC timestamp>/.

    An `out` that is a file, holds a finished run or cannot be created raises ValueError naming it."""
    if out is None:
        base = runs_dir() / experiment
        out = base / utc_now()
        suffix = 1
        while out.exists():
            out = base / f"{utc_now()}-{suffix}"
            suffix += 1
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"run folder {out} is a file, not a folder; choose another --out")
    if (out / "results.json").exists():
        raise ValueError(f"run folder {out} already holds a finished run (results.json); choose another --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"cannot create the run folder {out}: {err.strerror or err}") from err
    return out


def latest_run(experiment: str, folder: Path | None = None) -> Path | None:
    """The newest complete run of an experiment (one with results.json), or None."""
    base = Path(folder or runs_dir()) / experiment
    pointer = base / "latest"
    if pointer.is_file():
        candidate = base / pointer.read_text().strip()
        if (candidate / "results.json").is_file():
            return candidate
    complete = sorted(p.parent for p in base.glob("*/results.json"))
    return complete[-1] if complete else None


def run_and_record(experiment: str, config: Any, run: Callable[[Any, Path], dict], out: str | Path | None = None,
                   seed: int | None = None) -> Path:
    """Create the run folder, record config and provenance, run, then write results.json last."""
    import time

    folder = new_run_dir(experiment, out)
    write_json(folder / "config.json", config)
    record = provenance(seed, experiment=experiment)
    write_json(folder / "provenance.json", record)
    start = time.perf_counter()
    results = run(config, folder)
    record["wall_time_s"] = time.perf_counter() - start
    record["finished_utc"] = utc_now()
    write_json(folder / "provenance.json", record)
    write_json(folder / "results.json", results)
    if folder.parent == runs_dir() / experiment:
        atomic_write_text(folder.parent / "latest", folder.name + "\n")
    return folder


def save_figure(fig: Any, out: Path, name: str) -> None:
    """A plotly figure as <name>.json (what the dashboard reads) and <name>.html (offline: plotly.min.js
    is written once beside it, never fetched from a CDN)."""
    from lab.files import atomic_write

    out = Path(out)
    atomic_write_text(out / f"{name}.json", fig.to_json())
    atomic_write(out / f"{name}.html",
                 lambda tmp: fig.write_html(str(tmp), include_plotlyjs="directory", full_html=True))


def save_table(rows: Any, out: Path, name: str) -> Path:
    """A table (pandas DataFrame or list of dicts) as <name>.parquet, atomically."""
    import pandas as pd

    from lab.files import atomic_write

    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    path = Path(out) / f"{name}.parquet"
    atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False))
    return path
