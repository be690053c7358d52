"""What every dashboard page shares: cached model loading, run-folder reading, messages instead of tracebacks.

The dashboard is a view: it reads run folders written by `forma run` and calls tested library code
(lab.analysis, lab.metrics); it computes nothing of its own.

Text that comes from a run folder or a model (a headline's sentence, a note, a key, a path, a token) is shown as
text, never read as Markdown or HTML: it goes into a page through `plain` (escaped) or `code` (a code span), so
that a results.json can show no image, link, heading or markup — a browser fetches nothing a run folder names.
"""

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import streamlit as st

from experiments import experiment as registered
from lab.folders import zoo_dir, zoo_names
from lab.progress import model_finished, model_progress, run_progress
from lab.runs import read_figures, read_results, run_record
from lab.runs import latest_run as newest_run
from lab.runs import read_table as read_parquet_table


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


def rerun(experiment: str) -> str:
    return f"Run `forma run {experiment} --quick` (or without --quick) to write it again."


def latest_run(experiment: str) -> tuple[Path | None, dict | None, str | None]:
    """(folder, results, problem): the newest complete run, or a sentence saying what is wrong."""
    folder = newest_run(experiment)
    if folder is None:
        return None, None, f"No run of `{experiment}` yet. Make one with `forma run {experiment} --quick` (or without --quick for the full experiment)."
    try:
        return folder, read_results(folder), None
    except (FileNotFoundError, ValueError) as err:
        return (folder, None,
                f"The run in {code(folder)} has an unreadable results.json ({plain(err)}). " + rerun(experiment))


def figures(folder: Path, unreadable: list[str] | None = None) -> list[tuple[str, Any]]:
    """Every plotly figure a run saved, by name (lab.runs.read_figures); the file names of those that cannot be
    read are appended to `unreadable`."""
    found, bad = read_figures(folder)
    if unreadable is not None:
        unreadable.extend(bad)
    return found


def show_figures(folder: Path, only: list[str] | None = None) -> None:
    unreadable: list[str] = []
    for name, fig in figures(folder, unreadable):
        if only is None or name in only:
            st.plotly_chart(fig, key=f"fig-{folder.name}-{name}")
    if unreadable:
        st.warning(f"Figures in {code(folder)} that are not readable plotly JSON, left out: "
                   f"{plain(', '.join(unreadable))}. " + rerun(folder.parent.name))


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
    wrong = {key for key, kind in fields.items()
             if results.get(key) is not None and not isinstance(results[key], kind)}
    for key in sorted(wrong):
        kinds = fields[key] if isinstance(fields[key], tuple) else (fields[key],)
        problems.append(f"{code(key)} is a {type(results[key]).__name__}, "
                        f"not a {' or '.join(k.__name__ for k in kinds)}")
    if problems:
        warn_shape(path.parent, experiment, "; ".join(problems))
    return {key: value for key, value in results.items() if key not in wrong}


def show_run(experiment: str, render: Callable[[Path, dict], None], fields: FieldTypes | None = None,
             required: tuple[str, ...] = ()) -> None:
    """An experiment's page: the header of its latest run, then render(folder, results). A results.json that
    lacks a field, holds one of another type, or a value of another shape deeper down is a warning that names
    the file and says what to run — never a traceback."""
    folder, results = show_run_header(experiment)
    if results is None:
        return
    path = folder / "results.json"
    results = checked_fields(results, path, experiment, fields or {}, required)
    try:
        render(folder, results)
    except SHAPE_ERRORS as err:
        st.warning(f"{code(path)} holds a value this page cannot show ({type(err).__name__}: {plain(err)}), so the "
                   f"rest of the page is left out. " + rerun(experiment))


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
    provenance = run_record(folder)["provenance"]
    git = provenance.get("git")
    commit = str((git if isinstance(git, dict) else {}).get("commit") or "unknown")
    wall = provenance.get("wall_time_s")
    st.caption(f"Run {code(folder.name)} · seed {plain(provenance.get('seed'))} · commit {plain(commit[:10])}"
               + (f" · {wall:.0f} s" if isinstance(wall, (int, float)) else ""))
    return folder, results


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


def show_table(rows: Any) -> None:
    """Rows (a list of dicts or a DataFrame) as a table whose numbers show SIGNIFICANT digits, and lists of
    numbers as [a, b]. st.table is plain HTML, which every browser draws; the interactive data grid draws
    on a canvas that a headless browser may leave blank."""
    import pandas as pd

    # object columns: a column of integers with a missing value stays integers (pandas would make it float)
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows, dtype=object)
    if frame.empty:
        return

    def cell(value: Any) -> Any:  # st.table reads Markdown in every cell: a run's text is escaped (`plain`)
        if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
            return f"[{shorts(value)}]"
        return short(value) if value is None or isinstance(value, (int, float)) else plain(value)

    frame = frame.map(cell).rename(columns=plain)
    st.table(frame.set_index(frame.columns[0]))


def number(label: str, value: Any, fmt: str = "{:.4f}", help: str | None = None) -> None:
    """A metric; a missing value (None) shows as "—", anything else that is not a number is a TypeError, which
    show_run turns into a warning naming results.json."""
    if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
        raise TypeError(f"{label!r} is {value!r}, not a number")
    st.metric(label, "—" if value is None else fmt.format(value), help=help)


def show_headlines(results: dict) -> None:
    """The run's headlines (results.json "headlines", made by the experiment's `headlines(results)`): the
    sentences it supports first, then those it cannot support at this size, each with the reason in words."""
    if not isinstance(results.get("headlines"), list):
        st.info("This run has no headlines (it was made before Forma wrote them): run the experiment again.")
        return
    entries = [h for h in results["headlines"] if isinstance(h, dict)]
    supported = [h for h in entries if h.get("supported")]
    unsupported = [h for h in entries if not h.get("supported")]
    if supported:
        st.markdown("\n".join(f"- {plain(h.get('sentence'))}" for h in supported))
    if unsupported:
        st.markdown("**Not shown, because this run cannot support it:**\n"
                    + "\n".join(f"- {plain(h.get('name'))}: {plain(h.get('why_not') or 'no reason recorded')}"
                                 for h in unsupported))


PROGRESS_REFRESH_S = 2.0  # how often a page looks at its job's progress file while the job works


def show_progress(kind: str, name: str) -> bool:
    """The progress of the job that is making this page's run (kind "run": `forma run NAME`) or model (kind
    "model": `forma train NAME`): its step / total, elapsed time and ETA (lab.progress), looked at again every
    PROGRESS_REFRESH_S; once the job has finished, the whole page runs again and shows its results. A page
    with no run yet keeps looking, so that a job started after it was opened (`forma demo`) appears too.
    True when such a job is at work."""
    read, finished = {"run": (run_progress, newest_run), "model": (model_progress, model_finished)}[kind]
    shown = finished(name)
    first = read(name)
    working = first is not None and first.active

    def body() -> None:
        progress = read(name)
        if finished(name) != shown or (progress is not None and progress.active) != working:
            st.rerun()  # a job began, or ended and wrote its results: the whole page again
        if progress is None:
            return
        if progress.active:
            st.progress(progress.fraction or 0.0, text=code(progress.line()))
            if shown is not None:
                st.caption("What follows is the previous " + ("run" if kind == "run" else "model")
                           + "; the page fills in again when this job ends.")
        elif progress.state == "failed":
            st.warning(f"{code(progress.job)} failed: {plain(progress.error)}. Its log says more "
                       f"(`forma demo` keeps it in runs/demo/).")

    waiting = working or (kind == "run" and shown is None)
    st.fragment(body, run_every=PROGRESS_REFRESH_S if waiting else None)()
    return working
