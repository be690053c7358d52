"""lab.metrics.statistics and lab.metrics.scaling: analytic values."""

import math

import numpy as np
import pytest

from lab.metrics.scaling import fit_power_law
from lab.metrics.statistics import spearman, t_quantile_975


def test_spearman_is_exact_at_the_acceptance_threshold():
    # One adjacent swap among five: ρ = 1 − 6·Σd²/(n(n²−1)) = 1 − 12/120 = 0.9 exactly, which meets "≥ 0.9".
    assert spearman([1, 2, 3, 4, 5], [1, 2, 4, 3, 5]) == 0.9
    assert spearman([0.10, 0.23, 0.25, 0.27, 0.28], [0.12, 0.14, 0.18, 0.16, 0.20]) == 0.9
    assert spearman([1, 2, 3], [3, 2, 1]) == -1.0
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(np.corrcoef([1, 2.5, 2.5, 4], [1, 3, 2, 4])[0, 1])
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_power_law_fit_recovers_a_noise_free_law_and_covers_a_noisy_one():
    N = np.array([1e3, 3e3, 1e4, 3e4, 1e5, 3e5])
    exact = 2.0 + 5.0 * N**-0.5
    fit = fit_power_law(N, exact)
    assert fit["E_nats"] == pytest.approx(2.0, abs=1e-3) and fit["alpha"] == pytest.approx(0.5, rel=0.02)
    noisy = exact + np.random.default_rng(0).normal(0.0, 0.005, len(N))
    fit = fit_power_law(N, noisy)
    assert fit["E_ci95"][0] <= 2.0 <= fit["E_ci95"][1] and fit["dof"] == 3
    assert math.isnan(fit_power_law(N[:3], exact[:3])["E_ci95"][0])  # 3 points: no interval


def test_power_law_fit_constrains_only_e():
    """E ≥ 0 is the only constraint: a law whose loss rises with N is fitted with A < 0, an E above every
    loss is allowed, and an E the data would put below 0 sits at 0 with the interval open below."""
    N = np.array([1e3, 3e3, 1e4, 3e4, 1e5, 3e5])
    rising = 3.0 - 2.0 * N**-0.3
    fit = fit_power_law(N, rising)
    assert fit["A"] < 0 and fit["E_nats"] == pytest.approx(3.0, abs=1e-2) and fit["E_nats"] > rising.max()
    below = -0.5 + 10.0 * N**-0.2
    fit = fit_power_law(N, below)
    assert fit["E_nats"] == 0.0 and fit["E_ci95_open"] and "below" in fit["E_ci95_open"]


def test_t_quantiles():
    assert t_quantile_975(1) == pytest.approx(12.706, abs=1e-3)
    assert t_quantile_975(10) == pytest.approx(2.2281, abs=1e-4)  # the last table entry
    for dof, table in ((11, 2.2010), (15, 2.1314), (30, 2.0423), (120, 1.9799)):  # the expansion
        assert t_quantile_975(dof) == pytest.approx(table, abs=2e-4)


def test_sign_says_which_way_a_difference_points():
    from lab.metrics.statistics import sign

    assert [sign(x) for x in (-2.5, 0.0, 1e-12)] == [-1, 0, 1]


def test_permutation_tests_match_scipy_and_their_smallest_p_values():
    """Exact permutation p-values against scipy.stats.permutation_test listing every relabelling, and the floor
    1/n! (rank correlation) or 1/C(m + k, k) (two groups) that decides whether a claim could be supported."""
    from scipy import stats

    from lab.metrics.statistics import permutation_p, smallest_permutation_p, spearman, spearman_permutation_p

    mf, rates = [0.056, 0.218, 0.25, 0.2684, 0.282], [0.0687, 0.2588, 0.2782, 0.2157, 0.6455]
    for alternative in ("greater", "less"):
        peer = stats.permutation_test(
            (rates,),
            lambda y: stats.spearmanr(mf, y).statistic,
            permutation_type="pairings",
            alternative=alternative,
            n_resamples=math.inf,
        ).pvalue
        assert spearman_permutation_p(mf, rates, alternative) == pytest.approx(peer, abs=1e-12)
    assert spearman(mf, rates) == pytest.approx(0.7) and spearman_permutation_p(mf, rates) == pytest.approx(14 / 120)
    assert spearman_permutation_p([1, 2, 3], [1, 2, 3]) == pytest.approx(1 / 6)  # 3 points: never below 1/6
    assert spearman_permutation_p([1, 2, 3, 4, 5], [1, 2, 3, 4, 5]) == pytest.approx(1 / 120)
    assert spearman_permutation_p([1, 2, 2, 3], [4, 3, 3, 1], "two-sided") == pytest.approx(
        stats.permutation_test(
            ([4, 3, 3, 1],),
            lambda y: abs(stats.spearmanr([1, 2, 2, 3], y).statistic),
            permutation_type="pairings",
            alternative="greater",
            n_resamples=math.inf,
        ).pvalue
    )
    assert math.isnan(spearman_permutation_p([1, 1, 1], [1, 2, 3]))

    rng = np.random.default_rng(1)
    for m, k in ((3, 3), (4, 5), (3, 6)):
        a, b = rng.normal(size=m), rng.normal(size=k) + 0.8
        for alternative in ("greater", "less"):
            peer = stats.permutation_test(
                (a, b),
                lambda x, y: np.mean(y) - np.mean(x),
                permutation_type="independent",
                alternative=alternative,
                n_resamples=math.inf,
            ).pvalue
            assert permutation_p(a, b, alternative) == pytest.approx(peer, abs=1e-12)
        two_sided = stats.permutation_test(
            (a, b),
            lambda x, y: abs(np.mean(y) - np.mean(x)),
            permutation_type="independent",
            alternative="greater",
            n_resamples=math.inf,
        ).pvalue
        assert permutation_p(a, b) == pytest.approx(two_sided, abs=1e-12)
    apart = permutation_p([0.15, 0.151, 0.149], [0.12, 0.121, 0.119], "less")
    assert apart == pytest.approx(1 / 20) == smallest_permutation_p(3, 3, "less")
    assert smallest_permutation_p(4, 4, "less") == pytest.approx(1 / 70)
    assert permutation_p([0.15, 0.151, 0.149], [0.12, 0.121, 0.119], "greater") == 1.0


def test_a_permutation_test_beyond_the_exact_limit_draws_seeded_relabellings():
    from lab.metrics.statistics import EXACT_LIMIT, permutation_p

    rng = np.random.default_rng(0)
    a, b = rng.normal(size=12), rng.normal(size=12) + 1.5  # C(24, 12) ≈ 2.7 million deals
    assert math.comb(24, 12) > EXACT_LIMIT
    p = permutation_p(a, b, "greater", seed=3)
    assert p == permutation_p(a, b, "greater", seed=3) and 0 < p < 0.01
    assert 0.3 < permutation_p(a, a + rng.normal(scale=1e-3, size=12), "two-sided") <= 1
