"""The demo's board: one line per job on the terminal (waiting, starting, its progress as lab.progress records
it, done or failed), redrawn in place on a terminal and printed every so often to a log."""

import shutil
import sys
import threading
import time
from pathlib import Path


def job_progress(argv: list[str]):
    """The progress record (lab.progress) of the job `forma ARGV`, or None: a run's from its run folder, a
    training's from its model folder."""
    from lab.progress import PROGRESS_FILE, model_progress, read_progress, run_progress

    command, name = argv[0], argv[1]
    if command == "build":
        return model_progress(name)
    if command == "run" and "--out" in argv[:-1]:
        return read_progress(Path(argv[argv.index("--out") + 1]) / PROGRESS_FILE)
    return run_progress(name) if command == "run" else None


class JobBoard:
    """One line per demo job on the terminal: waiting, starting, its progress (lab.progress: elapsed, stage,
    step / total, ETA), done or failed. On a terminal the lines are redrawn in place every second, below the
    messages; otherwise (a log, a pipe) each running job's line is printed every `every_s` seconds."""

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
        self.say(f"[demo] {label} …")

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
            lines = [f"[demo] {self.status(label)}" for label in self.rows]
            if self.terminal:  # one screen line each, or the redraw would miscount the lines to go up
                width = shutil.get_terminal_size().columns - 1
                self._clear()
                self.stream.write("".join(f"\x1b[2K{line[:width]}\n" for line in lines))
                self.drawn = len(lines)
            else:
                self.stream.write("".join(f"{line}\n" for label, line in zip(self.rows, lines) if label in self.began))
            self.stream.flush()

    def _clear(self) -> None:
        if self.terminal and self.drawn:
            self.stream.write(f"\x1b[{self.drawn}F\x1b[0J")  # up to the board's first line, erase to the end
            self.stream.flush()
            self.drawn = 0

    def _loop(self) -> None:
        while not self.stop.wait(self.every_s):
            self.draw()


BOARD_EVERY_S = 15.0  # a line per running job this often when the demo's output is a log, not a terminal
