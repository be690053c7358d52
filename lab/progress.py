"""Progress of Forma's long operations, told three ways: a bar on a terminal, a line every so often where the
output is not a terminal (a `forma demo` job's log, CI), and a small file that the dashboard and `forma demo` read.

    bar(total, label)   what a loop counts its steps with (the training loop, activation collection). On a
                        terminal a tqdm bar; otherwise a line at each further tenth done and at least every
                        LINE_EVERY_S, and one when it closes:
                            train: step 120/1000 (12%) · 0:14 elapsed · ETA 1:42 · loss=2.3456
                        A bar shown or not (show=False: an experiment's inner trainings), it is the job's
                        current stage while it counts.
    recording(path, job) wraps a whole job (`forma run NAME`, `forma build NAME`): every RECORD_EVERY_S it writes
                        the job's progress file — <run folder>/.progress.json, models/NAME/.progress.json —
                        atomically: its state, elapsed time and the innermost bar still counting. With echo,
                        it also says so on stderr (a redrawn line on a terminal, a line every LINE_EVERY_S in a log).
    read_progress, run_progress, model_progress, model_finished   the readers.

Only the standard library and tqdm are imported here: the command line and the dashboard load this module
before (or without) torch.
"""

import json
import os
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from lab.files import atomic_write_text
from lab.outside_files import read_json

PROGRESS_FILE = ".progress.json"  # hidden: a job's state, not one of its artefacts
FORMAT = "forma-progress/1"
LINE_EVERY_S = 10.0  # a log line at least this often while a bar counts …
LINE_EVERY_FRACTION = 0.1  # … and at each further tenth of its total
RECORD_EVERY_S = 1.0  # how often a job rewrites its progress file
STALE_S = 30.0  # a "running" file not rewritten for this long belongs to a job that ended without saying so
STATES = ("running", "done", "failed", "stopped")  # "done": the job's work is over, its results are being written


def clock(seconds: float) -> str:
    """Seconds as m:ss, or h:mm:ss from an hour."""
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


@dataclass(frozen=True)
class Stage:
    """Where one bar stands: `step` of `total` (None: not known), its own elapsed time, and the ETA from its
    rate so far, (total − step) · elapsed / (step − initial) — None until a step is done."""

    label: str
    step: int
    total: int | None
    unit: str
    elapsed_s: float
    eta_s: float | None
    postfix: str = ""

    def __post_init__(self) -> None:
        if self.step < 0 or (self.total is not None and self.total < 0):
            raise ValueError(f"progress of {self.label!r}: step {self.step} and total {self.total} must be ≥ 0")
        if self.elapsed_s < 0 or (self.eta_s is not None and self.eta_s < 0):
            raise ValueError(
                f"progress of {self.label!r}: elapsed_s {self.elapsed_s} and eta_s {self.eta_s} must be ≥ 0"
            )

    @property
    def fraction(self) -> float | None:
        return min(1.0, self.step / self.total) if self.total else None

    def counted(self) -> str:
        """`step 120/1000 (12%)`, or `step 120` when the total is not known."""
        if self.fraction is None:
            return f"{self.unit} {self.step}"
        return f"{self.unit} {self.step}/{self.total} ({self.fraction:.0%})"

    def line(self) -> str:
        """The bar as one log line: label, step / total, elapsed, ETA (and the loop's own values)."""
        parts = [f"{self.label}: {self.counted()}", f"{clock(self.elapsed_s)} elapsed"]
        if self.total and self.step < self.total:
            parts.append(f"ETA {clock(self.eta_s)}" if self.eta_s is not None else "ETA —")
        if self.postfix:
            parts.append(self.postfix)
        return " · ".join(parts)


# The bars counting now, innermost last: the job's current stage. Weak references: a bar a loop left unclosed
# (an exception went through it) leaves with the loop's frame.
_ACTIVE: list[weakref.ref] = []
_ACTIVE_LOCK = threading.Lock()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or minimal stream
        return False


class Bar:
    """A progress bar over `total` units (see the module's docstring); used as tqdm is: update, set_postfix,
    write, close (or as a context manager). `disable` is True when it shows nothing (show=False)."""

    def __init__(
        self,
        total: int | None,
        label: str,
        unit: str = "step",
        initial: int = 0,
        show: bool = True,
        stream: TextIO | None = None,
        line_every_s: float = LINE_EVERY_S,
    ):
        from tqdm.auto import tqdm

        self.total, self.label, self.unit = total, label, unit
        self.n = self.initial = initial
        self.postfix = ""
        self.disable = not show
        self.stream = stream if stream is not None else sys.stderr
        terminal = show and _is_terminal(self.stream)
        self._lines = show and not terminal
        self._line_every_s = line_every_s
        self._tqdm = tqdm(total=total, initial=initial, unit=unit, desc=label, file=self.stream, disable=not terminal)
        self._started = time.monotonic()
        self._last_line = (self._started, initial)
        self._closed = False
        with _ACTIVE_LOCK:
            _ACTIVE.append(weakref.ref(self))

    def snapshot(self) -> Stage:
        elapsed = time.monotonic() - self._started
        done = self.n - self.initial
        eta = None
        if self.total and done > 0:
            eta = max(0.0, elapsed * (self.total - self.n) / done)
        return Stage(self.label, self.n, self.total, self.unit, elapsed, eta, self.postfix)

    def update(self, n: int = 1) -> None:
        self.n += n
        self._tqdm.update(n)
        if self._lines and self._due():
            self._line()

    def set_postfix(self, **values: Any) -> None:
        self.postfix = ", ".join(f"{key}={value}" for key, value in values.items())
        if not self._tqdm.disable:
            self._tqdm.set_postfix(values)

    def write(self, message: str) -> None:
        """A message on stdout that does not break the bar (above it on a terminal, a line of its own in a log)."""
        if self._tqdm.disable:
            print(message, flush=True)
        else:
            self._tqdm.write(message)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with _ACTIVE_LOCK:
            _ACTIVE[:] = [ref for ref in _ACTIVE if ref() is not None and ref() is not self]
        if self._lines and self.n != self._last_line[1]:
            self._line()
        self._tqdm.close()

    def __enter__(self) -> "Bar":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _due(self) -> bool:
        at, step = self._last_line
        if time.monotonic() - at >= self._line_every_s:
            return True
        if not self.total:
            return False
        tenth = self.total * LINE_EVERY_FRACTION
        return int(self.n // tenth) > int(step // tenth)

    def _line(self) -> None:
        self._last_line = (time.monotonic(), self.n)
        print(self.snapshot().line(), file=self.stream, flush=True)


def bar(
    total: int | None, label: str, unit: str = "step", initial: int = 0, show: bool = True, stream: TextIO | None = None
) -> Bar:
    """The progress bar every long loop in Forma counts with (see the module's docstring)."""
    return Bar(total, label, unit=unit, initial=initial, show=show, stream=stream)


def current_stage() -> Stage | None:
    """The innermost bar counting now in this process, or None."""
    with _ACTIVE_LOCK:
        live = [bar for bar in (ref() for ref in _ACTIVE) if bar is not None]
    return live[-1].snapshot() if live else None


@dataclass(frozen=True)
class Progress:
    """A job's progress file: what it is (`job`, the command), its state (STATES), its process, when it
    started, how long it has run, when the file was written (`updated`, seconds since the epoch), the bar it
    is in (None between bars, or in work no bar counts) and, when it failed, the error in one line."""

    job: str
    state: str
    pid: int
    started_utc: str
    elapsed_s: float
    updated: float
    stage: Stage | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"progress state must be one of {', '.join(STATES)}, got {self.state!r}")
        if self.elapsed_s < 0:
            raise ValueError(f"progress of {self.job!r}: elapsed_s {self.elapsed_s} must be ≥ 0")

    @property
    def active(self) -> bool:
        """The job is still at work (or writing its results)."""
        return self.state in ("running", "done")

    @property
    def fraction(self) -> float | None:
        return self.stage.fraction if self.stage is not None else None

    def line(self) -> str:
        """`forma run kl --quick: 1:12 elapsed; train step 120/400 (30%), ETA 0:20`."""
        text = f"{self.job}: {clock(self.elapsed_s)} elapsed"
        if self.state == "done":
            return text + "; writing its results"
        if self.state != "running":
            return text + f"; {self.state}" + (f" ({self.error})" if self.error else "")
        if self.stage is not None:
            text += f"; {self.stage.label} {self.stage.counted()}"
            if self.stage.total and self.stage.step < self.stage.total:
                text += f", ETA {clock(self.stage.eta_s) if self.stage.eta_s is not None else '—'}"
            if self.stage.postfix:
                text += f" · {self.stage.postfix}"
        return text

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self)}

    @classmethod
    def from_json(cls, record: Any) -> "Progress":
        """The record a progress file holds; ValueError naming what is wrong with it."""
        if not isinstance(record, dict) or record.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} record")
        fields = {k: v for k, v in record.items() if k != "format"}
        stage = fields.pop("stage", None)
        try:
            return cls(**fields, stage=Stage(**stage) if isinstance(stage, dict) else None)
        except TypeError as err:
            raise ValueError(f"a {FORMAT} record with other fields: {err}") from None


def alive(pid: int) -> bool:
    """Whether process `pid` is still running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # someone else's process: alive, as far as this reader can tell
    return True


def read_progress(path: str | Path) -> Progress | None:
    """The progress file at `path`, or None when there is none (or it is not one). A "running" or "done" record
    whose job is gone — its process ended, or the file has not been rewritten for STALE_S — reads "stopped"."""
    try:  # through lab.outside_files: a FIFO or a link out of the folder is no progress file, and never waited on
        progress = Progress.from_json(read_json(path, Path(path).parent, max_bytes=2**20))
    except (OSError, ValueError):
        return None
    if progress.active and (time.time() - progress.updated > STALE_S or not alive(progress.pid)):
        return Progress(**{**progress.__dict__, "state": "stopped"})
    return progress


class _Recorder:
    def __init__(self, path: Path, job: str, echo: bool, stream: TextIO):
        self.path, self.job, self.echo, self.stream = path, job, echo, stream
        self.terminal = echo and _is_terminal(stream)
        self.started = time.monotonic()
        self.started_utc = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.last_echo = self.started
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name=f"progress of {job}", daemon=True)

    def progress(self, state: str = "running", error: str | None = None) -> Progress:
        return Progress(
            self.job,
            state,
            os.getpid(),
            self.started_utc,
            time.monotonic() - self.started,
            time.time(),
            current_stage() if state == "running" else None,
            error,
        )

    def write(self, progress: Progress) -> None:
        with self.lock:
            try:
                atomic_write_text(self.path, json.dumps(progress.to_json()) + "\n")
            except OSError:
                pass  # progress is a courtesy: a full disk must not end the job it describes

    def _loop(self) -> None:
        while not self.stop.wait(RECORD_EVERY_S):
            progress = self.progress()
            self.write(progress)
            if self.echo and (self.terminal or time.monotonic() - self.last_echo >= LINE_EVERY_S):
                self.last_echo = time.monotonic()
                self.say(progress.line())

    def say(self, line: str) -> None:
        if self.terminal:
            print(f"\r\x1b[2K{line}", end="", file=self.stream, flush=True)
        else:
            print(line, file=self.stream, flush=True)

    def finish(self, state: str, error: str | None = None) -> None:
        self.stop.set()
        self.thread.join()
        progress = self.progress(state, error)
        self.write(progress)
        if self.echo:
            self.say(progress.line())
            if self.terminal:
                print(file=self.stream, flush=True)


@contextmanager
def recording(path: str | Path, job: str, echo: bool = False, stream: TextIO | None = None) -> Iterator[None]:
    """Write the progress file of `job` at `path` while the block runs (see the module's docstring): "running"
    every RECORD_EVERY_S, then "done" — or "failed" with the error, "stopped" when Ctrl-C or a signal ended it."""
    recorder = _Recorder(Path(path), job, echo, stream if stream is not None else sys.stderr)
    recorder.write(recorder.progress())
    recorder.thread.start()
    try:
        yield
    except BaseException as err:
        # Ctrl-C, and the exceptions that carry the signal that ended the job (`signum`), stop it; others fail it.
        stopped = isinstance(err, (KeyboardInterrupt, SystemExit)) or hasattr(err, "signum")
        recorder.finish("stopped" if stopped else "failed", f"{type(err).__name__}: {err}".splitlines()[0])
        raise
    recorder.finish("done")
