"""`forma harvest` and `forma patch` (lab/cli/datasets.py). docs/distributed.md's commands, as written: in one
process, and as 2 gloo ranks under torchrun with a rank killed by SIGKILL in the middle, then run again — the files
are byte for byte the one process's. One process killed with SIGKILL at seeded moments (any file operation,
tests/fault_zygote.py) and rerun writes the same bytes too; bad input gets one line."""

import json
import os
import random
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.cli.parser import main
from tests.builders import REPO
from tests.fault_zygote import Forks

PAGE = REPO / "docs" / "distributed.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", flags=re.DOTALL | re.MULTILINE)
# Imported by every Python the launches start (PYTHONPATH): in the rank named by FORMA_TEST_FAULT, it plants that
# fault (tests/fault_zygote.py's: SIGKILL just before the N-th watched file operation); elsewhere it does nothing.
SITECUSTOMIZE = """\
import json, os
_fault = json.loads(os.environ.get("FORMA_TEST_FAULT", "null"))
if _fault and os.environ.get("RANK") == str(_fault["rank"]):
    from tests.fault_zygote import plant
    plant(_fault["fault"])
"""

pytestmark = pytest.mark.usefixtures("one_thread_per_module")


def page_blocks() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(PAGE.read_text())]


def commands(heading: str) -> list[str]:
    """The command lines of the bash block under `heading` on the page."""
    text = PAGE.read_text()
    section = text[text.index(f"## {heading}\n") :]
    code = next(m.group(2) for m in FENCE.finditer(section) if m.group(1) == "bash")
    return [line for line in code.replace("\\\n", " ").splitlines() if line.strip() and not line.startswith("#")]


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def tried(tmp_path_factory) -> Path:
    """A folder with the page's model and data (its first python block) and its one-process commands run."""
    folder = tmp_path_factory.mktemp("distributed-page")
    setup = next(code for language, code in page_blocks() if language == "python")
    here = Path.cwd()
    os.chdir(folder)
    try:
        exec(compile(setup, str(PAGE), "exec"), {"__name__": "distributed_page"})
        for line in commands("One process"):
            argv = shlex.split(line)
            assert argv[0] == "forma" and main(argv[1:] + ["--no-progress"]) == 0, line
    finally:
        os.chdir(here)
    return folder


def shell_env(site: Path, sitecustomize: str, **extra: str) -> dict[str, str]:
    """A user's shell for the page's command lines: torchrun first on PATH, offline, one thread a process, with
    `sitecustomize` imported by every Python it starts (from `site`)."""
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(sitecustomize)
    return os.environ | {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": f"{site}{os.pathsep}{REPO}",
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        **extra,
    }


def launch(line: str, folder: Path, fault: dict | None = None) -> subprocess.CompletedProcess:
    """A command line of the page in `folder`, as a user's shell runs it (torchrun first on PATH, offline, one thread
    a process), with `fault` planted in one rank."""
    env = shell_env(folder / "site", SITECUSTOMIZE, FORMA_TEST_FAULT=json.dumps(fault))
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", line],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def torchrun_line(command: str) -> str:
    (line,) = [line for line in commands("Two processes on one machine (CPU)") if f"-m lab.cli {command} " in line]
    assert line.startswith("torchrun --standalone --nproc-per-node 2 -m lab.cli") and "--device" not in line
    return line


@pytest.mark.slow
def test_two_ranks_killed_and_rerun_harvest_the_bytes_of_one_process(tried):
    """Rank 1 is killed with SIGKILL just before its second shard lands (12 parts of a batch each; rank 1 harvests
    parts 6 … 11: its first is done, its second written but not in place); torchrun ends rank 0 wherever it is. The
    same command again finishes, and every file — shards, each part's index, the merged index, the plan — is the
    one-process run's. (A part of several shards killed half-way resumes from its last one:
    tests/lab/analysis/test_activations_harvest.py.)"""
    line = torchrun_line("harvest")
    out = tried / shlex.split(line)[shlex.split(line).index("--out") + 1]
    killed = launch(line, tried, {"rank": 1, "fault": {"kill": 2, "match": ".safetensors", "event": "os.rename"}})
    assert killed.returncode != 0 and "Signal 9 (SIGKILL) received" in killed.stderr, killed.stderr[-3000:]
    assert not (out / "index.json").exists()
    assert (out / "part-00006" / "index.json").is_file() and not (out / "part-00007" / "index.json").exists()
    done = launch(line, tried)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "from 48 sequences of 32 tokens into acts-2 (2 ranks)" in done.stdout
    assert folder_bytes(out) == folder_bytes(tried / "acts")


@pytest.mark.slow
def test_two_ranks_killed_and_rerun_sweep_the_bytes_of_one_process(tried):
    """Rank 0 is killed with SIGKILL just before its second part's table rows land (12 pairs, a part each; rank 0
    sweeps parts 0 … 5). The same command again finishes, and the tables, the manifest, the plan and the parts are
    the one-process run's; then the page's diff of both runs against one process passes."""
    line = torchrun_line("patch")
    out = tried / "sweep-2"
    killed = launch(line, tried, {"rank": 0, "fault": {"kill": 2, "match": ".safetensors", "event": "os.rename"}})
    assert killed.returncode != 0 and "Signal 9 (SIGKILL) received" in killed.stderr, killed.stderr[-3000:]
    assert not (out / "sweep.json").exists() and (out / "parts" / "part-00000.safetensors").is_file()
    assert not (out / "parts" / "part-00001.safetensors").exists()
    done = launch(line, tried)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "swept 12 pairs (2 ranks)" in done.stdout
    assert folder_bytes(out) == folder_bytes(tried / "sweep")
    (check,) = [line for line in commands("Two processes on one machine (CPU)") if line.startswith("diff ")]
    if (tried / "acts-2" / "index.json").is_file():  # the harvest's test ran first (it makes acts-2)
        checked = launch(check, tried)
        assert checked.returncode == 0 and "the same files as one process" in checked.stdout, checked.stdout


# Imported by every Python the launch starts: each rank writes its pid, then stalls at its first shard's rename (as a
# rank does that waits on a slow disk or a collective) — until its launcher is killed under it.
STALL = """\
import os, sys, time
if os.environ.get("RANK") is not None:
    open(os.path.join(os.environ["FORMA_TEST_PIDS"], os.environ["RANK"]), "w").write(str(os.getpid()))
    def _stall(event, args):
        if event == "os.rename" and str(args[1]).endswith(".safetensors"):
            time.sleep(600)
    sys.addaudithook(_stall)
"""


def _running(pid: int) -> bool:
    """Whether `pid` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.slow
def test_ranks_end_when_their_launcher_is_killed_and_the_command_then_resumes(tried, tmp_path):
    """torchrun's launcher killed with SIGKILL (no chance to end its ranks) while both ranks work: each rank sees
    its launcher gone and ends within seconds (lab.distributed.end_with_launcher), none left running unsupervised;
    the same command again finishes with the one process's bytes."""
    line = torchrun_line("harvest").replace("--out acts-2", "--out acts-orphan")
    pids = tmp_path / "pids"
    pids.mkdir()
    env = shell_env(tmp_path / "site", STALL, FORMA_TEST_PIDS=str(pids))
    launcher = subprocess.Popen(
        shlex.split(line), cwd=tried, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 240
        while len(list(pids.iterdir())) < 2 or not list((tried / "acts-orphan").rglob("*.safetensors*")):
            assert launcher.poll() is None and time.monotonic() < deadline, "the ranks never reached their shards"
            time.sleep(0.2)
        ranks = [int(p.read_text()) for p in pids.iterdir()]
        assert all(_running(pid) for pid in ranks)
        launcher.kill()  # SIGKILL: torchrun cannot pass anything on to its ranks
        launcher.wait()
        deadline = time.monotonic() + 30
        while any(_running(pid) for pid in ranks) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_running(pid) for pid in ranks), "a rank outlived its launcher"
    finally:
        launcher.kill()
        launcher.wait()
    done = launch(line, tried)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert folder_bytes(tried / "acts-orphan") == folder_bytes(tried / "acts")


# Two ranks in lab.cli.datasets.process_group: rank 0 works LEAVE_WORK_S longer than rank 1 (rank 0 alone measures
# and writes, as in `forma transcoders`), or raises in the body. Each records when its work ended and when it left.
LEAVE_WORK_S = 2.0
LEAVE = """\
import json, os, sys, time
from pathlib import Path
from lab.cli.datasets import process_group
out, fail, work_s = Path(sys.argv[1]), sys.argv[2] == "fail", float(sys.argv[3])
with process_group("cpu") as (rank, world):
    if rank == 0:
        if fail:
            raise SystemExit("rank 0 failed")
        time.sleep(work_s)
    worked = time.monotonic()
left = time.monotonic()
(out / f"rank-{rank}.json").write_text(json.dumps({"worked": worked, "left": left}))
"""


@pytest.mark.slow
def test_the_ranks_leave_the_group_together_and_a_failed_rank_leaves_at_once(tmp_path):
    """A rank whose work is done does not tear its connections down while another still works: it leaves the group
    with the last one (a rank left alone in teardown while its peer still held the group ended in SIGABRT). A rank
    whose body raises leaves at once, waiting for no one, and torchrun ends the other."""
    script = tmp_path / "leave.py"
    script.write_text(LEAVE)
    env = shell_env(tmp_path / "site", "")
    command = ["torchrun", "--standalone", "--nproc-per-node", "2", str(script), str(tmp_path)]
    done = subprocess.run(
        [*command, "ok", str(LEAVE_WORK_S)], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rank0, rank1 = (json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1))
    assert rank1["worked"] < rank0["worked"] - LEAVE_WORK_S / 2  # rank 1 was done first ...
    assert rank1["left"] >= rank0["worked"]  # ... and left with rank 0
    start = time.monotonic()
    failed = subprocess.run([*command, "fail", "0"], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert failed.returncode != 0 and "rank 0 failed" in failed.stderr, failed.stderr[-3000:]
    assert time.monotonic() - start < 60


# Kills of one process at seeded moments: which watched file operations a run makes is traced first, then the run
# is killed just before a few of them, each time followed by the same command run to the end.
SEED, KILLS = 37, 4


@pytest.mark.slow
@pytest.mark.parametrize("command", ["harvest", "patch"])
def test_one_process_killed_at_seeded_moments_resumes_to_the_same_bytes(tried, fault_zygote, tmp_path, command):
    line = commands("One process")[["harvest", "patch"].index(command)]
    words = [str(tried / word) if (tried / word).exists() else word for word in shlex.split(line)[1:]]
    argv = [words[0], "--no-progress", *words[1:]]  # (the log's name is made of the first two)
    out = argv.index("--out") + 1
    forks = Forks(fault_zygote, tmp_path, {})
    reference = tried / argv[out]

    argv[out] = str(tmp_path / "traced")
    trace = tmp_path / "trace.jsonl"
    status, log = forks.call(argv, {"trace": str(trace)})
    assert status == 0, log
    operations = len(trace.read_text().splitlines())
    assert folder_bytes(tmp_path / "traced") == folder_bytes(reference)
    moments = sorted(random.Random(SEED).sample(range(1, operations + 1), KILLS))
    for moment in moments:
        argv[out] = str(tmp_path / f"killed-{moment}")
        status, log = forks.call(argv, {"kill": moment})
        assert status == -9, f"not killed at operation {moment} of {operations}: {log}"
        status, log = forks.call(argv)
        assert status == 0, f"after a kill at operation {moment}: {log}"
        assert folder_bytes(Path(argv[out])) == folder_bytes(reference), f"killed at operation {moment}"


def test_the_commands_sweep_names_are_the_sweeps():
    from lab.analysis.sweeps import SWEEPS
    from lab.cli.datasets import SWEEP_NAMES

    assert SWEEP_NAMES == tuple(SWEEPS)


def test_bad_input_gets_one_line_and_exit_2(tried, capsys):
    model = str(tried / "tiny")
    harvest = ["harvest", model, "--hook", "blocks.0.hook_resid_post", "--no-progress"]
    for argv, message in [
        (
            harvest + ["--corpus", str(tried / "pairs.jsonl"), "--out", str(tried / "x")],
            "a corpus is a .txt (text) or a .npy (token ids) file",
        ),
        (
            harvest + ["--corpus", str(tried / "corpus.npy"), "--seq-len", "33", "--out", str(tried / "x")],
            "the sequence length must be 1 … n_ctx = 32, got 33",
        ),
        (
            harvest
            + [
                "--corpus",
                str(tried / "corpus.npy"),
                "--seq-len",
                "32",
                "--batch-size",
                "4",
                "--shard-mb",
                "0.05",
                "--hook",
                "blocks.1.attn.hook_z",
                "--out",
                str(tried / "acts"),
            ],
            "already holds a complete harvest",
        ),
        (
            harvest + ["--corpus", str(tried / "corpus.npy"), "--seq-len", "32", "--out", str(tried / "acts")],
            "already holds a complete harvest",
        ),
        (
            ["patch", model, "--pairs", str(tried / "corpus.npy"), "--sweep", "head", "--out", str(tried / "y")],
            "a dataset of prompt pairs is a .csv or a .jsonl file",
        ),
        (
            ["patch", model, "--pairs", str(tried / "no-such.csv"), "--sweep", "head", "--out", str(tried / "y")],
            "no-such.csv",
        ),
    ]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(f"forma {argv[0]}: error: ") and message in err and err.count("\n") == 1, err
    with pytest.raises(SystemExit) as exit:
        main(["patch", model, "--pairs", "p.csv", "--sweep", "heads", "--out", "y"])
    assert exit.value.code == 2 and "invalid choice: 'heads'" in capsys.readouterr().err


def half_written(folder: Path) -> list[str]:
    """The files under their final names in `folder` (not inside a write's temporary folder, `.<name>.<random>.tmp`)
    that do not read whole: a .safetensors file safetensors cannot open, a .json file json cannot parse."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    broken = []
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or any(part.endswith(".tmp") for part in path.relative_to(folder).parts[:-1]):
            continue
        try:
            if path.suffix == ".safetensors":
                load_file(str(path))
            elif path.suffix == ".json":
                json.loads(path.read_text())
        except (SafetensorError, ValueError, OSError) as err:
            broken.append(f"{path.relative_to(folder)}: {err}")
    return broken


@pytest.mark.slow
def test_forma_patch_killed_before_each_file_operation_leaves_nothing_half_written_and_resumes_to_the_same_bytes(
    tried, fault_zygote, tmp_path
):
    """The page's one-process `forma patch`, killed (SIGKILL) just before each of its watched file operations in
    turn (traced first: its plan, each part's table rows, each sweep's table, the manifest): at every kill each file
    under its final name reads whole, and the same command run again writes the bytes of the uninterrupted run,
    every killed write's temporary and the dead writer's lock gone (after a kill once sweep.json landed, it says
    in one line that the sweep is complete)."""
    line = commands("One process")[1]
    words = [str(tried / word) if (tried / word).exists() else word for word in shlex.split(line)[1:]]
    argv = [words[0], "--no-progress", *words[1:]]
    out = argv.index("--out") + 1
    reference = tried / argv[out]
    forks = Forks(fault_zygote, tmp_path, {})
    argv[out] = str(tmp_path / "traced")
    trace = tmp_path / "trace.jsonl"
    status, log = forks.call(argv, {"trace": str(trace)})
    assert status == 0, log
    operations = len(trace.read_text().splitlines())
    assert operations >= 10 and folder_bytes(tmp_path / "traced") == folder_bytes(reference)
    print(f"forma patch: killed before each of its {operations} file operations")
    for moment in range(1, operations + 1):
        argv[out] = str(tmp_path / f"killed-{moment}")
        status, log = forks.call(argv, {"kill": moment})
        assert status == -9, f"not killed at operation {moment} of {operations}: {log}"
        complete = (Path(argv[out]) / "sweep.json").is_file()
        if Path(argv[out]).exists():
            assert half_written(Path(argv[out])) == [], f"killed at operation {moment}"
        status, log = forks.call(argv)
        if complete:  # killed after sweep.json landed: the rerun tidies, and says the sweep is complete
            assert status == 2 and "already holds a complete sweep" in log, f"after a kill at {moment}: {log}"
        else:
            assert status == 0, f"after a kill at operation {moment}: {log}"
        assert folder_bytes(Path(argv[out])) == folder_bytes(reference), f"killed at operation {moment}"
