"""What every dashboard page shares: cached model loading, run-folder reading, messages instead of tracebacks.

The dashboard is a view: it reads run folders written by `forma run` and calls tested library code
(lab.analysis, lab.metrics); it computes nothing of its own.

Text that comes from a run folder or a model (a headline's sentence, a note, a key, a path, a token) is shown as
text, never read as Markdown or HTML: it goes into a page through `plain` (escaped) or `code` (a code span), so
that a results.json can show no image, link, heading or markup — a browser fetches nothing a run folder names.
"""

import datetime
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import streamlit as st
from safetensors import SafetensorError

from dashboards.charts import draw, relabel
from experiments import experiment as registered
from experiments import real_run_name, run_command
from lab.analysis.transcoders.model import Transcoders
from lab.folders import zoo_dir, zoo_names
from lab.headlines import reason as headline_reason
from lab.headlines import split as split_headlines
from lab.jobs import model_finished, model_progress, queued, run_progress
from lab.names import NAMES
from lab.runs import latest_run as newest_run
from lab.runs import read_figures, read_results, run_record
from lab.runs import read_table as read_parquet_table
from lab.zoo.transcoders import transcoder_sets

MARKDOWN_SYNTAX = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:&=^\"'])")  # every character Markdown or Streamlit reads


def plain(value: Any) -> str:
    """`value` as text that Streamlit's Markdown shows literally: every ASCII punctuation mark that Markdown, GitHub's
    tables and autolinks, or Streamlit's directives (:red[…], :emoji:, $math$) give a meaning is escaped with a
    backslash, and line breaks and leading spaces go, so no heading, list or code block can begin."""
    return MARKDOWN_SYNTAX.sub(r"\\\1", " ".join(str(value).splitlines()).strip())


def code(value: Any) -> str:
    """`value` as a Markdown code span (shown verbatim, in a monospace font): fenced by one backtick more than the
    longest run of backticks inside it, on one line."""
    text = " ".join(str(value).splitlines())
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    return f"{fence} {text} {fence}" if text.startswith("`") or text.endswith("`") else f"{fence}{text}{fence}"


# An identifier in a run's text (a function, a field, a hook: `n_params()`, ModelConfig.n_params, hook_attn_scores),
# or a span the text itself fences in backticks; a symbol with a subscript (d_k, W_U, H_t) is mathematics, not one.
IDENTIFIER = re.compile(r"`([^`]+)`|(?<![\w.])([A-Za-z][\w.]*_[\w.]*\w(?:\(\))?)")
SYMBOL = re.compile(r"[A-Za-z]{1,2}_([A-Za-z]|[A-Z]+|[0-9]+)")


def prose(value: Any) -> str:
    """A run's text as `plain` shows it, but each identifier in it (IDENTIFIER) as a code span: a reader sees code
    as code, and the words as words."""
    text, out, start = " ".join(str(value).splitlines()).strip(), [], 0
    for match in IDENTIFIER.finditer(text):
        name = match.group(1) or match.group(2)
        if match.group(2) and SYMBOL.fullmatch(name):
            continue
        out += [MARKDOWN_SYNTAX.sub(r"\\\1", text[start : match.start()]), code(name)]
        start = match.end()
    return "".join(out) + MARKDOWN_SYNTAX.sub(r"\\\1", text[start:])


def rerun(run: str) -> str:
    """What to run to write a run of runs/<run>/ again (an experiment's, or its real-model track's: run_command)."""
    return f"Run `{run_command(run)} --quick` (or without --quick) to write it again."


def latest_run(experiment: str) -> tuple[Path | None, dict | None, str | None]:
    """(folder, results, problem): the newest complete run, or a sentence saying what is wrong."""
    folder = newest_run(experiment)
    if folder is None:
        return (
            None,
            None,
            f"No run of `{experiment}` yet. Make one with `forma run {experiment} --quick` (or without --quick for "
            "the full experiment).",
        )
    try:
        return folder, read_results(folder), None
    except (FileNotFoundError, ValueError) as err:
        return (
            folder,
            None,
            f"The run in {code(folder)} has an unreadable results.json ({plain(err)}). " + rerun(experiment),
        )


def figures(folder: Path, unreadable: list[str] | None = None) -> list[tuple[str, Any]]:
    """Every plotly figure a run saved, by name (lab.runs.read_figures); the file names of those that cannot be
    read are appended to `unreadable`."""
    found, bad = read_figures(folder)
    if unreadable is not None:
        unreadable.extend(bad)
    return found


def show_figures(folder: Path, only: list[str] | None = None, names: dict[str, str] | None = None) -> None:
    """The run's figures (those in `only`, if given), each drawn as every chart is, the keys they show in the
    words `names` gives them (dashboards.charts.relabel; by default Forma's display names, lab.names)."""
    unreadable: list[str] = []
    for name, fig in figures(folder, unreadable):
        if only is None or name in only:
            draw(relabel(fig, NAMES if names is None else names), f"fig-{folder.parent.name}-{folder.name}-{name}")
    if unreadable:
        st.warning(
            f"Figures in {code(folder)} that are not readable plotly JSON, left out: "
            f"{plain(', '.join(unreadable))}. " + rerun(folder.parent.name)
        )


def read_table(path: Path, experiment: str, columns: list[str] | None = None):
    """A run's parquet table, or None after a warning that names the file (missing is not a problem: None)."""
    try:
        return read_parquet_table(path, columns)
    except ValueError as err:
        st.warning(f"{plain(err)}. " + rerun(experiment))
        return None


FieldTypes = dict[str, type | tuple[type, ...]]
SHAPE_ERRORS = (KeyError, TypeError, ValueError, AttributeError, IndexError)


def warn_shape(folder: Path, experiment: str, problem: str) -> None:
    """A warning that the run's results.json is not what the page reads: the file, what is wrong, what to run."""
    st.warning(f"{code(folder / 'results.json')} is not what this page reads: {problem}. " + rerun(experiment))


def checked_fields(results: dict, path: Path, experiment: str, fields: FieldTypes, required: tuple[str, ...]) -> dict:
    """`results` without the fields whose type is not the one this page reads, after one warning that names
    the file, each such field and each missing required one. Fields the page does not read are ignored."""
    problems = [f"it has no {code(key)}" for key in required if key not in results]
    wrong = {key for key, kind in fields.items() if results.get(key) is not None and not isinstance(results[key], kind)}
    for key in sorted(wrong):
        kinds = fields[key] if isinstance(fields[key], tuple) else (fields[key],)
        problems.append(
            f"{code(key)} is a {type(results[key]).__name__}, not a {' or '.join(k.__name__ for k in kinds)}"
        )
    if problems:
        warn_shape(path.parent, experiment, "; ".join(problems))
    return {key: value for key, value in results.items() if key not in wrong}


def show_run(
    experiment: str,
    render: Callable[[Path, dict], None],
    fields: FieldTypes | None = None,
    required: tuple[str, ...] = (),
) -> None:
    """An experiment's page: the header of its latest run, then render(folder, results). A results.json that
    lacks a field, holds one of another type, or a value of another shape deeper down is a warning that names
    the file and says what to run — never a traceback."""
    folder, results = show_run_header(experiment)
    if results is None:
        return
    render_checked(folder, results, experiment, render, fields, required, "page")


def render_checked(
    folder: Path,
    results: dict,
    experiment: str,
    render: Callable[[Path, dict], None],
    fields: FieldTypes | None,
    required: tuple[str, ...],
    part: str,
) -> None:
    """render(folder, results) once results.json's fields are checked; a value of another shape is a warning that
    names the file and leaves the rest of the `part` out."""
    path = folder / "results.json"
    results = checked_fields(results, path, folder.parent.name, fields or {}, required)
    try:
        render(folder, results)
    except SHAPE_ERRORS as err:
        st.warning(
            f"{code(path)} holds a value this page cannot show ({type(err).__name__}: {plain(err)}), so the "
            f"rest of the {part} is left out. " + rerun(experiment)
        )


def show_real_track(
    experiment: str,
    render: Callable[[Path, dict], None],
    fields: FieldTypes | None = None,
    required: tuple[str, ...] = (),
) -> None:
    """The experiment's real-model track below its toy-world run: the newest run of runs/<experiment>_real/
    (`forma run EXPERIMENT --model smollm2`), headed by the model it measured and the run it is, then
    render(folder, results); or how to make one. A malformed results.json is a warning, as on the page above."""
    name = real_run_name(experiment)
    st.header("On a real language model")
    working = show_progress("run", name)
    folder = newest_run(name)
    if folder is None:
        if not working:
            st.info(
                f"No real-model run yet. `{run_command(name)} --quick` makes one in minutes (without --quick, the "
                "full profile)."
            )
        return
    try:
        results = read_results(folder)
    except (FileNotFoundError, ValueError) as err:
        st.warning(f"The run in {code(folder)} has an unreadable results.json ({plain(err)}). " + rerun(name))
        return
    record = run_record(folder)
    st.caption(f"Run {code(folder.name)} · {plain(describe_run(folder, record))}")
    if record["config"].get("quick"):
        st.info("A quick run of the real-model track: the small profile, for tests and the demo.")
    show_config(folder, record["config"])
    render_checked(folder, results, name, render, fields, required, "real-model track")


def show_run_header(experiment: str) -> tuple[Path | None, dict | None]:
    """Title, the run's provenance line, or the message that says how to make a run."""
    st.title(registered(experiment).title)
    working = show_progress("run", experiment)
    folder, results, problem = latest_run(experiment)
    if problem and folder is None and working:  # no run yet, one on its way: its progress says so
        return None, None
    if problem:
        (st.warning if folder else st.info)(problem)  # its parts from the run folder are escaped
        return None, None
    record = run_record(folder)
    st.caption(f"Run {code(folder.name)} · {plain(describe_run(folder, record))}")
    if record["config"].get("quick"):
        st.info(
            f"A quick run: the small profile, for tests and the demo. Its numbers are not the full experiment's; "
            f"`forma run {experiment}` makes that run (the page shows the newest)."
        )
    show_config(folder, record["config"])
    return folder, results


def made_at(folder: Path) -> str:
    """When a run was made, in words, from its folder's UTC stamp ("4 December 2026, 23:22 UTC"); the folder's
    name for any other name."""
    try:
        stamp = datetime.datetime.strptime(folder.name, "%Y-%m-%dT%H-%M-%SZ")
    except ValueError:
        return folder.name
    return f"{stamp.day} {stamp:%B %Y, %H:%M} UTC"


def describe_run(folder: Path, record: dict[str, Any]) -> str:
    """`made 4 December 2026, 23:22 UTC · quick profile · its own models · seed 0 · commit 1a2b3c4d5e · 73 s`: which
    run a page shows, from its folder, config and provenance."""
    config, provenance = record["config"], record["provenance"]
    git = provenance.get("git") if isinstance(provenance.get("git"), dict) else {}
    wall = provenance.get("wall_time_s")
    parts = [
        f"made {made_at(folder)}",
        "quick profile" if config.get("quick") else "default profile",
        f"model {config['model']}" if config.get("model") else "its own models, trained by the run",
        f"seed {provenance.get('seed')}",
        f"commit {str(git.get('commit') or 'unknown')[:10]}",
    ]
    if isinstance(wall, (int, float)):
        parts.append(f"{wall:.0f} s")
    return " · ".join(parts)


def show_config(folder: Path, config: dict[str, Any]) -> None:
    """The run's config.json, one row per field in words, folded away; the file itself one click away."""
    with st.expander("The run's config (config.json)"):
        show_table([{"field": words(key), "value": value} for key, value in config.items()])
        st.download_button(
            "Download config.json",
            json.dumps(config, indent=2),
            file_name="config.json",
            mime="application/json",
            key=f"config-{folder.parent.name}-{folder.name}",
            on_click="ignore",
        )


def model_version(name_or_path: str) -> tuple:
    """What a cached model is keyed on besides its name: the folder it is read from and each file's size and
    modification time, so a model retrained (or a zoo folder moved) while the dashboard runs is read again."""
    folder = zoo_dir() / name_or_path if name_or_path in zoo_names() else Path(name_or_path)
    try:
        files = sorted(f for f in folder.iterdir() if f.is_file())
        return (str(folder.resolve()), tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files))
    except OSError:  # no such folder: the loader says so
        return (str(folder), ())


@st.cache_resource(show_spinner="Loading model…")
def load_model(name_or_path: str, version: tuple = ()):
    from lab import HookedTransformer

    return HookedTransformer.from_pretrained(name_or_path).eval()


@st.cache_resource(show_spinner="Loading model…")
def load_trained_model(name: str, version: tuple = ()):
    """Zoo model `name` with its weights as trained (`lab.load.load_model`, no weight processing), as `forma
    transcoders` loads it: the model its transcoders were built from, a pretrained one's too (`load_model` folds a
    Hugging Face folder's norms, which changes the weights the transcoders' fingerprint names)."""
    from lab.load import load_model as as_trained

    return as_trained(name).eval()


@st.cache_resource(show_spinner="Loading transcoders…")
def open_transcoders(path: str, name: str, version: tuple = ()) -> Transcoders:
    """The transcoders in `path`, checked against zoo model `name` (what they were built from, their shapes): any
    file that cannot be read, or was built from another model, is one ValueError naming it."""
    try:
        return Transcoders.load(path, load_trained_model(name, model_version(name)))
    except (OSError, KeyError, TypeError, SafetensorError) as err:
        raise ValueError(f"the transcoders in {path} cannot be read: {err}") from err


def transcoders_version(path: str, name: str) -> tuple:
    """What open_transcoders is keyed on besides the path: its files' and the model's sizes and times."""
    return (model_version(path), model_version(name))


def feature_page(name: str, kind: str, layer: int, feature: int) -> str:
    """The address of the Transcoder features page showing feature `feature` of model layer `layer` of zoo model
    `name`'s transcoder set `kind` (its query parameters, which that page reads)."""
    return "/features?" + urlencode({"model": name, "set": kind, "layer": layer, "feature": feature})


def try_load_model(name_or_path: str):
    """The model, or None after showing a message that says what to run."""
    try:
        return load_model(name_or_path, model_version(name_or_path))
    except FileNotFoundError as err:
        st.warning(plain(err))
    except (ValueError, KeyError, OSError) as err:
        st.error(f"Could not load {code(name_or_path)}: {plain(err)}")
    return None


SIGNIFICANT = 4  # digits a table or a sentence shows; the exact value is in the tooltip or results.json


def short(value: Any) -> str:
    """A number as a reader wants it: 4 significant digits (integers whole); anything else as text."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "—" if value is None else str(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:.{SIGNIFICANT}g}"


def shorts(values: Any) -> str:
    """A number or a list of numbers, each as `short` writes it."""
    return ", ".join(short(v) for v in values) if isinstance(values, (list, tuple)) else short(values)


# Words for the parts of a results key: a column header reads "hallucination rate", "95% interval", "(nats)".
KEY_WORDS = {
    "ci95": "95% interval",
    "se": "SE",
    "ece": "ECE",
    "nll": "NLL",
    "kl": "KL",
    "auroc": "AUROC",
    "aurc": "AURC",
    "tv": "TV",
    "eps": "ε bins",
    "mf": "monofact rate",
    "crc": "CRC",
    "ltt": "LTT",
    "ik": "IK",
    "rhs": "right side",
    "lhs": "left side",
    "mis": "Mis",
    "gamma": "γ",
    "alpha": "α",
    "delta": "δ",
    "n": "n",
    "pos": "positives",
    "neg": "negatives",
    "max": "largest",
    "min": "smallest",
}
UNITS = {"nats": "nats", "s": "s", "pct": "%", "bits": "bits"}


def words(key: str) -> str:
    """A results key as a header in words, its unit in parentheses: `heldout_nll_nats` → "heldout NLL (nats)",
    `auroc_ci95` → "AUROC 95% interval", `delta_0_01` → "δ 0.01"."""
    parts = [p for p in str(key).split("_") if p]
    unit = UNITS.get(parts[-1]) if len(parts) > 1 else None
    if unit:
        parts = parts[:-1]
    out: list[str] = []
    for part in parts:
        if part.isdigit() and out and out[-1].isdigit():  # 0_01 → 0.01
            out[-1] = f"{out[-1]}.{part}"
        else:
            out.append(KEY_WORDS.get(part.lower(), part) if part.islower() or part.isdigit() else part)
    return " ".join(out) + (f" ({unit})" if unit else "")


ROUND_OFF = 1e-12  # a float this close to 0 in a table is 0 that floating point missed (a KL of a law with itself)


def cell(value: Any) -> Any:
    """One table cell as a reader reads it: SIGNIFICANT digits, an interval as [a, b], yes / no, "—" for a
    missing value or one that is not a number, 0 for a float within ROUND_OFF of it (the download keeps every
    digit)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, float) and abs(value) < ROUND_OFF:
        return "0"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return "—" if not value else (f"[{shorts(value)}]" if len(value) == 2 else shorts(value))
    return short(value) if isinstance(value, (int, float)) else str(value)


def flat(value: Any) -> bool:
    """A value a table cell can show (not a nested object: those are in the download)."""
    if isinstance(value, dict):
        return False
    if isinstance(value, (list, tuple)):
        return len(value) <= 8 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    return True


def show_table(
    rows: Any, labels: dict[str, str] | None = None, download: str | None = None, as_text: Callable[[Any], str] = plain
) -> None:
    """Rows (a list of dicts or a DataFrame) as a table a reader reads: the columns `labels` names, each headed in
    its words (with `labels` None: every column, headed by `words(key)`), each cell as `cell` writes it; columns
    of nested values left out (they are in the download). A plain HTML table (st.table: every browser draws it;
    the interactive grid draws on a canvas that a headless browser may leave blank), in a box that scrolls
    sideways when it is wider than the page. With `download` (a file name without its suffix), the rows as they
    are, every digit, one click away as CSV. Each cell is shown as `as_text` writes it (`plain`; `prose` shows the
    identifiers in a run's text as code)."""
    import pandas as pd

    # object columns: a column of integers with a missing value stays integers (pandas would make it float)
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows, dtype=object)
    if frame.empty:
        return
    shown = [c for c in (labels or frame.columns) if c in frame.columns and all(flat(v) for v in frame[c])]
    # st.table reads Markdown in every cell: each cell and header is escaped (`plain`)
    table = frame[shown].map(lambda v: as_text(cell(v)))
    table = table.rename(columns=lambda c: plain((labels or {}).get(c) or words(c)))
    st.table(table.set_index(table.columns[0]))
    if download:
        file = download.replace("_", "-")  # a file name a reader reads as words
        st.download_button(
            f"Download these rows, every digit ({file}.csv)",
            frame.to_csv(index=False),
            file_name=f"{file}.csv",
            mime="text/csv",
            key=f"download-{download}",
            on_click="ignore",
        )


def number(label: str, value: Any, fmt: str = "{:.4f}", help: str | None = None) -> None:
    """A metric; a missing value (None) shows as "—", anything else that is not a number is a TypeError, which
    show_run turns into a warning naming results.json."""
    if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
        raise TypeError(f"{label!r} is {value!r}, not a number")
    st.metric(label, "—" if value is None else fmt.format(value), help=help)


def show_headlines(results: dict) -> None:
    """The run's headlines (results.json "headlines", made by the experiment's `headlines(results)`), as
    lab.headlines words them: the sentences it supports first, then each claim it cannot support at this size,
    named in words, with the reason. Shown as text, never read as markdown."""
    parts = split_headlines(results)
    if parts is None:
        st.info("This run has no headlines (it was made before Forma wrote them): run the experiment again.")
        return
    supported, unsupported = parts
    if supported:
        st.text("\n".join(f"• {entry.get('sentence')}" for entry in supported))
    if unsupported:
        st.markdown("**Not shown, because this run cannot support it:**")
        st.text("\n".join(f"• {headline_reason(entry)}" for entry in unsupported))


PROGRESS_REFRESH_S = 2.0  # how often a page looks at its job's progress file while the job works or waits
FIRST_RUN_LOOK_S = 10.0  # how often a page without a run, and with no job at work or queued for it, looks for one


def show_progress(kind: str, name: str) -> bool:
    """The progress of the job that is making this page's run (kind "run": `forma run NAME`) or model (kind
    "model": `forma build NAME`): its step / total, elapsed time and ETA (lab.progress), looked at again every
    PROGRESS_REFRESH_S; before it starts, where it waits in `forma demo`'s queue (lab.jobs); once the job has
    finished, the whole page runs again and shows its results. A page with no run yet keeps looking, every
    FIRST_RUN_LOOK_S, so that a job started after it was opened (`forma demo`) appears too. True when such a job is
    at work or queued."""
    read, finished = {"run": (run_progress, newest_run), "model": (model_progress, model_finished)}[kind]
    command = "run" if kind == "run" else "build"
    shown = finished(name)
    first = read(name)
    working = first is not None and first.active
    was_queued = queued(command, name) is not None

    def body() -> None:
        progress = read(name)
        place = queued(command, name)
        if (
            finished(name) != shown
            or (progress is not None and progress.active) != working
            or (place is not None) != was_queued
        ):
            st.rerun()  # a job began, or ended and wrote its results: the whole page again
        if progress is not None and progress.active:
            st.progress(progress.fraction or 0.0, text=code(progress.line()))
            if shown is not None:
                st.caption(
                    "What follows is the previous "
                    + ("run" if kind == "run" else "model")
                    + "; the page fills in again when this job ends."
                )
        elif place is not None:
            st.info(place.sentence())
        elif progress is not None and progress.state == "failed":
            st.warning(
                f"{code(progress.job)} failed: {plain(progress.error)}. Its log says more "
                f"(`forma demo` keeps it in runs/demo/)."
            )

    if working or was_queued:
        every = PROGRESS_REFRESH_S
    elif kind == "run" and shown is None:
        every = FIRST_RUN_LOOK_S  # a page open on nothing yet: a job started later (`forma demo`) still appears
    else:
        every = None
    st.fragment(body, run_every=every)()
    return working or was_queued


def transcoder_sets_or_stop(graphs: bool = False) -> list[tuple[str, str]]:
    """(zoo model, transcoder set) for every set the zoo holds (graphs: those with a transcoder for every layer, which
    an attribution graph needs); with none, the page says how to make one and stops."""
    available = [(name, kind) for name in zoo_names() for kind in transcoder_sets(zoo_dir() / name, graphs=graphs)]
    if not available:
        st.info(
            "No model has transcoders yet. Train a model and its transcoders: `forma build pydoc`, then "
            "`forma transcoders pydoc` (they land in models/pydoc/transcoders/)."
        )
        st.stop()
    return available
