"""Statistics of small samples that Forma's experiments report: rank correlation, Student t quantiles, and the
exact permutation tests that a headline over a handful of points or training runs rests on.

A permutation test asks how often relabelling the data — every relabelling, when there are few enough to list —
gives a statistic at least as extreme as the one observed; under the null hypothesis that the labels do not matter
(exchangeability) that share is an exact p-value at any sample size (Fisher 1935; Good 2005, *Permutation,
Parametric and Bootstrap Tests of Hypotheses*, ch. 3). Its smallest possible value is 1 / (number of relabellings):
5 points give 1/120 for a rank correlation, 3 runs against 3 give 1/20 for a difference of means, so the test says
at the run's size whether a claim could have been supported at all.
"""

import itertools
import math
from typing import Literal

import numpy as np
import pandas as pd

# Student t quantiles t_{0.975, ν} for ν = 1 … 10 (standard tables); beyond, the expansion in 1/ν of
# Abramowitz & Stegun 26.7.5 (four terms) is within 2e-4 of the exact value.
_T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281)


def t_quantile_975(dof: int) -> float:
    """Student t quantile t_{0.975, dof}: the half-width factor of a two-sided 95% interval."""
    if dof < 1:
        raise ValueError(f"degrees of freedom must be ≥ 1, got {dof}")
    if dof <= len(_T975):
        return _T975[dof - 1]
    z = 1.959964  # the normal quantile
    return (
        z
        + (z**3 + z) / (4 * dof)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * dof**3)
        + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * dof**4)
    )


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation with average ranks for ties, in integer arithmetic.

    Doubled average ranks are integers, so the covariance and variances are exact, and without ties the two
    variances are equal and the square root of their product is exact too: a value the formula makes exactly
    0.9 — one adjacent swap among five — is 0.9, not 0.8999999999999998.
    """
    rx = [round(2 * r) for r in pd.Series(x).rank()]
    ry = [round(2 * r) for r in pd.Series(y).rank()]
    n = len(rx)
    cov = n * sum(a * b for a, b in zip(rx, ry)) - sum(rx) * sum(ry)
    var_x = n * sum(a * a for a in rx) - sum(rx) ** 2
    var_y = n * sum(b * b for b in ry) - sum(ry) ** 2
    if var_x == 0 or var_y == 0:
        return float("nan")
    return cov / math.sqrt(var_x * var_y)


def sign(x: float) -> int:
    """−1, 0 or +1: which way a difference points."""
    return int(x > 0) - int(x < 0)


# Beyond this many relabellings a permutation test draws them at random (seeded) instead of listing them all.
EXACT_LIMIT = 100_000
N_RANDOM_PERMUTATIONS = 20_000

Alternative = Literal["greater", "less", "two-sided"]


def _doubled_ranks(x: list[float]) -> np.ndarray:
    return np.array([round(2 * r) for r in pd.Series(x).rank()], dtype=np.int64)


def _tail_share(observed: int, statistics: np.ndarray, alternative: Alternative, centre: float) -> float:
    if alternative == "greater":
        return float(np.mean(statistics >= observed))
    if alternative == "less":
        return float(np.mean(statistics <= observed))
    return float(np.mean(np.abs(statistics - centre) >= abs(observed - centre) - 1e-9))


def spearman_permutation_p(
    x: list[float], y: list[float], alternative: Alternative = "greater", seed: int = 0
) -> float:
    """The permutation p-value of Spearman's ρ between x and y: the share of the n! pairings of x with a
    permutation of y whose ρ is at least the observed one ("greater"), at most it ("less"), or at least as far
    from 0 ("two-sided"). The variances of the ranks do not change under permutation, so ρ is compared through
    Σ 2r_x·2r_y in integers: ties with the observed value are counted exactly. Every pairing is listed up to
    EXACT_LIMIT (n ≤ 8); beyond, N_RANDOM_PERMUTATIONS seeded ones, with p = (1 + #as extreme) / (1 + draws) (a
    valid p-value, Phipson & Smyth 2010). NaN when x or y is constant (ρ undefined)."""
    if len(x) != len(y) or len(x) < 2:
        raise ValueError(f"x and y need the same length ≥ 2, got {len(x)} and {len(y)}")
    rx, ry = _doubled_ranks(x), _doubled_ranks(y)
    if len(set(rx.tolist())) < 2 or len(set(ry.tolist())) < 2:
        return float("nan")
    n = len(rx)
    observed = int(rx @ ry)
    centre = float(rx.sum() * ry.sum() / n)  # E[Σ r_x r_π(y)] over permutations: ρ = 0
    if math.factorial(n) <= EXACT_LIMIT:
        orders = np.array(list(itertools.permutations(range(n))), dtype=np.int64)
        return _tail_share(observed, ry[orders] @ rx, alternative, centre)
    rng = np.random.default_rng(seed)
    drawn = np.array([rng.permutation(ry) @ rx for _ in range(N_RANDOM_PERMUTATIONS)])
    share = _tail_share(observed, drawn, alternative, centre)
    return (1 + share * len(drawn)) / (1 + len(drawn))


def permutation_p(a: list[float], b: list[float], alternative: Alternative = "two-sided", seed: int = 0) -> float:
    """The permutation p-value of mean(b) − mean(a) for two independent groups: the share of the C(m + k, k)
    ways to deal the pooled values into groups of the same sizes whose difference is at least the observed one
    ("greater": b above a), at most it ("less"), or at least as far from 0 ("two-sided"). Listed exactly up to
    EXACT_LIMIT deals; beyond, N_RANDOM_PERMUTATIONS seeded ones with p = (1 + #as extreme) / (1 + draws). The
    null hypothesis is that the m + k values are exchangeable (the label a or b does not matter); the smallest
    p-value it can give is 1 / C(m + k, k) (two-sided: twice that)."""
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    if len(a) < 1 or len(b) < 1 or not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError(f"both groups need at least one finite value, got {len(a)} and {len(b)}")
    pooled, k = np.concatenate([a, b]), len(b)
    total = pooled.sum()
    tolerance = 1e-12 * max(1.0, float(np.abs(pooled).max()))

    def differences(b_sums: np.ndarray) -> np.ndarray:
        return b_sums / k - (total - b_sums) / len(a)

    observed = float(differences(np.array([b.sum()]))[0])
    if math.comb(len(pooled), k) <= EXACT_LIMIT:
        deals = np.array(list(itertools.combinations(range(len(pooled)), k)), dtype=np.int64)
        stats = differences(pooled[deals].sum(axis=1))
        draws = None
    else:
        rng = np.random.default_rng(seed)
        stats = differences(
            np.array([pooled[rng.permutation(len(pooled))[:k]].sum() for _ in range(N_RANDOM_PERMUTATIONS)])
        )
        draws = len(stats)
    if alternative == "greater":
        hits = np.sum(stats >= observed - tolerance)
    elif alternative == "less":
        hits = np.sum(stats <= observed + tolerance)
    else:
        hits = np.sum(np.abs(stats) >= abs(observed) - tolerance)
    return float(hits / len(stats)) if draws is None else float((1 + hits) / (1 + draws))


def smallest_permutation_p(m: int, k: int, alternative: Alternative = "two-sided") -> float:
    """The smallest p-value `permutation_p` can give for groups of m and k (all of one group beyond all of the
    other): 1 / C(m + k, k), twice that two-sided. A claim whose test cannot get below its level at these sizes
    cannot be supported by them."""
    smallest = 1 / math.comb(m + k, k)
    return min(1.0, 2 * smallest) if alternative == "two-sided" else smallest
