"""The `forma` command line under bad arguments and signals: a one-line error for a bad value, and no child
process (the Streamlit server, a demo job) outliving `forma`, however it ends."""

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.cli.dashboard import free_port, wait_until_serving
from lab.cli.parser import MAX_SEED, main
from tests.builders import REPO, hf_model, signals_as_sent


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


@pytest.mark.parametrize(
    "argv", [["hooks", ""], ["hooks", "  "], ["trust", ""], ["run", "calibration", "--quick", "--model", ""]]
)
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
@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL], ids=lambda s: signal.Signals(s).name
)
def test_the_dashboard_server_ends_with_forma_dashboard(tmp_path, signum):
    port = free_port()
    parent = subprocess.Popen(
        [sys.executable, "-m", "lab.cli", "dashboard", "--port", str(port)],
        env=env(),
        cwd=REPO,
        preexec_fn=signals_as_sent(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
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
from lab.cli.demo import run_side_by_side
run_side_by_side([("forma run equations --quick", ["run", "equations", "--quick", "--out", sys.argv[1]])])
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=lambda s: signal.Signals(s).name)
def test_demo_jobs_end_with_forma_demo(tmp_path, signum):
    parent = subprocess.Popen(
        [sys.executable, "-c", DEMO_JOBS, str(tmp_path / "run")],
        env=env() | {"FORMA_RUNS_DIR": str(tmp_path / "runs")},
        cwd=REPO,
        preexec_fn=signals_as_sent(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
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


# --------------------------------------------------------------------------------------------
# A signal ends `forma run` at once: one line, exit 128 + the signal, nothing left behind
# --------------------------------------------------------------------------------------------
def descendants(pid: int) -> set[int]:
    """Every process below `pid` (children, their children, …)."""
    found, todo = set(), [pid]
    while todo:
        try:
            below = children(todo.pop())
        except OSError:  # ended meanwhile
            continue
        todo += list(below - found)
        found |= below
    return found


def forma_lines(err: str, command: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith(f"forma {command}:")]


def test_a_signal_is_raised_once_and_one_started_ignored_stays_ignored():
    """interrupting_signals: SIGTERM raises Interrupted where the code is; a second signal while the clean-up runs
    is ignored; SIGHUP ignored on entry (nohup) stays ignored; the handlers before it come back after."""
    from lab.cli.stopping import Interrupted, interrupting_signals

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    cleaned = False
    try:
        with pytest.raises(Interrupted) as stop:
            with interrupting_signals():
                assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
                try:
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(5)  # the handler raises before this ends
                finally:
                    os.kill(os.getpid(), signal.SIGINT)  # while cleaning up: ignored
                    time.sleep(0.1)
                    cleaned = True
        assert stop.value.signum == signal.SIGTERM and str(stop.value) == "interrupted by SIGTERM" and cleaned
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) is before[signal.SIGINT]
        assert signal.getsignal(signal.SIGTERM) is before[signal.SIGTERM]
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=lambda s: signal.Signals(s).name)
def test_a_signal_ends_forma_run_and_its_workers_at_once_leaving_nothing(tmp_path, signum):
    """`forma run kl --quick --workers 2` signalled while both workers train (the parent alone, as `kill` or a
    service manager sends it): the workers and the parent end within seconds, the parent says so in one line
    and exits 128 + the signal, and the temporary folders (the workers' `forma-workers-*`) are gone."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    parent = subprocess.Popen(
        [sys.executable, "-m", "lab.cli", "run", "kl", "--quick", "--workers", "2", "--out", str(tmp_path / "run")],
        cwd=REPO,
        preexec_fn=signals_as_sent(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env() | {"TMPDIR": str(tmp)},
    )
    family: set[int] = set()
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # each worker writes its stage there; null until its task has begun
            stages = [p.read_text() for p in tmp.glob("forma-workers-*/*.json")]
            if len(stages) == 2 and "train" in "".join(stages):
                break
            assert parent.poll() is None, parent.communicate()
            time.sleep(0.2)
        family = descendants(parent.pid)
        assert len(family) >= 2, "the workers did not start"
        parent.send_signal(signum)
        _, err = parent.communicate(timeout=30)  # the fault this holds: a hang of minutes with a worker alive
        assert wait_until_ended(family, 10) == set()
        assert parent.returncode == 128 + signum, err[-3000:]
        assert "Traceback" not in err
        assert forma_lines(err, "run") == [f"forma run: interrupted by {signal.Signals(signum).name}"], err[-3000:]
        assert [p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_")] == []  # torch's own cache
        assert not (tmp_path / "run" / "results.json").exists()
    finally:
        for pid in family | (descendants(parent.pid) if parent.poll() is None else set()):
            if not ended(pid):
                os.kill(pid, signal.SIGKILL)
        parent.kill()
        parent.wait()


@pytest.mark.slow
def test_ctrl_c_of_forma_run_with_a_model_is_one_line_and_exit_130(tmp_path):
    """`forma run calibration --model DIR --mmlu CSV` interrupted while it works: one line, exit 130."""
    from tests.builders import letter_tokenizer

    model = tmp_path / "gpt2"
    hf_model("gpt2").save_pretrained(model)
    letter_tokenizer(model)
    csv_path = tmp_path / "mmlu.csv"
    rows = [f"w{i} w{i + 1} w{i + 2},w{i + 3},w{i + 4},w{i + 5},w{i + 6},{'ABCD'[i % 4]}" for i in range(40)]
    csv_path.write_text("question,A,B,C,D,answer\n" + "\n".join(rows) + "\n")
    out = tmp_path / "run"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lab.cli",
            "run",
            "calibration",
            "--quick",
            "--model",
            str(model),
            "--mmlu",
            str(csv_path),
            "--out",
            str(out),
        ],
        cwd=REPO,
        preexec_fn=signals_as_sent(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env(),
    )
    try:
        deadline = time.monotonic() + 300
        while not (out / ".progress.json").exists() and time.monotonic() < deadline:  # the experiment has begun
            assert parent.poll() is None, parent.communicate()
            time.sleep(0.05)
        parent.send_signal(signal.SIGINT)
        _, err = parent.communicate(timeout=60)
        assert parent.returncode == 130 and "Traceback" not in err, err[-3000:]
        assert forma_lines(err, "run") == ["forma run: interrupted by SIGINT"], err[-3000:]
        assert not (out / "results.json").exists()
    finally:
        parent.kill()
        parent.wait()


SIGNAL_TESTS = [
    "test_a_signal_ends_forma_run_and_its_workers_at_once_leaving_nothing[SIGINT]",
    "test_ctrl_c_of_forma_run_with_a_model_is_one_line_and_exit_130",
    "test_the_dashboard_server_ends_with_forma_dashboard[SIGINT]",
]


def ignoring_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_signal_tests_pass_in_a_suite_started_with_sigint_ignored(tmp_path):
    """`make test &` (or any runner that starts the suite ignoring SIGINT) passes SIG_IGN on to every process the
    suite starts: the tests that send SIGINT give their child the default themselves (signals_as_sent)."""
    probe = [sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)"]
    seen = subprocess.run(probe, preexec_fn=ignoring_sigint, capture_output=True, text=True, check=True).stdout
    assert seen.strip() == "True"  # the premise: a suite started so ignores SIGINT
    here = Path(__file__).relative_to(REPO).as_posix()
    suite = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *(f"{here}::{t}" for t in SIGNAL_TESTS)],
        cwd=REPO,
        env={k: v for k, v in env().items() if not k.startswith("PYTEST_")} | {"TMPDIR": str(tmp_path)},
        preexec_fn=ignoring_sigint,
        capture_output=True,
        text=True,
    )
    assert suite.returncode == 0, suite.stdout[-4000:]
    assert f"{len(SIGNAL_TESTS)} passed" in suite.stdout, suite.stdout[-4000:]


# An empty folder on a read-only mount, and a folder on a full disk, as `--out`: real mounts in a private mount
# namespace (`unshare --user --map-root-user --mount`: no root needed where user namespaces are allowed);
# where they are not, the same error injected where the run's first file is created (tempfile.mkstemp, mkdtemp).
UNWRITABLE = {
    "read-only": ('mount -t tmpfs -o ro,size=1m tmpfs "$1"', ".", "EROFS"),
    "full": (
        'mount -t tmpfs -o size=64k tmpfs "$1" && { head -c 1048576 /dev/zero > "$1/filler" 2>/dev/null || :; }',
        "run",
        "ENOSPC",
    ),
}
INJECTED = """
import errno, os, runpy, sys, tempfile
folder, code = sys.argv.pop(1), sys.argv.pop(1)
def failing(real):
    def make(*args, dir=None, **kwargs):
        if dir is not None and str(dir).startswith(folder):
            raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)), str(dir))
        return real(*args, dir=dir, **kwargs)
    return make
tempfile.mkstemp, tempfile.mkdtemp = failing(tempfile.mkstemp), failing(tempfile.mkdtemp)
runpy.run_module("lab.cli", run_name="__main__")
"""


def private_mounts() -> bool:
    import shutil

    return (
        shutil.which("unshare") is not None
        and subprocess.run(
            ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", "mount -t tmpfs tmpfs /mnt"],
            capture_output=True,
        ).returncode
        == 0
    )


@pytest.mark.parametrize("fault", UNWRITABLE)
def test_an_out_folder_that_cannot_be_written_is_one_line_and_exit_2(tmp_path, fault):
    mount, below, code = UNWRITABLE[fault]
    folder = tmp_path / "mounted"
    folder.mkdir()
    out = folder / below
    forma = [sys.executable, "-m", "lab.cli", "run", "equations", "--quick", "--out", str(out)]
    listing = tmp_path / "left"
    if private_mounts():  # the run, then what it left in the mount, listed from inside the namespace
        script = (
            f'{mount} && dir="$1" && shift && {{ "$@"; code=$?; cd "$dir" && find . -mindepth 1 | sort > '
            f'"{listing}"; exit $code; }}'
        )
        argv = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh", str(folder)] + forma
    else:
        argv = [sys.executable, "-c", INJECTED, str(folder), code] + forma[1:]
    done = subprocess.run(argv, cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    (line,) = forma_lines(done.stderr, "run")
    assert line.startswith("forma run: error:") and os.strerror(getattr(errno, code)) in line and str(folder) in line
    if listing.exists():  # no file was left, whole or cut short: only the filler and the empty run folder
        assert listing.read_text().split() == {"read-only": [], "full": ["./filler", "./run"]}[fault]


@pytest.mark.parametrize(
    "argv, wrong, near",
    [
        (["run", "equations", "--quik"], "--quik", "--quick"),
        (["run", "kl", "--quick", "--wrokers", "2"], "--wrokers 2", "--workers"),
        (["build", "markov", "--reusme"], "--reusme", "--resume"),
    ],
)
def test_a_mistyped_option_is_an_error_of_its_command_naming_the_nearest(capsys, argv, wrong, near):
    with pytest.raises(SystemExit) as exit:
        main(argv)
    err = capsys.readouterr().err
    assert exit.value.code == 2 and f"usage: forma {argv[0]} " in err, err
    assert f"forma {argv[0]}: error: unrecognized arguments: {wrong} (did you mean {near}?)" in err, err


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_make_demo_stopped_by_sigterm_stops_forma_demo_and_the_dashboard(tmp_path):
    """SIGTERM to `make demo`'s own pid (make passes it on to its child, the recipe's command): `forma demo`, the
    dashboard and the demo's job all end, and the port is free again. (-o: make does not rebuild .venv first.)"""
    import shutil
    import socket

    if shutil.which("make") is None:
        pytest.fail("make is needed: `make demo` is the documented way to start the demo")
    port = free_port()
    make = subprocess.Popen(
        ["make", "-s", "-o", ".venv/.installed", "demo", f"DEMO_ARGS=--only equations --port {port}"],
        cwd=REPO,
        preexec_fn=signals_as_sent(),
        env=env() | {"FORMA_RUNS_DIR": str(tmp_path / "runs"), "FORMA_ZOO_DIR": str(tmp_path / "zoo")},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    family: set[int] = set()
    try:
        wait_until_serving(f"http://127.0.0.1:{port}", make, 180)
        family = descendants(make.pid)
        assert len(family) >= 2  # forma demo and the dashboard (and the demo's job)
        make.send_signal(signal.SIGTERM)
        assert wait_until_ended(family, 30) == set()
        make.wait(30)
        with pytest.raises(ConnectionRefusedError):  # nothing serves there any more
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        for pid in family | (descendants(make.pid) if make.poll() is None else set()):
            if not ended(pid):
                os.kill(pid, signal.SIGKILL)
        make.kill()
        make.wait()
