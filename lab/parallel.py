"""Independent pieces of an experiment in worker processes: the trainings of a sweep share no state, so two
cores finish them in about half the time.

A task is `(function, *arguments)`: a module-level function (a worker imports it by name) whose arguments
and result pickle. Each worker is a fresh interpreter (spawn: no copy of the caller's threads or locks) that
runs torch on `threads` intra-op threads, so a task computes exactly what it computes in this process at that
thread count: results never depend on `workers`, only the wall time does. `then` chains follow-up tasks on
a task's result (the upweighting runs start from one γ's optimum) without waiting for the other tasks.

A worker dies with its parent (Linux: PR_SET_PDEATHSIG), so a killed run leaves nothing computing. A worker
ignores SIGINT (a terminal's Ctrl-C reaches the whole process group): the caller decides, and when a task fails
or the caller is interrupted (Ctrl-C, or SIGTERM made one by `lab.cli`), every worker is killed and has ended,
and the workers' folder is gone, before the error goes on.

Progress: the tasks are counted by a bar (lab.progress, shown nowhere, so it is the job's current stage in its
progress file: `in 2 workers task 3/7 (43%), ETA 0:40`), and each worker tells the caller, every
lab.progress.RECORD_EVERY_S, where its own innermost bar stands (a training's `train step 300/1200`), which
that bar carries as its postfix. Each worker writes its stage to a small file of a private folder; the caller
reads them when its progress is asked for: no queue, no thread in the caller.
"""

import ctypes
import json
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from multiprocessing.connection import wait as wait_for
from pathlib import Path
from typing import Any

from lab.files import atomic_write_text
from lab.progress import RECORD_EVERY_S, Bar, Stage, bar, current_stage

__all__ = ["Task", "run_tasks"]

Task = tuple[Any, ...]  # (function, *arguments)
FollowUp = Callable[[Any], Sequence[Task]]


def _check(workers: Any, tasks: Sequence[Task]) -> None:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    for task in tasks:
        if not (isinstance(task, tuple) and task and callable(task[0])):
            raise ValueError(f"a task is (function, *arguments), got {task!r}")
        if workers > 1 and getattr(task[0], "__module__", None) == "__main__":
            raise ValueError(
                f"a task's function must live in an importable module for a worker to find it, "
                f"not in __main__: {task[0]!r}"
            )


def run_tasks(
    tasks: Sequence[Task], workers: int = 1, then: Mapping[int, FollowUp] | None = None, threads: int = 1
) -> list[Any]:
    """Run every task and return their results in order: `tasks`' own, then the follow-ups of `then[i]`
    (called with task i's result, returning more tasks) in order of i. workers = 1 runs them here, one after
    another; more runs them in that many worker processes. The first task to fail raises its own error
    here, and the tasks still running are stopped."""
    _check(workers, tasks)
    then = dict(then or {})
    if workers == 1:
        with bar(len(tasks), "tasks", unit="task", show=False) as counted:
            results = []
            for task in tasks:
                results.append(task[0](*task[1:]))
                counted.update()
            for i in sorted(then):
                more = list(then[i](results[i]))
                counted.total += len(more)
                for task in more:
                    results.append(task[0](*task[1:]))
                    counted.update()
        return results
    stages = Path(tempfile.mkdtemp(prefix="forma-workers-"))
    try:
        with WorkersBar(len(tasks), workers, stages) as counted:
            return _in_workers(list(tasks), workers, then, threads, counted, stages)
    finally:
        shutil.rmtree(stages, ignore_errors=True)


class WorkersBar(Bar):
    """The bar over a run's tasks, shown nowhere; its postfix is where each worker's own innermost bar stands,
    read from the files the workers write into `stages` (the `now` part of the job's progress line)."""

    def __init__(self, total: int, workers: int, stages: Path):
        super().__init__(total, f"in {workers} workers", unit="task", show=False)
        self.stages = stages

    def snapshot(self) -> Stage:
        now = []
        for path in sorted(self.stages.glob("*.json")):
            try:
                record = json.loads(path.read_text(encoding="utf-8"))
                stage = Stage(**record) if isinstance(record, dict) else None
            except (OSError, UnicodeDecodeError, ValueError, TypeError):  # a worker between two writes
                continue
            if stage is not None:
                now.append(f"{stage.label} {stage.counted()}")
        self.postfix = ("now " + ", ".join(now)) if now else ""
        return super().snapshot()


def _in_workers(
    tasks: list[Task], workers: int, then: dict[int, FollowUp], threads: int, counted: Bar, stages: Path
) -> list[Any]:
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_start_worker,
        initargs=(threads, str(stages)),
    )
    own: list[Any] = [None] * len(tasks)
    follow: dict[int, list[Any]] = {}
    where: dict[Future, tuple[int, int]] = {}  # future → (parent index, -1 for an own task or its place)
    try:
        with _main_not_rerun():
            for i, task in enumerate(tasks):
                where[pool.submit(*task)] = (i, -1)
        pending = set(where)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                i, place = where[future]
                result = future.result()  # a task's error is raised here, as itself
                counted.update()
                if place >= 0:
                    follow[i][place] = result
                    continue
                own[i] = result
                if i in then:
                    more = list(then[i](result))
                    _check(workers, more)
                    follow[i] = [None] * len(more)
                    counted.total += len(more)
                    for j, task in enumerate(more):
                        with _main_not_rerun():
                            submitted = pool.submit(*task)
                        where[submitted] = (i, j)
                        pending.add(submitted)
    except BaseException:
        _stop(pool)
        raise
    pool.shutdown()
    return own + [result for i in sorted(follow) for result in follow[i]]


@contextmanager
def _main_not_rerun() -> Iterator[None]:
    """While workers start: a spawned interpreter re-runs the caller's __main__ (to find functions defined
    there) unless it has no file or module name. Tasks are functions of importable modules, so a worker needs
    none of it — and a script without an `if __name__ == "__main__":` guard would start its whole run again
    in every worker."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = {key: main.__dict__[key] for key in ("__spec__", "__file__") if key in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def _stop(pool: ProcessPoolExecutor, wait_s: float = 10.0) -> None:
    """Cancel what has not started and end what has, at once: the results of a failed or interrupted sweep are
    discarded, so each worker gets SIGKILL (on SIGTERM a training in a worker would finish its step, and then
    take the next task queued for it), and this returns once they have ended (or after `wait_s`)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    sentinels = []
    for process in processes:
        try:
            sentinels.append(process.sentinel)
            process.kill()
        except (ValueError, OSError):  # already ended and closed
            pass
    deadline = time.monotonic() + wait_s
    while sentinels and time.monotonic() < deadline:
        ended = wait_for(sentinels, timeout=max(0.0, deadline - time.monotonic()))
        sentinels = [s for s in sentinels if s not in ended]


def _start_worker(threads: int, stages: str) -> None:
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to act on: it ends the workers
    import torch

    torch.set_num_threads(threads)
    threading.Thread(
        target=_tell_stage, args=(Path(stages) / f"{os.getpid()}.json",), daemon=True, name="stage of this worker"
    ).start()


def _tell_stage(path: Path) -> None:
    """Every RECORD_EVERY_S, this worker's innermost bar (null between bars) into `path`, for the caller's bar."""
    while True:
        stage = current_stage()
        try:
            atomic_write_text(path, json.dumps(stage.__dict__ if stage is not None else None))
        except OSError:  # the caller has finished and removed the folder: nothing left to tell
            return
        threading.Event().wait(RECORD_EVERY_S)
