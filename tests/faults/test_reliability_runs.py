"""Run folders under faults and bad input: nothing written where it does not belong, nothing half-written under
its final name, one folder per run however many start at once, the same results for the same seed."""

import errno
import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import experiments
from lab.cli.parser import main
from lab.files import OWNER_FILE, is_temporary
from lab.progress import PROGRESS_FILE
from lab.runs import (
    PLOTLY_BUNDLE,
    latest_run,
    new_run_dir,
    run_and_record,
    save_figure,
    without_timings,
)
from tests.builders import REPO, figure, toy_run
from tests.fault_zygote import Forks


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------------------------
# --out: only a new or empty folder, or an unfinished run of the same experiment
# --------------------------------------------------------------------------------------------
def test_a_model_folder_given_as_out_is_refused_and_left_byte_identical(tmp_path, capsys):
    from lab import HookedTransformer
    from tests.builders import tiny_config

    model_folder = tmp_path / "model"
    HookedTransformer(tiny_config()).save(model_folder)  # config.json + model.safetensors
    before = snapshot(model_folder)
    assert main(["run", "equations", "--quick", "--out", str(model_folder)]) == 2
    err = capsys.readouterr().err
    assert "Forma did not write" in err and str(model_folder) in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert snapshot(model_folder) == before
    assert sorted(p.name for p in model_folder.iterdir()) == sorted(before)


def killed_run(folder: Path, experiment: str = "toy") -> None:
    """What a run of `experiment` killed half-way leaves in `folder`: its manifest listing what it began to write,
    provenance.json, and the temporary of a figure its writer never renamed (listed before it was begun)."""

    def killed(cfg, out):
        save_figure(figure(), out, "curve")
        (out / ".curve.html.abc123.tmp").mkdir()
        (out / ".curve.html.abc123.tmp" / "curve.html").write_text("<html><bo")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_and_record(experiment, {"seed": 0}, killed, out=folder, seed=0)


def test_an_unfinished_run_of_the_same_experiment_is_taken_and_finished(tmp_path):
    folder = tmp_path / "run"
    killed_run(folder)
    assert json.loads((folder / OWNER_FILE).read_text())["command"] == "run toy"
    assert new_run_dir("toy", folder) == folder
    run_and_record("toy", {"seed": 0}, toy_run, out=folder, seed=0)
    assert json.loads((folder / "results.json").read_text())["n"] == 500
    assert not [p for p in folder.iterdir() if is_temporary(p)]


def test_the_manifest_lists_every_file_a_run_wrote(tmp_path):
    folder = tmp_path / "run"
    run_and_record("toy", {"seed": 0}, toy_run, out=folder, seed=0)
    listed = set(json.loads((folder / OWNER_FILE).read_text())["entries"])
    assert {p.name for p in folder.iterdir()} - {OWNER_FILE} <= listed
    assert {"provenance.json", "config.json", "results.json", "curve.json", "curve.html", PLOTLY_BUNDLE} <= listed


def test_a_users_file_in_out_is_one_line_and_exit_2_and_left_as_it_was(tmp_path, capsys):
    """A user's file beside a run (any name: notes.txt, a `.foo.tmp` named like Forma's temporaries, a
    provenance.json of their own) is refused in one line naming it, before anything is written."""
    for name in ("notes.txt", ".foo.tmp", ".notes.abc123.tmp", "provenance.json"):
        folder = tmp_path / name.strip(".")
        folder.mkdir()
        (folder / name).write_text("the user's own")
        assert main(["run", "equations", "--quick", "--out", str(folder)]) == 2
        err = capsys.readouterr().err
        assert name in err and "--overwrite" in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1
        assert snapshot(folder) == {name: b"the user's own"}


def test_with_overwrite_a_run_writes_beside_the_users_files_and_leaves_them(tmp_path):
    """--overwrite: the run goes on; the user's files stay where they are, byte for byte (one named like a file the
    run writes would be replaced: docs/experiments.md)."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    (folder / ".foo.tmp").write_text("mine too")
    run_and_record("toy", {"seed": 0}, toy_run, out=folder, seed=0, overwrite=True)
    assert json.loads((folder / "results.json").read_text())["n"] == 500
    assert (folder / "notes.txt").read_text() == "mine" and (folder / ".foo.tmp").read_text() == "mine too"
    assert "notes.txt" not in json.loads((folder / OWNER_FILE).read_text())["entries"]
    run_and_record("toy", {"seed": 1}, toy_run, out=folder, seed=1, overwrite=True)  # a finished run: again
    assert (folder / "notes.txt").read_text() == "mine" and (folder / ".foo.tmp").read_text() == "mine too"
    assert json.loads((folder / "config.json").read_text())["seed"] == 1


def test_a_killed_runs_temporaries_go_on_the_rerun_and_a_users_tmp_file_stays(tmp_path):
    """A rerun removes only the temporaries of names its manifest lists; a user's `.foo.tmp` or
    `.notes.abc123.tmp`, written beside the killed run (and let in with --overwrite), is never removed."""
    folder = tmp_path / "run"
    killed_run(folder)
    (folder / ".foo.tmp").write_text("the user's")
    (folder / ".notes.abc123.tmp").write_text("the user's too")
    with pytest.raises(ValueError, match="Forma did not write"):
        run_and_record("toy", {"seed": 0}, toy_run, out=folder, seed=0)
    assert (folder / ".curve.html.abc123.tmp").is_dir()  # refused before anything is removed
    run_and_record("toy", {"seed": 0}, toy_run, out=folder, seed=0, overwrite=True)
    assert not (folder / ".curve.html.abc123.tmp").exists()
    assert (folder / ".foo.tmp").read_text() == "the user's"
    assert (folder / ".notes.abc123.tmp").read_text() == "the user's too"


def test_a_run_killed_while_writing_its_manifest_is_taken_again(tmp_path):
    """A kill during the manifest's first write leaves only its temporary: the same --out is taken again (the
    temporary removed), as an empty folder is."""
    folder = tmp_path / "run"
    (folder / f".{OWNER_FILE}.abc123.tmp").mkdir(parents=True)
    (folder / f".{OWNER_FILE}.abc123.tmp" / OWNER_FILE).write_text('{"form')
    run_and_record("toy", {"seed": 0}, toy_run, out=folder, seed=0)
    assert json.loads((folder / "results.json").read_text())["n"] == 500
    assert not [p for p in folder.iterdir() if is_temporary(p)]


def test_an_unfinished_run_of_another_experiment_is_refused(tmp_path):
    folder = tmp_path / "run"
    killed_run(folder, "kl")
    before = snapshot(folder)
    with pytest.raises(ValueError, match="holds a run kl"):
        run_and_record("toy", {"seed": 0}, toy_run, out=folder, seed=0)
    assert snapshot(folder) == before


@pytest.mark.parametrize("contents", [{"notes.txt": "mine"}, {"provenance.json": "{half"}, {"config.json": "{}"}])
def test_a_folder_with_other_files_is_refused(tmp_path, contents):
    folder = tmp_path / "run"
    folder.mkdir()
    for name, text in contents.items():
        (folder / name).write_text(text)
    with pytest.raises(ValueError, match="Forma did not write"):
        new_run_dir("toy", folder)
    assert snapshot(folder) == {name: text.encode() for name, text in contents.items()}


def test_an_empty_folder_and_a_new_one_are_taken(tmp_path):
    (tmp_path / "empty").mkdir()
    assert new_run_dir("toy", tmp_path / "empty") == tmp_path / "empty"
    assert new_run_dir("toy", tmp_path / "a" / "b").is_dir()


def test_a_folder_in_use_by_another_run_is_refused(tmp_path):
    folder = tmp_path / "run"

    def inner(cfg, out):
        with pytest.raises(ValueError, match="in use by another run"):
            run_and_record("toy", cfg, toy_run, out=out, seed=0)
        return {"n": 0}

    run_and_record("toy", {"seed": 0}, inner, out=folder, seed=0)


# --------------------------------------------------------------------------------------------
# Run folders started at once are distinct
# --------------------------------------------------------------------------------------------
def _make_run_dirs(args: tuple[str, int]) -> list[str]:
    barrier_path, n = args
    while not Path(barrier_path).exists():  # start together
        time.sleep(0.001)
    return [str(new_run_dir("toy")) for _ in range(n)]


def test_runs_started_at_once_get_distinct_folders(tmp_path, monkeypatch):
    """Every process asks for runs/toy/<the same stamp> at the same moment: each gets its own folder."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setenv("FORMA_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setattr("lab.runs.utc_now", lambda: "2026-01-01T00-00-00Z")
    go = tmp_path / "go"
    with multiprocessing.get_context("fork").Pool(6) as pool:
        pending = pool.map_async(_make_run_dirs, [(str(go), 5)] * 6)
        with ThreadPoolExecutor(4) as threads:
            in_threads = [threads.submit(_make_run_dirs, (str(go), 5)) for _ in range(4)]
            time.sleep(0.5)
            go.touch()
            folders = [f for batch in pending.get(60) for f in batch] + [f for t in in_threads for f in t.result()]
    assert len(folders) == 50 and len(set(folders)) == 50
    assert all(Path(f).is_dir() and [p.name for p in Path(f).iterdir()] == [OWNER_FILE] for f in folders)
    assert sorted(p.name for p in (tmp_path / "runs" / "toy").iterdir())[:2] == [
        "2026-01-01T00-00-00Z",
        "2026-01-01T00-00-00Z-1",
    ]


# --------------------------------------------------------------------------------------------
# latest: never outside runs/
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pointer", ["../..", "..", ".", "/etc", "../outside", "sub/dir", "", "\x00", "nothing"])
def test_a_latest_pointer_outside_runs_is_ignored(tmp_path, pointer):
    base = tmp_path / "runs" / "toy"
    for name in ("2026-01-01T00-00-00Z", "2026-01-02T00-00-00Z"):
        (base / name).mkdir(parents=True)
        (base / name / "results.json").write_text("{}\n")
    (base / "sub" / "dir").mkdir(parents=True)
    (base / "sub" / "dir" / "results.json").write_text("{}\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "results.json").write_text("{}\n")
    (tmp_path / "results.json").write_text("{}\n")  # what "../.." would reach
    (base / "latest").write_text(pointer + "\n")
    assert latest_run("toy", tmp_path / "runs") == base / "2026-01-02T00-00-00Z"  # the newest complete run


def test_a_latest_pointer_through_a_link_is_ignored(tmp_path):
    base = tmp_path / "runs" / "toy"
    (base / "2026-01-01T00-00-00Z").mkdir(parents=True)
    (base / "2026-01-01T00-00-00Z" / "results.json").write_text("{}\n")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "results.json").write_text("{}\n")
    (base / "zz-link").symlink_to(tmp_path / "elsewhere")
    (base / "latest").write_text("zz-link\n")
    assert latest_run("toy", tmp_path / "runs") == base / "2026-01-01T00-00-00Z"


def test_a_good_latest_pointer_is_followed(tmp_path):
    base = tmp_path / "runs" / "toy"
    for name in ("2026-01-01T00-00-00Z", "2026-01-02T00-00-00Z"):
        (base / name).mkdir(parents=True)
        (base / name / "results.json").write_text("{}\n")
    (base / "latest").write_text("2026-01-01T00-00-00Z\n")
    assert latest_run("toy", tmp_path / "runs") == base / "2026-01-01T00-00-00Z"


# --------------------------------------------------------------------------------------------
# Atomic artefacts: a failed write leaves no results.json and nothing cut short
# --------------------------------------------------------------------------------------------
WRITTEN = ["provenance.json", "config.json", PLOTLY_BUNDLE, "curve.json", "curve.html", "results.json"]


@pytest.mark.parametrize("failing", WRITTEN)
def test_a_disk_that_fills_while_writing_leaves_no_results_and_nothing_cut_short(tmp_path, monkeypatch, failing):
    reference = tmp_path / "reference"
    run_and_record("toy", {"seed": 0}, toy_run, out=reference, seed=0)
    complete = snapshot(reference)
    write_text = Path.write_text

    def full_disk(self: Path, data: str, *args, **kwargs) -> int:
        if self.parent.name.startswith(f".{failing}."):  # the temporary that becomes `failing` (in its folder)
            write_text(self, data[: len(data) // 2], *args, **kwargs)
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return write_text(self, data, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    folder = tmp_path / "run"
    with pytest.raises(OSError, match="No space left"):
        run_and_record("toy", {"seed": 0}, toy_run, out=folder, seed=0)
    left = snapshot(folder)
    assert "results.json" not in left and failing not in left
    assert not [name for name in left if is_temporary(name)]
    for name, data in left.items():  # every file there is whole: as a complete run writes it
        if name == "provenance.json":
            assert json.loads(data)["experiment"] == "toy"
        elif name == OWNER_FILE:  # the manifest: what the run had begun to write, every file left among it
            assert set(left) - {OWNER_FILE} <= set(json.loads(data)["entries"]), name
        elif name.endswith(".html"):
            assert len(data) == len(complete[name]) and data.rstrip().endswith(b"</html>")
        else:
            assert data == complete[name], name


def test_a_truncated_plotly_bundle_beside_a_run_is_replaced(tmp_path):
    from plotly.offline import get_plotlyjs

    folder = tmp_path / "run"
    killed_run(folder)  # the run a full disk stopped: its bundle cut short (an earlier Forma's, not atomic)
    (folder / PLOTLY_BUNDLE).write_text(get_plotlyjs()[:100_000])
    run_and_record("toy", {"seed": 0}, toy_run, out=folder, seed=0)
    assert (folder / PLOTLY_BUNDLE).read_text(encoding="utf-8") == get_plotlyjs()
    assert 'src="plotly.min.js"' in (folder / "curve.html").read_text()


def test_save_figure_never_lets_plotly_write_the_bundle_itself(tmp_path, monkeypatch):
    """plotly's write_html writes plotly.min.js in place (not atomically): Forma never calls it."""
    import plotly.io

    def refuse(*args, **kwargs):
        raise AssertionError("plotly.io.write_html called")

    monkeypatch.setattr(plotly.io, "write_html", refuse)
    monkeypatch.setattr("plotly.basedatatypes.BaseFigure.write_html", refuse)
    save_figure(figure(), tmp_path, "curve")
    assert {p.name for p in tmp_path.iterdir()} == {"curve.json", "curve.html", PLOTLY_BUNDLE}


TOY_SCRIPT = """
import sys
from lab.runs import run_and_record
from tests.builders import toy_run
run_and_record("toy", {"seed": 0}, toy_run, out=sys.argv[1], seed=0)
"""


def _file_size_limit(limit: int):
    def preexec() -> None:
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


@pytest.mark.slow
@pytest.mark.parametrize("limit", [500, 5_000, 1_000_000])  # provenance.json, table.parquet, plotly.min.js
def test_a_real_write_failure_in_any_writer_leaves_nothing_cut_short(tmp_path, limit):
    """Files may grow to `limit` bytes only (RLIMIT_FSIZE, as a nearly full disk): whichever writer hits it —
    JSON, plotly's bundle, pyarrow's parquet — the run fails with no results.json and no file cut short."""
    env = os.environ | {"PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    reference, folder = tmp_path / "reference", tmp_path / "run"
    run_and_record("toy", {"seed": 0}, toy_run, out=reference, seed=0)
    complete = snapshot(reference)
    assert any(len(data) > limit for data in complete.values())
    failed = subprocess.run(
        [sys.executable, "-c", TOY_SCRIPT, str(folder)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        preexec_fn=_file_size_limit(limit),
    )
    assert failed.returncode != 0 and "File too large" in failed.stderr
    left = snapshot(folder)
    assert "results.json" not in left and not [name for name in left if is_temporary(name)]
    for name, data in left.items():  # whole: provenance.json as first written, the rest as a complete run's
        if name == "provenance.json":
            assert json.loads(data)["experiment"] == "toy"
        elif name == OWNER_FILE:  # the manifest: what the run had begun to write, every file left among it
            assert set(left) - {OWNER_FILE} <= set(json.loads(data)["entries"]), name
        else:
            assert len(data) == len(complete[name]), name


# --------------------------------------------------------------------------------------------
# Same seed, same results.json
# --------------------------------------------------------------------------------------------
def differences(a, b, path: str = "") -> list[str]:
    """The paths at which two parsed JSON documents differ (NaN equals NaN)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [
            d
            for k in sorted(set(a) | set(b), key=str)
            for d in (differences(a[k], b[k], f"{path}/{k}") if k in a and k in b else [f"{path}/{k} (one side)"])
        ]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    same = json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    return [] if same else [f"{path}: {json.dumps(a)[:80]} ≠ {json.dumps(b)[:80]}"]


def test_without_timings_removes_exactly_the_timing_fields():
    results = {
        "seconds": 3.0,
        "timing": {"train_s": 1.0},
        "wall_time_s": 2.0,
        "finished_utc": "x",
        "checks": [{"name": "a", "seconds": 0.1, "measured": 1.5}],
        "kl_nats": 0.25,
        "n_seen": 4,
    }
    assert without_timings(results) == {"checks": [{"name": "a", "measured": 1.5}], "kl_nats": 0.25, "n_seen": 4}


@pytest.mark.slow
@pytest.mark.parametrize("name", experiments.experiment_names())
def test_the_same_seed_gives_the_same_results(quick_run, quick_rerun, tmp_path, name):
    """A second quick run, in a fresh process (another hash seed, another torch default seed, default threads)
    and, for an experiment that shares its trainings out among worker processes, on one process instead of
    the default's two (tests/builders.py::rerun_argv), writes the results.json of the session's quick run,
    timing fields (lab.runs.TIMING_FIELDS) aside."""
    first = json.loads((quick_run(name) / "results.json").read_text())
    second = json.loads((quick_rerun(name, tmp_path / "again") / "results.json").read_text())
    assert differences(without_timings(first), without_timings(second)) == []


# --------------------------------------------------------------------------------------------
# kill -9 at each kind of moment
# --------------------------------------------------------------------------------------------
def whole(path: Path) -> bool:
    """Whether a file under its final name is complete, by what its format requires."""
    from plotly.offline import get_plotlyjs

    data = path.read_bytes()
    if path.name == PLOTLY_BUNDLE:
        return data.decode("utf-8") == get_plotlyjs()
    if path.suffix == ".json":
        try:
            json.loads(data)
            return True
        except ValueError:
            return False
    if path.suffix == ".html":
        return data.rstrip().endswith(b"</html>")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            pq.read_table(path)
            return True
        except (OSError, ValueError):
            return False
    return True


def digest(folder: Path) -> dict[str, str]:
    return {k: hashlib.sha256(v).hexdigest() for k, v in snapshot(folder).items()}


# Where the trials kill `forma run` (faults of tests/fault_zygote.py: SIGKILL just before the N-th watched file
# operation of that kind on a path with that ending), one of each state its folders can be left in: nothing in
# place yet; provenance, config and the progress file in place while it computes (the first figure file's
# temporary beside them is no other state: no check reads a temporary); every artefact but results.json;
# results.json but `latest` still naming the earlier run; `latest` naming it, its progress file not yet
# removed. Counted by path, not by the clock: the progress file is rewritten every second from a thread, so an
# operation's overall number differs from run to run.
KILL_MOMENTS = {
    "before its first file is in place": {"match": "/provenance.json", "event": "os.rename", "kill": 1},
    "while it computes": {"match": "/" + PROGRESS_FILE, "event": "os.rename", "kill": 2},
    "before results.json is in place": {"match": "/results.json", "event": "os.rename", "kill": 1},
    "before latest names it": {"match": "/latest", "event": "os.rename", "kill": 1},
    "before its progress file is removed": {"match": "/" + PROGRESS_FILE, "event": "os.remove", "kill": 1},
}
AFTER_RESULTS = ("before latest names it", "before its progress file is removed")  # results.json is written last


@pytest.mark.slow
def test_forma_run_killed_at_each_kind_of_moment_loses_nothing(tmp_path, fault_zygote, quick_run):
    """`forma run equations --quick` kill -9'd at each moment of KILL_MOMENTS, beside a finished run (a copy of
    the session's quick run, named by `latest`): that run stays intact, a folder killed before its results.json
    is in place has none (and one killed after holds every file the finished run holds), `latest` names a
    complete run, and every file under its final name is whole. Between two watched operations only a file
    opened for writing changes, and a run opens none under runs/ but temporaries (checked from the trace of the
    last trial, killed at its last operation): so these moments leave every state a kill at any moment can
    leave. The runs are forked from one process that has imported Forma (tests/fault_zygote.py), as
    `python -m lab.cli run equations --quick` runs after its imports."""
    runs = tmp_path / "runs"
    base = runs / "equations"
    finished = base / quick_run("equations").name
    shutil.copytree(quick_run("equations"), finished)
    (base / "latest").write_text(finished.name + "\n")
    command = ["run", "equations", "--quick"]
    forks = Forks(fault_zygote, tmp_path, {"FORMA_RUNS_DIR": str(runs)})
    trace = tmp_path / "last.trace"
    before = digest(finished)
    files = {p.name for p in finished.iterdir() if not is_temporary(p)}
    counts = {
        "trials": 0,
        "killed": 0,
        "earlier run changed": 0,
        "results.json in a killed run": 0,
        "files missing beside results.json": 0,
        "latest not complete": 0,
        "half-written files": 0,
    }
    for moment, fault in KILL_MOMENTS.items():
        counts["trials"] += 1
        folders = set(base.glob("*/"))
        last = moment == list(KILL_MOMENTS)[-1]
        status, log = forks.call(command, fault=fault | ({"trace": str(trace)} if last else {}))
        assert status == -signal.SIGKILL, f"not killed {moment}: exit status {status}\n{log[-3000:]}"
        counts["killed"] += 1
        (new,) = {p for p in base.glob("*/") if not is_temporary(p)} - folders  # (a kill before `latest` is
        # renamed leaves its temporary folder)
        if moment in AFTER_RESULTS:
            counts["files missing beside results.json"] += not files <= {p.name for p in new.iterdir()}
        else:
            counts["results.json in a killed run"] += (new / "results.json").exists()
        counts["earlier run changed"] += digest(finished) != before
        latest = base / (base / "latest").read_text().strip()
        counts["latest not complete"] += (
            not (latest / "results.json").is_file() or latest_run("equations", runs) != latest
        )
        counts["half-written files"] += sum(
            not whole(p) for p in runs.rglob("*") if p.is_file() and not is_temporary(p) and p.name != "latest"
        )
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    assert events[-1]["event"] == "os.remove" and events[-1]["path"] == str(new / PROGRESS_FILE)  # all but the end
    writes = [e["path"] for e in events if e["event"] in ("open", "tempfile.mkstemp", "tempfile.mkdtemp")]
    assert [p for p in writes if Path(p).is_relative_to(runs) and not is_temporary(p)] == []
    print(f"\nkill -9 trials of forma run equations --quick: {counts}")
    losses = {k: v for k, v in counts.items() if k not in ("trials", "killed")}
    assert counts["killed"] == len(KILL_MOMENTS)
    assert losses == dict.fromkeys(losses, 0)
