"""`forma demo`'s job queue as a file (runs/demo/queue.json) that the dashboard reads, so that a page whose run or
model the demo has queued says so — "queued by `forma demo` (2 ahead)" — instead of "no run yet"; and what each
job needs first (`NEEDS`: the calibration run reads the pydoc model, so it starts once pydoc's training ended).

    write_queue(jobs, states)   the demo rewrites the file, atomically, whenever a job changes state
    queued(kind, name)          the dashboard's reader: where `forma KIND NAME` waits (or that it has started)

A queue whose demo has ended (its process is gone) is no queue. Standard library only: the dashboard reads it
before (or without) torch.
"""

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from lab.files import atomic_write_text
from lab.folders import zoo_dir
from lab.outside_files import read_json_object
from lab.progress import PROGRESS_FILE, Progress, alive, read_progress
from lab.runs import runs_dir

FORMAT = "forma-demo-queue/1"
JOB_STATES = ("waiting", "running", "done", "failed")
# What a job reads that another job of the demo makes: it starts after that one has ended.
NEEDS = {"run calibration": ("build pydoc",), "transcoders markov": ("build markov",)}


def queue_file() -> Path:
    return runs_dir() / "demo" / "queue.json"


def what(argv: list[str]) -> str:
    """The job's kind and name, as NEEDS and the demo's order write it: "build pydoc", "run kl"."""
    return " ".join(argv[:2])


def write_queue(jobs: list[tuple[str, list[str]]], states: dict[str, str]) -> None:
    """The demo's jobs in the order they start (`jobs`: (label, argv)), each with its state (JOB_STATES) and
    what it waits for; with the demo's process id, so that a reader can tell a queue whose demo has ended."""
    record = {
        "format": FORMAT,
        "pid": os.getpid(),
        "updated": time.time(),
        "jobs": [
            {"job": label, "argv": argv, "state": states[label], "needs": list(NEEDS.get(what(argv), ()))}
            for label, argv in jobs
        ],
    }
    try:
        atomic_write_text(queue_file(), json.dumps(record) + "\n")
    except OSError:
        pass  # the queue file is a courtesy to the dashboard: a full disk must not stop the demo


@dataclass(frozen=True)
class Waiting:
    """A job in a live demo's queue that has not ended: its command, whether it has started, how many jobs
    ahead of it have not ended (running or waiting), and the jobs it waits for that have not ended."""

    job: str
    started: bool
    ahead: int
    waits_for: tuple[str, ...]

    def sentence(self) -> str:
        """The page's sentence: "Queued by `forma demo` (2 ahead): `forma run calibration --quick` starts
        after `forma build pydoc`, whose result it reads, and when a core is free; …", or that it has started."""
        if self.started:
            return f"`{self.job}` has started (`forma demo`); its progress shows here in a moment."
        text = f"Queued by `forma demo` ({self.ahead} ahead): `{self.job}` starts "
        if self.waits_for:
            text += f"after {', '.join(f'`{job}`' for job in self.waits_for)}, whose result it reads, and "
        return text + "when a core is free; this page fills in when it ends."

    def short(self) -> str:
        """Home's few words: "queued by `forma demo` (2 ahead)", or "started by `forma demo`"."""
        return "started by `forma demo`" if self.started else f"queued by `forma demo` ({self.ahead} ahead)"


def queued(kind: str, name: str) -> Waiting | None:
    """Where `forma KIND NAME` (kind "run" or "build") stands in a live demo's queue, while it waits or runs; None
    when no demo runs, the file is unreadable, or that job is not in it or has ended."""
    try:
        record = read_json_object(queue_file(), what="demo queue")
        jobs = record["jobs"]
        if record.get("format") != FORMAT or not alive(int(record["pid"])):
            return None
        states = {job["job"]: job["state"] for job in jobs}
        mine = next((job for job in jobs if job["argv"][:2] == [kind, name]), None)
        if mine is None or mine["state"] not in ("waiting", "running"):
            return None
        before = jobs[: jobs.index(mine)]
        ahead = sum(job["state"] in ("waiting", "running") for job in before)
        labels = {what(job["argv"]): job["job"] for job in jobs}
        waits = tuple(
            labels[need] for need in mine["needs"] if need in labels and states[labels[need]] in ("waiting", "running")
        )
        return Waiting(mine["job"], mine["state"] == "running", ahead, waits)
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError, IndexError):
        return None


def run_progress(experiment: str, folder: Path | None = None) -> Progress | None:
    """The progress of `experiment`'s newest run that has not finished (no results.json) and has a progress
    file, in runs/<experiment>/ (or `folder`/<experiment>/); None when the newest such run is not newer than
    its newest finished one, or there is none."""
    base = Path(folder or runs_dir()) / experiment
    if not base.is_dir():
        return None
    newest_finished = max((p.parent.name for p in base.glob("*/results.json")), default="")
    for run in sorted((p.parent for p in base.glob(f"*/{PROGRESS_FILE}")), key=lambda p: p.name, reverse=True):
        if run.name <= newest_finished:
            return None
        if not (run / "results.json").exists():
            progress = read_progress(run / PROGRESS_FILE)
            if progress is not None:
                return progress
    return None


def model_progress(name: str) -> Progress | None:
    """The progress of `forma build NAME` (models/NAME/.progress.json), or None."""
    return read_progress(zoo_dir() / name / PROGRESS_FILE)


def model_finished(name: str) -> float | None:
    """When zoo model NAME's published card was written (its mtime), or None when it has none: what changes
    when `forma build NAME` finishes."""
    try:
        return (zoo_dir() / name / "card.json").stat().st_mtime
    except OSError:
        return None
