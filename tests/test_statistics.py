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
    exact = 2.0 + 5.0 * N ** -0.5
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
    rising = 3.0 - 2.0 * N ** -0.3
    fit = fit_power_law(N, rising)
    assert fit["A"] < 0 and fit["E_nats"] == pytest.approx(3.0, abs=1e-2) and fit["E_nats"] > rising.max()
    below = -0.5 + 10.0 * N ** -0.2
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
