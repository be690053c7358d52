"""The scoreboard's real lenses and head detectors on smollm2 (experiments.scoreboard.real_lenses), at a test's size
over the corpus slice of tests/real/conftest.py: every lens reads the model itself at the output, the logit lens
gains over another window's reading before the last block where a lens emitting random logits gains nothing, and
the induction detector's top heads, ablated one at a time, raise the loss on the second copy more than heads drawn
at random."""

import dataclasses

import numpy as np
import pytest
import torch

from experiments.scoreboard.real_lenses import (
    QUICK_SIZES,
    WORLD,
    ablation_effects,
    detector_scores,
    lens_grades_real,
    lens_part,
    lens_readings,
    repeated_sequences,
    unigram_log_probs,
)
from lab.load import load_model
from lab.zoo.transcoders import corpus_windows

pytestmark = pytest.mark.real

SIZES = dataclasses.replace(
    QUICK_SIZES, layers=(25, 29), eval_windows=4, fit_windows=2, length=16, tuned_iterations=2, n_boot=300
)


@pytest.fixture(scope="module")
def model(zoo):
    return load_model(zoo)


def test_lens_rows_read_the_model_at_the_output_and_gain_over_another_window(model, corpus):
    rows, record = lens_part(model, corpus, SIZES)
    by = {(r["method"], r["readout"], r["grade"]): r for r in rows}
    assert {r["world"] for r in rows} == {WORLD}
    assert {m for m, _, _ in by} == {"logit lens", "tuned lens"}  # the quick sizes fit no Jacobian lens
    for method in ("logit lens", "tuned lens"):
        assert by[(method, "output", "kl_model")]["value"] == pytest.approx(0.0, abs=1e-4)
        assert by[(method, "resid_pre 25", "kl_model")]["value"] > 0.1
        assert by[(method, "resid_pre 29", "kl_model")]["control"] > 0  # the unigram law's KL beside it
    assert by[("logit lens", "resid_pre 29", "prompt_gain")]["low"] > 0
    assert record["tuned"]["evaluations"] >= 1


def test_a_lens_emitting_random_logits_gains_nothing_over_another_window(model, corpus):
    windows = corpus_windows(corpus, 4, 16, "val")
    g = torch.Generator().manual_seed(0)

    def random_stack(stack: torch.Tensor) -> torch.Tensor:
        return torch.randn(stack.shape, generator=g) * stack.norm(dim=-1, keepdim=True).mean()

    log_unigram = unigram_log_probs(corpus, model.cfg.d_vocab)
    readings = lens_readings(model, windows, {"random": random_stack}, [29], log_unigram, windows_per_pass=4)
    gain = lens_grades_real(readings, n_boot=300, seed=0)["random"][29]["prompt_gain"].value
    assert gain.low < 0 < gain.high


def test_the_induction_detectors_top_heads_outweigh_random_heads_when_ablated(model):
    sizes = dataclasses.replace(QUICK_SIZES, head_sequences=2, head_span=8)
    tokens, scored = repeated_sequences(model, sizes)
    scores = detector_scores(model, tokens, ["induction"])["induction"].mean(0).ravel()
    top = np.argsort(-scores)[:4]
    others = np.setdiff1d(np.arange(len(scores)), top)
    drawn = np.random.default_rng(0).choice(others, size=8, replace=False)
    n_heads = model.cfg.n_heads
    heads = [(int(i) // n_heads, int(i) % n_heads) for i in np.concatenate([top, drawn])]
    effects = ablation_effects(model, tokens, scored, heads).mean(0).ravel()
    assert scores[top].min() > 0.5  # smollm2 has induction heads
    assert effects[top].mean() > effects[drawn].mean() + 0.05, (effects[top], effects[drawn])
