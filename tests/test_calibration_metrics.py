"""Calibration metrics on analytic cases and against torchmetrics."""

import numpy as np
import pytest
import torch

from lab.metrics.calibration import (auroc, bin_indices, bootstrap_ci, brier, ece, fit_temperature, mce,
                                     multiclass_summary, nll, noise_floor_ece, reliability,
                                     rms_calibration_error, softmax)


def test_constant_confidence_0_9_at_accuracy_0_6_gives_ece_0_3():
    confidence = np.full(10, 0.9)
    correct = np.array([1] * 6 + [0] * 4)
    assert ece(confidence, correct) == pytest.approx(0.3)
    assert ece(confidence, correct, 10, "equal_mass") == pytest.approx(0.3)
    assert mce(confidence, correct) == pytest.approx(0.3)
    assert rms_calibration_error(confidence, correct) == pytest.approx(0.3)


def test_ece_matches_torchmetrics_on_random_inputs():
    from torchmetrics.classification import BinaryCalibrationError

    rng = np.random.default_rng(0)
    for _ in range(5):
        confidence = rng.uniform(0.0, 1.0, 500)
        correct = (rng.random(500) < confidence ** 1.5).astype(int)
        metric = BinaryCalibrationError(n_bins=15, norm="l1")
        # The binary form bins `preds` and compares each bin's mean with the mean of `target`: given the
        # top-label confidence and its correctness, that is exactly the top-label ECE.
        theirs = metric(torch.tensor(confidence), torch.tensor(correct)).item()
        assert ece(confidence, correct) == pytest.approx(theirs, abs=1e-6)


def test_equal_mass_bins_hold_equal_counts():
    bins = bin_indices(np.random.default_rng(1).random(100), 10, "equal_mass")
    assert np.bincount(bins).tolist() == [10] * 10


def test_brier_decomposition_is_exact_when_bins_hold_one_confidence_each():
    confidence = np.repeat([0.1, 0.5, 0.9], 100)
    correct = np.concatenate([np.r_[np.ones(20), np.zeros(80)], np.r_[np.ones(50), np.zeros(50)],
                              np.r_[np.ones(70), np.zeros(30)]])
    b = brier(confidence, correct, n_bins=10)
    assert b.score == pytest.approx(b.reliability - b.resolution + b.uncertainty)
    assert b.reliability == pytest.approx(((0.1 - 0.2) ** 2 + 0 + (0.9 - 0.7) ** 2) / 3)


def test_auroc_on_hand_made_cases():
    assert auroc([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1]) == 1.0
    assert auroc([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1]) == 0.0
    assert auroc([0.5, 0.5, 0.5, 0.5], [0, 1, 0, 1]) == 0.5
    assert auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75


def test_noise_floor_of_a_calibrated_model_at_n_200_is_about_0_07():
    confidence = np.random.default_rng(2).uniform(0.25, 1.0, 200)
    mean, p95 = noise_floor_ece(confidence, n_sim=300)
    assert 0.04 < mean < 0.10 and p95 > mean


def test_fit_temperature_recovers_a_known_temperature():
    rng = np.random.default_rng(3)
    true_logits = rng.normal(0, 2.0, (4000, 5))
    labels = np.array([rng.choice(5, p=p) for p in softmax(true_logits)])
    for T in (0.5, 2.0):
        fitted = fit_temperature(true_logits * T, labels)  # logits that are T× too sharp/flat
        assert fitted == pytest.approx(T, rel=0.02 * 2.5)  # sampling noise at n = 4000
    assert nll(softmax(true_logits), labels) < nll(softmax(true_logits * 2.0), labels)


def test_bootstrap_interval_contains_the_estimate_and_summary_has_every_key():
    rng = np.random.default_rng(4)
    probs = softmax(rng.normal(0, 2, (300, 4)))
    labels = np.array([rng.choice(4, p=p) for p in probs])
    summary = multiclass_summary(probs, labels, n_boot=200)
    lo, hi = summary["ece_ci95"]
    assert lo <= summary["ece_15_equal_width"] <= hi + 0.02
    assert abs(summary["accuracy"] - summary["mean_confidence"]) < 0.08  # calibrated by construction
    assert bootstrap_ci(lambda x: float(np.mean(x)), np.ones(10), n_boot=20) == (1.0, 1.0)


def test_bad_inputs_are_clear_errors():
    with pytest.raises(ValueError, match="differ in length"):
        ece([0.5], [1, 0])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        ece([1.5], [1])
    with pytest.raises(ValueError, match="scheme"):
        reliability([0.5], [1], scheme="quantile")
