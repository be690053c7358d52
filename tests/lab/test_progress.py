"""Progress of long operations (lab.progress): the log line's format, a bar's lines without a terminal, the
progress file a job writes and the readers the dashboard and `forma demo` use."""

import io
import json
import os
import re
import time

import pytest

import lab.progress as progress
from lab.jobs import run_progress
from lab.progress import PROGRESS_FILE, Progress, Stage, bar, clock, read_progress, recording

LINE = re.compile(r"train: step (\d+)/10 \((\d+)%\) · \d+:\d\d elapsed(?: · ETA \d+:\d\d)?(?: · loss=\S+)?")


def test_clock_writes_minutes_and_hours():
    assert [clock(s) for s in (0, 14.4, 102, 3600, 3725)] == ["0:00", "0:14", "1:42", "1:00:00", "1:02:05"]


def test_a_stage_line_says_step_total_elapsed_and_eta():
    stage = Stage("train", 120, 1000, "step", elapsed_s=14.2, eta_s=101.7, postfix="loss=2.3456")
    assert stage.line() == "train: step 120/1000 (12%) · 0:14 elapsed · ETA 1:42 · loss=2.3456"
    assert Stage("train", 1000, 1000, "step", 90.0, 0.0).line() == "train: step 1000/1000 (100%) · 1:30 elapsed"
    assert Stage("activations", 64, None, "seq", 3.0, None).line() == "activations: seq 64 · 0:03 elapsed"


def test_a_bar_off_a_terminal_writes_a_line_at_each_tenth_and_at_the_end():
    log = io.StringIO()  # not a terminal, like a demo job's log
    with bar(10, "train", stream=log) as b:
        for _ in range(7):
            b.update(1)
            b.set_postfix(loss="2.5000")
    lines = log.getvalue().splitlines()
    assert [int(LINE.fullmatch(line)[1]) for line in lines] == list(range(1, 8)), lines
    assert lines[-1].endswith("loss=2.5000") and "\r" not in log.getvalue()


def test_a_bar_not_shown_writes_nothing_but_is_the_current_stage():
    log = io.StringIO()
    with bar(4, "train", stream=log, show=False) as b:
        b.update(3)
        stage = progress.current_stage()
        assert (stage.label, stage.step, stage.total) == ("train", 3, 4) and stage.eta_s is not None
    assert log.getvalue() == "" and progress.current_stage() is None


def test_the_eta_is_the_rate_so_far_times_what_is_left(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    b = bar(100, "train", initial=20, show=False)  # resumed at step 20: only this run's steps set the rate
    now[0] += 30.0
    b.update(10)
    stage = b.snapshot()
    b.close()
    assert stage.elapsed_s == 30.0 and stage.eta_s == pytest.approx(30.0 * 70 / 10)


def test_a_job_records_its_progress_file_then_done_and_echoes_lines(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "RECORD_EVERY_S", 0.05)
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.05)
    path, log = tmp_path / PROGRESS_FILE, io.StringIO()
    with recording(path, "forma run kl --quick", echo=True, stream=log):
        with bar(8, "train", show=False) as b:
            b.update(2)
            deadline = time.monotonic() + 10
            while (read_progress(path) is None or read_progress(path).stage is None) and time.monotonic() < deadline:
                time.sleep(0.02)
            seen = read_progress(path)
    assert seen.state == "running" and seen.pid == os.getpid() and seen.active
    assert (seen.stage.label, seen.stage.step, seen.stage.total) == ("train", 2, 8)
    assert seen.line().startswith("forma run kl --quick: 0:00 elapsed; train step 2/8 (25%), ETA ")
    assert read_progress(path).state == "done"
    lines = log.getvalue().splitlines()
    assert any(line.startswith("forma run kl --quick: 0:00 elapsed; train step 2/8 (25%)") for line in lines), lines
    assert lines[-1] == "forma run kl --quick: 0:00 elapsed; writing its results"


def test_a_failed_job_says_why_and_a_vanished_one_reads_stopped(tmp_path):
    path = tmp_path / PROGRESS_FILE
    with pytest.raises(ValueError), recording(path, "forma run kl --quick"):
        raise ValueError("no such model 'x'\nsecond line")
    failed = read_progress(path)
    assert (failed.state, failed.error, failed.active) == ("failed", "ValueError: no such model 'x'", False)
    record = json.loads(path.read_text()) | {"state": "running", "updated": time.time() - progress.STALE_S - 1}
    path.write_text(json.dumps(record))
    assert read_progress(path).state == "stopped"
    path.write_text("{cut sh")
    assert read_progress(path) is None


def test_run_progress_is_the_newest_unfinished_run_newer_than_every_finished_one(tmp_path):
    def job(stamp: str, finished: bool) -> None:
        folder = tmp_path / "kl" / stamp
        with recording(folder / PROGRESS_FILE, f"run {stamp}"):
            pass
        record = json.loads((folder / PROGRESS_FILE).read_text()) | {"state": "running", "updated": time.time()}
        (folder / PROGRESS_FILE).write_text(json.dumps(record))
        if finished:
            (folder / "results.json").write_text("{}")

    assert run_progress("kl", tmp_path) is None
    job("2026-01-01T00-00-00Z", finished=False)
    job("2026-01-02T00-00-00Z", finished=True)
    assert run_progress("kl", tmp_path) is None  # an older unfinished run is not this page's job
    job("2026-01-03T00-00-00Z", finished=False)
    assert run_progress("kl", tmp_path).job == "run 2026-01-03T00-00-00Z"


def test_a_progress_record_is_validated():
    with pytest.raises(ValueError, match="state must be one of"):
        Progress("forma run kl", "sleeping", 1, "2026-01-01T00:00:00Z", 1.0, 0.0)
    with pytest.raises(ValueError, match="must be ≥ 0"):
        Stage("train", -1, 10, "step", 0.0, None)


def test_forma_train_off_a_terminal_logs_readable_progress_lines(tmp_path, monkeypatch, capsys):
    """What a `forma demo` job's log gets: `forma build NAME` with stderr not a terminal writes step / total,
    elapsed and ETA lines (no carriage returns), and leaves no progress file once the model is published."""
    from lab.cli.parser import main
    from tests.builders import TINY_MARKOV, write_recipe

    monkeypatch.setenv("FORMA_ZOO_DIR", str(tmp_path))
    write_recipe(tmp_path, "tiny", TINY_MARKOV)
    assert main(["build", "tiny"]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("train: ")]
    assert "\r" not in err and lines, err
    steps = [int(re.match(r"train: step (\d+)/6 \(\d+%\) · \d+:\d\d elapsed", line)[1]) for line in lines]
    assert steps == sorted(steps) and steps[-1] == 6
    assert all("ETA" in line for line in lines[:-1] if not line.startswith("train: step 6/6"))
    assert not (tmp_path / "tiny" / PROGRESS_FILE).exists()
