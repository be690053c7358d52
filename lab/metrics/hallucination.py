"""The hallucination bound's quantities (docs/definitions.md §2), as pure functions of numpy arrays.

Kalai & Vempala, "Calibrated Language Models Must Hallucinate" (STOC 2024, arXiv 2311.14648):

    factoids Y = facts F ∪ hallucinations H;  p lives on F;  g is the model's distribution
    g(H) ≥ MF − Mis(g, p) − 3e^(−s)/δ − sqrt(6 ln(6/δ) / n)      with prob. ≥ 1 − δ,  e^(−s) = |F|/|H|

    MF       monofact rate: #(training examples whose fact occurs exactly once) / n  (Good–Turing)
    Mis      ‖p^Π − g‖_TV: bin Y by g's value, spread p's mass evenly inside each bin (p^Π), and take
             the total variation against g over every factoid. ½ Σ_B |p(B) − g(B)| is only a lower bound.

Conventions every function here shares:
* `g` and `p` are arrays over the same factoids, in the same order. `g` may sum to less than 1: the
  rest is the model's malformed output, which is not a factoid (and so not a hallucination). It is
  kept as one more outcome, ⊥, on which p^Π and p put no mass, so the TV stays a distance between two
  probability distributions: ‖p^Π − g‖_TV = ½ (Σ_Y |p^Π(y) − g(y)| + g(⊥)). This is the quantity the
  bound needs: g(H) ≥ p^Π(H) − sup_S (p^Π(S) − g(S)), and the sup over S ⊆ Y is exactly this TV.
  g is never renormalised onto Y (docs/definitions.md §2, traps).
* Bins are sets of factoids with similar g, so they are a function of g alone (never of p): ε-log bins
  ((1−ε)^(i+1), (1−ε)^i], or adaptive bins, g's values cut so that each bin holds ≈ 1/b of g's mass.
* Counts are occurrences in the training sample, one entry per fact (not distinct strings).

Miao & Kearns (arXiv 2502.08666) add `kl_hat`, an empirical bin-wise KL on the training sample, and
Kalai, Nachum, Vempala & Zhang (arXiv 2509.04664, Thm. 2) the singleton-rate bound for prompts with one
arbitrary correct answer (`singleton_bound`, `singleton_calibration_delta`).
"""

import math
from typing import Literal, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "BinTable",
    "KVBound",
    "SingletonBound",
    "bin_index",
    "bin_table",
    "binmass_tv",
    "bound_slack",
    "kl_hat",
    "miscalibration_tv",
    "missing_mass",
    "monofact_rate",
    "singleton_bound",
    "singleton_calibration_delta",
]

Scheme = Literal["eps", "adaptive"]
_SUM_TOLERANCE = 1e-6  # Σg may exceed 1 by float round-off over millions of factoids, no more


# --- Good–Turing ---------------------------------------------------------------------------------
def _counts(counts: ArrayLike) -> NDArray[np.int64]:
    array = np.asarray(counts)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"counts must be a non-empty 1-D array (one entry per fact), got shape {array.shape}")
    if not np.issubdtype(array.dtype, np.integer):
        if not np.all(np.isfinite(array)) or np.any(array != np.round(array)):
            raise ValueError("counts must be whole numbers of occurrences")
        array = array.astype(np.int64)
    if np.any(array < 0):
        raise ValueError("counts must be non-negative")
    if array.sum() == 0:
        raise ValueError("counts are all zero: there is no training sample")
    return array.astype(np.int64)


def monofact_rate(counts: ArrayLike) -> float:
    """MF = #(training examples whose fact occurs exactly once) / n, with `counts[f]` the occurrences of
    fact f in the sample and n = Σ counts. Each fact seen once is one such example, so MF is the number
    of singleton facts over n: the Good–Turing estimate of the missing mass. The singleton rate of
    Kalai et al. 2025 is the same formula over prompt counts."""
    array = _counts(counts)
    return float((array == 1).sum() / array.sum())


def missing_mass(p: ArrayLike, counts: ArrayLike) -> float:
    """p({f : f never occurs in the training sample}) — what MF estimates."""
    p_array = _distribution(p, "p", exact=True)
    array = _counts(counts)
    if p_array.shape != array.shape:
        raise ValueError(f"p has {p_array.size} entries but counts has {array.size}; both are per fact")
    return float(p_array[array == 0].sum())


# --- binning by g --------------------------------------------------------------------------------
def _distribution(values: ArrayLike, name: str, exact: bool) -> NDArray[np.float64]:
    """A 1-D float64 array of probabilities; `exact` demands Σ = 1, otherwise Σ ≤ 1 (g: rest malformed)."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array over factoids, got shape {array.shape}")
    if not np.all(np.isfinite(array)) or np.any(array < 0):
        raise ValueError(f"{name} must hold finite, non-negative probabilities")
    total = array.sum()
    if exact and abs(total - 1.0) > _SUM_TOLERANCE:
        raise ValueError(f"{name} must sum to 1, got {total:.9g}")
    if not exact and total > 1.0 + _SUM_TOLERANCE:
        raise ValueError(f"{name} sums to {total:.9g} > 1; it must be a (sub-)probability distribution")
    return array


def _check_scheme(scheme: str, eps: float, n_bins: int) -> None:
    if scheme not in ("eps", "adaptive"):
        raise ValueError(f"scheme must be 'eps' or 'adaptive', got {scheme!r}")
    if scheme == "eps" and not 0.0 < eps < 1.0:
        raise ValueError(f"eps must lie in (0, 1), got {eps!r}")
    if scheme == "adaptive" and (not isinstance(n_bins, (int, np.integer)) or n_bins < 1):
        raise ValueError(f"n_bins must be a positive integer, got {n_bins!r}")


def _bins(
    g: NDArray[np.float64], scheme: str, eps: float, n_bins: int
) -> tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.float64]]:
    """(bin of every factoid, lower edge of every bin index, upper edge of every bin index)."""
    _check_scheme(scheme, eps, n_bins)
    if scheme == "eps":
        index = np.empty(g.shape, dtype=np.int64)
        positive = g > 0
        index[positive] = np.floor(np.log(g[positive]) / math.log(1.0 - eps)).astype(np.int64)
        n_positive_bins = int(index[positive].max()) + 1 if positive.any() else 0
        index[~positive] = n_positive_bins  # g = 0 has no ε-bin: one of its own, after every other
        powers = (1.0 - eps) ** np.arange(n_positive_bins + 1, dtype=np.float64)
        low = np.append(powers[1:], 0.0)  # bin i is ((1−ε)^(i+1), (1−ε)^i]; the g = 0 bin is [0, 0]
        high = np.append(powers[:-1], 0.0)
        return index, low, high
    total = g.sum()
    if total == 0:
        return np.zeros(g.shape, dtype=np.int64), np.zeros(1), np.zeros(1)
    descending = np.sort(g)[::-1]
    mass_before = np.cumsum(descending) - descending
    sorted_bin = np.minimum(np.floor(n_bins * mass_before / total), n_bins - 1).astype(np.int64)
    new_value = np.ones(g.shape, dtype=bool)
    new_value[1:] = descending[1:] != descending[:-1]
    first_of_level = np.flatnonzero(new_value)
    sorted_bin = sorted_bin[first_of_level][np.cumsum(new_value) - 1]  # a level set joins its first member's bin
    # Bins are runs of the decreasing order: the largest g of bin k starts its run, the smallest ends it.
    starts = np.searchsorted(sorted_bin, np.arange(n_bins), side="left")
    ends = np.searchsorted(sorted_bin, np.arange(n_bins), side="right")
    filled = ends > starts
    high = np.where(filled, descending[np.minimum(starts, g.size - 1)], np.nan)
    low = np.where(filled, descending[np.maximum(ends - 1, 0)], np.nan)
    # A factoid belongs to the first bin whose smallest value it reaches (bins hold whole level sets).
    lows, bins = low[filled], np.flatnonzero(filled)
    index = bins[np.searchsorted(-lows, -g, side="left")]
    return index, low, high


def bin_index(g: ArrayLike, scheme: Scheme = "eps", eps: float = 0.1, n_bins: int = 20) -> NDArray[np.int64]:
    """The bin of every factoid; bins are intervals of g's value, so the partition depends on g alone.

    "eps":      bin i holds g ∈ ((1−ε)^(i+1), (1−ε)^i], i = ⌊ln g / ln(1−ε)⌋ (bin 0 is (1−ε, 1]);
                factoids with g = 0 get one bin of their own, after every other.
    "adaptive": factoids in decreasing order of g; one lands in bin ⌊b · (g-mass of the factoids before
                it) / g(Y)⌋ (capped at b − 1), so each bin holds ≈ 1/b of g's mass; equal values always
                share a bin (the one of the first of them), so a bin is a set of whole level sets.
    """
    return _bins(_distribution(g, "g", exact=False), scheme, eps, n_bins)[0]


class BinTable(NamedTuple):
    """Per non-empty bin B, in increasing bin index: its g-interval, |B|, g(B), p(B), and its share
    ½ Σ_{y∈B} |p(B)/|B| − g(y)| of the coarsened TV. g_low and g_high are the interval's edges for ε-log
    bins (open below, closed above) and the smallest and largest g in the bin for adaptive bins."""

    bin: NDArray[np.int64]
    g_low: NDArray[np.float64]
    g_high: NDArray[np.float64]
    n_factoids: NDArray[np.int64]
    g_mass: NDArray[np.float64]
    p_mass: NDArray[np.float64]
    n_support: NDArray[np.int64]  # factoids of the bin with p > 0 (the facts, where p lives on all of F)
    tv_within: NDArray[np.float64]
    malformed_mass: float  # g(⊥) = 1 − g(Y)

    @property
    def miscalibration(self) -> float:
        """‖p^Π − g‖_TV = Σ_B tv_within + ½ g(⊥)."""
        return float(self.tv_within.sum() + 0.5 * self.malformed_mass)

    @property
    def spread_off_support(self) -> float:
        """p^Π(Y \\ supp p) = Σ_B p(B)·(|B| − n_support(B))/|B|: with supp p = F, the mass p^Π puts on
        hallucinations. For every g, g(H) ≥ p^Π(H) − Mis (the sup over S of p^Π(S) − g(S) is the TV): the
        deterministic half of Kalai & Vempala's bound; the other half, p^Π(H) ≳ MF, holds w.p. ≥ 1 − δ."""
        return float(np.sum(self.p_mass * (self.n_factoids - self.n_support) / self.n_factoids))

    @property
    def binmass(self) -> float:
        """½ (Σ_B |p(B) − g(B)| + g(⊥)) ≤ miscalibration."""
        return float(0.5 * (np.abs(self.p_mass - self.g_mass).sum() + self.malformed_mass))

    def rows(self) -> list[dict[str, float | int]]:
        return [
            {
                "bin": int(b),
                "g_low": float(lo),
                "g_high": float(hi),
                "n_factoids": int(n),
                "g_mass": float(gm),
                "p_mass": float(pm),
                "n_support": int(ns),
                "tv_within": float(tv),
            }
            for b, lo, hi, n, gm, pm, ns, tv in zip(
                self.bin,
                self.g_low,
                self.g_high,
                self.n_factoids,
                self.g_mass,
                self.p_mass,
                self.n_support,
                self.tv_within,
            )
        ]


def bin_table(g: ArrayLike, p: ArrayLike, scheme: Scheme = "eps", eps: float = 0.1, n_bins: int = 20) -> BinTable:
    """Bin the factoids by g and tabulate g's and p's mass per bin (see `BinTable`)."""
    g_array = _distribution(g, "g", exact=False)
    p_array = _distribution(p, "p", exact=True)
    if g_array.shape != p_array.shape:
        raise ValueError(f"g has {g_array.size} entries but p has {p_array.size}; both are over the same factoids")
    index, low, high = _bins(g_array, scheme, eps, n_bins)
    size = np.bincount(index, minlength=len(low))
    g_mass = np.bincount(index, weights=g_array, minlength=len(low))
    p_mass = np.bincount(index, weights=p_array, minlength=len(low))
    n_support = np.bincount(index[p_array > 0], minlength=len(low))
    spread = (p_mass / np.maximum(size, 1))[index]  # p^Π(y) = p(B)/|B| for y in B
    tv_within = 0.5 * np.bincount(index, weights=np.abs(spread - g_array), minlength=len(low))
    used = np.flatnonzero(size)
    return BinTable(
        used,
        low[used],
        high[used],
        size[used],
        g_mass[used],
        p_mass[used],
        n_support[used],
        tv_within[used],
        max(0.0, 1.0 - float(g_array.sum())),
    )


def miscalibration_tv(g: ArrayLike, p: ArrayLike, scheme: Scheme = "eps", eps: float = 0.1, n_bins: int = 20) -> float:
    """Mis(g, p) = ‖p^Π − g‖_TV over every factoid and the malformed outcome ⊥ (module docstring):
    ½ (Σ_B Σ_{y∈B} |p(B)/|B| − g(y)| + g(⊥)), with Π the ε-log or adaptive bins of g."""
    return bin_table(g, p, scheme, eps, n_bins).miscalibration


def binmass_tv(g: ArrayLike, p: ArrayLike, scheme: Scheme = "eps", eps: float = 0.1, n_bins: int = 20) -> float:
    """The bin-mass form ½ (Σ_B |p(B) − g(B)| + g(⊥)): a lower bound on `miscalibration_tv` (the triangle
    inequality inside each bin), equal to it only when g is constant on every bin that p touches."""
    return bin_table(g, p, scheme, eps, n_bins).binmass


def kl_hat(g_train: ArrayLike, counts: ArrayLike, scheme: Scheme = "eps", eps: float = 0.1, n_bins: int = 20) -> float:
    """Miao & Kearns's empirical KL: Σ_B P_B ln(P_B / G_B) in nats over g-bins of the training sample.

    `g_train[i]` is the model's probability of the i-th distinct training fact and `counts[i]` its number
    of occurrences (> 0). The facts are binned by g; P_B = (training examples in B) / n and G_B = the
    model's mass on the facts in B, not renormalised. A relative indicator only: a model that memorises
    its sample (g = counts / n) scores 0 whatever its hallucination rate.
    """
    g_array = _distribution(g_train, "g_train", exact=False)
    array = _counts(counts)
    if g_array.shape != array.shape:
        raise ValueError(f"g_train has {g_array.size} entries but counts has {array.size}")
    if np.any(array == 0):
        raise ValueError("kl_hat takes the facts of the training sample: every count must be positive")
    index = bin_index(g_array, scheme, eps, n_bins)
    data_mass = np.bincount(index, weights=array.astype(np.float64)) / array.sum()
    model_mass = np.bincount(index, weights=g_array)
    used = data_mass > 0
    with np.errstate(divide="ignore"):
        return float(np.sum(data_mass[used] * (np.log(data_mass[used]) - np.log(model_mass[used]))))


# --- the bounds ----------------------------------------------------------------------------------
class KVBound(NamedTuple):
    """Both sides of Kalai & Vempala's bound, its finite-sample slack and the margin left side − right side."""

    hallucination_rate: float  # the left side, g(H)
    right_side: float  # MF − Mis − slack
    slack: float  # 3e^(−s)/δ + sqrt(6 ln(6/δ)/n): what the bound gives up for finite |H| and n
    margin: float  # g(H) − right_side; ≥ 0 when the bound holds (it says nothing when right_side < 0)


def bound_slack(
    hallucination_rate: float,
    monofact_rate: float,
    miscalibration: float,
    n_facts: int,
    n_hallucinations: int,
    n_train: int,
    delta: float,
) -> KVBound:
    """Kalai & Vempala's bound g(H) ≥ MF − Mis − 3e^(−s)/δ − sqrt(6 ln(6/δ)/n), e^(−s) = |F|/|H|,
    which holds with probability ≥ 1 − δ over the training sample. At δ = 0.01 the two slack terms are
    the headline 300·|F|/|H| and sqrt(6 ln 600 / n) ≈ 6.2/√n (the paper rounds to 7/√n)."""
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
    if n_facts <= 0 or n_hallucinations <= 0 or n_train <= 0:
        raise ValueError("n_facts, n_hallucinations and n_train must be positive")
    slack = 3.0 * (n_facts / n_hallucinations) / delta + math.sqrt(6.0 * math.log(6.0 / delta) / n_train)
    right = monofact_rate - miscalibration - slack
    return KVBound(float(hallucination_rate), float(right), float(slack), float(hallucination_rate - right))


class SingletonBound(NamedTuple):
    """Kalai, Nachum, Vempala & Zhang 2025, Thm. 2: err ≥ sr − 2/min_c|E_c| − (35 + 6 ln N)/√N − δ."""

    error: float
    right_side: float  # with the finite-N term
    right_side_without_finite_n: float  # sr − 2/min|E_c| − δ
    finite_n_term: float  # (35 + 6 ln N)/√N: 1.22 at N = 5,000, 0.90 at 10⁴, still 0.12 at 10⁶
    margin: float
    margin_without_finite_n: float


def singleton_bound(
    error: float, singleton_rate: float, min_wrong_answers: int, n_train: int, calibration_delta: float
) -> SingletonBound:
    """Both forms of the arbitrary-facts bound of Kalai et al. 2025 (arXiv 2509.04664, Thm. 2).

    error: the model's probability of an erroneous answer, prompts drawn from their distribution;
    singleton_rate: prompts seen exactly once in the N training examples, over N; min_wrong_answers:
    min_c |E_c|, the fewest wrong answers any prompt has; calibration_delta: δ = |p̂(A) − p(A)| from
    `singleton_calibration_delta`. The finite-N term is reported apart because it swamps everything
    below N ≈ 10⁶ (docs/definitions.md §2).
    """
    if min_wrong_answers < 1 or n_train < 1:
        raise ValueError("min_wrong_answers and n_train must be positive")
    finite = (35.0 + 6.0 * math.log(n_train)) / math.sqrt(n_train)
    without = singleton_rate - 2.0 / min_wrong_answers - calibration_delta
    return SingletonBound(
        float(error),
        float(without - finite),
        float(without),
        float(finite),
        float(error - (without - finite)),
        float(error - without),
    )


def singleton_calibration_delta(
    answer_probs: ArrayLike, truth: ArrayLike, prompt_probs: ArrayLike, threshold: float
) -> float:
    """δ = |p̂(A) − p(A)| with A = {(c, r) : p̂(r | c) > threshold} (Kalai et al. 2025, the threshold
    1/min_c|E_c|). `answer_probs[c, r]` is the model's p̂(r | c) (rows may sum to < 1: malformed
    answers are never in A), `truth[c]` the index of c's one correct answer and `prompt_probs[c]` the
    prompt distribution μ(c). p puts all of c's mass on its correct answer, so
    p(A) = Σ_c μ(c)·1[p̂(a_c | c) > threshold] and p̂(A) = Σ_c μ(c) Σ_{r: p̂(r|c) > threshold} p̂(r | c)."""
    q = np.asarray(answer_probs, dtype=np.float64)
    mu = _distribution(prompt_probs, "prompt_probs", exact=True)
    truth_index = np.asarray(truth, dtype=np.int64)
    if q.ndim != 2 or q.shape[0] != mu.size or truth_index.shape != mu.shape:
        raise ValueError(
            f"answer_probs must be [prompts, answers] with one truth and one μ per prompt; got "
            f"{q.shape}, {truth_index.shape}, {mu.shape}"
        )
    if not np.all(np.isfinite(q)) or np.any(q < 0) or np.any(q.sum(axis=1) > 1 + _SUM_TOLERANCE):
        raise ValueError("every row of answer_probs must be a (sub-)probability distribution")
    above = q > threshold
    model_mass = float(mu @ np.where(above, q, 0.0).sum(axis=1))
    true_mass = float(mu @ above[np.arange(mu.size), truth_index])
    return abs(model_mass - true_mass)
