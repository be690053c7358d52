"""The scaling fit L(N) = E + A·N^(−α): the loss a family of models approaches as it grows (E), with a
profile-likelihood interval, as the kl experiment fits it against a source's known entropy rate."""

import math
from typing import Any

import numpy as np

from lab.metrics.statistics import t_quantile_975

ALPHA_RANGE = (1e-3, 10.0)  # the α grid: wide enough that an α at its edge (flagged) is a property of the data


def fit_power_law(n_params: Any, loss: Any, alphas: Any = None, n_grid: int = 6000) -> dict[str, Any]:
    """Least-squares fit of L(N) = E + A·N^(−α) with E ≥ 0, and a 95% profile interval for E.

    E ≥ 0 is the only constraint: A may take either sign, and α runs over a log grid on ALPHA_RANGE (an α
    on its edge is flagged). For each α the model is linear in x = (N/N₀)^(−α) (N₀ the geometric mean of N,
    for conditioning), so E and A follow in closed form; the fit is the best (α, E ≥ 0, A). The interval is
    the profile-likelihood one for nonlinear least squares (Bates & Watts 1988, §6.1): E is in it when the
    residual sum of squares with E held fixed, RSS(E) = min_{A, α} RSS, satisfies
    RSS(E) ≤ RSS_min·(1 + t²_{0.975, n−3}/(n − 3)). It needs n ≥ 4 points. The fitted E is in the interval
    by definition (RSS(Ê) = RSS_min), so that is no check of anything. E is searched on [0, 2·max L]; an
    interval that reaches an end of that range is reported as open there (at 0: the data cannot tell E
    from 0).
    """
    N = np.asarray(n_params, dtype=np.float64)
    L = np.asarray(loss, dtype=np.float64)
    if N.shape != L.shape or N.ndim != 1 or len(N) < 3:
        raise ValueError(f"need matching 1-D n_params and loss with ≥ 3 points, got {N.shape} and {L.shape}")
    alphas = np.geomspace(*ALPHA_RANGE, 800) if alphas is None else np.asarray(alphas, dtype=np.float64)
    n0 = float(np.exp(np.log(N).mean()))
    x = (N[None, :] / n0) ** (-alphas[:, None])  # [alpha, point]

    # Profile over E ∈ [0, 2·max L]: for fixed E and α the best A is Σx(L−E)/Σx².
    E_grid = np.linspace(0.0, 2.0 * float(L.max()), n_grid)
    y = L[None, :] - E_grid[:, None]  # [E, point]
    sxx0 = (x**2).sum(axis=1)  # [alpha]
    sxy = y @ x.T  # [E, alpha]
    A_grid = sxy / sxx0[None, :]
    rss_grid = (y**2).sum(axis=1)[:, None] - A_grid * sxy  # [E, alpha]
    profile = rss_grid.min(axis=1)
    g = int(np.argmin(profile))
    a = int(np.argmin(rss_grid[g]))
    E, A0, best_alpha, rss_min = float(E_grid[g]), float(A_grid[g, a]), a, float(profile[g])
    polished = _off_grid(x, L)  # E off the grid, where that fits better
    if polished[3] < rss_min:
        best_alpha, E, A0, rss_min = polished
    alpha = float(alphas[best_alpha])
    dof = len(N) - 3
    out: dict[str, Any] = {
        "E_nats": E,
        "A": A0 * n0**alpha,
        "alpha": alpha,
        "rss": rss_min,
        "dof": dof,
        "alpha_at_grid_edge": best_alpha in (0, len(alphas) - 1),
        "constraints": f"E ≥ 0 only (A either sign, α on a log grid over [{ALPHA_RANGE[0]:g}, {ALPHA_RANGE[1]:g}])",
    }
    return out | _profile_interval(E_grid, profile, E, rss_min, dof)


def _profile_interval(E_grid: np.ndarray, profile: np.ndarray, E: float, rss_min: float, dof: int) -> dict[str, Any]:
    """The 95% profile interval for E (see `fit_power_law`): the E of the grid whose RSS(E) = `profile` is within
    RSS_min·(1 + t²_{0.975, dof}/dof), with the ends of the grid it reaches named as open."""
    if dof < 1:
        return {"E_ci95": [math.nan, math.nan], "E_ci95_open": "no interval: fewer than 4 points"}
    threshold = rss_min * (1 + t_quantile_975(dof) ** 2 / dof)
    inside = np.nonzero(profile <= max(threshold, float(profile.min())))[0]  # a perfect fit: its grid point
    lo, hi = int(inside.min()), int(inside.max())
    open_ends = [side for side, at_edge in (("below", lo == 0), ("above", hi == len(E_grid) - 1)) if at_edge]
    # Ê belongs to the confidence set by definition; the grid's resolution could leave it just outside.
    return {
        "E_ci95": [min(float(E_grid[lo]), E), max(float(E_grid[hi]), E)],
        "E_ci95_open": " and ".join(open_ends) or None,
        "rss_threshold": float(threshold),
    }


def _off_grid(x: np.ndarray, L: np.ndarray) -> tuple[int, float, float, float]:
    """(α's index, E, A, RSS) of the best fit with E off the grid: for each α the unconstrained (E, A) is
    closed-form, kept where E ≥ 0 (RSS inf when it is nowhere)."""
    xm, lm = x.mean(axis=1), L.mean()
    slope = ((x - xm[:, None]) * (L - lm)[None, :]).sum(axis=1) / ((x - xm[:, None]) ** 2).sum(axis=1)
    intercept = lm - slope * xm
    rss = ((L[None, :] - intercept[:, None] - slope[:, None] * x) ** 2).sum(axis=1)
    rss = np.where(intercept >= 0, rss, np.inf)
    best = int(np.argmin(rss))
    return best, float(intercept[best]), float(slope[best]), float(rss[best])
