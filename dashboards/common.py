"""What every dashboard page shares: cached model loading, run-folder reading, messages instead of tracebacks.

The dashboard is a view: it reads run folders written by `forma run` and calls tested library code
(lab.analysis, lab.metrics); it computes nothing of its own.
"""

import json
from pathlib import Path
from typing import Any

import plotly.io as pio
import streamlit as st


from lab.zoo import zoo_dir, zoo_names

EXPERIMENTS = {
    "kl": "KL decomposition",
    "hallucination": "Hallucination on arbitrary facts",
    "calibration": "Calibration",
    "equations": "The seeds' equations",
}
RESERVED_JSON = {"results", "config", "provenance", "world", "card"}


def latest_run(experiment: str) -> tuple[Path | None, dict | None, str | None]:
    """(folder, results, problem): the newest complete run, or a sentence saying what is wrong."""
    from lab.runs import latest_run as find

    folder = find(experiment)
    if folder is None:
        return None, None, f"No run of `{experiment}` yet. Make one with `forma run {experiment} --quick` (or without --quick for the full experiment)."
    try:
        results = json.loads((folder / "results.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        return folder, None, (f"The run in `{folder}` has an unreadable results.json ({err}). "
                              f"Run `forma run {experiment}` again.")
    if not isinstance(results, dict):
        return folder, None, f"The run in `{folder}` has a results.json that is not a JSON object."
    return folder, results, None


def figures(folder: Path) -> list[tuple[str, Any]]:
    """Every plotly figure a run saved (as <name>.json beside its HTML), by name."""
    found = []
    for path in sorted(folder.glob("*.json")):
        if path.stem in RESERVED_JSON:
            continue
        try:
            found.append((path.stem, pio.from_json(path.read_text())))
        except (ValueError, json.JSONDecodeError):
            continue
    return found


def show_figures(folder: Path, only: list[str] | None = None) -> None:
    for name, fig in figures(folder):
        if only is None or name in only:
            st.plotly_chart(fig, key=f"fig-{folder.name}-{name}")


def show_run_header(experiment: str) -> tuple[Path | None, dict | None]:
    """Title, the run's provenance line, or the message that says how to make a run."""
    st.title(EXPERIMENTS[experiment])
    folder, results, problem = latest_run(experiment)
    if problem:
        (st.warning if folder else st.info)(problem)
        return None, None
    provenance = {}
    try:
        provenance = json.loads((folder / "provenance.json").read_text())
    except (OSError, json.JSONDecodeError):
        pass
    commit = (provenance.get("git") or {}).get("commit") or "unknown"
    wall = provenance.get("wall_time_s")
    st.caption(f"Run `{folder.name}` · seed {provenance.get('seed')} · commit {commit[:10]}"
               + (f" · {wall:.0f} s" if isinstance(wall, (int, float)) else ""))
    return folder, results


@st.cache_resource(show_spinner="Loading model…")
def load_model(name_or_path: str):
    from lab import HookedTransformer

    return HookedTransformer.from_pretrained(name_or_path).eval()


def try_load_model(name_or_path: str):
    """The model, or None after showing a message that says what to run."""
    try:
        return load_model(name_or_path)
    except FileNotFoundError as err:
        st.warning(f"{err}")
    except (ValueError, KeyError, OSError) as err:
        st.error(f"Could not load `{name_or_path}`: {err}")
    return None


def zoo_table() -> list[dict[str, Any]]:
    import tomllib

    rows = []
    for name in zoo_names():
        directory = zoo_dir() / name
        card: dict[str, Any] = {}
        if (directory / "card.json").is_file():
            try:
                card = json.loads((directory / "card.json").read_text())
            except json.JSONDecodeError:
                card = {}
        try:
            description = tomllib.loads((zoo_dir() / name / "model.toml").read_text()).get("description", "")
        except (OSError, tomllib.TOMLDecodeError):
            description = ""
        trained = (directory / "model.safetensors").is_file()
        rows.append({"model": name, "trained": "yes" if trained else f"no — run `forma train {name}`",
                     "parameters": card.get("n_params"), "train time (s)": _round(card.get("train_s")),
                     "held-out loss (nats)": _round(card.get("best_val_loss_nats"), 3), "description": description})
    return rows


def _round(value: Any, digits: int = 0) -> Any:
    return round(value, digits) if isinstance(value, (int, float)) else None


def number(label: str, value: Any, fmt: str = "{:.4f}", help: str | None = None) -> None:
    st.metric(label, fmt.format(value) if isinstance(value, (int, float)) else "—", help=help)


def show_headlines(results: dict) -> None:
    """The run's headlines (results.json "headlines", made by the experiment's `headlines(results)`): the
    sentences it supports first, then those it cannot support at this size, each with the reason in words."""
    entries = [h for h in results.get("headlines") or [] if isinstance(h, dict)]
    supported = [h for h in entries if h.get("supported")]
    unsupported = [h for h in entries if not h.get("supported")]
    if supported:
        st.markdown("\n".join(f"- {h.get('sentence')}" for h in supported))
    if unsupported:
        st.markdown("**Not shown, because this run cannot support it:**\n"
                    + "\n".join(f"- {h.get('name')}: {h.get('why_not') or 'no reason recorded'}" for h in unsupported))
