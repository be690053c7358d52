"""Independent pieces of an experiment in worker processes: the trainings of a sweep share no state, so two
cores finish them in about half the time.

A task is `(function, *arguments)`: a module-level function (a worker imports it by name) whose arguments
and result pickle. Each worker is a fresh interpreter (spawn: no copy of the caller's threads or locks) that
runs torch on `threads` intra-op threads, so a task computes exactly what it computes in this process at that
thread count: results never depend on `workers`, only the wall time does. `then` chains follow-up tasks on
a task's result (the upweighting runs start from one γ's optimum) without waiting for the other tasks.

A worker dies with its parent (Linux: PR_SET_PDEATHSIG), so a killed run leaves nothing computing.
"""

import ctypes
import multiprocessing
import signal
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

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
            raise ValueError(f"a task's function must live in an importable module for a worker to find it, "
                             f"not in __main__: {task[0]!r}")


def run_tasks(tasks: Sequence[Task], workers: int = 1, then: Mapping[int, FollowUp] | None = None,
              threads: int = 1) -> list[Any]:
    """Run every task and return their results in order: `tasks`' own, then the follow-ups of `then[i]`
    (called with task i's result, returning more tasks) in order of i. workers = 1 runs them here, one after
    another; more runs them in that many worker processes. The first task to fail raises its own error
    here, and the tasks still running are stopped."""
    _check(workers, tasks)
    then = dict(then or {})
    if workers == 1:
        results = [task[0](*task[1:]) for task in tasks]
        for i in sorted(then):
            results += [task[0](*task[1:]) for task in then[i](results[i])]
        return results
    return _in_workers(list(tasks), workers, then, threads)


def _in_workers(tasks: list[Task], workers: int, then: dict[int, FollowUp], threads: int) -> list[Any]:
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_start_worker, initargs=(threads,))
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
                if place >= 0:
                    follow[i][place] = result
                    continue
                own[i] = result
                if i in then:
                    more = list(then[i](result))
                    _check(workers, more)
                    follow[i] = [None] * len(more)
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


def _stop(pool: ProcessPoolExecutor) -> None:
    """Cancel what has not started and end what has: a failed sweep should not keep two cores busy."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()


def _start_worker(threads: int) -> None:
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    import torch

    torch.set_num_threads(threads)
