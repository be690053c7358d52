"""lab.metrics.hallucination on hand-computed cases (docs/definitions.md §2)."""

import math

import numpy as np
import pytest

from lab.metrics.hallucination import (
    bin_index,
    bin_table,
    binmass_tv,
    bound_slack,
    kl_hat,
    miscalibration_tv,
    missing_mass,
    monofact_rate,
    singleton_bound,
    singleton_calibration_delta,
)


def test_monofact_rate_on_a_hand_counted_sample():
    # Training sample a b a c d d d e over facts a..f: a twice, d three times, b c e once, f never.
    sample = ["a", "b", "a", "c", "d", "d", "d", "e"]
    counts = np.array([sample.count(f) for f in "abcdef"])
    assert counts.tolist() == [2, 1, 1, 3, 1, 0]
    assert monofact_rate(counts) == pytest.approx(3 / 8)  # b, c, e: three examples out of eight
    p = np.array([0.3, 0.2, 0.1, 0.2, 0.1, 0.1])
    assert missing_mass(p, counts) == pytest.approx(0.1)  # only f is unseen


def test_monofact_rate_counts_occurrences_not_distinct_strings():
    assert monofact_rate([1, 1, 1, 1]) == 1.0  # four facts once each: every example is a monofact
    assert monofact_rate([4, 0, 0, 0]) == 0.0  # one fact four times: none


@pytest.mark.parametrize("bad", [[], [0, 0], [1, -1], [1.5, 2]])
def test_monofact_rate_rejects_bad_counts(bad):
    with pytest.raises(ValueError):
        monofact_rate(bad)


def test_eps_bins_are_half_open_intervals_of_powers():
    # (0.9, 1] is bin 0 and (0.81, 0.9] bin 1, closed at the top; 0.1 ∈ (0.9^22, 0.9^21]; 0.05 ∈ bin 28.
    assert bin_index(np.array([1.0])).tolist() == [0]
    assert bin_index(np.array([0.95, 0.05])).tolist() == [0, 28]
    assert bin_index(np.array([0.9, 0.1])).tolist() == [1, 21]
    assert bin_index(np.array([0.5, 0.25, 0.25]), eps=0.5).tolist() == [1, 2, 2]
    # g = 0 has no ε-bin: it gets one of its own, after every other.
    assert bin_index(np.array([0.85, 0.0])).tolist() == [1, 2]


def test_adaptive_bins_hold_equal_mass_and_keep_ties_together():
    g = np.array([0.1, 0.4, 0.2, 0.3])
    # Decreasing: 0.4 (mass before 0), 0.3 (0.4), 0.2 (0.7), 0.1 (0.9) → bins ⌊2·before⌋ = 0, 0, 1, 1.
    assert bin_index(g, "adaptive", n_bins=2).tolist() == [1, 0, 1, 0]
    assert bin_index(np.full(4, 0.25), "adaptive", n_bins=4).tolist() == [0, 0, 0, 0]


def test_coarsened_tv_exceeds_the_bin_mass_form():
    # Two factoids share the ε-bin (0.9^12, 0.9^11] = (0.282, 0.314]; p's 0.59 sits on one of them.
    g = np.array([0.30, 0.29, 0.41])
    p = np.array([0.59, 0.00, 0.41])
    assert bin_index(g).tolist() == [11, 11, 8]
    # Bin masses agree exactly (0.59 = 0.59, 0.41 = 0.41), so the bin-mass form is 0; p^Π spreads 0.59
    # as 0.295 + 0.295, which differs from g by 0.005 + 0.005: the coarsened TV is ½·0.01.
    assert binmass_tv(g, p) == pytest.approx(0.0, abs=1e-15)
    assert miscalibration_tv(g, p) == pytest.approx(0.005)
    # …and both are far below the plain TV ½ Σ|p − g| = 0.29, which coarsening forgives.
    assert 0.5 * np.abs(p - g).sum() == pytest.approx(0.29)


def test_malformed_mass_counts_in_the_tv_and_is_never_renormalised_away():
    g = np.array([0.30, 0.29, 0.20, 0.01])  # Σ = 0.8: the model emits 0.2 of non-factoids
    p = np.array([0.60, 0.00, 0.40, 0.00])
    # Bins {0, 1}, {2}, {3}: within-bin ½(0 + 0.01) + ½·0.2 + ½·0.01, plus ½·0.2 for ⊥.
    assert miscalibration_tv(g, p) == pytest.approx(0.5 * (0.01 + 0.2 + 0.01 + 0.2))
    assert binmass_tv(g, p) == pytest.approx(0.5 * (0.01 + 0.2 + 0.01 + 0.2))
    table = bin_table(g, p)
    assert table.bin.tolist() == [11, 15, 43] and table.n_factoids.tolist() == [2, 1, 1]
    np.testing.assert_allclose(table.g_low, 0.9 ** np.array([12, 16, 44]))  # ε-bins: the interval edges
    np.testing.assert_allclose(table.g_high, 0.9 ** np.array([11, 15, 43]))
    assert table.miscalibration == pytest.approx(miscalibration_tv(g, p))
    assert table.binmass == pytest.approx(binmass_tv(g, p))
    assert table.g_mass.sum() + table.malformed_mass == pytest.approx(1.0)
    assert table.p_mass.sum() == pytest.approx(1.0)
    assert table.tv_within.sum() + 0.5 * table.malformed_mass == pytest.approx(miscalibration_tv(g, p))
    # A model that emits nothing well formed is as far from p as can be.
    assert miscalibration_tv(np.zeros(4), p) == pytest.approx(1.0)


def test_adaptive_tv_by_hand():
    g = np.array([0.4, 0.3, 0.2, 0.1])
    p = np.array([0.5, 0.5, 0.0, 0.0])
    # Bins {0.4, 0.3} (p 1.0 → 0.5 each) and {0.2, 0.1} (p 0): ½(0.1 + 0.2 + 0.2 + 0.1) = 0.3.
    assert miscalibration_tv(g, p, scheme="adaptive", n_bins=2) == pytest.approx(0.3)
    assert binmass_tv(g, p, scheme="adaptive", n_bins=2) == pytest.approx(0.5 * (0.3 + 0.3))
    table = bin_table(g, p, scheme="adaptive", n_bins=2)  # adaptive bins: the smallest and largest g inside
    assert table.g_high.tolist() == [0.4, 0.2] and table.g_low.tolist() == [0.3, 0.1]


def test_bin_mass_form_is_a_lower_bound_and_calibrated_models_score_zero():
    rng = np.random.default_rng(0)
    for _ in range(50):
        g = rng.dirichlet(np.full(40, 0.3)) * rng.uniform(0.5, 1.0)
        p = np.zeros(40)
        p[rng.choice(40, 5, replace=False)] = rng.dirichlet(np.ones(5))
        for scheme in ("eps", "adaptive"):
            tv = miscalibration_tv(g, p, scheme=scheme, n_bins=4)
            assert binmass_tv(g, p, scheme=scheme, n_bins=4) <= tv + 1e-12
            assert 0.0 <= tv <= 1.0
    # g equal to p^Π itself (constant inside each bin) has zero miscalibration.
    g = np.array([0.25, 0.25, 0.5])
    assert miscalibration_tv(g, np.array([0.5, 0.0, 0.5])) == pytest.approx(0.0, abs=1e-15)


def test_deterministic_half_of_the_bound_holds_for_every_g():
    # g(H) ≥ p^Π(H) − ‖p^Π − g‖_TV for any g, malformed mass included: what makes Mis the right TV.
    rng = np.random.default_rng(1)
    for _ in range(200):
        n = int(rng.integers(3, 30))
        g = rng.dirichlet(np.full(n, 0.5)) * rng.uniform(0.0, 1.0)
        p = np.zeros(n)
        facts = rng.choice(n, int(rng.integers(1, n)), replace=False)
        p[facts] = rng.dirichlet(np.ones(len(facts)))
        hallucination = np.ones(n, dtype=bool)
        hallucination[facts] = False
        for scheme in ("eps", "adaptive"):
            table = bin_table(g, p, scheme=scheme, n_bins=3)
            assert g[hallucination].sum() >= table.spread_off_support - table.miscalibration - 1e-12


def test_spread_off_support_by_hand():
    g = np.array([0.30, 0.29, 0.41])
    p = np.array([0.59, 0.00, 0.41])
    table = bin_table(g, p)  # bin {0, 1} spreads 0.59 over one fact and one hallucination
    assert table.n_support.tolist() == [1, 1]
    assert table.spread_off_support == pytest.approx(0.295)


def test_kl_hat_is_zero_for_a_memoriser_and_by_hand_otherwise():
    counts = np.array([3, 1])
    assert kl_hat(counts / 4, counts) == pytest.approx(0.0, abs=1e-15)
    # g = (0.5, 0.25) in different ε-bins: P = (3/4, 1/4), G = (1/2, 1/4) → (3/4) ln 1.5.
    assert kl_hat(np.array([0.5, 0.25]), counts) == pytest.approx(0.75 * math.log(1.5))
    with pytest.raises(ValueError):
        kl_hat(np.array([0.5, 0.25]), np.array([1, 0]))


def test_bound_slack_by_hand():
    # |F|/|H| = 1/300 at δ = 0.01 gives 3·(1/300)/0.01 = 1; n = 6 ln 600 / 0.25 makes the root 0.5.
    n = 6 * math.log(600) / 0.25
    bound = bound_slack(
        0.2, monofact_rate=0.9, miscalibration=0.1, n_facts=1, n_hallucinations=300, n_train=round(n), delta=0.01
    )
    root = math.sqrt(6 * math.log(600) / round(n))
    assert bound.slack == pytest.approx(1.0 + root)
    assert bound.right_side == pytest.approx(0.9 - 0.1 - 1.0 - root)
    assert bound.margin == pytest.approx(0.2 - bound.right_side)
    assert bound.hallucination_rate == 0.2
    # The headline at δ = 0.01: 300·|F|/|H| + sqrt(6 ln 600/n) ≈ 300·|F|/|H| + 6.2/√n.
    b = bound_slack(0.0, 0.0, 0.0, n_facts=1000, n_hallucinations=6_719_000, n_train=5000, delta=0.01)
    assert b.slack == pytest.approx(300 * 1000 / 6_719_000 + 6.2 / math.sqrt(5000), abs=1e-3)


def test_singleton_calibration_delta_and_bound_by_hand():
    q = np.array([[0.5, 0.3, 0.2], [0.1, 0.45, 0.35]])  # row 2 leaves 0.1 to malformed answers
    mu = np.array([0.75, 0.25])
    # A = {(0, 0), (1, 1)} above 0.4: p̂(A) = .75·.5 + .25·.45 = .4875; p(A) = .75 (truth 0 ∈ A, truth 2 ∉ A).
    assert singleton_calibration_delta(q, [0, 2], mu, threshold=0.4) == pytest.approx(0.2625)
    b = singleton_bound(error=0.4, singleton_rate=0.3, min_wrong_answers=2, n_train=100, calibration_delta=0.1)
    assert b.finite_n_term == pytest.approx((35 + 6 * math.log(100)) / 10)
    assert b.right_side_without_finite_n == pytest.approx(0.3 - 1.0 - 0.1)
    assert b.right_side == pytest.approx(-0.8 - b.finite_n_term)
    assert b.margin_without_finite_n == pytest.approx(1.2)
    assert b.margin == pytest.approx(0.4 - b.right_side)


def test_inputs_are_checked():
    with pytest.raises(ValueError, match="sum"):
        miscalibration_tv(np.array([0.7, 0.7]), np.array([0.5, 0.5]))
    with pytest.raises(ValueError, match="scheme"):
        miscalibration_tv(np.array([0.5, 0.5]), np.array([0.5, 0.5]), scheme="equal")
    with pytest.raises(ValueError, match="same factoids"):
        miscalibration_tv(np.array([0.5, 0.5]), np.array([1.0]))
    with pytest.raises(ValueError, match="delta"):
        bound_slack(0.1, 0.1, 0.1, 1, 10, 10, delta=0.0)
