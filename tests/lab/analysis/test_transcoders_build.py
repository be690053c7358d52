"""lab.zoo.transcoders and `forma transcoders`: transcoders for a zoo model, end to end."""

import json
import shutil

import numpy as np
import pytest
import torch

from lab.cli.parser import TRANSCODER_KINDS, main
from lab.data.real_corpus import FORMAT
from lab.folders import DEFAULT_ZOO_DIR
from lab.zoo.transcoders import (
    PRESETS,
    corpus_windows,
    load_contexts,
    load_quality,
    model_windows,
    transcoder_sets,
    world_windows,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_forma_transcoders_trains_measures_and_keeps_them_with_their_contexts(markov_zoo, capsys):
    assert (
        main(
            [
                "transcoders",
                "markov",
                "--kind",
                "jumprelu",
                "--steps",
                "20",
                "--windows",
                "32",
                "--features",
                "48",
                "--no-progress",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "layer 1: FVU" in out and "loss recovered" in out
    # the fixture's model is untrained: zero-ablating its MLPs does not raise the loss, so no share is printed
    assert "nan" not in out and "undefined: zero-ablating them does not raise the loss" in out
    assert transcoder_sets(markov_zoo) == ["jumprelu"]
    folder = markov_zoo / "transcoders" / "jumprelu"
    quality = load_quality(folder)
    assert len(quality["held_out"]["fvu"]) == 2 and quality["transcoders"]["d_features"] == 48
    contexts = load_contexts(folder)
    assert contexts["values"].shape == (2, 48, 8) and contexts["windows"].shape == (32, 16)  # windows: n_ctx long
    assert not list(markov_zoo.glob("transcoders/.*"))  # the harvests are gone


def test_an_untrained_model_is_one_clear_line(markov_zoo, capsys):
    (markov_zoo / "model.safetensors").unlink()
    assert main(["transcoders", "markov"]) == 2
    assert "not trained yet: run `forma build markov` first" in capsys.readouterr().err


def test_the_command_lines_kinds_are_the_presets():
    assert tuple(PRESETS) == TRANSCODER_KINDS


def test_windows_come_from_the_models_own_world(markov_zoo):
    windows = world_windows(markov_zoo, 5, 64)
    assert windows.shape == (5, 16) and int(windows.max()) < 32


def test_forma_transcoders_says_where_it_is_from_first_to_last(markov_zoo, capsys):
    """With progress (off a terminal: lines), every stage says itself as it begins — the windows and harvest, the
    training's steps counted, the measuring, the top contexts — so the command is never silent for long."""
    argv = ["transcoders", "markov", "--kind", "topk", "--steps", "20", "--windows", "32", "--features", "48"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    stages = ["the world's windows", "transcoders: train: step 20/20", "measuring them", "top contexts"]
    places = [err.find(stage) for stage in stages]
    assert all(p >= 0 for p in places) and places == sorted(places), err


def write_corpus_folder(folder, train, held_out):
    """A corpus folder as `forma corpus real` writes it, of the given streams (its manifest's format alone)."""
    folder.mkdir(parents=True)
    np.save(folder / "train.npy", np.asarray(train, dtype=np.uint16))
    np.save(folder / "held_out.npy", np.asarray(held_out, dtype=np.uint16))
    (folder / "manifest.json").write_text(json.dumps({"format": FORMAT}))
    return folder


def test_corpus_windows_are_seeded_draws_of_each_split(tmp_path, markov_zoo):
    corpus = write_corpus_folder(tmp_path / "corpus", np.arange(1000), 5000 + np.arange(300))
    train = corpus_windows(corpus, 8, 16, "train", seed=3)
    assert train.shape == (8, 16) and train.dtype == torch.int64
    assert all(int(w[0]) < 1000 and (w == w[0] + torch.arange(16)).all() for w in train)  # whole slices of train.npy
    assert len({int(w[0]) for w in train}) == 8  # no start twice
    assert (corpus_windows(corpus, 8, 16, "train", seed=3) == train).all()
    assert not (corpus_windows(corpus, 8, 16, "train", seed=4) == train).all()
    held_out = corpus_windows(corpus, 8, 16, "val", seed=3)
    assert int(held_out.min()) >= 5000  # the held-out documents' stream alone
    with pytest.raises(ValueError, match="too few for 400 windows"):
        corpus_windows(corpus, 400, 16, "val")
    # a zoo model trained here keeps its world's windows, whatever corpus exists
    assert (model_windows(markov_zoo, 5, 64, seed=1) == world_windows(markov_zoo, 5, 64, seed=1)).all()
    assert (model_windows(markov_zoo, 5, 16, seed=1, corpus=corpus) == corpus_windows(corpus, 5, 16, seed=1)).all()


@pytest.fixture
def pretrained_zoo(tmp_path, monkeypatch):
    """A private zoo holding smollm2's recipe alone (no weights: the refusals come before any model is read)."""
    folder = tmp_path / "models" / "smollm2"
    folder.mkdir(parents=True)
    shutil.copy(DEFAULT_ZOO_DIR / "smollm2" / "model.toml", folder / "model.toml")
    monkeypatch.setenv("FORMA_ZOO_DIR", str(tmp_path / "models"))
    return folder


def test_a_pretrained_model_without_a_corpus_is_one_clear_line(pretrained_zoo, tmp_path, capsys):
    assert main(["transcoders", "smollm2"]) == 2
    assert "smollm2 is pretrained: give the corpus its transcoders read, --corpus DIR" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "manifest.json").write_text(json.dumps({"format": "something-else"}))
    write_corpus_folder(tmp_path / "half", [1, 2, 3], [4, 5]).joinpath("held_out.npy").unlink()
    for folder, says in (
        ("nowhere", "is not a folder"),
        ("empty", "holds no manifest.json"),
        ("other", f"is not a {FORMAT} manifest"),
        ("half", "holds no held_out.npy"),
    ):
        assert main(["transcoders", "smollm2", "--corpus", str(tmp_path / folder)]) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1, err


def test_a_model_trained_here_refuses_a_corpus(markov_zoo, tmp_path, capsys):
    corpus = write_corpus_folder(tmp_path / "corpus", np.arange(100), np.arange(100))
    assert main(["transcoders", "markov", "--corpus", str(corpus)]) == 2
    assert "markov was trained here and reads its own world" in capsys.readouterr().err


def test_forma_transcoders_of_some_layers_measures_and_replaces_those_alone(markov_zoo, capsys):
    """--layers 1 (the quick profile's way): one layer's transcoders, harvested, trained and measured alone; the
    loss recovered replaces that layer's MLP, and quality.json says which; attribution graphs do not list the set."""
    argv = ["transcoders", "markov", "--layers", "1", "--steps", "10", "--windows", "16", "--features", "32"]
    assert main([*argv, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "layer 1: FVU" in out and "layer 0" not in out and "with the MLPs of layers 1 replaced" in out
    folder = markov_zoo / "transcoders" / "topk"
    quality = load_quality(folder)
    assert quality["layers"] == [1] and quality["loss"]["replaced_layers"] == [1]
    assert len(quality["held_out"]["fvu"]) == 1 and quality["transcoders"]["layers"] == [1]
    assert load_contexts(folder)["values"].shape == (1, 32, 8)
    assert transcoder_sets(markov_zoo) == ["topk"] and transcoder_sets(markov_zoo, graphs=True) == []
    assert main(["transcoders", "markov", "--layers", "0,1", "--steps", "10", "--windows", "16", "--no-progress"]) == 0
    assert load_quality(folder)["layers"] == [0, 1] and load_quality(folder)["transcoders"]["layers"] is None
    assert transcoder_sets(markov_zoo, graphs=True) == ["topk"]


def test_layers_the_model_lacks_are_one_clear_line(markov_zoo, capsys):
    assert main(["transcoders", "markov", "--layers", "2"]) == 2
    assert "--layers: the model has layers 0 … 1, not 2" in capsys.readouterr().err
    for bad in ("x", "-1", "0,,1"):
        with pytest.raises(SystemExit) as exit:
            main(["transcoders", "markov", "--layers", bad])
        assert exit.value.code == 2 and "--layers" in capsys.readouterr().err


QUICK = ["--steps", "10", "--windows", "32", "--features", "32", "--no-progress"]


def test_harvests_within_the_disk_budget_are_made_and_past_it_the_activations_stream(markov_zoo, capsys, monkeypatch):
    """The harvests' bytes are estimated before any is made (rows × hooks × d_model × bytes per value: 32 + 64
    windows of 16 tokens, 4 hooks, d_model 32, float32); within --disk-budget they are made, past it none is: the
    training rows stream from the model, the measures run it on the held-out windows. Either way the command says
    which and why (as it is taken, with progress, and at the end), and quality.json records it beside the measures
    of every layer."""
    assert main(["transcoders", "markov", *QUICK[:-1]]) == 0  # with progress: the route is said as it is taken
    captured = capsys.readouterr()
    assert "within the disk budget of 20 GB: harvesting to disk" in captured.err
    assert "harvest: the harvests take" in captured.out  # and again at the end
    quality = load_quality(markov_zoo / "transcoders" / "topk")
    assert quality["route"]["route"] == "harvest" and quality["contexts_from"] == "train"
    assert quality["route"]["harvest_bytes"] == (32 + 64) * 16 * 4 * 32 * 4
    import lab.zoo.transcoders as zoo_transcoders

    def no_harvest(*args, **kwargs):
        raise AssertionError("a harvest was made past the disk budget")

    monkeypatch.setattr(zoo_transcoders, "harvest_windows", no_harvest)
    assert main(["transcoders", "markov", *QUICK, "--disk-budget", "0.0001", "--overwrite"]) == 0
    captured = capsys.readouterr()
    assert "stream: the harvests would take" in captured.out
    assert "past the disk budget of 0.0001 GB: streaming the activations from the model into training" in captured.out
    assert "layer 1: FVU" in captured.out and "loss recovered" in captured.out
    quality = load_quality(markov_zoo / "transcoders" / "topk")
    assert quality["route"]["route"] == "stream" and quality["contexts_from"] == "held_out"
    assert quality["train_rows"] == 10 * 512 and len(quality["held_out"]["fvu"]) == 2
    assert 0 <= min(quality["held_out"]["dead"]) and quality["loss"]["ce_model"] > 0
    assert load_contexts(markov_zoo / "transcoders" / "topk")["windows"].shape == (64, 16)  # the held-out ones
    assert not list(markov_zoo.glob("transcoders/.*"))


def test_a_disk_budget_that_is_no_size_is_one_clear_line(markov_zoo, capsys):
    for bad in ("0", "-1", "x", "inf"):
        with pytest.raises(SystemExit) as exit:
            main(["transcoders", "markov", "--disk-budget", bad])
        assert exit.value.code == 2 and "--disk-budget" in capsys.readouterr().err
