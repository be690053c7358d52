"""The demo's board: one line per job on the terminal (waiting, starting, its progress as lab.progress records
it, done or failed), redrawn in place on a terminal; in a log, a line only where a job moves on (a new stage, a
further quarter of one), so that a log only ever moves forward."""

import shutil
import sys
import threading
import time
from pathlib import Path


def job_progress(argv: list[str]):
    """The progress record (lab.progress) of the job `forma ARGV`, or None: a run's from its run folder, a
    training's from its model folder."""
    from lab.jobs import model_progress, run_progress
    from lab.progress import PROGRESS_FILE, read_progress

    command, name = argv[0], argv[1]
    if command == "build":
        return model_progress(name)
    if command == "run" and "--out" in argv[:-1]:
        return read_progress(Path(argv[argv.index("--out") + 1]) / PROGRESS_FILE)
    return run_progress(name) if command == "run" else None


class JobBoard:
    """One line per demo job on the terminal: waiting, starting, its progress (lab.progress: elapsed, stage,
    step / total, ETA), done or failed. On a terminal the lines are redrawn in place every second, below the
    messages; otherwise (a log, a pipe) a running job's line is printed, looked at every `every_s` seconds, only when
    it has moved on (`moved_on`): no ETA in it (an estimate may grow), no "starting" after a stage has shown. Each job
    is numbered, "(job 2 of 6)", from the start."""

    def __init__(self, jobs: list[tuple[str, list[str]]], stream=None, every_s: float | None = None):
        self.stream = stream if stream is not None else sys.stdout
        try:
            self.terminal = self.stream.isatty()
        except (AttributeError, ValueError):
            self.terminal = False
        self.every_s = every_s if every_s is not None else (1.0 if self.terminal else BOARD_EVERY_S)
        self.argv = dict(jobs)
        self.rows = {label: f"{label}: waiting for a free core" for label, _ in jobs}
        self.began: dict[str, float] = {}
        self.logged: dict[str, tuple[str, int | None, int]] = {}  # per job: the (stage, total, quarter) last logged
        self.drawn = 0
        self.lock = threading.RLock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="demo job board", daemon=True)

    def __enter__(self) -> "JobBoard":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        if self.terminal:
            self.draw()

    def started(self, label: str) -> None:
        with self.lock:
            self.began[label] = time.time()
            self.rows[label] = f"{label}: starting"
        self.say(f"[demo] {label} … (job {list(self.rows).index(label) + 1} of {len(self.rows)})")

    def ended(self, label: str, row: str, message: str, error: bool = False) -> None:
        with self.lock:
            self.began.pop(label, None)
            self.rows[label] = row
        self.say(message, error)

    def say(self, message: str, error: bool = False) -> None:
        """A message above the board (stderr when `error`)."""
        with self.lock:
            self._clear()
            print(message, file=sys.stderr if error else self.stream, flush=True)
            if self.terminal:
                self.draw()

    def status(self, label: str) -> str:
        from lab.progress import clock

        began = self.began.get(label)
        if began is None:
            return self.rows[label]
        progress = job_progress(self.argv[label])
        if progress is not None and progress.updated >= began and progress.active:
            return progress.line()
        return f"{label}: starting ({clock(time.time() - began)})"

    def draw(self) -> None:
        with self.lock:
            if self.terminal:  # one screen line each, or the redraw would miscount the lines to go up
                lines = [f"[demo] {self.status(label)}" for label in self.rows]
                width = shutil.get_terminal_size().columns - 1
                self._clear()
                self.stream.write("".join(f"\x1b[2K{line[:width]}\n" for line in lines))
                self.drawn = len(lines)
            else:
                self.stream.write("".join(f"[demo] {line}\n" for line in map(self.moved_on, self.rows) if line))
            self.stream.flush()

    def moved_on(self, label: str) -> str | None:
        """The running job's line for a log, when it has moved on since the last one logged: a stage it had not
        logged, or a further quarter of the same stage; else None. `forma run kl --quick: 1:12 elapsed; train step
        120/400 (30%)`."""
        from lab.progress import clock

        began = self.began.get(label)
        progress = job_progress(self.argv[label]) if began is not None else None
        if progress is None or progress.updated < began or not progress.active or progress.stage is None:
            return None
        stage = progress.stage
        here = (stage.label, stage.total, int(4 * stage.fraction) if stage.fraction is not None else 0)
        last = self.logged.get(label)
        if last is not None and last[:2] == here[:2] and last[2] >= here[2]:
            return None
        self.logged[label] = here
        return f"{progress.job}: {clock(progress.elapsed_s)} elapsed; {stage.label} {stage.counted()}"

    def _clear(self) -> None:
        if self.terminal and self.drawn:
            self.stream.write(f"\x1b[{self.drawn}F\x1b[0J")  # up to the board's first line, erase to the end
            self.stream.flush()
            self.drawn = 0

    def _loop(self) -> None:
        while not self.stop.wait(self.every_s):
            self.draw()


BOARD_EVERY_S = 5.0  # how often a log (not a terminal) looks whether a running job has moved on
