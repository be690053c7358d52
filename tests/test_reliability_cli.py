"""The `forma` command line under bad arguments and signals: a one-line error for a bad value, and no child
process (the Streamlit server, a demo job) outliving `forma`, however it ends."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.cli import MAX_SEED, free_port, main, wait_until_serving

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("seed", [str(2**70), str(2**63), "-1", "seven"])
def test_a_seed_outside_what_the_generators_take_is_an_argument_error(capsys, seed):
    with pytest.raises(SystemExit) as exit:
        main(["run", "equations", "--quick", "--seed", seed, "--out", "/nonexistent/never-made"])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and "--seed" in err and "Traceback" not in err and "Overflow" not in err
    assert "0 … 2**63 − 1" in err or "not an integer" in err


@pytest.mark.parametrize("workers", ["0", "-2", "two"])
def test_a_worker_count_below_one_is_an_argument_error(capsys, workers):
    with pytest.raises(SystemExit) as exit:
        main(["run", "kl", "--quick", "--workers", workers, "--out", "/nonexistent/never-made"])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and "--workers" in err and "Traceback" not in err
    assert "workers must be ≥ 1" in err or "not an integer" in err


def test_workers_for_an_experiment_without_independent_trainings_is_refused(capsys, tmp_path):
    assert main(["run", "equations", "--quick", "--workers", "2", "--out", str(tmp_path / "never")]) == 2
    assert "experiment 'equations' takes no --workers" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_the_largest_seed_is_one_every_generator_takes():
    """MAX_SEED plus the offsets experiments add stays inside torch.manual_seed's range (< 2**64) and numpy's."""
    import numpy as np
    import torch

    for offset in (0, 1, 17, 2000, 12345):
        torch.Generator().manual_seed(MAX_SEED + offset)
        np.random.default_rng([MAX_SEED + offset, 5])
    with pytest.raises((ValueError, RuntimeError)):
        torch.Generator().manual_seed(2**64)


@pytest.mark.parametrize("argv", [["hooks", ""], ["hooks", "  "], ["trust", ""], ["run", "calibration", "--quick", "--model", ""]])
def test_an_empty_model_name_says_so(capsys, argv):
    with pytest.raises(SystemExit) as exit:
        main(argv)
    err = capsys.readouterr().err
    assert exit.value.code == 2 and "the model name is empty" in err and "config.json" not in err


def test_an_empty_model_name_is_refused_by_the_loader_too():
    from lab import HookedTransformer

    with pytest.raises(ValueError, match="the model name is empty"):
        HookedTransformer.from_pretrained("")


# --------------------------------------------------------------------------------------------
# Children end with their parent
# --------------------------------------------------------------------------------------------
def children(pid: int) -> set[int]:
    """The child processes of `pid`, over all its threads (a thread that forks is the child's parent)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found |= {int(c) for c in (task / "children").read_text().split()}
        except OSError:
            pass
    return found


def ended(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
    except OSError:
        return True
    return state in "ZX"  # a zombie has ended; only its parent's wait() is missing


def wait_until_ended(pids: set[int], timeout_s: float) -> set[int]:
    """The pids still running after up to `timeout_s` (polls; returns as soon as all have ended)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not all(ended(p) for p in pids):
        time.sleep(0.1)
    return {p for p in pids if not ended(p)}


def env() -> dict[str, str]:
    return os.environ | {"PYTHONPATH": str(REPO)}


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL],
                         ids=lambda s: signal.Signals(s).name)
def test_the_dashboard_server_ends_with_forma_dashboard(tmp_path, signum):
    port = free_port()
    parent = subprocess.Popen([sys.executable, "-m", "lab.cli", "dashboard", "--port", str(port)], env=env(),
                              cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_serving(f"http://127.0.0.1:{port}", parent, 180)
        server = children(parent.pid)
        assert server
        parent.send_signal(signum)
        assert wait_until_ended(server, 30) == set()
        assert parent.wait(30) == (0 if signum != signal.SIGKILL else -signal.SIGKILL)
    finally:
        for pid in children(parent.pid) if parent.poll() is None else ():
            os.kill(pid, signal.SIGKILL)
        parent.kill()
        parent.wait()


DEMO_JOBS = """
import sys
from lab.cli import run_side_by_side
run_side_by_side([("forma run equations --quick", ["run", "equations", "--quick", "--out", sys.argv[1]])])
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=lambda s: signal.Signals(s).name)
def test_demo_jobs_end_with_forma_demo(tmp_path, signum):
    parent = subprocess.Popen([sys.executable, "-c", DEMO_JOBS, str(tmp_path / "run")],
                              env=env() | {"FORMA_RUNS_DIR": str(tmp_path / "runs")}, cwd=REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not children(parent.pid) and time.monotonic() < deadline:
            assert parent.poll() is None
            time.sleep(0.05)
        jobs = children(parent.pid)
        assert jobs
        parent.send_signal(signum)
        assert wait_until_ended(jobs, 30) == set()
        assert not (tmp_path / "run" / "results.json").exists()
    finally:
        for pid in children(parent.pid) if parent.poll() is None else ():
            os.kill(pid, signal.SIGKILL)
        parent.kill()
        parent.wait()
