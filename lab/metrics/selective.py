"""Selective prediction: answer only when a risk score is low enough, and say what that buys (pure numpy).

A prompt is *answered* at threshold λ when its risk score s ≤ λ (lower = safer), else the model abstains.
Over n prompts with errors e_i ∈ {0, 1}:

    coverage(λ)        = #{s_i ≤ λ} / n
    selective risk R(λ) = #{s_i ≤ λ, e_i = 1} / #{s_i ≤ λ}         the error rate among answered prompts
    joint risk J(λ)     = #{s_i ≤ λ, e_i = 1} / n                   answered *and* wrong
    AURC = (1/n) Σ_k R_k, R_k the risk of answering the k least risky (Geifman, Uziel & El-Yaniv 2019,
           "Bias-Reduced Uncertainty Estimation for Deep Neural Classifiers", arXiv 1805.08206); tied scores
           are answered in a random order, and AURC is its expectation. E-AURC = AURC − AURC*, the oracle's.

Two ways to choose λ on a calibration split with a promise about new prompts (i.i.d. with the calibration ones):

* Conformal risk control (`crc_threshold`; Angelopoulos, Bates, Fisch, Lei & Schuster 2022, arXiv 2208.02814):
  for a loss monotone in λ and bounded by B — here L_i(λ) = 1{s_i ≤ λ, e_i = 1}, non-decreasing, B = 1 —
  λ̂ = sup{λ : (Σ_i L_i(λ) + B) / (n + 1) ≤ α} gives E[L_{n+1}(λ̂)] ≤ α: it controls the *joint* rate
  P(answered and wrong), in expectation over the calibration draw. The selective risk is not monotone in λ,
  so CRC says nothing about it.
* Learn then Test (`ltt_threshold`; Angelopoulos, Bates, Candès, Jordan & Lei 2021, arXiv 2110.01052): each λ of
  a grid fixed before the calibration data is a null hypothesis H_λ: R(λ) > α, tested with the binomial tail
  p-value of the answered calibration prompts; fixed-sequence testing at level δ controls the family-wise
  error, so with probability ≥ 1 − δ over the calibration draw every certified λ has R(λ) ≤ α. This is the
  promise about the error rate among answered prompts.

Also here: Wilson's interval for a proportion, and the sampling baselines over a value slot (the share of k sampled
answers that agree with the model's answer — self-consistency, Wang et al. 2023, arXiv 2203.11171 — and the discrete
semantic entropy of Farquhar, Kossen, Kuhn & Gal 2024, Nature 630, with equal answers as the meaning classes).
"""

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "Certified",
    "RiskCoverage",
    "answer_agreement",
    "aurc",
    "binomial_cdf",
    "crc_min_calibration",
    "crc_threshold",
    "discrete_semantic_entropy",
    "ltt_grid",
    "ltt_min_answered",
    "ltt_threshold",
    "optimal_aurc",
    "risk_coverage",
    "selective_outcome",
    "wilson_interval",
]


def _inputs(scores: ArrayLike, errors: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    s = np.asarray(scores, dtype=np.float64).ravel()
    e = np.asarray(errors).ravel()
    if s.shape != e.shape:
        raise ValueError(f"scores and errors differ in length: {s.size} vs {e.size}")
    if s.size == 0:
        raise ValueError("no prompts: scores is empty")
    if not np.all(np.isfinite(s)):
        raise ValueError("risk scores must be finite numbers")
    if e.dtype != bool and not np.all((e == 0) | (e == 1)):
        raise ValueError("errors must be 0/1 (or boolean): 1 where the answer is wrong")
    return s, e.astype(np.float64)


def _check_level(value: float, name: str) -> None:
    if not (isinstance(value, (int, float)) and 0 < value < 1):
        raise ValueError(f"{name} must lie in (0, 1), got {value!r}")


@dataclass(frozen=True)
class RiskCoverage:
    """The curve an abstention rule traces: answering s ≤ threshold[j] covers coverage[j] of the prompts at
    selective risk risk[j] (one point per distinct score, ascending)."""

    threshold: NDArray[np.float64]
    coverage: NDArray[np.float64]
    risk: NDArray[np.float64]


def risk_coverage(scores: ArrayLike, errors: ArrayLike) -> RiskCoverage:
    s, e = _inputs(scores, errors)
    values, inverse = np.unique(s, return_inverse=True)
    answered = np.cumsum(np.bincount(inverse, minlength=len(values)))
    wrong = np.cumsum(np.bincount(inverse, weights=e, minlength=len(values)))
    return RiskCoverage(values, answered / s.size, wrong / answered)


def aurc(scores: ArrayLike, errors: ArrayLike) -> float:
    """(1/n) Σ_{k=1}^{n} E[errors among the k least risky] / k, ties answered in a uniformly random order: within a
    tie of m prompts holding w errors, the j-th answered adds w/m expected errors."""
    s, e = _inputs(scores, errors)
    values, inverse, sizes = np.unique(s, return_inverse=True, return_counts=True)
    wrong = np.bincount(inverse, weights=e, minlength=len(values))
    before = np.concatenate([[0.0], np.cumsum(wrong)[:-1]])  # errors answered before each tie group
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    group = np.repeat(np.arange(len(values)), sizes)
    j = np.arange(s.size) - starts[group] + 1  # 1-based rank within its tie group
    expected = before[group] + j * wrong[group] / sizes[group]
    return float(np.mean(expected / np.arange(1, s.size + 1)))


def optimal_aurc(errors: ArrayLike) -> float:
    """AURC* of the oracle that answers every right prompt before any wrong one (Geifman et al. 2019)."""
    e = np.asarray(errors).astype(np.float64).ravel()
    return aurc(e, e)


def wilson_interval(k: int, n: int, z: float = 1.959963984540054) -> list[float] | None:
    """Wilson's 95% score interval for k successes in n (Wilson 1927): sound near 0 and 1, where Wald's is not;
    None when n = 0."""
    if n == 0:
        return None
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [max(0.0, centre - half), min(1.0, centre + half)]


def selective_outcome(scores: ArrayLike, errors: ArrayLike, threshold: float) -> dict[str, Any]:
    """What answering s ≤ threshold does on these prompts: counts, coverage, selective and joint risk, each rate
    with its Wilson interval (the selective risk is None when nothing is answered)."""
    s, e = _inputs(scores, errors)
    answered = s <= threshold
    n, n_answered, n_wrong = s.size, int(answered.sum()), int(e[answered].sum())
    return {
        "threshold": float(threshold),
        "n": n,
        "n_answered": n_answered,
        "n_wrong_answered": n_wrong,
        "coverage": n_answered / n,
        "coverage_ci95": wilson_interval(n_answered, n),
        "selective_risk": n_wrong / n_answered if n_answered else None,
        "selective_risk_ci95": wilson_interval(n_wrong, n_answered),
        "joint_risk": n_wrong / n,
        "joint_risk_ci95": wilson_interval(n_wrong, n),
    }


def crc_min_calibration(alpha: float) -> int:
    """The fewest calibration prompts with which `crc_threshold` can answer anything: (n + 1)α ≥ 1, n = ⌈1/α⌉ − 1."""
    _check_level(alpha, "alpha")
    return max(0, math.ceil(1 / alpha - 1e-12) - 1)


def crc_threshold(scores: ArrayLike, errors: ArrayLike, alpha: float) -> float:
    """Conformal risk control for L_i(λ) = 1{s_i ≤ λ, e_i = 1} (B = 1): the largest λ with Σ_i L_i(λ) ≤ (n + 1)α − 1,
    which is just below the (m + 1)-th smallest score of a wrong prompt, m = ⌊(n + 1)α − 1⌋. −∞ (abstain on every
    prompt) when (n + 1)α < 1; +∞ when fewer than m + 1 prompts are wrong. Guarantees E[L_{n+1}(λ̂)] ≤ α."""
    s, e = _inputs(scores, errors)
    _check_level(alpha, "alpha")
    budget = (s.size + 1) * alpha - 1
    if budget < 0:
        return -math.inf
    wrong = np.sort(s[e == 1])
    m = math.floor(budget + 1e-12)
    if m >= wrong.size:
        return math.inf
    return float(np.nextafter(wrong[m], -np.inf))


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(Binomial(n, p) ≤ k), summed in log space (no cancellation for small tails)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    if not 0 < p < 1:
        return 1.0 if p == 0 else 0.0
    i = np.arange(k + 1)
    log_terms = (
        math.lgamma(n + 1)
        - np.array([math.lgamma(x + 1) + math.lgamma(n - x + 1) for x in i])
        + i * math.log(p)
        + (n - i) * math.log1p(-p)
    )
    top = log_terms.max()
    return float(min(1.0, math.exp(top) * np.exp(log_terms - top).sum()))


def ltt_min_answered(alpha: float, delta: float) -> int:
    """n_min = ⌈ln δ / ln(1 − α)⌉: the fewest answered calibration prompts — all of them right — whose binomial p-value
    (1 − α)^n_min reaches δ. With fewer calibration prompts Learn then Test certifies nothing."""
    _check_level(alpha, "alpha")
    _check_level(delta, "delta")
    return math.ceil(math.log(delta) / math.log(1 - alpha))


def ltt_grid(
    reference_scores: ArrayLike, n_calibration: int, alpha: float, delta: float, step: float = 0.01
) -> NDArray[np.float64]:
    """Thresholds for `ltt_threshold`, fixed before the calibration data is seen: the quantiles of risk scores from a
    split disjoint from calibration (`reference_scores`) at coverage levels c₀, c₀ + step, …, 1. n_min =
    ⌈ln δ / ln(1 − α)⌉ is the fewest answered prompts — all of them right — whose p-value (1 − α)^n_min reaches δ:
    with fewer no hypothesis can be rejected, and fixed-sequence testing stops at its first. c₀ = 2·n_min / n, so
    that the first test survives a count below its expectation or one chance error. The grid's start changes only
    how much is certified (power), never the guarantee."""
    _check_level(alpha, "alpha")
    _check_level(delta, "delta")
    reference = np.asarray(reference_scores, dtype=np.float64).ravel()
    if reference.size == 0 or not np.all(np.isfinite(reference)):
        raise ValueError("reference_scores must be a non-empty array of finite scores")
    n_min = ltt_min_answered(alpha, delta)
    start = min(1.0, 2 * n_min / n_calibration)
    levels = np.append(np.arange(start, 1.0, step), 1.0)
    return np.unique(np.quantile(reference, levels, method="inverted_cdf"))


@dataclass(frozen=True)
class Certified:
    """LTT's answer: answer a prompt when its score ≤ threshold (−∞: no λ certified, abstain on every prompt).
    p_values[j] belongs to grid[j] for the hypotheses tested before the sequence stopped. smallest_p_value: the
    smallest p-value over the whole grid, tested or not — how near any threshold came to certification when none
    was (a description, not a test: the smallest of many p-values certifies nothing)."""

    threshold: float
    alpha: float
    delta: float
    n_certified: int
    p_values: list[float]
    n_grid: int
    smallest_p_value: float


def ltt_threshold(scores: ArrayLike, errors: ArrayLike, alpha: float, delta: float, grid: ArrayLike) -> Certified:
    """Learn then Test with fixed-sequence testing over `grid` (ascending: fewest answers first). H_λ: R(λ) > α is
    rejected when p_λ = P(Binomial(n_λ, α) ≤ k_λ) ≤ δ, n_λ the answered calibration prompts and k_λ the wrong ones —
    valid given n_λ, since the answered prompts' errors are then i.i.d. Bernoulli(R(λ)); no answer, no rejection.
    The sequence stops at its first non-rejection; λ̂ is the last rejected. Fixed-sequence testing controls the
    family-wise error at δ for any order fixed in advance (R need not be monotone), so P(R(λ̂) > α) ≤ δ."""
    s, e = _inputs(scores, errors)
    _check_level(alpha, "alpha")
    _check_level(delta, "delta")
    grid = np.asarray(grid, dtype=np.float64).ravel()
    if grid.size == 0 or np.any(np.diff(grid) <= 0):
        raise ValueError("grid must be a non-empty, strictly increasing array of thresholds")
    order = np.argsort(s, kind="stable")
    sorted_s, cum_wrong = s[order], np.cumsum(e[order])
    every = []
    for lam in grid:
        n_answered = int(np.searchsorted(sorted_s, lam, side="right"))
        k = int(cum_wrong[n_answered - 1]) if n_answered else 0
        every.append(binomial_cdf(k, n_answered, alpha) if n_answered else 1.0)
    threshold, p_values = -math.inf, []
    for lam, p in zip(grid, every):
        p_values.append(p)
        if p > delta:
            break
        threshold = float(lam)
    n_certified = len(p_values) - (p_values[-1] > delta)
    return Certified(threshold, alpha, delta, n_certified, p_values, int(grid.size), float(min(every)))


def answer_agreement(samples: Sequence[str], reference: str) -> float:
    """The share of sampled answers equal to the reference answer (self-consistency)."""
    if not samples:
        raise ValueError("no sampled answers")
    return sum(sample == reference for sample in samples) / len(samples)


def discrete_semantic_entropy(samples: Sequence[str]) -> float:
    """−Σ_c f_c ln f_c over the classes c of equal answers, f_c their shares among the samples (nats)."""
    if not samples:
        raise ValueError("no sampled answers")
    shares = np.array(list(Counter(samples).values()), dtype=np.float64) / len(samples)
    return float(-(shares * np.log(shares)).sum())
