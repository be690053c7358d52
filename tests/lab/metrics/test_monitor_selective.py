"""Selective prediction (lab.metrics.selective): risk–coverage and AURC on hand-computed cases, the binomial tail
against a peer, and the two abstention guarantees checked for their frequency on synthetic scores whose error
probabilities are known exactly."""

import math

import numpy as np
import pytest

from lab.metrics.selective import (
    answer_agreement,
    aurc,
    binomial_cdf,
    crc_min_calibration,
    crc_threshold,
    discrete_semantic_entropy,
    ltt_grid,
    ltt_min_answered,
    ltt_threshold,
    optimal_aurc,
    risk_coverage,
    selective_outcome,
    wilson_interval,
)


def test_risk_coverage_answers_the_least_risky_first():
    curve = risk_coverage([0.4, 0.1, 0.3, 0.2], [1, 0, 0, 1])
    assert curve.threshold.tolist() == [0.1, 0.2, 0.3, 0.4]
    assert curve.coverage.tolist() == [0.25, 0.5, 0.75, 1.0]
    assert np.allclose(curve.risk, [0.0, 0.5, 1 / 3, 0.5])


def test_risk_coverage_keeps_ties_together():
    curve = risk_coverage([0.1, 0.1, 0.5], [0, 1, 1])
    assert curve.coverage.tolist() == [2 / 3, 1.0] and np.allclose(curve.risk, [0.5, 2 / 3])


def test_aurc_is_the_mean_selective_risk_over_coverages():
    assert math.isclose(aurc([0.1, 0.2, 0.3, 0.4], [0, 1, 0, 1]), (0 + 1 / 2 + 1 / 3 + 2 / 4) / 4)


def test_aurc_of_tied_scores_is_the_expectation_over_orders():
    # Tied scores are answered in a random order: at every coverage the expected risk is the error rate.
    errors = np.array([1, 0, 0, 1, 0, 1, 1, 0, 0, 0])
    assert math.isclose(aurc(np.zeros(10), errors), errors.mean())
    # A tie between one right and one wrong answer, after a right one: (0 + (0 + ½)/2 + 1/3) / 3.
    assert math.isclose(aurc([0.0, 1.0, 1.0], [0, 1, 0]), (0 + 0.25 + 1 / 3) / 3)
    assert aurc([0.0, 1.0, 1.0], [0, 1, 0]) == aurc([0.0, 1.0, 1.0], [0, 0, 1])


def test_a_perfect_signal_on_a_hand_example():
    # Errors [0, 0, 1, 1] ranked right answers first: risks 0, 0, 1/3, 1/2 at coverages ¼ … 1, so AURC = 5/24;
    # the reversed ranking gives 1, 1, 2/3, 1/2 and AURC = 19/24.
    errors = [0, 0, 1, 1]
    assert math.isclose(aurc([0.1, 0.2, 0.3, 0.4], errors), 5 / 24)
    assert math.isclose(optimal_aurc(errors), 5 / 24)
    assert math.isclose(aurc([0.4, 0.3, 0.2, 0.1], errors), 19 / 24)


def test_the_oracle_ranking_reaches_the_optimal_aurc_and_no_ranking_beats_it():
    rng = np.random.default_rng(0)
    errors = rng.random(200) < 0.3
    oracle = errors.astype(float) + rng.random(200) * 0.1  # every error ranked after every right answer
    assert math.isclose(aurc(oracle, errors), optimal_aurc(errors))
    for seed in range(20):
        assert aurc(np.random.default_rng(seed).random(200), errors) >= optimal_aurc(errors)
    # Geifman et al.'s closed form r + (1 − r) ln(1 − r) is its continuous limit.
    r = errors.mean()
    assert abs(optimal_aurc(errors) - (r + (1 - r) * math.log(1 - r))) < 0.01


def test_binomial_cdf_matches_scipy_and_the_closed_forms():
    from scipy.stats import binom

    for n in (1, 7, 60, 400):
        for p in (0.01, 0.05, 0.3, 0.9):
            for k in range(-1, n + 1, max(1, n // 9)):
                assert math.isclose(binomial_cdf(k, n, p), binom.cdf(k, n, p), rel_tol=1e-9, abs_tol=1e-300)
    assert math.isclose(binomial_cdf(0, 45, 0.05), 0.95**45)
    assert binomial_cdf(0, 0, 0.2) == 1.0 and binomial_cdf(-1, 5, 0.2) == 0.0


def test_wilson_interval_matches_hand_computed_values():
    low, high = wilson_interval(50, 100)
    assert math.isclose(low, 0.4038, abs_tol=1e-4) and math.isclose(high, 0.5962, abs_tol=1e-4)
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and math.isclose(high, 0.2775, abs_tol=1e-4)
    assert wilson_interval(0, 0) is None


def test_selective_outcome_counts_answers_and_errors():
    out = selective_outcome([0.1, 0.2, 0.3, 0.9], [0, 1, 0, 1], threshold=0.3)
    assert (out["n"], out["n_answered"], out["n_wrong_answered"]) == (4, 3, 1)
    assert out["coverage"] == 0.75 and math.isclose(out["selective_risk"], 1 / 3) and out["joint_risk"] == 0.25
    nothing = selective_outcome([0.1, 0.2], [0, 1], threshold=-math.inf)
    assert nothing["n_answered"] == 0 and nothing["selective_risk"] is None and nothing["selective_risk_ci95"] is None


def test_crc_threshold_on_a_hand_example():
    # n = 9, α = 0.3: Σ losses ≤ (n + 1)α − 1 = 2, so the third-lowest wrong score is just out of reach.
    scores = [0.1, 0.2, 0.3, 0.35, 0.4, 0.5, 0.6, 0.7, 0.8]
    errors = [0, 1, 0, 1, 0, 0, 1, 1, 0]
    threshold = crc_threshold(scores, errors, 0.3)
    assert 0.5 <= threshold < 0.6 and threshold == np.nextafter(0.6, -np.inf)
    assert crc_threshold(scores, errors, 0.05) == -math.inf  # (n + 1)α < B: no answer can be afforded
    assert crc_threshold(scores, [0] * 9, 0.3) == math.inf  # no error at all: answer everything


def test_ltt_grid_starts_where_a_rejection_is_possible():
    grid = ltt_grid(np.linspace(0, 1, 1001), n_calibration=300, alpha=0.05, delta=0.1)
    n_min = math.ceil(math.log(0.1) / math.log(0.95))  # 45: the fewest answers, all right, that reject
    assert math.isclose(grid[0], 2 * n_min / 300, abs_tol=2e-3) and grid[-1] == 1.0
    assert np.all(np.diff(grid) > 0)


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2, 0.3])
def test_the_fewest_calibration_prompts_with_which_each_rule_can_answer(alpha):
    """Below crc_min_calibration(α) prompts CRC abstains on everything, at it CRC can answer some (even when
    every prompt is wrong); below ltt_min_answered(α, δ) all-right prompts LTT certifies nothing, at it it can."""
    n = crc_min_calibration(alpha)
    assert (n + 1) * alpha >= 1 - 1e-12 > n * alpha
    for count, answers in ((n - 1, False), (n, True)):  # every prompt wrong: the hardest case
        assert (crc_threshold(np.linspace(0, 1, count), np.ones(count), alpha) > -math.inf) is answers
    m = ltt_min_answered(alpha, 0.1)
    for count, certified in ((m - 1, False), (m, True)):
        right = np.linspace(0, 1, count)
        grid = np.array([1.0])  # answer everything: all right, p-value (1 − α)^count
        assert (ltt_threshold(right, np.zeros(count), alpha, 0.1, grid).threshold == 1.0) is certified


def test_learn_then_test_reports_the_smallest_p_value_over_its_grid():
    """Where nothing is certified, how near any threshold came: the smallest binomial tail over the whole grid,
    tested or not — here the second threshold's, which the fixed sequence never reaches."""
    scores = np.arange(10.0)
    wrong = np.array([1, 0, 0, 0, 0, 0, 0, 1, 1, 1])
    grid = np.array([0.0, 6.0, 9.0])  # answers 1, 7 and 10 prompts: 1, 1 and 4 wrong
    certified = ltt_threshold(scores, wrong, 0.3, 0.1, grid)
    from scipy.stats import binom

    every = [binom.cdf(1, 1, 0.3), binom.cdf(1, 7, 0.3), binom.cdf(4, 10, 0.3)]
    assert certified.threshold == -math.inf and certified.p_values == pytest.approx(every[:1])
    assert certified.smallest_p_value == pytest.approx(min(every)) and certified.smallest_p_value < every[0]


SYNTHETIC_N = 500


def synthetic(seed: int, n: int = SYNTHETIC_N, power: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Scores s ~ U(0, 1), wrong with probability s^power: the selective risk of answering s ≤ λ is
    R(λ) = λ^power / (power + 1) and the joint risk P(s ≤ λ, wrong) = λ^(power + 1) / (power + 1), exactly."""
    rng = np.random.default_rng(seed)
    s = rng.random(n)
    return s, rng.random(n) < s**power


@pytest.mark.parametrize("alpha", [0.1, 0.2])
def test_learn_then_test_keeps_its_promise_over_200_calibration_draws(alpha):
    """P(R(λ̂) > α) ≤ δ: the share of draws whose certified threshold has true selective risk R(λ̂) = λ̂²/3 above α
    stays within δ plus three binomial standard errors; a naive threshold (the largest whose empirical risk is ≤ α)
    breaks it about half the time, so the check can fail."""
    delta, seeds = 0.1, 200
    reference = np.random.default_rng(10_000).random(2000)  # a disjoint split's scores: only the grid
    grid = ltt_grid(reference, SYNTHETIC_N, alpha, delta)
    violations, naive_violations, thresholds = 0, 0, []
    for seed in range(seeds):
        s, wrong = synthetic(seed, power=2)
        certified = ltt_threshold(s, wrong, alpha, delta, grid)
        threshold = min(max(certified.threshold, 0.0), 1.0)  # −∞: nothing answered, no risk taken
        violations += threshold**2 / 3 > alpha
        thresholds.append(threshold)
        curve = risk_coverage(s, wrong)
        naive = min(curve.threshold[curve.risk <= alpha].max(), 1.0)
        naive_violations += naive**2 / 3 > alpha
    slack = 3 * math.sqrt(delta * (1 - delta) / seeds)
    assert violations / seeds <= delta + slack
    assert naive_violations / seeds > delta + slack
    assert np.median(thresholds) > 0.6 * math.sqrt(3 * alpha)  # not vacuous: most of what R(λ) ≤ α allows


def test_conformal_risk_control_keeps_the_joint_rate_at_alpha_in_expectation():
    """E[1{answered and wrong}] ≤ α, and ≥ α − 2/(n + 1) for continuous scores (Angelopoulos et al. 2022, Thm 1
    and 2): the mean over 200 draws of the exact joint risk λ̂²/2 at each draw's threshold lies within three standard
    errors of that band."""
    alpha, seeds, n = 0.1, 200, 200
    joint = []
    for seed in range(seeds):
        s, wrong = synthetic(seed, n)
        threshold = min(max(crc_threshold(s, wrong, alpha), 0.0), 1.0)
        joint.append(threshold**2 / 2)
    se = np.std(joint, ddof=1) / math.sqrt(seeds)
    assert alpha - 2 / (n + 1) - 3 * se <= np.mean(joint) <= alpha + 3 * se


def test_abstention_inputs_are_checked():
    with pytest.raises(ValueError, match="alpha"):
        crc_threshold([0.1], [0], 1.5)
    with pytest.raises(ValueError, match="delta"):
        ltt_threshold([0.1], [0], 0.1, 0.0, [0.5])
    with pytest.raises(ValueError, match="differ in length"):
        aurc([0.1, 0.2], [1])
    with pytest.raises(ValueError, match="0/1"):
        risk_coverage([0.1, 0.2], [2, 0])
    with pytest.raises(ValueError, match="finite"):
        aurc([0.1, math.nan], [1, 0])


def test_self_consistency_and_discrete_semantic_entropy():
    assert answer_agreement(["a", "a", "b", "a"], "a") == 0.75
    assert discrete_semantic_entropy(["a"] * 5) == 0.0
    assert math.isclose(discrete_semantic_entropy(["a", "b", "a", "b"]), math.log(2))
    assert math.isclose(discrete_semantic_entropy(["a", "b", "c"]), math.log(3))
