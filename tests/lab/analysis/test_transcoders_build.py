"""lab.zoo.transcoders and `forma transcoders`: transcoders for a zoo model, end to end."""

import pytest

from lab.cli.parser import TRANSCODER_KINDS, main
from lab.zoo.transcoders import PRESETS, load_contexts, load_quality, transcoder_sets, world_windows

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
