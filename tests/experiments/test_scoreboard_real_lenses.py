"""experiments.scoreboard.real_lenses on a tiny random model (the real model's tests are in tests/real/): the
layer-by-layer ablation equals the full-forward one of lab.analysis.grading, the lens readings read the model itself
at the output and a prompt-blind lens gains nothing, and the head grades' controls sit at chance where the
detector's do not."""

import dataclasses

import numpy as np
import pytest
import torch

from experiments.scoreboard.config import REAL_LENSES_QUICK
from experiments.scoreboard.per_world import row
from experiments.scoreboard.real_lenses import (
    ablation_effects,
    head_grades,
    lens_grades_real,
    lens_readings,
    repeated_sequences,
)
from lab import HookedTransformer, ModelConfig
from lab.analysis.grading import head_ablation_effects

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny() -> HookedTransformer:
    cfg = ModelConfig(d_vocab=160, d_model=32, n_layers=3, n_heads=4, n_ctx=24, positions="rotary", norm="rmsnorm")
    return HookedTransformer(cfg, seed=1).eval()


def test_layer_by_layer_ablation_equals_the_full_forward_one():
    m = tiny()
    tokens, scored = repeated_sequences(m, dataclasses.replace(REAL_LENSES_QUICK, head_sequences=3, head_span=6))
    assert tokens.shape == (3, 13) and (tokens[:, 0] == 0).all() and torch.equal(tokens[:, 1:7], tokens[:, 7:])
    assert scored[0].nonzero().flatten().tolist() == [7, 8, 9, 10, 11]  # predicting the second copy's x_1 … x_5
    ours = ablation_effects(m, tokens, scored)
    full = head_ablation_effects(m, tokens, scored).numpy()  # every head, a whole forward pass each
    np.testing.assert_allclose(ours, full, atol=1e-4)
    some = ablation_effects(m, tokens, scored, heads=[(1, 2), (2, 0)])
    assert np.isnan(some[:, 0]).all() and np.isfinite(some[:, 1, 2]).all() and np.isnan(some[:, 1, 0]).all()
    np.testing.assert_allclose(some[:, 2, 0], full[:, 2, 0], atol=1e-4)


def test_lens_readings_read_the_model_at_the_output_and_a_prompt_blind_lens_gains_nothing():
    m = tiny()
    windows = torch.randint(0, 160, (6, 10), generator=torch.Generator().manual_seed(0))
    uniform = torch.full((160,), -float(np.log(160)))
    blind = {"blind": lambda stack: stack.mean(dim=(1, 2), keepdim=True).expand_as(stack).clone()}
    readings = lens_readings(m, windows, {"logit": lambda stack: stack} | blind, [0, 2], uniform, windows_per_pass=3)
    graded = lens_grades_real(readings, n_boot=200, seed=0)
    assert graded["logit"][3]["kl_model"].value.value == pytest.approx(0.0, abs=1e-5)
    assert graded["logit"][3]["prompt_gain"].value.low > 0  # another window's output is not this one's
    for layer in (0, 2, 3):
        assert graded["blind"][layer]["prompt_gain"].value.value == pytest.approx(0.0, abs=1e-5)
    kl = graded["logit"][2]["kl_model"]
    assert kl.control_kind == "beaten" and kl.chance == pytest.approx(np.mean(readings["unigram"]))
    line = row("logit lens", "w", "resid_pre 2", kl)
    assert line["grade"] == "kl_model" and line["control_means"].startswith("the training split's unigram")


def test_head_grades_controls_sit_at_chance_and_a_detector_that_reads_the_effects_beats_them():
    rng = np.random.default_rng(0)
    effects = rng.normal(size=(8, 40)) * 0.1 + np.linspace(0, 1, 40)
    reading = {"induction": np.tile(np.linspace(0, 1, 40), (8, 1)), "previous_token": rng.random((8, 40)) * 0.4}
    grades = head_grades(reading, effects, n_boot=300, seed=0)
    assert grades["spearman_induction"].value.low > 0.9 and grades["auroc_induction"].value.low > 0.9
    for name, grade in grades.items():
        assert grade.control_at_chance, name  # random scores or random flags know nothing of the effects
    assert grades["spearman_previous_token"].value.low < 0.5  # scores unrelated to the effects
