"""Transcoders for smollm2 over the real corpus, the quick profile as a user runs it: `forma transcoders smollm2
--corpus DIR --layers 0,1 --features 256` on a slice of the corpus (the json package of the standard library and
einops, tokenized by smollm2's tokenizer, held out by module), harvested and trained, then streamed past a tiny disk
budget; per layer FVU, L0 and dead share, and the loss recovered with those layers' MLPs replaced, on held-out
documents; and the same on two module-parallel ranks of torchrun, byte for byte. The model's folder is linked into a
private zoo, so that the checkout's models/smollm2 gains nothing."""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lab.analysis.transcoders.measures import reconstruction_measures
from lab.analysis.transcoders.model import Transcoders
from lab.analysis.transcoders.stream import WindowActivations
from lab.cli.parser import main
from lab.load import load_model
from lab.zoo.transcoders import corpus_windows, load_contexts, load_quality

pytestmark = pytest.mark.real

PROFILE = ["--layers", "0,1", "--features", "256", "--steps", "20", "--windows", "16", "--held-out-windows", "8"]


@pytest.mark.parametrize("route", ["harvest", "stream"])
def test_forma_transcoders_smollm2_quick_profile(zoo, corpus, route, monkeypatch, capsys):
    monkeypatch.setenv("FORMA_ZOO_DIR", str(zoo.parent))
    budget = ["--disk-budget", "0.001"] if route == "stream" else []  # 1 MB: the harvests take more
    assert main(["transcoders", "smollm2", "--corpus", str(corpus), *PROFILE, *budget, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "layer 0: FVU" in out and "layer 1: FVU" in out and "layer 2" not in out
    assert "with the MLPs of layers 0, 1 replaced" in out and f"{route}: the harvests" in out
    folder = zoo / "transcoders" / "topk"
    quality = load_quality(folder)
    assert quality["route"]["route"] == route and quality["layers"] == [0, 1]
    measures = quality["held_out"]
    assert quality["held_out_rows"] == 8 * 64 and measures["rows"] == [8 * 64] * 2
    for layer in range(2):
        assert 0 < measures["fvu"][layer] < 10 and math.isfinite(measures["fvu"][layer])
        assert 0 < measures["l0"][layer] <= 16  # top-16
        assert 0 <= measures["dead"][layer] < 1
    loss = quality["loss"]
    assert loss["replaced_layers"] == [0, 1]
    assert loss["ce_model"] < loss["ce_zero_ablated"]  # smollm2's first MLPs matter on held-out text
    assert math.isfinite(loss["recovered"])
    assert json.loads((folder / "training.json").read_text())["steps"] == 20
    assert load_contexts(folder)["values"].shape == (2, 256, 8)
    model = load_model(zoo)
    transcoders = Transcoders.load(folder, model)  # built from this model, layers 0 and 1
    assert transcoders.cfg.layers == (0, 1) and transcoders.cfg.d_model == 576
    # the measures are of the held-out documents' windows (seed 1: the training's seed + 1), and training learned:
    # the trained set explains more of each layer's output there than the untrained one it started from
    windows = corpus_windows(corpus, 8, 64, "val", seed=1)
    held_out = WindowActivations(model, windows, transcoders.cfg)
    again = reconstruction_measures(transcoders, held_out)
    assert again["fvu"] == pytest.approx(measures["fvu"], rel=1e-3)
    untrained = reconstruction_measures(Transcoders(transcoders.cfg), held_out)
    assert all(t < u for t, u in zip(again["fvu"], untrained["fvu"])), (again["fvu"], untrained["fvu"])


def test_forma_transcoders_smollm2_on_two_ranks_is_one_process_byte_for_byte(zoo, corpus, tmp_path, monkeypatch):
    """`torchrun --nproc-per-node 2 -m lab.cli transcoders smollm2 ... --parallel modules`: the ranks share the
    harvests and each trains one of the two layers; every file rank 0 writes is the one process's bytes."""
    monkeypatch.setenv("FORMA_ZOO_DIR", str(zoo.parent))
    command = ["transcoders", "smollm2", "--corpus", str(corpus), *PROFILE, "--no-progress", "--overwrite"]
    assert main(command) == 0
    out, reference = zoo / "transcoders" / "topk", tmp_path / "reference"
    shutil.move(out, reference)
    repo = Path(__file__).resolve().parents[2]
    env = os.environ | {"PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1", "FORMA_ZOO_DIR": str(zoo.parent)}
    torchrun = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc-per-node", "2"]
    done = subprocess.run(
        [*torchrun, "-m", "lab.cli", *command, "--parallel", "modules"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "(2 ranks, modules-parallel)" in done.stdout
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(p.name for p in reference.iterdir())
    for name in files:  # weights, loss curve, measures, top contexts: the bits of one process
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name
