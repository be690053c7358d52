"""The scoreboard's real lenses and head detectors on smollm2 (experiments.scoreboard.real_lenses), at a test's size
over the corpus slice of tests/real/conftest.py: every lens reads the model itself at the output, the logit lens
gains over another window's reading before the last block where a lens emitting random logits gains nothing, and
the induction detector's top heads, ablated one at a time, raise the loss on the second copy more than heads drawn
at random; and Forma's tuned lens fitted on the training windows reads smollm2 at least as well as the tuned-lens
package's own training on the same windows and layers."""

import dataclasses

import numpy as np
import pytest
import torch

from experiments.scoreboard.config import REAL_LENSES_QUICK
from experiments.scoreboard.real_lenses import (
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
    REAL_LENSES_QUICK, layers=(25, 29), eval_windows=4, fit_windows=2, length=16, tuned_iterations=2, n_boot=300
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
    sizes = dataclasses.replace(REAL_LENSES_QUICK, head_sequences=2, head_span=8)
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


def test_formas_tuned_lens_reads_smollm2_as_well_as_the_packages_training(model, corpus, monkeypatch):
    """The tuned-lens package on smollm2's export (lab.hf.convert.to_hf; its TransformerLens probe off), trained by
    its recipe (benchmarks.tuned_lens.train_package_lens) on the same training windows and layers as Forma's fit, at
    the quick sizes of the benchmark that records it on the real corpus (benchmarks.tuned_lens.compare_on_real,
    SMOLLM2_QUICK): on held-out windows Forma's KL(P_θ ‖ lens) is at or below the top of the package's interval at
    each layer, and every lens reads the model itself at the output."""
    from tuned_lens import model_surgery

    from benchmarks.tuned_lens import SMOLLM2_QUICK, compare_on_real

    monkeypatch.setattr(model_surgery, "_transformer_lens_available", False)
    graded, fits = compare_on_real(model, corpus, SMOLLM2_QUICK)
    for layer in SMOLLM2_QUICK.layers:
        forma, package = graded["forma"][layer]["kl_model"].value, graded["package"][layer]["kl_model"].value
        assert forma.value <= package.high, (layer, forma, package)
        assert forma.value < graded["logit"][layer]["kl_model"].value.low, layer
    for lens in ("forma", "package", "logit"):
        assert graded[lens][model.cfg.n_layers]["kl_model"].value.value == pytest.approx(0.0, abs=1e-4)
    assert set(fits["forma_evaluations"]) == set(SMOLLM2_QUICK.layers)


def test_an_early_stopped_fit_judged_on_its_own_windows_fits_as_far_as_one_call(model, corpus):
    """fit_tuned_lens(validation=) runs L-BFGS one iteration a call; judged on the fitting windows themselves every
    iterate is kept, and the fit gets at least as far as one call of every iteration, on smollm2, where the unit
    step overshoots and each call needs a line search of its own (one call's shares 5/4 of an evaluation an
    iteration)."""
    from lab.analysis.tuned_lens import fit_tuned_lens

    fit = corpus_windows(corpus, 2, 16, "train")
    whole = fit_tuned_lens(model, fit, max_iter=4, layers=[15])
    stepwise = fit_tuned_lens(model, fit, max_iter=4, layers=[15], validation=fit)
    assert stepwise.stopped_at[15] == 4
    assert stepwise.train_kl_nats[15] <= whole.train_kl_nats[15]
    assert whole.train_kl_nats[15] < 0.8 * fit_tuned_lens(model, fit, max_iter=1, layers=[15]).train_kl_nats[15]
