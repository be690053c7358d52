"""Calibration metrics on analytic cases and against the peers (torchmetrics, netcal, relplot)."""

import math

import numpy as np
import pytest
import torch

from lab.metrics.calibration import (
    bin_indices,
    brier,
    ece,
    ece_debiased,
    fit_temperature,
    mce,
    multiclass_summary,
    nll,
    noise_floor_ece,
    reliability,
    rms_calibration_error,
    softmax,
    squared_ce,
    squared_ce_debiased,
)
from lab.metrics.discrimination import MIN_PER_CLASS, Metric, auroc, auroc_ci, bootstrap_ci


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
        correct = (rng.random(500) < confidence**1.5).astype(int)
        metric = BinaryCalibrationError(n_bins=15, norm="l1")
        # The binary form bins `preds` and compares each bin's mean with the mean of `target`: given the
        # top-label confidence and its correctness, that is exactly the top-label ECE.
        theirs = metric(torch.tensor(confidence), torch.tensor(correct)).item()
        assert ece(confidence, correct) == pytest.approx(theirs, abs=1e-6)


# --- bin edges: the peers' convention -----------------------------------------------------------
def wavy(confidence: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Correctness from a curve that crosses the diagonal many times: bins' gaps change sign, so moving an
    item across an edge changes the ECE (with gaps of one sign the ECE is |Σ gaps| wherever items fall)."""
    return (rng.random(len(confidence)) < np.clip(confidence + 0.2 * np.sin(12 * np.pi * confidence), 0, 1)).astype(int)


def edge_heavy(n_bins: int, n: int = 3000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Half the confidences exactly on numpy's bin edges (0 and 1 included), half in between."""
    rng = np.random.default_rng(seed)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    confidence = np.where(rng.random(n) < 0.5, rng.choice(edges, n), rng.random(n))
    return confidence, wavy(confidence, rng)


@pytest.mark.parametrize("n_bins", [15, 10])
def test_edge_items_go_to_the_bin_they_open_as_in_netcal(n_bins):
    """Bins are [e_k, e_{k+1}) with the last one closed, [e_{b−1}, 1] (numpy.histogram's rule, netcal's)."""
    from netcal.metrics import ECE

    confidence, correct = edge_heavy(n_bins)
    theirs = ECE(bins=n_bins).measure(confidence, correct)
    # netcal clips confidences into [ε, 1 − ε] first; that moves 0 and 1 by 2e-16, not across an edge.
    assert ece(confidence, correct, n_bins) == pytest.approx(theirs, abs=1e-12)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    assert bin_indices(edges, n_bins, "equal_width").tolist() == list(range(n_bins)) + [n_bins - 1]


def test_edge_items_agree_with_torchmetrics_and_relplot_where_their_edges_are_ours():
    """torchmetrics and relplot put a confidence of exactly 1 in a bin of its own, and torchmetrics' own
    float edges differ from numpy's by one ulp at one edge of 15 (k = 11): on every other edge, and
    between them, the three agree exactly."""
    import relplot.metrics
    from torchmetrics.classification import BinaryCalibrationError

    n_bins = 15
    ours = np.linspace(0.0, 1.0, n_bins + 1)
    torch_edges = torch.linspace(0.0, 1.0, n_bins + 1, dtype=torch.float64).numpy()
    shared = ours[:-1][ours[:-1] == torch_edges[:-1]]
    assert len(shared) == n_bins - 1
    rng = np.random.default_rng(1)
    n = 3000
    confidence = np.where(rng.random(n) < 0.5, rng.choice(shared, n), rng.uniform(0.0, 0.999, n))
    correct = wavy(confidence, rng)
    mine = ece(confidence, correct, n_bins)
    theirs = BinaryCalibrationError(n_bins=n_bins, norm="l1")(torch.tensor(confidence), torch.tensor(correct)).item()
    assert mine == pytest.approx(theirs, abs=1e-12)
    assert mine == pytest.approx(relplot.metrics.binnedECE(confidence, correct, nbins=n_bins), abs=1e-12)
    # Right-closed bins — Forma's rule before — give another number on the same data: the test can fail.
    right_closed = np.clip(np.searchsorted(ours, confidence, side="left") - 1, 0, n_bins - 1)
    count = np.bincount(right_closed, minlength=n_bins)
    used = count > 0
    gap = np.abs(np.bincount(right_closed, correct, n_bins)[used] - np.bincount(right_closed, confidence, n_bins)[used])
    assert abs(gap.sum() / n - mine) > 1e-3


# --- equal-mass bins: a deterministic rule ------------------------------------------------------
def test_equal_mass_bins_hold_equal_counts():
    bins = bin_indices(np.random.default_rng(1).random(100), 10, "equal_mass")
    assert np.bincount(bins).tolist() == [10] * 10


def test_equal_mass_remainder_rule_is_rank_times_b_over_n():
    """The item of rank i (0-based, by confidence) goes to bin ⌊i·b/n⌋: for n = 23, b = 10 the bins hold
    3, 2, 2, 3, 2, 2, 3, 2, 2, 2 items, whatever order the items come in."""
    confidence = np.random.default_rng(2).random(23)
    expected = [3, 2, 2, 3, 2, 2, 3, 2, 2, 2]
    assert np.bincount(bin_indices(confidence, 10, "equal_mass")).tolist() == expected
    order = np.random.default_rng(3).permutation(23)
    assert np.array_equal(
        bin_indices(confidence[order], 10, "equal_mass"), bin_indices(confidence, 10, "equal_mass")[order]
    )


def test_equal_mass_ties_share_the_bin_of_their_lowest_rank():
    """Equal confidences are never split: a run of ties takes the bin its lowest-ranked member's rank gives."""
    confidence = np.array([0.1, 0.2, 0.5, 0.5, 0.5, 0.5, 0.7, 0.9, 0.9, 0.95])
    bins = bin_indices(confidence, 5, "equal_mass")  # ranks 0..9 → ⌊i/2⌋: 0 0 1 1 2 2 3 3 4 4 before ties
    assert bins.tolist() == [0, 0, 1, 1, 1, 1, 3, 3, 3, 4]
    assert np.array_equal(bin_indices(confidence[::-1], 5, "equal_mass"), bins[::-1])


# --- the rest of the metrics ----------------------------------------------------------------------
def test_brier_decomposition_is_exact_when_bins_hold_one_confidence_each():
    confidence = np.repeat([0.1, 0.5, 0.9], 100)
    correct = np.concatenate(
        [np.r_[np.ones(20), np.zeros(80)], np.r_[np.ones(50), np.zeros(50)], np.r_[np.ones(70), np.zeros(30)]]
    )
    b = brier(confidence, correct, n_bins=10)
    assert b.score == pytest.approx(b.reliability - b.resolution + b.uncertainty)
    assert b.reliability == pytest.approx(((0.1 - 0.2) ** 2 + 0 + (0.9 - 0.7) ** 2) / 3)


def test_auroc_on_hand_made_cases():
    assert auroc([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1]) == 1.0
    assert auroc([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1]) == 0.0
    assert auroc([0.5, 0.5, 0.5, 0.5], [0, 1, 0, 1]) == 0.5
    assert auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75
    # Positives {0.5, 0.9} against negatives {0.1, 0.5}: pairs won 1, 1, ½ (tie), 1 → 3.5 / 4.
    assert auroc([0.1, 0.5, 0.5, 0.9], [0, 0, 1, 1]) == pytest.approx(0.875)
    assert math.isnan(auroc([0.2, 0.3], [1, 1]))
    # k classes with an [n, k] score matrix: the mean one-vs-rest AUROC.
    scores = np.array([[0.8, 0.1, 0.1], [0.2, 0.7, 0.1], [0.1, 0.2, 0.7], [0.6, 0.3, 0.1]])
    assert auroc(scores, [0, 1, 2, 1]) == pytest.approx(
        np.mean([auroc(scores[:, c], np.array([0, 1, 2, 1]) == c) for c in range(3)])
    )


def test_auroc_refuses_scores_given_as_labels():
    """One argument order, (scores, labels): labels that are not 0/1 are an error, so a call written in the
    other order fails loudly instead of returning a number."""
    with pytest.raises(ValueError, match="labels must be 0/1"):
        auroc([0, 0, 1, 1], [0.1, 0.5, 0.5, 0.9])


def test_auroc_interval_is_stratified_and_never_drops_a_resample():
    """1 positive in 97: a row bootstrap leaves the positive out of ~37% of resamples; the stratified
    bootstrap keeps one of each class in every resample, and below MIN_PER_CLASS it refuses the interval."""
    rng = np.random.default_rng(0)
    labels = np.r_[1, np.zeros(96, dtype=int)]
    scores = rng.random(97)
    m = auroc_ci(scores, labels, n_boot=200)
    assert (m.n_pos, m.n_neg) == (1, 96)
    assert m.value == pytest.approx(auroc(scores, labels))
    assert math.isnan(m.low) and math.isnan(m.high)
    assert "1 positive" in m.why_no_interval and f"at least {MIN_PER_CLASS}" in m.why_no_interval
    # Enough of each class: an interval that holds the estimate.
    labels = (rng.random(200) < 0.2).astype(int)
    scores = labels + rng.normal(0, 1.0, 200)
    m = auroc_ci(scores, labels, n_boot=300)
    assert m.why_no_interval is None and m.low < m.value < m.high
    assert (m.n_pos, m.n_neg) == (labels.sum(), (1 - labels).sum())


def test_stratified_group_bootstrap_keeps_class_counts_and_whole_groups():
    seen = []

    def record(scores, labels, groups):
        seen.append((int(labels.sum()), len(labels), groups))
        return auroc(scores, labels)

    groups = np.repeat(np.arange(30), 2)
    labels = np.r_[np.ones(20, dtype=int), np.zeros(40, dtype=int)]  # groups 0–9 positive, 10–29 negative
    bootstrap_ci(record, np.arange(60.0), labels, groups, groups=groups, strata=labels, n_boot=50)
    for n_pos, n, drawn in seen[1:]:
        assert (n_pos, n) == (20, 60)  # 10 positive groups and 20 negative groups drawn in each resample
        assert all(np.sum(drawn == g) % 2 == 0 for g in np.unique(drawn))  # a group comes with both its rows


def test_bootstrap_refuses_an_interval_when_resamples_are_not_finite():
    m = bootstrap_ci(lambda s, y: auroc(s, y), np.arange(6.0), np.array([1, 0, 0, 0, 0, 0]), n_boot=100)
    assert math.isnan(m.low) and "resamples" in m.why_no_interval
    m = bootstrap_ci(lambda x: float(np.mean(x)), np.arange(100.0), n_boot=300)
    assert isinstance(m, Metric) and m.low < 49.5 < m.high and m.value == 49.5
    assert bootstrap_ci(lambda x: float(np.mean(x)), np.ones(10), n_boot=20)[1:3] == (1.0, 1.0)


def test_noise_floor_of_a_calibrated_model_at_n_200_is_about_0_07():
    confidence = np.random.default_rng(2).uniform(0.25, 1.0, 200)
    mean, p95 = noise_floor_ece(confidence, n_sim=300)
    assert 0.04 < mean < 0.10 and p95 > mean


# --- debiased estimates (Kumar, Liang & Ma 2019, §5) ----------------------------------------------
def calibrated(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    confidence = rng.uniform(0.25, 1.0, n)
    return confidence, (rng.random(n) < confidence).astype(int)


def test_debiased_squared_error_of_a_calibrated_model_is_zero_within_noise_and_the_plug_in_is_not():
    """Perfect calibration: the true squared calibration error is 0. Over 300 data sets of n = 500 the
    debiased estimate's mean lies within 3 standard errors of 0; the plug-in's is many standard errors above."""
    debiased, plug_in = [], []
    for seed in range(300):
        c, y = calibrated(500, seed)
        debiased.append(squared_ce_debiased(c, y))
        plug_in.append(squared_ce(c, y))
    debiased, plug_in = np.array(debiased), np.array(plug_in)
    se = debiased.std(ddof=1) / np.sqrt(len(debiased))
    assert abs(debiased.mean()) < 3 * se
    assert plug_in.mean() > 20 * plug_in.std(ddof=1) / np.sqrt(len(plug_in))
    assert squared_ce(*calibrated(500, 0)) == pytest.approx(rms_calibration_error(*calibrated(500, 0)) ** 2)


def test_debiased_ece_is_nearer_a_known_ece_than_the_plug_in():
    """Accuracy = confidence − 0.05 everywhere: the binned ECE is 0.05 exactly in expectation of the bins'
    gaps. At n = 400 the plug-in overshoots by its noise; the debiased ECE lands nearer 0.05 on average,
    and at perfect calibration it sits below the plug-in (no estimator of |μ| is unbiased at μ = 0)."""
    plug, debiased = [], []
    for seed in range(100):
        rng = np.random.default_rng(seed)
        c = rng.uniform(0.3, 0.95, 400)
        y = (rng.random(400) < c - 0.05).astype(int)
        plug.append(ece(c, y))
        debiased.append(ece_debiased(c, y, seed=seed))
    assert abs(np.mean(debiased) - 0.05) < abs(np.mean(plug) - 0.05)
    c, y = calibrated(500, 1)
    assert ece_debiased(c, y) < ece(c, y)


def test_fit_temperature_recovers_a_known_temperature():
    rng = np.random.default_rng(3)
    true_logits = rng.normal(0, 2.0, (4000, 5))
    labels = np.array([rng.choice(5, p=p) for p in softmax(true_logits)])
    for T in (0.5, 2.0):
        fitted = fit_temperature(true_logits * T, labels)  # logits that are T× too sharp/flat
        assert fitted == pytest.approx(T, rel=0.02 * 2.5)  # sampling noise at n = 4000
    assert nll(softmax(true_logits), labels) < nll(softmax(true_logits * 2.0), labels)


def test_summary_has_every_key_and_each_ece_its_interval_floor_and_debiased_estimate():
    rng = np.random.default_rng(4)
    probs = softmax(rng.normal(0, 2, (300, 4)))
    labels = np.array([rng.choice(4, p=p) for p in probs])
    summary = multiclass_summary(probs, labels, n_boot=200)
    for key in ("ece_15_equal_width", "ece_10_equal_mass"):
        lo, hi = summary[f"{key}_ci95"]
        assert lo <= summary[key] <= hi + 0.02
        assert summary[f"noise_floor_{key}"] > 0 and f"{key}_debiased" in summary
    assert summary["ece_ci95"] == summary["ece_15_equal_width_ci95"]
    assert abs(summary["accuracy"] - summary["mean_confidence"]) < 0.08  # calibrated by construction
    assert summary["auroc_confidence_n_pos"] + summary["auroc_confidence_n_neg"] == 300


def test_bad_inputs_are_clear_errors():
    with pytest.raises(ValueError, match="differ in length"):
        ece([0.5], [1, 0])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        ece([1.5], [1])
    with pytest.raises(ValueError, match="scheme"):
        reliability([0.5], [1], scheme="quantile")


def test_delong_variance_is_its_structural_components_and_its_interval_covers():
    """DeLong's variance from midranks equals the structural-component definition computed pair by pair; its
    normal interval at a Bonferroni level covers the true AUROC of a binormal model about as often as it says,
    where a percentile bootstrap of 1,000 resamples has 2 per tail."""
    from statistics import NormalDist

    from lab.metrics.discrimination import auroc_ci, auroc_delong_variance

    rng = np.random.default_rng(0)
    scores = np.round(rng.normal(size=300), 1)  # ties, which ψ counts ½
    labels = rng.random(300) < 0.3
    scores[labels] += 0.8
    pos, neg = scores[labels], scores[~labels]
    psi = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
    v10, v01 = psi.mean(axis=1), psi.mean(axis=0)
    assert auroc_delong_variance(scores, labels) == pytest.approx(
        v10.var(ddof=1) / len(pos) + v01.var(ddof=1) / len(neg), rel=1e-12
    )
    level = 1 - 0.05 / 12
    metric = auroc_ci(scores, labels, level=level, method="delong")
    half = NormalDist().inv_cdf(1 - (1 - level) / 2) * math.sqrt(auroc_delong_variance(scores, labels))
    assert (metric.low, metric.high) == pytest.approx((psi.mean() - half, psi.mean() + half))
    assert (metric.n_pos, metric.n_neg) == (len(pos), len(neg))

    shift, truth, covered, trials = 0.6, NormalDist().cdf(0.6 / math.sqrt(2)), 0, 400
    for _ in range(trials):
        y = rng.random(200) < 0.4
        s = rng.normal(size=200) + shift * y
        low, high = auroc_ci(s, y, level=0.9, method="delong").interval
        covered += low <= truth <= high
    assert abs(covered / trials - 0.9) < 0.05, covered / trials
    with pytest.raises(ValueError, match="ungrouped binary"):
        auroc_ci(scores, labels, groups=np.arange(300) // 2, method="delong")
    assert auroc_ci(scores[:30], labels[:30], method="delong").why_no_interval  # too few of a class: no interval


def test_delong_variance_is_the_two_sample_jackknife_of_scikit_learns_auroc():
    """DeLong's variance equals the jackknife that leaves out one positive, then one negative, at a time (the
    two samples' delete-one variances summed, Arvesen 1969): here each left-out AUROC is scikit-learn's
    roc_auc_score, so the check runs through code that shares nothing with ours but the definition."""
    from sklearn.metrics import roc_auc_score

    from lab.metrics.discrimination import auroc_delong_variance

    rng = np.random.default_rng(5)
    scores = np.round(rng.normal(size=120), 1)  # ties
    labels = rng.random(120) < 0.35
    scores[labels] += 0.7

    def jackknife(sample: np.ndarray) -> float:
        left_out = np.array([roc_auc_score(np.delete(labels, i), np.delete(scores, i)) for i in np.flatnonzero(sample)])
        return (len(left_out) - 1) / len(left_out) * float(np.sum((left_out - left_out.mean()) ** 2))

    assert auroc_delong_variance(scores, labels) == pytest.approx(jackknife(labels) + jackknife(~labels), rel=1e-10)
    assert math.isnan(auroc_delong_variance(scores[:3], [True, False, False]))  # one positive: no variance
