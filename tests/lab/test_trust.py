"""`forma trust`: every check runs, passes on a sound model, and fails when a path is broken."""

import json

import pytest

from lab import HookedTransformer
from lab.cli.parser import main
from lab.trust import trust_report
from tests.builders import hf_model, tiny_config


def test_a_sound_model_passes_every_check(tmp_path, capsys):
    model = HookedTransformer(tiny_config(mlp="gelu_tanh"), seed=0)
    model.save(tmp_path)
    assert main(["trust", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "trust.json").read_text())
    assert report["passed"] and report["hugging_face"]["applicable"]
    assert report["hooks"]["never_fired"] == []
    assert 0.5 < report["bfloat16"]["top1_agreement"] <= 1.0
    assert "Hugging Face logits" in capsys.readouterr().out


@pytest.mark.slow
def test_a_hugging_face_folder(tmp_path):

    hf_model("llama").save_pretrained(tmp_path)
    assert main(["trust", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "trust.json").read_text())["hugging_face"]["architecture"] == "llama"


def test_non_hf_shapes_are_marked_not_applicable():
    report = trust_report(HookedTransformer(tiny_config(block="post_ln"), seed=0))
    assert report["hugging_face"]["applicable"] is False and report["passed"]


def test_a_broken_explicit_path_fails_the_attention_check(monkeypatch):
    from lab.model.attention import Attention

    original = Attention._explicit
    monkeypatch.setattr(Attention, "_explicit", lambda self, q, k, v, offset: original(self, q, k, v, offset) * 1.01)
    report = trust_report(HookedTransformer(tiny_config(), seed=0))
    assert not report["attention_paths"]["passed"] and not report["passed"]


def test_missing_model_is_a_clear_error(capsys):
    assert main(["trust", "no-such-model"]) == 2
    assert "unknown model" in capsys.readouterr().err
