"""The KL experiment's real-model track on smollm2 (experiments.kl.real): the world's words are single tokens that
never merge; CE = H(p) + KL(p ‖ P_θ) over the full vocabulary holds to round-off on the pretrained model, and the
check fails when a term is perturbed or KL is taken over the words alone; a run is the same bits for the same
seed, and an interrupted one continues on its folder to those bits; `forma run kl --model smollm2 --quick` writes
it to runs/kl_real/. The runs here use a tiny profile (TINY): the quick one's time is measured by the CLI run."""

import copy
import json

import pytest
import torch

import experiments.kl.real as real
from experiments.kl import Config
from experiments.kl.config import REAL_WORDS, RealProfile
from lab.cli.parser import main
from lab.folders import is_trained
from lab.metrics.information import entropy, kl
from lab.model.transformer import HookedTransformer
from tests.builders import page, smollm2_folder, texts

pytestmark = pytest.mark.real

# One step of two sequences: a single checkpoint (the whole model, written by lab.train) per run.
TINY = RealProfile(
    words_per_sequence=8, eval_sequences=4, steps=1, batch_size=2, n_checkpoints=1, trained_blocks=1, warmup_steps=0
)


@pytest.fixture(scope="module")
def name():
    return "smollm2" if is_trained("smollm2") else str(smollm2_folder())


@pytest.fixture(scope="module")
def model(name):
    return HookedTransformer.from_pretrained(name).eval()


@pytest.fixture(scope="module")
def held(model):
    ids, start = real.word_ids(model.tokenizer), real.start_token(model.tokenizer)
    return real.RealHeldOut(real.world(), 4, 16, seed=1, ids=ids, start=start)


def test_each_word_is_one_token_and_rendered_text_encodes_word_for_word(model):
    ids = real.word_ids(model.tokenizer)
    assert len(set(ids)) == len(REAL_WORDS)
    words = torch.from_numpy(real.world().sample(64, 32, seed=0))
    real.check_rendering(model.tokenizer, words, ids)  # raises otherwise
    assert model.tokenizer.convert_ids_to_tokens(real.start_token(model.tokenizer)) == "<|endoftext|>"


def test_a_word_of_two_tokens_or_a_merging_pair_is_refused(model):
    with pytest.raises(ValueError, match="not one"):
        real.word_ids(model.tokenizer, (" red", " aquamarinequartz"))
    with pytest.raises(ValueError, match="when they meet"):
        real.word_ids(model.tokenizer, ("a", "b"))  # no space between them: "ab" is one token


def test_the_identity_holds_to_round_off_on_the_pretrained_model(model, held):
    row = real.measure_real(model, held)
    assert row["identity_max_abs_residual_nats"] <= real.IDENTITY_TOLERANCE_NATS
    assert real.identity_check([row])["holds"]
    # the pretrained model spreads mass off the eight words, which KL counts through −log P_θ on them
    assert 0 < row["mass_on_words"] < 1
    assert row["kl_nats"] > 0
    assert row["cross_entropy_nats"] == pytest.approx(row["entropy_nats"] + row["kl_nats"], abs=1e-9)


def test_the_check_fails_when_the_entropy_term_is_perturbed(model, held, monkeypatch):
    monkeypatch.setattr(real, "entropy", lambda p: entropy(p) + 1e-6)
    assert not real.identity_check([real.measure_real(model, held)])["holds"]


def test_the_check_fails_when_kl_ignores_the_mass_off_the_words(model, held, monkeypatch):
    index = torch.tensor(held.ids)

    def kl_on_words(p, q):  # P_θ renormalised on the words: what a KL over the chain's symbols alone would be
        q_words = q[..., index] / q[..., index].sum(dim=-1, keepdim=True)
        return kl(p[..., index], q_words)

    monkeypatch.setattr(real, "kl", kl_on_words)
    assert not real.identity_check([real.measure_real(model, held)])["holds"]


def run_tiny(model, name, out, seed=0):
    return real.run_real(copy.deepcopy(model), name, TINY, seed, out)


def test_an_interrupted_run_continues_on_its_folder_to_the_same_bits(model, name, tmp_path, monkeypatch):
    first = run_tiny(model, name, tmp_path / "a")
    assert first["identity"]["holds"]
    assert [r["step"] for r in first["checkpoints"]] == [0, 1]
    assert (tmp_path / "a" / "kl_real.json").is_file()
    assert not (tmp_path / "a" / "finetune" / "checkpoint").exists()  # the weights are not kept
    names = first["trained_parameters"]["names"]
    assert names[-1].startswith("unembed.") and not any(n.startswith(("embed.", "blocks.0.")) for n in names)

    measured = real.measure_real
    calls = []

    def stop_before_the_last(model_, held_):
        calls.append(1)
        if len(calls) == 2:  # after the last segment's training and checkpoint, before its measurement
            raise KeyboardInterrupt
        return measured(model_, held_)

    monkeypatch.setattr(real, "measure_real", stop_before_the_last)
    with pytest.raises(KeyboardInterrupt):
        run_tiny(model, name, tmp_path / "b")
    monkeypatch.setattr(real, "measure_real", measured)
    assert [r["step"] for r in json.loads((tmp_path / "b" / "finetune" / "curve.json").read_text())["rows"]] == [0]
    resumed = run_tiny(model, name, tmp_path / "b")  # a second run of the same seed, half of it read back
    assert resumed["checkpoints"] == first["checkpoints"]


def test_forma_run_kl_with_model_writes_the_real_track_to_runs_kl_real_and_the_page_shows_it(
    name, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("FORMA_RUNS_DIR", str(tmp_path))
    monkeypatch.setattr(Config, "REAL_PROFILES", (TINY, TINY))
    assert main(["run", "kl", "--model", name, "--quick"]) == 0
    [folder] = [p for p in (tmp_path / "kl_real").iterdir() if p.is_dir()]
    results = json.loads((folder / "results.json").read_text())
    assert results["identity"]["holds"] and results["model_label"] == "SmolLM2-135M-Instruct, 4-bit GGUF dequantized"
    assert json.loads((folder / "config.json").read_text())["model"] == name
    assert "CE = H(p) + KL(p ‖ P_θ)" in capsys.readouterr().out
    at = page("kl")
    at.run()
    assert not at.exception, at.exception
    shown = texts(at)
    assert "SmolLM2-135M-Instruct, 4-bit GGUF dequantized" in shown and "red, blue, green" in shown
    assert "Largest |CE − H − KL|" in " ".join(str(c.value) for c in at.caption)


def test_forma_run_kl_started_again_on_an_interrupted_runs_folder_continues_it(name, tmp_path, monkeypatch):
    monkeypatch.setenv("FORMA_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setattr(Config, "REAL_PROFILES", (TINY, TINY))
    out = tmp_path / "run"
    measured, calls = real.measure_real, []

    def stop_before_the_last(model_, held_):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return measured(model_, held_)

    monkeypatch.setattr(real, "measure_real", stop_before_the_last)
    assert main(["run", "kl", "--model", name, "--quick", "--out", str(out)]) != 0
    assert not (out / "results.json").exists() and (out / "finetune" / "curve.json").is_file()
    monkeypatch.setattr(real, "measure_real", measured)
    assert main(["run", "kl", "--model", name, "--quick", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert [r["step"] for r in results["checkpoints"]] == [0, 1] and results["identity"]["holds"]
