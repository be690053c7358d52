"""Statistics of small samples that Forma's experiments report: rank correlation and Student t quantiles."""

import math

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
    return (z + (z ** 3 + z) / (4 * dof) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * dof ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * dof ** 3)
            + (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / (92160 * dof ** 4))


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
