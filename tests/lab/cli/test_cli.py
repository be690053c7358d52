"""The `forma` command line: truthful help, clear errors, exit codes."""

import json
import re
import shutil
import subprocess
import sys
import time

import pytest

from lab import HookedTransformer
from lab.cli.parser import main
from lab.folders import DEFAULT_ZOO_DIR, zoo_names
from tests.builders import TESTS, tiny_config


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "hooks" in capsys.readouterr().out


def test_hooks_lists_names_and_shapes(tmp_path, capsys):
    HookedTransformer(tiny_config()).save(tmp_path)
    assert main(["hooks", str(tmp_path), "--tokens", "5"]) == 0
    out = capsys.readouterr().out
    assert "blocks.1.attn.hook_pattern" in out and "[1, 4, 5, 5]" in out


def test_unknown_model_is_a_clear_error_with_exit_code_2(capsys):
    assert main(["hooks", "no-such-model"]) == 2
    assert "unknown model 'no-such-model'" in capsys.readouterr().err


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "lab.cli", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("forma ")


@pytest.mark.slow
def test_demo_fills_in_missing_runs_and_shows_generations(tmp_path, monkeypatch, capsys):
    """The demo's flow on a private zoo whose models (and markov's transcoders) exist already: missing runs are
    made, none twice."""
    import shutil

    import experiments
    from lab.analysis.transcoders.model import built_from, model_fingerprint
    from lab.data.tokenizers import word_level
    from tests.builders import random_transcoders

    for name in zoo_names():
        (tmp_path / "models" / name).mkdir(parents=True)
        shutil.copy(DEFAULT_ZOO_DIR / name / "model.toml", tmp_path / "models" / name / "model.toml")
        tokenizer = word_level(["Return", "the", "This", "module", "provides", "If", "file"])
        model = HookedTransformer(tiny_config(d_vocab=tokenizer.get_vocab_size()), tokenizer=tokenizer)
        model.save(tmp_path / "models" / name)
        if name == "markov":
            folder = tmp_path / "models" / name / "transcoders" / "topk"
            random_transcoders(model, activation="topk").save(folder, built_from(model_fingerprint(model), 0))
    monkeypatch.setenv("FORMA_ZOO_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("FORMA_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setattr(experiments, "experiment_names", lambda: ["equations"])
    assert main(["demo", "--no-dashboard"]) == 0
    out = capsys.readouterr().out
    assert "forma run equations --quick" in out and "pydoc generations" in out
    assert "markov's transcoders: already built" in out
    assert len(list((tmp_path / "runs" / "equations").glob("*/results.json"))) == 1
    assert main(["demo", "--no-dashboard"]) == 0
    assert "equations: a run exists" in capsys.readouterr().out


def test_a_failing_demo_job_is_reported_and_the_dashboard_keeps_serving(tmp_path, monkeypatch, capsys):
    """The dashboard serves before the jobs start; a job that fails is reported with its log's end, the
    dashboard stays up for the rest, and the demo's exit status says a job failed."""
    import experiments

    monkeypatch.setenv("FORMA_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setattr("lab.folders.is_trained", lambda name: True)
    monkeypatch.setattr(experiments, "experiment_names", lambda: ["no-such-experiment"])
    served = []  # a stand-in server: it "serves" until it ends by itself
    monkeypatch.setattr("lab.cli.demo.dashboard_command", lambda port: [sys.executable, "-c", "pass"])
    monkeypatch.setattr("lab.cli.demo.wait_until_serving", lambda url, process, timeout_s: served.append(url))
    assert main(["demo", "--port", "8765"]) == 1
    captured = capsys.readouterr()
    assert served == ["http://127.0.0.1:8765"]
    assert captured.out.index("dashboard at http://127.0.0.1:8765") < captured.out.index("no-such-experiment --quick …")
    assert "forma run no-such-experiment --quick: FAILED" in captured.err and "invalid choice" in captured.err
    assert "the dashboard keeps serving what finished" in captured.out
    assert (tmp_path / "runs" / "demo" / "run-no-such-experiment-quick.log").is_file()


def test_forma_run_prints_the_runs_headlines_then_its_folder(tmp_path, monkeypatch, capsys):
    """What a run shows is its headlines (README): `forma run` prints each supported sentence, then each claim the
    run cannot support, in words with the reason, then the folder — read back from the results.json it wrote; a
    quick run says it is one before its numbers."""
    import experiments.equations
    from lab.headlines import title
    from lab.runs import headline

    said = headline("kv_cache_cost", "Caching keeps attention linear in the prefix.", 2.0, None, True)
    unsaid = headline(
        "p_ik_verdict_partial",
        "not to be printed",
        None,
        None,
        None,
        supported=False,
        why_not="fewer than 10 wrong answers on the test split",
    )
    monkeypatch.setattr(experiments.equations, "run", lambda cfg, out: {"headlines": [said, unsaid]})
    assert main(["run", "equations", "--quick", "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "A quick run (the small profile, for tests and the demo): `forma run equations` is the full experiment.",
        "Headlines:",
        f"  - {said['sentence']}",
        "Not shown, because this run cannot support it:",
        f"  - {title('p_ik_verdict_partial')}: {unsaid['why_not']}",
        f"results in {tmp_path / 'run'}",
    ]
    assert title("p_ik_verdict_partial") == "P(IK) verdict at the partial checkpoint"


class FakeJob:
    """A `forma` job the demo starts, as CHILDREN.start returns it: it records when it ran, and what the queue
    file said about the other jobs while it ran."""

    def __init__(self, argv: list[str], log: list, seconds: dict[str, float], seen: dict):
        self.what = " ".join(argv[3:5])
        self.log, self.seconds, self.seen = log, seconds, seen

    def wait(self) -> int:
        from lab.jobs import queued

        self.log.append(("start", self.what))
        if self.what == "build pydoc":
            self.seen["calibration"] = queued("run", "calibration")
            self.seen["pydoc"] = queued("build", "pydoc")
        time.sleep(self.seconds.get(self.what, 0.05))
        self.log.append(("end", self.what))
        return 0


def test_the_demo_runs_a_job_after_the_one_whose_result_it_reads(tmp_path, monkeypatch):
    """Calibration reads the pydoc model: it waits until pydoc's training has ended, while the next job in order
    takes the free core; the queue file says so meanwhile (lab.jobs.queued, what the pages read)."""
    from lab.cli.demo import run_side_by_side
    from lab.cli.stopping import CHILDREN
    from lab.jobs import queued

    monkeypatch.setenv("FORMA_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    log: list = []
    seen: dict = {}
    monkeypatch.setattr(CHILDREN, "start", lambda argv, **popen: FakeJob(argv, log, {"build pydoc": 1.0}, seen))
    jobs = [
        ("forma run calibration --quick", ["run", "calibration", "--quick"]),
        ("forma run equations --quick", ["run", "equations", "--quick"]),
        ("forma build pydoc --quick", ["build", "pydoc", "--quick"]),
    ]
    assert run_side_by_side(jobs)
    order = [what for kind, what in log if kind == "start"]
    # not DEMO_ORDER's calibration-first: pydoc and equations take the two cores (in either order: each worker
    # thread logs its own start), calibration the first core pydoc frees
    assert set(order[:2]) == {"build pydoc", "run equations"} and order[2] == "run calibration"
    assert log.index(("start", "run calibration")) > log.index(("end", "build pydoc"))
    waiting = seen["calibration"]
    assert waiting is not None and not waiting.started and waiting.waits_for == ("forma build pydoc --quick",)
    assert waiting.ahead == 1  # pydoc's training, running; equations comes after calibration in the order
    assert "Queued by `forma demo` (1 ahead)" in waiting.sentence() and "after `forma build pydoc" in waiting.sentence()
    assert seen["pydoc"] is not None and seen["pydoc"].started
    assert queued("run", "calibration") is None  # every job has ended


def test_demo_only_names_a_demo_model_or_an_experiment(capsys):
    assert main(["demo", "--no-dashboard", "--only", "nonesuch"]) == 2
    assert "--only 'nonesuch' is neither a demo model nor an experiment" in capsys.readouterr().err


def test_the_demo_board_prints_each_running_jobs_progress_line_off_a_terminal(tmp_path, monkeypatch):
    """Off a terminal (a log, a pipe), a running job's line, read from its progress file, only where it moves on (a
    new stage, a further quarter of one), without an ETA; each job numbered of the total from the start; waiting and
    finished jobs print nothing; the same stage again, or back at an earlier step, prints nothing."""
    import io

    from lab.cli.job_board import JobBoard
    from lab.progress import PROGRESS_FILE, bar, recording

    out = io.StringIO()
    run_folder = tmp_path / "run"
    board = JobBoard(
        [
            ("forma run kl --quick", ["run", "kl", "--quick", "--out", str(run_folder)]),
            ("forma build facts", ["build", "facts"]),
        ],
        stream=out,
    )
    board.started("forma run kl --quick")
    monkeypatch.setattr("lab.progress.RECORD_EVERY_S", 0.05)
    with recording(run_folder / PROGRESS_FILE, "forma run kl --quick"), bar(40, "train", show=False) as b:
        b.update(10)
        deadline = time.monotonic() + 10
        while "step 10/40" not in board.status("forma run kl --quick") and time.monotonic() < deadline:
            time.sleep(0.02)
        board.draw()
        board.draw()  # nothing new
        b.n = 5  # back at an earlier step (a count that restarts): nothing
        time.sleep(0.2)
        board.draw()
    lines = out.getvalue().splitlines()
    assert lines[0] == "[demo] forma run kl --quick … (job 1 of 2)"
    assert len(lines) == 2, lines
    assert re.fullmatch(r"\[demo\] forma run kl --quick: 0:0[0-9] elapsed; train step 10/40 \(25%\)", lines[1]), lines


@pytest.mark.parametrize("case", ["a file", "a finished run", "under a file"])
def test_an_unusable_out_folder_is_a_clear_error_and_nothing_is_written(tmp_path, capsys, case):
    target = tmp_path / "taken"
    if case == "a file":
        target.write_text("keep me\n")
        expected = "is a file"
    elif case == "a finished run":
        target.mkdir()
        (target / "results.json").write_text("{}\n")
        expected = "already holds a finished run"
    else:
        target.write_text("keep me\n")
        target = target / "run"
        expected = "cannot create the run folder"
    before = sorted((p.name, p.read_bytes() if p.is_file() else None) for p in tmp_path.rglob("*"))
    assert main(["run", "equations", "--quick", "--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert expected in err and str(target) in err and "Traceback" not in err
    assert sorted((p.name, p.read_bytes() if p.is_file() else None) for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("tokens, message", [("65", "longer than the model's context n_ctx = 64"), ("0", "at least 1")])
def test_hooks_refuses_a_probe_length_outside_the_context(tmp_path, capsys, tokens, message):
    HookedTransformer(tiny_config()).save(tmp_path)  # n_ctx = 64
    assert main(["hooks", str(tmp_path), "--tokens", tokens]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("command", ["dashboard", "demo"])
@pytest.mark.parametrize("port", ["99999", "0", "http"])
def test_a_bad_port_is_refused_before_anything_starts(capsys, command, port):
    with pytest.raises(SystemExit) as exit:
        main([command, "--port", port])
    assert exit.value.code == 2 and "--port" in capsys.readouterr().err


HEAVY_MODULES = ("torch", "transformer_lens", "transformers", "numpy", "streamlit")


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["run", "--help"],
        ["build", "--help"],
        ["cards", "--help"],
        ["transcoders", "--help"],
        ["graphs", "--help"],
        ["graphs", "markov"],
        ["harvest", "--help"],
        ["patch", "--help"],
        ["questions", "--help"],
        ["questions", "--seed", "-1"],
        ["corpus", "--help"],
        ["corpus", "real", "--held-out", "1.5"],
        ["patch", "m", "--sweep", "x"],
        ["run", "no-such-experiment"],
        ["build", "markov", "--seed"],
        ["--version"],
        ["hooks", "gpt2"],
        ["hooks", "no/such/folder"],
        ["trust", "gpt2"],
        ["run", "kl", "--model", "gpt2"],
        ["run", "calibration", "--model", "gpt2", "--mmlu", "mmlu.csv"],
        ["run", "calibration", "--model", str(TESTS), "--mmlu", "no/such.csv"],
        ["run", "monitor", "--model", str(TESTS), "--qa", "no/such.csv"],
    ],
    ids=lambda argv: " ".join(argv),
)
def test_help_and_argument_errors_import_nothing_heavy(argv):
    """`forma --help`, every subcommand's help, an argument error (an option the experiment does not take) and a
    model name that is neither a folder nor a zoo model (`forma hooks`, `forma trust`, `forma run --model`), and a
    question file that is not there (the model a folder: tests/), answer before torch, TransformerLens, numpy or
    streamlit are imported: those take seconds to load, and only the commands that compute need them.
    (benchmarks/cli.py measures how long each answer takes.)"""
    probe = (
        "import sys, runpy\n"
        f"sys.argv = ['forma', *{argv!r}]\n"
        "try:\n"
        "    runpy.run_module('lab.cli', run_name='__main__')\n"
        "except SystemExit as exit:\n"
        "    code = exit.code\n"
        f"heavy = [m for m in {HEAVY_MODULES!r} if m in sys.modules]\n"
        "print('HEAVY', heavy, file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert "HEAVY []" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert done.stdout or "error:" in done.stderr  # it answered: help, the version, or an argparse error


def test_the_lazy_top_level_names_are_the_models():
    import lab
    import lab.model

    assert lab.HookedTransformer is lab.model.transformer.HookedTransformer
    assert lab.KVCache is lab.model.kv_cache.KVCache
    assert sorted(lab.__all__) == sorted(name for name in lab.__all__ if hasattr(lab, name))
    with pytest.raises(AttributeError, match="module 'lab' has no attribute 'NoSuchThing'"):
        _ = lab.NoSuchThing


def test_the_demo_board_redraws_one_line_per_job_in_place_on_a_terminal():
    import io

    from lab.cli.job_board import JobBoard

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    board = JobBoard(
        [("forma run kl --quick", ["run", "kl", "--quick"]), ("forma build facts", ["build", "facts"])], stream=out
    )
    board.draw()
    board.draw()
    board.ended("forma build facts", "forma build facts: done in 3 s", "[demo] forma build facts: done in 3 s")
    rows = "\x1b[2K[demo] forma run kl --quick: waiting for a free core\n\x1b[2K[demo] forma build facts: "
    assert out.getvalue() == (
        rows
        + "waiting for a free core\n"
        + "\x1b[2F\x1b[0J"
        + rows
        + "waiting for a free core\n"
        + "\x1b[2F\x1b[0J"
        + "[demo] forma build facts: done in 3 s\n"
        + rows
        + "done in 3 s\n"
    )


def test_a_quick_train_never_replaces_a_model_of_the_full_recipe(tmp_path, monkeypatch, capsys):
    """`forma build markov --quick` over a model of the full recipe (card.json "quick": false) is refused with one
    line that names --replace and another zoo, exit 2, and the model's files as they were."""

    folder = tmp_path / "markov"
    folder.mkdir()
    shutil.copy(DEFAULT_ZOO_DIR / "markov" / "model.toml", folder / "model.toml")
    (folder / "model.safetensors").write_bytes(b"the full model")
    (folder / "card.json").write_text(json.dumps({"name": "markov", "quick": False}))
    monkeypatch.setenv("FORMA_ZOO_DIR", str(tmp_path))
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    assert main(["build", "markov", "--quick", "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert "full recipe" in error and "--replace" in error and "FORMA_ZOO_DIR" in error, error
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before


def test_the_demo_trains_markovs_transcoders_after_markov_so_the_graphs_page_is_filled(tmp_path, monkeypatch):
    """The attribution-graphs page draws a model with transcoders: the demo queues markov's (small) once markov's
    build has ended, and says so instead when they exist."""
    import shutil

    from lab.cli.demo import DEMO_ORDER, missing_jobs
    from lab.jobs import NEEDS

    zoo_copy = tmp_path / "models"
    (zoo_copy / "markov").mkdir(parents=True)
    shutil.copy(DEFAULT_ZOO_DIR / "markov" / "model.toml", zoo_copy / "markov" / "model.toml")
    monkeypatch.setenv("FORMA_ZOO_DIR", str(zoo_copy))
    monkeypatch.setenv("FORMA_RUNS_DIR", str(tmp_path / "runs"))
    jobs = [argv for _, argv in missing_jobs({"markov"}, quick=True)]
    assert jobs[0] == ["build", "markov", "--quick"] and jobs[1][:2] == ["transcoders", "markov"]
    assert NEEDS["transcoders markov"] == ("build markov",) and "transcoders markov" in DEMO_ORDER
    from lab.cli.parser import build_parser

    build_parser().parse_args(jobs[1])  # an unknown flag would exit 2 here
    (zoo_copy / "markov" / "transcoders" / "topk").mkdir(parents=True)
    (zoo_copy / "markov" / "transcoders" / "topk" / "transcoders.safetensors").write_bytes(b"")
    assert [argv[0] for _, argv in missing_jobs({"markov"}, quick=True)] == ["build"]


def _differences(before: object, after: object, prefix: str = "") -> dict[str, tuple[object, object]]:
    """Every entry two resolved configs (or profiles) differ in, a dataclass's fields and a dict's keys one by one,
    with its two values; a key one side lacks is said as the kl recipe's help says it."""
    import dataclasses

    def table(value: object) -> dict:
        if dataclasses.is_dataclass(value):
            return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return value if isinstance(value, dict) else {}

    a, b = table(before), table(after)
    out: dict[str, tuple[object, object]] = {}
    for key in a | b:
        if isinstance(a.get(key), dict) or isinstance(b.get(key), dict):
            out |= _differences(a.get(key, {}), b.get(key, {}), f"{prefix}{key}.")
        elif a.get(key, "recipe") != b.get(key, "recipe"):
            out[f"{prefix}{key}"] = (a.get(key, "recipe"), b.get(key, "recipe"))
    return out


def _help_sections(out: str) -> dict[str, list[str]]:
    """`forma run NAME --help`'s "--quick in …" sections: each header's lines."""
    sections: dict[str, list[str]] = {}
    for block in out.split("\n--quick in ")[1:]:
        header, *lines = block.splitlines()
        sections[header] = [line.strip() for line in lines if line.startswith("  ")]
    return sections


@pytest.mark.parametrize("name", ["kl", "hallucination", "calibration", "monitor", "equations", "scoreboard"])
def test_forma_run_name_help_says_everything_quick_changes_from_the_profiles(name, capsys):
    """`forma run NAME --help` prints the run's options, then what --quick changes, read from the experiment's
    profiles (experiments.quick_changes), and what it changes in the real-model track apart. Every difference
    between the resolved default and quick runs — the Config's fields, its profile's entries, and with `--model`
    the real-model track's — is one of those lines, with both values: a change the profiles do not declare fails."""
    import experiments

    assert set(experiments.experiment_names()) == {
        "kl",
        "hallucination",
        "calibration",
        "monitor",
        "equations",
        "scoreboard",
    }  # each is a case here
    with pytest.raises(SystemExit) as done:
        main(["run", name, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    sections = _help_sections(out)
    config = experiments.load(name).Config
    tracks = {f"{name} (default → quick):": {}}
    if "model" in experiments.experiment(name).options:
        tracks[f"{name}'s real-model track (--model) (default → quick):"] = {"model": "smollm2"}
    assert "--quick" in out and set(sections) == set(tracks)
    every_line = [line for lines in sections.values() for line in lines]
    for header, model in tracks.items():
        default, quick = config(**model), config(quick=True, **model)
        profile = "real_profile" if model else "profile"
        declared = _differences(getattr(default, profile), getattr(quick, profile))
        resolved = {k: v for k, v in _differences(default, quick).items() if k != "quick"}
        for changes, lines in ((declared, sections[header]), (resolved, every_line)):
            for key, (before, after) in changes.items():
                line = f"{key}: {'as the recipe has it' if before == 'recipe' else repr(before)} → {after!r}"
                assert line in lines, f"{header} lacks {line!r}"
        assert declared or sections[header] == ["nothing: it has one size"]
    if name == "calibration":  # a field the quick profile sets, said with both values
        assert f"steps: {config().steps!r} → {config(quick=True).steps!r}" in sections["calibration (default → quick):"]
    if name == "scoreboard":  # a profile's dict entry, key by key
        default, quick = config().profile, config(quick=True).profile
        assert f"steps.facts: {default.steps['facts']!r} → {quick.steps['facts']!r}" in out
    if name == "monitor":  # the real-model track's own size, in its own section
        assert "n_questions: 300 → 120" in sections["monitor's real-model track (--model) (default → quick):"]


def test_the_installed_forma_command_answers():
    """The `forma` a user types is the console script pyproject.toml installs beside this Python (its entry point
    must name where main lives), not `python -m lab.cli`."""
    from pathlib import Path

    script = shutil.which("forma", path=str(Path(sys.executable).parent))
    assert script, f"no forma script beside {sys.executable}: pip install -e ."
    done = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("forma "), done.stdout + done.stderr
