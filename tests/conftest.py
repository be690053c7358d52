"""Shared fixtures: tiny models and tokenizers built from configs — nothing is fetched from a hub."""

import csv
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import pytest
import torch

from lab import HookedTransformer
from lab.configs import torch_threads
from lab.folders import DEFAULT_ZOO_DIR, zoo_names
from tests.builders import (
    DOCS,
    REPO,
    TESTS,
    USER_THREADS,
    VOCAB,
    HFCase,
    blocks,
    hf_cases,
    hf_model,
    letter_tokenizer,
    quick_argv,
    rerun_argv,
    run_bash,
    tiny_config,
    word_tokenizer,
)

SAME_SEED = "test_the_same_seed_gives_the_same_results"
BACKGROUND = pytest.StashKey["Background"]()


class Background:
    """`forma run NAME --quick` for every experiment, then each same-seed rerun, in subprocesses one after
    another on a thread: the whole suite's quick runs compute on the second core while the tests that need
    none of them run on the first (those that do are moved last, pytest_collection_modifyitems). A job a
    test waits for goes to the front of the queue; a job that fails fails the tests that wait for it, with
    its log."""

    def __init__(self, root: Path, names: list[str], reruns: list[str]):
        self.root, self.runs_dir = root, root / "runs"
        env = os.environ | {"PYTHONPATH": str(REPO), "FORMA_RUNS_DIR": str(self.runs_dir)}
        self.env = {k: v for k, v in env.items() if not k.startswith("PYTEST_")}
        self.queue = [("quick", n) for n in names] + [("again", n) for n in reruns]
        self.done: dict[tuple[str, str], tuple[int, Path]] = {}
        self.closed, self.current = False, None
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._work, name="forma-quick-runs", daemon=True)
        self.thread.start()

    def rerun_dir(self, name: str) -> Path:
        return self.root / "again" / name

    def argv(self, kind: str, name: str) -> list[str]:
        return quick_argv(name) if kind == "quick" else rerun_argv(name, self.rerun_dir(name))

    def _work(self) -> None:
        while True:
            with self.changed:
                if self.closed or not self.queue:
                    return
                job = self.queue.pop(0)
            log = self.root / f"{job[0]}-{job[1]}.log"
            with log.open("w") as out:
                self.current = subprocess.Popen(
                    self.argv(*job), cwd=REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT
                )
                code = self.current.wait()
            with self.changed:
                self.done[job] = (code, log)
                self.changed.notify_all()

    def wait(self, kind: str, name: str) -> None:
        job = (kind, name)
        with self.changed:
            if job in self.queue:  # wanted now: next in line
                self.queue.remove(job)
                self.queue.insert(0, job)
            elif job not in self.done and not self.thread.is_alive():
                raise RuntimeError(f"no background job {job}")
            while job not in self.done:
                self.changed.wait()
        code, log = self.done[job]
        assert code == 0, f"`{' '.join(self.argv(*job)[1:])}` exited with {code}:\n{log.read_text()[-3000:]}"

    def close(self) -> None:
        with self.changed:
            self.closed = True
        if self.current is not None and self.current.poll() is None:
            self.current.kill()
        self.thread.join(timeout=30)
        shutil.rmtree(self.root, ignore_errors=True)


# What `make test-fast` leaves out (docs/testing.md): tests that read an experiment's quick run or its rerun
# (subprocesses of the background queue below), fork `forma` commands (the fault trials' fork server), start
# torchrun, and the files whose tests start processes of their own (the CLI end to end, the offline guard, the
# docs' examples, benchmarks, process pools, distributed training, the dashboard's pages), by path under tests/.
PROCESS_FIXTURES = {"quick_run", "quick_rerun", "fault_zygote", "torchrun_demo"}
PROCESS_MODULES = {
    "benchmarks/test_benchmarks.py",
    "benchmarks/test_benchmarks_distributed.py",
    "browser/test_browser.py",
    "dashboards/test_dashboard.py",
    "dashboards/test_dashboard_graphs.py",
    "faults/test_offline.py",
    "faults/test_reliability_cli.py",
    "faults/test_reliability_dashboard.py",
    "faults/test_reliability_runs.py",
    "faults/test_resume_faults.py",
    "lab/analysis/test_transcoders_distributed.py",
    "lab/cli/test_cli_datasets.py",
    "lab/test_distributed.py",
    "lab/test_parallel.py",
    "test_docs.py",
}


def pytest_itemcollected(item):
    """Mark `processes` (see PROCESS_FIXTURES): made at collection, so that `-m "not processes"` can select."""
    if PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())) or (
        item.path.relative_to(TESTS).as_posix() in PROCESS_MODULES
    ):
        item.add_marker(pytest.mark.processes)


@pytest.hookimpl(trylast=True)  # after -k / -m have deselected
def pytest_collection_modifyitems(session, config, items):
    """With the same-seed tests selected (the whole suite, or their file), start the quick runs and reruns in
    the background and move every test that reads a quick run after those that do not, module by module
    (a module's fixtures are made once)."""
    reruns = [
        item.callspec.params["name"] for item in items if item.originalname == SAME_SEED and hasattr(item, "callspec")
    ]
    if not reruns or config.option.collectonly:
        return
    import tempfile

    import experiments

    readers = [item for item in items if "quick_run" in item.fixturenames]
    # Every experiment's quick run when other tests read them too; else only those the reruns compare with.
    names = reruns if all(item.originalname == SAME_SEED for item in readers) else experiments.experiment_names()
    late_modules = {item.module.__name__ for item in readers}
    items[:] = [item for item in items if item.module.__name__ not in late_modules] + [
        item for item in items if item.module.__name__ in late_modules
    ]
    root = Path(tempfile.mkdtemp(prefix="forma-quick-runs-"))
    config.stash[BACKGROUND] = Background(root, names, reruns)


def pytest_unconfigure(config):
    background = config.stash.get(BACKGROUND, None)
    if background is not None:
        background.close()


@pytest.fixture(scope="session")
def quick_runs_dir(request, tmp_path_factory) -> Path:
    """A private runs/ folder for the session's quick runs (what `FORMA_RUNS_DIR` points the dashboard at)."""
    background = request.config.stash.get(BACKGROUND, None)
    return background.runs_dir if background is not None else tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="session")
def quick_run(request, quick_runs_dir):
    """quick_run(NAME) -> the folder of `forma run NAME --quick`, made once per session in quick_runs_dir
    (runs/NAME/<stamp>/ and runs/NAME/latest): the experiment's tests and the dashboard's read the same run.
    In the background (a subprocess, class Background) when the session has one, else here."""
    from lab.cli.parser import main
    from lab.runs import latest_run

    background = request.config.stash.get(BACKGROUND, None)
    folders: dict[str, Path] = {}

    def run(name: str) -> Path:
        if name not in folders:
            if background is not None:
                background.wait("quick", name)
                folders[name] = latest_run(name, quick_runs_dir)
                return folders[name]
            before = os.environ.get("FORMA_RUNS_DIR")
            os.environ["FORMA_RUNS_DIR"] = str(quick_runs_dir)
            try:
                assert main(["run", name, "--quick"]) == 0
            finally:
                if before is None:
                    del os.environ["FORMA_RUNS_DIR"]
                else:
                    os.environ["FORMA_RUNS_DIR"] = before
            folders[name] = latest_run(name, quick_runs_dir)
        return folders[name]

    return run


@pytest.fixture(scope="session")
def quick_rerun(request):
    """quick_rerun(NAME, out) -> `out`, holding a second `forma run NAME --quick` made in a fresh process (on
    one worker where the experiment has several): from the background queue when the session has one."""
    background = request.config.stash.get(BACKGROUND, None)

    def rerun(name: str, out: Path) -> Path:
        if background is not None:
            background.wait("again", name)
            return background.rerun_dir(name)
        env = os.environ | {"PYTHONPATH": str(REPO), "FORMA_RUNS_DIR": str(out.parent / "runs")}
        subprocess.run(rerun_argv(name, out), env=env, check=True, cwd=REPO, capture_output=True)
        return out

    return rerun


@pytest.fixture(scope="session")
def fault_zygote():
    """The fork server of the fault trials (tests/fault_zygote.py): Forma imported once for the session, each
    `forma` command a fork of it."""
    from tests.fault_zygote import Zygote

    server = Zygote()
    yield server
    server.close()


@pytest.fixture(scope="session")
def torchrun_demo(tmp_path_factory):
    """(folder, code, done): docs/torchrun.md's block that runs two ranks under torchrun, run once for the session
    in `folder` (it writes runs/ddp-demo/ there). The page's example (tests/test_docs.py) and the check that two
    ranks match one process (tests/lab/train/test_train.py) read the same launch: each launch costs seconds of
    start-up."""
    (code,) = [code for language, code, _ in blocks(DOCS / "torchrun.md") if language == "bash" and "torchrun" in code]
    folder = tmp_path_factory.mktemp("torchrun-demo")
    return folder, code, run_bash(code, folder)


@pytest.fixture(scope="session")
def stdlib_corpus(tmp_path_factory) -> Path:
    """The pydoc world's corpus.txt (lab.data.stdlib_corpus.stdlib_docstrings: the docstrings of this Python's standard
    library, seconds to parse), collected once a session. A private zoo that builds pydoc gets a copy as
    pydoc/corpus.txt, the cache its first build would have written with the same text."""
    from lab.data.stdlib_corpus import stdlib_docstrings

    path = tmp_path_factory.mktemp("stdlib-corpus") / "corpus.txt"
    stdlib_docstrings(cache=path)
    return path


@pytest.fixture
def empty(tmp_path, monkeypatch):
    """No runs and no trained model: a fresh clone (the dashboard's tests)."""
    (tmp_path / "runs").mkdir()
    zoo_copy = tmp_path / "models"
    for name in zoo_names():
        (zoo_copy / name).mkdir(parents=True)
        shutil.copy(DEFAULT_ZOO_DIR / name / "model.toml", zoo_copy / name / "model.toml")
    monkeypatch.setenv("FORMA_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("FORMA_ZOO_DIR", str(zoo_copy))
    return tmp_path


@pytest.fixture
def one_thread():
    """Tiny models and tensors: on a busy shared machine a second intra-op thread only adds hand-offs (measured
    up to ~10× slower), so the test runs on one and the caller's setting comes back after. A file opts in with
    `pytestmark = pytest.mark.usefixtures("one_thread")`, a single test by naming it."""
    with torch_threads(1):
        yield


@pytest.fixture
def user_threads():
    """The thread count a user gets (USER_THREADS), also in a module that pins one_thread: for the tests of what
    must hold at whatever thread count a process runs (same seed, same bits; resuming to the bit)."""
    with torch_threads(USER_THREADS):
        yield


@pytest.fixture(scope="module")
def one_thread_per_module():
    """one_thread for a whole module, so that it holds while the module's own module-scoped fixtures train."""
    with torch_threads(1):
        yield


@pytest.fixture(autouse=True)
def torch_backward_as_torch_has_it():
    """Importing nnsight replaces torch.Tensor.backward for the whole process (with one that parses the caller's
    source, for `with loss.backward():`); every test gets back the backward it started with, so that no test
    depends on which ran before it."""
    backward = torch.Tensor.backward
    yield
    torch.Tensor.backward = backward


PYTHONS_MAIN = sys.modules["__main__"]  # the process's own, before any page ran as `__main__`


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Streamlit's AppTest runs a page as `__main__` and leaves it there — in a test, or in a module-scoped
    fixture, which no test's teardown follows; a process started with the spawn method afterwards would run that
    page first (multiprocessing re-imports `__main__` in the child). Every test, and every fixture set up for it,
    starts with the process's own `__main__`."""
    sys.modules["__main__"] = PYTHONS_MAIN


@pytest.fixture(autouse=True)
def main_module_as_python_has_it():
    """After each test, the process's own `__main__` again (see pytest_runtest_setup)."""
    yield
    sys.modules["__main__"] = PYTHONS_MAIN


@pytest.fixture
def tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (3, 24), generator=torch.Generator().manual_seed(0))


@pytest.fixture
def model() -> HookedTransformer:
    return HookedTransformer(tiny_config(), seed=1).eval()


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """(model folder, CSV): a tiny random GPT-2 saved with a tokenizer of the letters A–D, and a generated
    MMLU-layout CSV of 40 questions (the calibration experiment's `--model PATH --mmlu FILE`)."""
    folder = tmp_path_factory.mktemp("hf")
    model_dir = folder / "gpt2"
    hf_model("gpt2").save_pretrained(model_dir)
    letter_tokenizer(model_dir)
    rng = np.random.default_rng(0)
    csv_path = folder / "mmlu.csv"
    with csv_path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["question", "A", "B", "C", "D", "answer"])  # a header row is skipped
        for _ in range(40):
            words = [f"w{i}" for i in rng.integers(0, VOCAB - 9, 13)]
            writer.writerow(
                [" ".join(words[:5])]
                + [" ".join(words[5 + 2 * k : 7 + 2 * k]) for k in range(4)]
                + ["ABCD"[rng.integers(4)]]
            )
    return model_dir, csv_path


@pytest.fixture(scope="module")
def qa_folder(tmp_path_factory):
    """A folder with gpt2/ (a tiny random GPT-2 and a word-level tokenizer) and qa.csv, 30 generated
    question–answer rows (the monitor experiment's `--model PATH --qa FILE`)."""
    folder = tmp_path_factory.mktemp("qa")
    hf_model("gpt2").save_pretrained(folder / "gpt2")
    word_tokenizer(folder / "gpt2", ("Question:", "Answer:"))
    rng = np.random.default_rng(0)
    with (folder / "qa.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["question", "answer"])
        for _ in range(30):
            writer.writerow([" ".join(f"w{i}" for i in rng.integers(0, VOCAB - 6, 5)), f"w{rng.integers(0, 9)}"])
    return folder


@pytest.fixture(params=hf_cases(), ids=lambda case: case.variant)
def hf_case(request) -> HFCase:
    """Every variant of every registered Hugging Face family (lab.hf.families.FAMILIES): a test that takes it runs
    for a family as soon as the family is in the table."""
    return request.param


@pytest.fixture(params=hf_cases(first_only=True), ids=lambda case: case.model_type)
def hf_family(request) -> HFCase:
    """Every registered Hugging Face family, once (its first variant): for the slower tests, a saved folder's."""
    return request.param
