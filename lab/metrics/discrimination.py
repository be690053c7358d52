"""How well a score separates two classes, and bootstrap intervals for any metric (pure numpy): one home,
one argument order, (scores, labels).

    AUROC = P(score of a random positive > score of a random negative), ties counting ½
          = U / (n₊ n₋), the Mann–Whitney U statistic from average ranks.

AUROC intervals (`auroc_ci`) are stratified: positives and negatives (groups holding them, when rows
are grouped) are resampled separately, so no resample lacks a class and none is dropped; below
MIN_PER_CLASS of either class no interval is given, and the reason is said in words.

A percentile bootstrap interval at level 1 − a rests on the a/2 · n_boot resamples in each tail: 1,000
resamples give 25 per tail at 95% but 2 at the 99.6% of a dozen Bonferroni-corrected claims, where the
interval's ends are single order statistics. `auroc_ci(..., method="delong")` needs no resamples: DeLong,
DeLong & Clarke-Pearson (1988)'s variance of the Mann–Whitney AUROC from its structural components,

    V₁₀(i) = (1/n₋) Σ_j ψ(s_i, s_j) for each positive i,  V₀₁(j) = (1/n₊) Σ_i ψ(s_i, s_j) for each negative j,
    ψ(a, b) = 1{a > b} + ½·1{a = b},   Var(AUROC) = S₁₀/n₊ + S₀₁/n₋ (S the sample variances, ddof 1),

computed from midranks (Sun & Xu 2014, IEEE Signal Processing Letters 21, "Fast implementation of DeLong's
algorithm"), with the normal interval AUROC ± z_{1−a/2}·√Var clipped to [0, 1] — the interval pROC's
`ci.auc(method = "delong")` gives — at any level (`auroc_delong_variance`).
"""

import math
from collections.abc import Callable
from statistics import NormalDist
from typing import Any, Literal, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

# The stratified bootstrap estimates each class's share of the AUROC's variance (DeLong et al. 1988:
# Var ≈ V₁₀/n₊ + V₀₁/n₋) from that class's own m units. It understates that share by the factor
# (m − 1)/m and has at most C(2m − 1, m) distinct resamples of the class: m = 1 gives a share of 0 (the
# "[0.168, 0.334]" interval of a single positive), m = 10 a 10% shortfall and 92,378 distinct resamples.
MIN_PER_CLASS = 10


class Metric(NamedTuple):
    """A metric's value and its bootstrap 95% interval. n_pos / n_neg: the two classes' counts behind an
    AUROC; why_no_interval: why low/high are NaN (too few of a class, resamples without a finite value)."""

    value: float
    low: float
    high: float
    n_pos: int | None = None
    n_neg: int | None = None
    why_no_interval: str | None = None

    def __str__(self) -> str:
        counts = f" ({self.n_pos} positives, {self.n_neg} negatives)" if self.n_pos is not None else ""
        if self.why_no_interval:
            return f"{self.value:.3f}{counts}, no interval: {self.why_no_interval}"
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}]{counts}"

    @property
    def interval(self) -> list[float] | None:
        return None if self.why_no_interval or not np.isfinite(self.low) else [self.low, self.high]

    def fields(self, key: str) -> dict[str, Any]:
        """{key, key_ci95, key_n_pos, key_n_neg, key_why_no_interval}: how results.json carries it."""
        out: dict[str, Any] = {key: self.value, f"{key}_ci95": self.interval}
        if self.n_pos is not None:
            out |= {f"{key}_n_pos": self.n_pos, f"{key}_n_neg": self.n_neg}
        out[f"{key}_why_no_interval"] = self.why_no_interval
        return out


def _average_ranks(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """1-based ranks, ties sharing their average rank."""
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    starts = np.r_[0, np.flatnonzero(sorted_x[1:] != sorted_x[:-1]) + 1]
    ends = np.r_[starts[1:], len(x)]
    ranks = np.empty(len(x))
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return ranks


def _binary_labels(labels: ArrayLike, n: int) -> NDArray[np.bool_]:
    y = np.asarray(labels).ravel()
    if y.shape != (n,):
        raise ValueError(f"scores and labels differ in length: {n} vs {y.size}")
    if y.dtype != bool and not np.all((y == 0) | (y == 1)):
        raise ValueError("labels must be 0/1 (or boolean): auroc takes (scores, labels), in that order")
    return y.astype(bool)


def auroc(scores: ArrayLike, labels: ArrayLike) -> float:
    """Area under the ROC curve = P(score of a random positive > score of a random negative), ties ½: the
    Mann–Whitney U statistic / (n₊ n₋). An [n, k] score matrix with class labels 0..k−1: the mean one-vs-rest
    AUROC over the k classes. NaN when a class is absent."""
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim == 2:
        y = np.asarray(labels).ravel()
        if not np.issubdtype(y.dtype, np.integer) or y.size and (y.min() < 0 or y.max() >= s.shape[1]):
            raise ValueError(f"with an [n, k] score matrix, labels must be class indices 0 … {s.shape[1] - 1}")
        return float(np.mean([auroc(s[:, c], y == c) for c in range(s.shape[1])]))
    s = s.ravel()
    y = _binary_labels(labels, s.size)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = _average_ranks(s)
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def _units(n: int, groups: Any, strata: Any) -> tuple[NDArray[np.int64], list[NDArray[np.int64]]]:
    """(unit of each row, the units of each stratum). A unit is a row, or a group when rows are grouped; a
    group's stratum is the set of strata values among its rows (all-positive, all-negative or mixed)."""
    unit = np.arange(n) if groups is None else np.unique(np.asarray(groups).ravel(), return_inverse=True)[1]
    if len(unit) != n:
        raise ValueError(f"groups must have one entry per row ({n}), got {len(unit)}")
    n_units = int(unit.max()) + 1 if n else 0
    if strata is None:
        return unit, [np.arange(n_units)]
    strata = np.asarray(strata).ravel()
    if len(strata) != n:
        raise ValueError(f"strata must have one entry per row ({n}), got {len(strata)}")
    keys: dict[int, set] = {}
    for u, s in zip(unit.tolist(), strata.tolist()):
        keys.setdefault(u, set()).add(s)
    by_key: dict[tuple, list[int]] = {}
    for u in range(n_units):
        by_key.setdefault(tuple(sorted(keys[u])), []).append(u)
    return unit, [np.array(v) for _, v in sorted(by_key.items())]


def bootstrap_ci(
    metric: Callable[..., float],
    *arrays: ArrayLike,
    groups: Any = None,
    strata: Any = None,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> Metric:
    """metric(*arrays) and its percentile bootstrap interval (Efron & Tibshirani 1993, §13.3).

    Resamples rows with replacement — whole groups when `groups` gives each row its entity (rows of one
    entity are not independent) — and, with `strata`, within each stratum separately (each stratum keeps
    its number of units in every resample). No resample is dropped: if any gives a non-finite value the
    interval is refused and `why_no_interval` says so (stratify by the labels to keep every class present).
    """
    columns = [np.asarray(a) for a in arrays]
    n = len(columns[0])
    value = float(metric(*columns))
    unit, strata_units = _units(n, groups, strata)
    rows_by_unit = np.argsort(unit, kind="stable")
    rng = np.random.default_rng(seed)
    n_units = len(np.unique(unit))
    samples = np.empty(n_boot)
    for b in range(n_boot):
        drawn = np.zeros(n_units, dtype=np.int64)
        for members in strata_units:
            drawn += np.bincount(members[rng.integers(0, len(members), len(members))], minlength=n_units)
        index = np.repeat(rows_by_unit, drawn[unit[rows_by_unit]])  # each row as often as its unit was drawn
        samples[b] = metric(*(col[index] for col in columns))
    bad = int(np.sum(~np.isfinite(samples)))
    if bad:
        return Metric(
            value,
            float("nan"),
            float("nan"),
            why_no_interval=(
                f"{bad} of {n_boot} resamples gave no finite value (a class missing from them?): no interval"
            ),
        )
    tail = (1 - level) / 2
    low, high = np.quantile(samples, [tail, 1 - tail])
    return Metric(value, float(low), float(high))


def auroc_delong_variance(scores: ArrayLike, labels: ArrayLike) -> float:
    """DeLong's variance of the AUROC, S₁₀/n₊ + S₀₁/n₋ (see the module docstring), from midranks: V₁₀(i) =
    (R_i − R⁺_i)/n₋ with R the midrank of positive i among all scores and R⁺ among the positives, V₀₁(j) =
    1 − (R_j − R⁻_j)/n₊ likewise for negative j. NaN with fewer than 2 of either class."""
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = _binary_labels(labels, s.size)
    pos, neg = s[y], s[~y]
    if len(pos) < 2 or len(neg) < 2:
        return float("nan")
    ranks = _average_ranks(s)
    v10 = (ranks[y] - _average_ranks(pos)) / len(neg)
    v01 = 1.0 - (ranks[~y] - _average_ranks(neg)) / len(pos)
    return float(np.var(v10, ddof=1) / len(pos) + np.var(v01, ddof=1) / len(neg))


def auroc_ci(
    scores: ArrayLike,
    labels: ArrayLike,
    groups: Any = None,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    min_per_class: int = MIN_PER_CLASS,
    method: Literal["bootstrap", "delong"] = "bootstrap",
) -> Metric:
    """AUROC with n_pos / n_neg and an interval at `level`: a stratified bootstrap (positives and negatives — or
    the groups holding them — resampled separately), or with method="delong" DeLong's normal interval, which
    needs no resamples and so holds at any level (ungrouped binary scores only). Fewer than `min_per_class`
    units of either class: no interval, and why_no_interval says how many there are. [n, k] scores: the
    one-vs-rest mean, each class a stratum."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels).ravel()
    value = auroc(s, y)
    binary = s.ndim == 1
    if method not in ("bootstrap", "delong"):
        raise ValueError(f"method must be 'bootstrap' or 'delong', got {method!r}")
    if method == "delong" and (groups is not None or not binary):
        raise ValueError("DeLong's interval is for ungrouped binary scores; use method='bootstrap'")
    unit = np.arange(len(y)) if groups is None else np.unique(np.asarray(groups).ravel(), return_inverse=True)[1]
    classes = [0, 1] if binary else list(range(s.shape[1]))
    holding = {c: len(np.unique(unit[(y.astype(int) if binary else y) == c])) for c in classes}
    n_pos, n_neg = (int(y.astype(bool).sum()), int((~y.astype(bool)).sum())) if binary else (None, None)
    what = "groups" if groups is not None else "items"
    if min(holding.values()) < min_per_class:
        counts = (
            f"{holding[1]} positive and {holding[0]} negative"
            if binary
            else ", ".join(f"{holding[c]} of class {c}" for c in classes)
        )
        return Metric(
            value,
            float("nan"),
            float("nan"),
            n_pos,
            n_neg,
            f"only {counts} {what}: a stratified AUROC interval needs at least {min_per_class} of each",
        )
    if method == "delong":
        half = NormalDist().inv_cdf(1 - (1 - level) / 2) * math.sqrt(auroc_delong_variance(s, y))
        return Metric(value, max(0.0, value - half), min(1.0, value + half), n_pos, n_neg)
    interval = bootstrap_ci(auroc, s, y, groups=groups, strata=y, n_boot=n_boot, level=level, seed=seed)
    return interval._replace(n_pos=n_pos, n_neg=n_neg)
