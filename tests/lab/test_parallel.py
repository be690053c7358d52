"""lab.parallel: independent tasks in worker processes give exactly what they give in this process."""

import os
import threading
import time

import pytest
import torch

from lab.parallel import run_tasks
from lab.progress import Progress, bar, current_stage


def train_tiny(seed: int) -> dict:
    """A few seeded optimizer steps: the result depends only on the seed, to the bit."""
    torch.manual_seed(seed)
    layer = torch.nn.Linear(8, 4)
    opt = torch.optim.Adam(layer.parameters(), lr=1e-2)
    x = torch.randn(64, 8)
    for _ in range(5):
        loss = layer(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {
        "seed": seed,
        "weight": layer.weight.detach().clone(),
        "threads": torch.get_num_threads(),
        "pid": os.getpid(),
    }


def fail_on_two(seed: int) -> int:
    if seed == 2:
        raise ValueError("task 2 refused its input")
    return seed


def count_slowly(steps: int) -> int:
    """A task whose own bar (shown nowhere, as an experiment's inner trainings are) counts for a few seconds."""
    with bar(steps, "slow", show=False) as counting:
        for _ in range(steps):
            time.sleep(0.1)
            counting.update()
    return steps


def then_double(result: dict) -> list:
    return [(train_tiny, result["seed"] + 10)]


def test_workers_give_the_same_results_in_task_order_as_this_process():
    """Own tasks in order, then the follow-ups of task 0 (which start from its result), bit for bit."""
    tasks = [(train_tiny, seed) for seed in range(4)]
    here = run_tasks(tasks, workers=1, then={0: then_double})
    there = run_tasks(tasks, workers=2, then={0: then_double})
    assert [r["seed"] for r in here] == [r["seed"] for r in there] == [0, 1, 2, 3, 10]
    assert all(torch.equal(a["weight"], b["weight"]) for a, b in zip(here, there))
    assert {r["pid"] for r in here} == {os.getpid()}
    assert os.getpid() not in {r["pid"] for r in there}
    assert {r["threads"] for r in there} == {1}  # each worker runs one intra-op thread


def test_a_task_defined_in_main_is_refused_before_any_worker_starts():
    import __main__

    def local(x):
        return x

    local.__module__ = __main__.__name__
    with pytest.raises(ValueError, match="importable module"):
        run_tasks([(local, 1), (local, 2)], workers=2)


def test_a_failing_task_raises_its_own_error():
    for workers in (1, 2):
        with pytest.raises(ValueError, match="task 2 refused its input"):
            run_tasks([(fail_on_two, s) for s in range(4)], workers=workers)


def test_bad_worker_counts_are_refused():
    with pytest.raises(ValueError, match="workers must be a positive integer"):
        run_tasks([(fail_on_two, 0)], workers=0)


def test_the_callers_progress_counts_the_tasks_and_says_where_each_workers_own_bar_stands():
    """A job's progress file reads the caller's current stage: with workers, the tasks done out of all, and the
    workers' innermost bars (`now slow step k/N`), which live in other processes."""
    seen, done = [], threading.Event()

    def watch():
        while not done.is_set():
            stage = current_stage()
            if stage is not None:
                seen.append(stage)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        assert run_tasks([(count_slowly, 60), (count_slowly, 60), (count_slowly, 5)], workers=2) == [60, 60, 5]
    finally:
        done.set()
        watcher.join()
    assert {(s.label, s.unit, s.total) for s in seen} == {("in 2 workers", "task", 3)}
    assert [s.step for s in seen] == sorted(s.step for s in seen) and seen[-1].step in (2, 3)
    inner = [s for s in seen if "slow step" in s.postfix]
    assert inner, f"no worker's stage reached the caller: {seen[-3:]}"
    # whichever task a worker runs last (the 60-step ones or the 5-step one) is the last bar seen
    assert all(s.postfix.startswith("now slow step ") for s in inner) and any("/60 (" in s.postfix for s in inner)
    line = Progress("forma run kl", "running", os.getpid(), "2026-01-01T00:00:00Z", 3.0, time.time(), inner[-1]).line()
    assert "; in 2 workers task " in line and " · now slow step " in line
    assert current_stage() is None  # the tasks' bar closed with run_tasks


def test_in_this_process_the_tasks_bar_gives_way_to_each_tasks_own_bar():
    seen = []

    def watch_then_count(steps):
        seen.append(current_stage())
        return steps

    assert run_tasks([(watch_then_count, 1), (watch_then_count, 2)], workers=1) == [1, 2]
    assert [(s.label, s.step, s.total) for s in seen] == [("tasks", 0, 2), ("tasks", 1, 2)]
