"""Fault trials for `forma build`: every recipe kind built, killed with SIGKILL at seeded random moments
(by the clock, during a checkpoint write, during the final publish), and resumed; and stopped by SIGINT
and SIGTERM. What was lost is counted, and must be nothing: the previous complete model is in place and
loadable at every kill, no file under a final name is half-written, and every resumed build equals an
uninterrupted one bit for bit (weights, and the card's losses and metrics.jsonl, wall times aside).

The runs are the quick recipes in a private zoo, shortened further (fewer steps, a checkpoint every few)
so that the trials fit in a minute or two; they are forked from one process that has imported Forma
(tests/fault_zygote.py), except the SIGTERM run, which is a fresh `python -m lab.cli`."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections import Counter
from pathlib import Path

import pytest
from safetensors.torch import load_file

from lab.folders import DEFAULT_ZOO_DIR
from lab.train.checkpoint import CHECKPOINT_FILES
from lab.zoo.builds import NEXT_LINK
from tests.builders import REPO
from tests.fault_zygote import ENV, Forks

SEED = 16  # seeds the kill moments
# Shorter quick recipes: the same code paths on less data, a checkpoint every few steps, seconds a build.
SHORTER = {
    "markov": {
        "train": {"steps": 16, "warmup_steps": 4, "eval_interval": 8, "checkpoint_interval": 3, "batch_size": 32}
    },
    "facts": {
        "train": {"steps": 16, "warmup_steps": 4, "eval_interval": 8, "checkpoint_interval": 3, "batch_size": 32}
    },
    "pydoc": {
        "world": {"vocab_size": 300, "max_train_chars": 50_000, "held_out_fraction": 0.01},
        "train": {"steps": 10, "warmup_steps": 3, "eval_interval": 5, "checkpoint_interval": 3, "seq_len": 64},
    },
    "dates": {
        "world": {"n_train": 2000, "n_held_out": 100},
        "train": {"steps": 24, "warmup_steps": 4, "eval_interval": 12, "checkpoint_interval": 5, "batch_size": 32},
    },
}
# Kills per recipe: by the clock, and at a file operation of a checkpoint write and of the final publish.
TRIALS = {
    "markov": ("clock", "clock", "checkpoint", "publish"),
    "facts": ("clock", "checkpoint", "publish"),
    "pydoc": ("clock", "checkpoint", "publish"),
    "dates": ("clock", "checkpoint", "publish"),
}


def toml_text(tables: dict) -> str:
    """A recipe as TOML (tables of strings, numbers, booleans and lists of strings are all recipes hold)."""

    def value(v):
        return json.dumps(v) if not isinstance(v, bool) else str(v).lower()

    lines = []

    def table(prefix, content):
        scalars = {k: v for k, v in content.items() if not isinstance(v, dict)}
        if scalars or not prefix:
            lines.append(f"[{prefix}]" if prefix else "")
            lines.extend(f"{k} = {value(v)}" for k, v in scalars.items())
        for k, v in content.items():
            if isinstance(v, dict):
                table(f"{prefix}.{k}" if prefix else k, v)

    table("", tables)
    return "\n".join(lines) + "\n"


def private_zoo(root: Path, corpus: Path) -> Path:
    """The SHORTER recipes, with pydoc's corpus cache (tests/conftest.py::stdlib_corpus) in place."""
    for name, shorter in SHORTER.items():
        recipe = tomllib.loads((DEFAULT_ZOO_DIR / name / "model.toml").read_text())
        for table, overrides in shorter.items():
            recipe.setdefault("quick", {}).setdefault(table, {}).update(overrides)
        (root / name).mkdir(parents=True)
        (root / name / "model.toml").write_text(toml_text(recipe))
    shutil.copy(corpus, root / "pydoc" / "corpus.txt")
    return root


class ZooForks(Forks):
    """Children of the fork server (tests/fault_zygote.py), every one on the private zoo `zoo_dir`."""

    def __init__(self, zygote, zoo_dir: Path, logs: Path) -> None:
        super().__init__(zygote, logs, {"FORMA_ZOO_DIR": str(zoo_dir)})
        self.zoo_dir = zoo_dir


def timeless(record: dict) -> dict:
    """A card or metrics record without what measures wall time or the machine."""
    return {k: v for k, v in record.items() if not (k.endswith("_s") or k == "provenance")}


def published(folder: Path) -> dict | None:
    """What a reader of models/NAME sees: every published file (card and metrics without wall times);
    None when no model is published. Loading it as a model must work whenever it exists."""
    if not (folder / "model.safetensors").is_file():
        return None
    from lab.load import is_encoder_decoder
    from lab.model.encoder_decoder import EncoderDecoder
    from lab.model.transformer import HookedTransformer

    (EncoderDecoder if is_encoder_decoder(folder) else HookedTransformer).load(folder)
    view = {}
    for path in sorted(folder.iterdir()):
        if path.name.startswith(".") or path.name == "model.toml":
            continue
        if path.name == "card.json":
            view[path.name] = timeless(json.loads(path.read_text()))
        elif path.name == "train":
            view["metrics"] = [timeless(json.loads(line)) for line in (path / "metrics.jsonl").read_text().splitlines()]
        else:
            view[path.name] = path.read_bytes()
    return view


def half_written(folder: Path) -> list[str]:
    """Files under a final name (not a temporary one) that do not parse, and checkpoints missing a file."""
    bad = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if ".tmp" not in d]
        root = Path(root)
        if root.name in ("checkpoint", ".checkpoint.old"):
            bad += [f"{root}: no {name}" for name in CHECKPOINT_FILES if not (root / name).is_file()]
        for name in files:
            path = root / name
            if ".tmp" in name or not path.exists():
                continue
            try:
                if name.endswith(".safetensors"):
                    load_file(str(path))
                elif name.endswith(".json"):
                    json.loads(path.read_text())
                elif name.endswith(".jsonl"):
                    [json.loads(line) for line in path.read_text().splitlines()]
            except Exception as err:  # any failure to parse is what this counts
                bad.append(f"{path}: {err}")
    return bad


def kill_points(trace: Path) -> dict[str, list[int]]:
    """Watched file operations of a build, by phase: those of checkpoint writes, and those of the final
    publish (everything after the new card.json is renamed into its build)."""
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    card = max(e["n"] for e in events if e["event"] == "os.rename" and e["path"].endswith("card.json"))
    return {
        "checkpoint": [e["n"] for e in events if "checkpoint" in e["path"] and e["n"] < card],
        "publish": [e["n"] for e in events if e["n"] > card],
    }


@pytest.fixture(scope="module")
def zygote(tmp_path_factory, fault_zygote, stdlib_corpus):
    root = tmp_path_factory.mktemp("fault-trials")
    return ZooForks(fault_zygote, private_zoo(root / "zoo", stdlib_corpus), root)


@pytest.mark.slow
def test_killed_builds_lose_nothing_and_resume_to_the_same_bits(zygote):
    rng = random.Random(SEED)
    lost = Counter()
    trials = Counter()
    for name, kinds in TRIALS.items():
        folder = zygote.zoo_dir / name
        train = ["build", name, "--quick", "--no-progress"]
        # A kill of the very first build, with no previous model: nothing may be published until it completes.
        pid, _ = zygote.run(train)
        first_clock = rng.uniform(0.5, 2.0)
        time.sleep(first_clock)
        os.kill(pid, signal.SIGKILL)
        if zygote.wait(pid) != 0:
            lost["published a model before it was complete"] += published(folder) is not None
        lost["half-written files"] += len(half_written(folder))
        status, log = zygote.call(train + ["--resume"] if (folder / NEXT_LINK).is_symlink() else train)
        assert status == 0, log
        reference = published(folder)
        # The uninterrupted build to compare with, traced to find the kill points.
        began = time.perf_counter()
        status, log = zygote.call(train, fault={"trace": str(zygote.logs / f"{name}.trace")})
        seconds = time.perf_counter() - began
        assert status == 0, log
        assert published(folder) == reference, f"{name}: a resumed build differs from an uninterrupted one"
        points = kill_points(zygote.logs / f"{name}.trace")
        for kind in kinds:
            if kind == "clock":
                pid, _ = zygote.run(train)
                time.sleep(rng.uniform(0.05, 0.95) * seconds)
                os.kill(pid, signal.SIGKILL)
            else:
                pid, _ = zygote.run(train, fault={"kill": rng.choice(points[kind])})
            status = zygote.wait(pid)
            trials[kind] += 1
            trials["finished before the kill"] += status == 0
            lost["previous model not in place"] += published(folder) != reference
            bad = half_written(folder)
            lost["half-written files"] += len(bad)
            pending = (folder / NEXT_LINK).is_symlink()
            status, log = zygote.call(train + ["--resume"])
            if pending:
                lost["resume failed"] += status != 0
            else:  # finished (or never began) before the kill: nothing to resume, and it says so
                lost["resume failed"] += status != 2 or "nothing to resume" not in log
            lost["resumed build differs"] += published(folder) != reference
            assert not bad, bad
    print(
        f"\nfault trials: {sum(trials[k] for k in ('clock', 'checkpoint', 'publish'))} kills after a complete "
        f"model + {len(TRIALS)} of a first build; by kind {dict(trials)}; lost {dict(lost) or 'nothing'}"
    )
    assert sum(trials[k] for k in ("clock", "checkpoint", "publish")) >= 10
    assert sum(lost.values()) == 0, dict(lost)


@pytest.mark.slow
def test_sigint_and_sigterm_stop_at_the_step_with_a_checkpoint_and_resume_to_the_same_bits(zygote, tmp_path):
    name, folder = "markov", zygote.zoo_dir / "markov"
    train = ["build", name, "--quick", "--no-progress"]
    if published(folder) is None:
        assert zygote.call(train)[0] == 0
    reference = published(folder)
    # The signal comes while step 5 appends its metrics line (the 1st operation on metrics.jsonl is its
    # creation, renamed in from its temporary folder, whose file is not counted): the loop must stop after step 5,
    # the step in flight, with a checkpoint of it.
    at_step_5 = {"match": "/train/metrics.jsonl", "at": 6}
    status, log = zygote.call(train, fault=at_step_5 | {"signal": "SIGINT"})
    stopped = [line for line in log.splitlines() if line.startswith("forma build:")]
    assert status == 128 + signal.SIGINT, log
    assert stopped == [
        f"forma build: interrupted by SIGINT at step 5/16; checkpoint saved in "
        f"{(folder / NEXT_LINK).resolve() / 'train' / 'checkpoint'}; "
        f"continue with `forma build markov --quick --resume`"
    ], log
    assert json.loads((folder / NEXT_LINK / "train" / "checkpoint" / "train_state.json").read_text())["step"] == 5
    assert published(folder) == reference and not half_written(folder)
    assert zygote.call(train + ["--resume"])[0] == 0
    assert published(folder) == reference

    # SIGTERM, to a fresh `python -m lab.cli` (the fault planted by the same audit hook).
    plant = f"from tests import fault_zygote; fault_zygote.plant({at_step_5 | {'signal': 'SIGTERM'}!r})"
    command = [sys.executable, "-c", f"{plant}; import runpy; runpy.run_module('lab.cli', run_name='__main__')", *train]
    done = subprocess.run(
        command,
        cwd=REPO,
        env=os.environ | ENV | {"FORMA_ZOO_DIR": str(zygote.zoo_dir), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 128 + signal.SIGTERM, done.stderr[-3000:]
    assert "interrupted by SIGTERM at step 5/16" in done.stderr and "--resume`" in done.stderr
    assert published(folder) == reference and not half_written(folder)
    assert zygote.call(train + ["--resume"])[0] == 0
    assert published(folder) == reference
