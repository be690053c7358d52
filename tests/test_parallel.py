"""lab.parallel: independent tasks in worker processes give exactly what they give in this process."""

import os

import pytest
import torch

from lab.parallel import run_tasks


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
    return {"seed": seed, "weight": layer.weight.detach().clone(), "threads": torch.get_num_threads(),
            "pid": os.getpid()}


def fail_on_two(seed: int) -> int:
    if seed == 2:
        raise ValueError("task 2 refused its input")
    return seed


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
