"""Run folders: where every experiment writes, with its provenance, atomically.

    runs/<experiment>/<UTC timestamp>/.forma-folder.json  the manifest: `run <experiment>`, every name written
                                      config.json      the experiment's Config, as run
                                      provenance.json  seed, git commit, package versions, wall time
                                      results.json     written last, atomically: present ⇒ complete
                                      *.parquet, *.html tables and plotly figures
    runs/<experiment>/latest                           the newest complete run's folder name

A crashed run leaves no results.json, so readers (the dashboard) never mistake it for a finished one.

Same config and seed ⇒ the same results.json on the same machine, except for its timing fields
(TIMING_FIELDS): a key named `seconds` or `timing`, or ending in `_s` or `_utc`, with everything under it.
`without_timings` removes exactly those, for comparing two runs.
"""

import dataclasses
import fcntl
import importlib.metadata
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lab.figure_text import as_text
from lab.files import (
    LOCK_FILE,
    OWNER_FILE,
    atomic_write,
    atomic_write_text,
    claim_folder,
    is_owned_temporary,
    owned,
    recording,
    remove_temporary,
)
from lab.outside_files import InputError, read_json, read_text, regular_file

REPO = Path(__file__).resolve().parents[1]
DEFAULT_RUNS_DIR = REPO / "runs"
PACKAGES = (
    "forma-lab",
    "torch",
    "transformer-lens",
    "transformers",
    "numpy",
    "einops",
    "tokenizers",
    "plotly",
    "streamlit",
)


TIMING_FIELDS = {"names": ("seconds", "timing"), "suffixes": ("_s", "_utc")}


def is_timing_field(key: str) -> bool:
    """A results.json key that holds a wall time or a clock reading (TIMING_FIELDS), not a measurement."""
    return key in TIMING_FIELDS["names"] or key.endswith(TIMING_FIELDS["suffixes"])


def without_timings(value: Any) -> Any:
    """`value` (parsed JSON) with every timing field removed, at any depth: what two runs of one seed share."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if not is_timing_field(str(k))}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(to_jsonable(data), indent=2, allow_nan=True) + "\n")


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
        return {
            "commit": git("rev-parse", "HEAD") or None,
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        }
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
    return {
        "seed": seed,
        "git": git_commit(),
        "packages": package_versions(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "argv": sys.argv,
        "started_utc": utc_now(),
        **extra,
    }


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H-%M-%SZ")


def runs_dir() -> Path:
    """runs/ of the checkout, or $FORMA_RUNS_DIR."""
    return Path(os.environ.get("FORMA_RUNS_DIR") or DEFAULT_RUNS_DIR)


RUN_FILES = ["provenance.json", "config.json", "results.json"]  # what every run writes; the rest it records as written


def run_command(experiment: str) -> str:
    """The command a run folder's manifest (lab.files.OWNER_FILE) names: `run <experiment>`."""
    return f"run {experiment}"


def new_run_dir(experiment: str, out: str | Path | None = None, *, overwrite: bool = False) -> Path:
    """The folder a run writes into, claimed (lab.files.claim_folder: its manifest, .forma-folder.json, lists every
    top-level name the run writes, as it writes it): `out` if given, else a new runs/<experiment>/<UTC timestamp>/.

    The timestamped folder is made with an exclusive mkdir, so two runs started in the same second get two
    folders (the second `<stamp>-1`, and so on). An `out` is taken when it is new, empty, or an unfinished run of
    the same experiment (its manifest names `run <experiment>` and lists all it holds): a run never writes over a
    file some other program wrote. A name the manifest does not list (a file of the user's, whatever its name) is
    refused unless `overwrite`, and then left where it is (one named like a file the run writes is replaced);
    a finished run (results.json) is refused unless `overwrite`. A file, another experiment's run, a folder that
    cannot be created: a ValueError naming it, raised before anything is written."""
    if out is None:
        folder = _new_timestamped_dir(runs_dir() / experiment)
        claim_folder(folder, run_command(experiment), RUN_FILES)
        return folder
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"run folder {out} is a file, not a folder; choose another --out")
    if (out / "results.json").exists() and not overwrite:
        raise ValueError(
            f"run folder {out} already holds a finished run (results.json); choose another --out, or give "
            "--overwrite to run again in it"
        )
    try:
        claim_folder(out, run_command(experiment), RUN_FILES, overwrite=overwrite)
    except OSError as err:
        raise ValueError(f"cannot create the run folder {out}: {err.strerror or err}") from err
    return out


def _new_timestamped_dir(base: Path) -> Path:
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"cannot create the runs folder {base}: {err.strerror or err}") from err
    stamp = utc_now()
    for suffix in itertools.count():
        candidate = base / (stamp if suffix == 0 else f"{stamp}-{suffix}")
        try:
            candidate.mkdir()  # exclusive: of two runs that try one name, exactly one gets it
            return candidate
        except FileExistsError:
            continue
        except OSError as err:
            raise ValueError(f"cannot create the run folder {candidate}: {err.strerror or err}") from err
    raise AssertionError("unreachable")


PROVENANCE_FILE = "provenance.json"  # a run's first file: its seed, commit and packages, then its wall time


@contextmanager
def _exclusive(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock on `folder` (flock on the directory itself: no file added, and released when the
    process ends, even by kill -9), so that two runs never write into one folder at once."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(f"run folder {folder} is in use by another run; choose another --out") from None
        yield
    finally:
        os.close(fd)


def _is_safe_pointer(base: Path, name: str) -> bool:
    """`latest` must name a direct child folder of runs/<experiment>/: no separator, no `.` or `..`, no link."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        return False
    candidate = base / name
    return candidate.is_dir() and not candidate.is_symlink()


def latest_run(experiment: str, folder: Path | None = None) -> Path | None:
    """The newest complete run of an experiment (one with results.json), or None.

    runs/<experiment>/latest names it; a pointer that is unreadable, names no complete run, or names anything but
    a direct child folder (`../..`, an absolute path, a link) is ignored, and the newest complete run by folder
    name is used instead — so a pointer never leads outside runs/."""
    base = Path(folder or runs_dir()) / experiment
    pointer = base / "latest"
    if pointer.is_file():
        try:
            name = read_text(pointer, base, max_bytes=4096).strip()
        except (OSError, ValueError):
            name = ""
        if _is_safe_pointer(base, name) and (base / name / "results.json").is_file():
            return base / name
    complete = sorted(p.parent for p in base.glob("*/results.json") if not p.parent.is_symlink())
    return complete[-1] if complete else None


def complete_runs(experiment: str, folder: Path | None = None) -> list[Path]:
    """Every complete run of an experiment (a folder of runs/<experiment>/ with results.json; no links),
    newest first by folder name (a UTC timestamp)."""
    base = Path(folder or runs_dir()) / experiment
    return sorted(
        (p.parent for p in base.glob("*/results.json") if not p.parent.is_symlink()), key=lambda p: p.name, reverse=True
    )


def run_record(folder: Path) -> dict[str, Any]:
    """What a run folder says of itself: its results, config and provenance (each {} when missing, unreadable,
    not a regular file inside the folder, or not a JSON object), and "problems", one sentence per such file."""
    record: dict[str, Any] = {"problems": []}
    for name in ("results", "config", "provenance"):
        try:
            value = read_json(Path(folder) / f"{name}.json", folder)
        except (OSError, ValueError) as err:
            value, problem = {}, str(err)
        else:
            problem = None if isinstance(value, dict) else f"{Path(folder) / f'{name}.json'} is not a JSON object"
            value = value if isinstance(value, dict) else {}
        record[name] = value
        if problem:
            record["problems"].append(problem)
    return record


def run_and_record(
    experiment: str,
    config: Any,
    run: Callable[[Any, Path], dict],
    out: str | Path | None = None,
    seed: int | None = None,
    *,
    overwrite: bool = False,
) -> Path:
    """Claim the run folder (`new_run_dir`), record provenance and config, run, then write results.json last.

    Every name the run writes is listed in the folder's manifest before it is written (lab.files.recording), so a
    rerun with the same `--out` finishes its own unfinished run: it removes the temporaries of writes killed
    half-way (.<name>.<random>.tmp) of the names listed, and nothing else — never a file of the user's, whatever
    its name. With `overwrite`, what an earlier run listed is removed first (the run starts afresh), and the
    user's files are left where they are. Every artefact is written atomically (lab.files), so a run that fails
    or is killed leaves whole files and temporaries, never a half-written file under its final name, and no
    results.json."""
    folder = new_run_dir(experiment, out, overwrite=overwrite)
    with _exclusive(folder), recording(folder):
        _tidy(folder, overwrite)
        record = provenance(seed, experiment=experiment)
        write_json(folder / PROVENANCE_FILE, record)
        write_json(folder / "config.json", config)
        start = time.perf_counter()
        results = run(config, folder)
        record["wall_time_s"] = time.perf_counter() - start
        record["finished_utc"] = utc_now()
        write_json(folder / "provenance.json", record)
        write_json(folder / "results.json", results)
    if folder.parent == runs_dir() / experiment:
        atomic_write_text(folder.parent / "latest", folder.name + "\n")
    return folder


def _tidy(folder: Path, overwrite: bool) -> None:
    """Remove the killed writes' temporaries of what the folder's manifest lists, and (overwrite) what it lists."""
    wrote = owned(folder)
    for path in folder.iterdir():
        if path.is_symlink() or path.name in (OWNER_FILE, LOCK_FILE):
            continue
        if is_owned_temporary(path, wrote | {OWNER_FILE}):
            remove_temporary(path)
        elif overwrite and path.name in wrote and path.is_dir():
            shutil.rmtree(path)
        elif overwrite and path.name in wrote:
            path.unlink()


PLOTLY_BUNDLE = "plotly.min.js"


def write_plotly_bundle(folder: Path) -> Path:
    """plotly.min.js in `folder`, as the installed plotly ships it, written atomically. One already there that
    differs (cut short by a full disk, or another plotly version's) is replaced, not trusted because it exists."""
    from plotly.offline import get_plotlyjs

    path = Path(folder) / PLOTLY_BUNDLE
    bundle = get_plotlyjs()
    try:
        current = read_text(path, folder, max_bytes=2 * len(bundle))
    except (OSError, ValueError):  # none, or no regular file of the folder: replaced all the same
        current = None
    if current != bundle:
        atomic_write_text(path, bundle)
    return path


def save_figure(fig: Any, out: Path, name: str) -> None:
    """A plotly figure as <name>.json (what the dashboard reads, its strings as they are) and <name>.html (offline:
    plotly.min.js is written once beside it, never fetched from a CDN; every string drawn as text,
    lab.figure_text.as_text, so a model label or question from a file is never a link or markup there). Every file
    is written atomically by Forma, the bundle first: plotly's own write_html would write plotly.min.js in place,
    where a failure leaves it cut short."""
    out = Path(out)
    write_plotly_bundle(out)
    atomic_write_text(out / f"{name}.json", fig.to_json())
    atomic_write_text(out / f"{name}.html", as_text(fig).to_html(include_plotlyjs="directory", full_html=True))


def save_table(rows: Any, out: Path, name: str) -> Path:
    """A table (pandas DataFrame or list of dicts) as <name>.parquet, atomically."""
    import pandas as pd

    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    path = Path(out) / f"{name}.parquet"
    atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False))
    return path


def headline(
    name: str,
    sentence: str,
    value: Any,
    interval: list[float] | None,
    direction: Any,
    supported: bool = True,
    why_not: str | None = None,
) -> dict[str, Any]:
    """One entry of results.json's "headlines" (docs/experiments.md): the claim in a sentence, the number behind it
    and its interval, the direction a quick run must share with the default one, and — when the run cannot
    support it — why not, in words."""
    return {
        "name": name,
        "sentence": sentence,
        "value": value,
        "interval": interval,
        "direction": direction,
        "supported": supported,
        "why_not": None if supported else why_not,
    }


# Readers: what the dashboard and the benchmarks read from a run folder, with the problem named in a sentence.
# A crashed or hand-edited run must give a message that names the file and what is wrong, never a traceback. Every
# file is read through lab.outside_files: a regular file that resolves inside the run folder (a link out of it, or a
# FIFO that would hang the page, is refused), of bounded size and nesting.

# the JSON files that are no figure (.forma-folder: the folder's manifest, lab.files.OWNER_FILE)
NOT_FIGURES = {"results", "config", "provenance", "world", "card", ".progress", ".forma-folder"}


def read_results(folder: Path) -> dict[str, Any]:
    """A complete run's results.json; a FileNotFoundError or ValueError that names the file and what is wrong."""
    path = Path(folder) / "results.json"
    try:
        results = read_json(path, folder, what="results file")
    except FileNotFoundError:
        raise
    except OSError as err:
        raise ValueError(f"unreadable {path} ({err})") from err
    if not isinstance(results, dict):
        raise ValueError(f"{path} is not a JSON object")
    return results


def read_figures(folder: Path) -> tuple[list[tuple[str, Any]], list[str]]:
    """([(name, plotly Figure)] for every figure a run saved (save_figure's <name>.json) by name, [the file names
    of those that are not readable plotly JSON, each with the reason])."""
    import plotly.graph_objects as go

    found, unreadable = [], []
    for path in sorted(Path(folder).glob("*.json")):
        if path.stem in NOT_FIGURES:
            continue
        try:
            spec = read_json(path, folder, what="figure")
            if not isinstance(spec, dict):
                raise InputError(f"{path.name} holds a JSON {type(spec).__name__}, not a figure")
            reaching = outside_resources(spec)
            if reaching:
                raise InputError(f"it would make the browser fetch {reaching[0]}")
            found.append((path.stem, go.Figure(spec)))
        except (OSError, ValueError, KeyError, TypeError) as err:  # cut short, no figure, not a regular file inside
            reason = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
            unreadable.append(f"{path.name} ({reason})")
    return found, unreadable


# Plotly draws these traces on maps it fetches (tiles, the world's outlines); Forma's figures never use them.
FETCHING_TRACES = (
    "scattergeo",
    "choropleth",
    "scattermapbox",
    "choroplethmapbox",
    "densitymapbox",
    "scattermap",
    "choroplethmap",
    "densitymap",
)


def outside_resources(spec: dict[str, Any]) -> list[str]:
    """What a plotly figure's JSON would make a browser fetch from elsewhere: an image by URL (not a data: URI),
    or a trace drawn on a map; [] for the figures Forma writes."""
    layout = spec.get("layout") if isinstance(spec.get("layout"), dict) else {}
    template = layout.get("template") if isinstance(layout.get("template"), dict) else {}
    found = []
    for where in (layout, template.get("layout") if isinstance(template.get("layout"), dict) else {}):
        for image in where.get("images") or [] if isinstance(where.get("images"), list) else []:
            source = image.get("source") if isinstance(image, dict) else None
            if isinstance(source, str) and not source.startswith("data:"):
                found.append(f"the image {source}")
    traces = spec.get("data") if isinstance(spec.get("data"), list) else []
    found += [
        f"a {trace.get('type')} trace's map"
        for trace in traces
        if isinstance(trace, dict) and trace.get("type") in FETCHING_TRACES
    ]
    return found


def read_table(path: Path, columns: list[str] | None = None) -> Any:
    """A run's parquet table (save_table) as a DataFrame, None when there is no such file; a ValueError that
    names the file when it is not a readable table."""
    import pandas as pd

    path = Path(path)
    if not path.exists():
        return None
    regular_file(path, path.parent, what="table")
    try:
        return pd.read_parquet(path, columns=columns)
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid (a truncated file) is a ValueError
        raise ValueError(f"{path} is not a readable parquet table ({err})") from err
