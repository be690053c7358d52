"""Calibration metrics (pure numpy): does confidence match accuracy?

Guo et al. 2017 ("On Calibration of Modern Neural Networks", §2); Kadavath et al. 2022
("Language Models (Mostly) Know What They Know", arXiv 2207.05221); Murphy 1973 for the Brier
decomposition. With confidences c_i and correctness y_i ∈ {0, 1} over n items, and bins B_m:

    ECE  = Σ_m (|B_m|/n) · |acc(B_m) − conf(B_m)|          (equal-width: 15 bins; equal-mass: 10)
    RMS  = sqrt(Σ_m (|B_m|/n) · (acc(B_m) − conf(B_m))²)
    MCE  = max_m |acc(B_m) − conf(B_m)|
    Brier = (1/n) Σ_i (c_i − y_i)²  = reliability − resolution + uncertainty (binned; exact when the
            confidences within a bin are equal)

Bins (`bin_indices`): equal-width bins are [e_k, e_{k+1}) with e_k = k/b, the last one closed at 1 —
numpy.histogram's rule, and netcal's; torchmetrics and relplot agree on every confidence below 1 except
within one ulp of an edge, where each library's own float edges decide (torchmetrics' torch.linspace
edge 11 of 15 sits one ulp above numpy's), and both put a confidence of exactly 1 in a bin of its own.
Equal-mass bins: the item of rank i (0-based, ascending confidence, ties in input order) goes to bin
⌊i·b/n⌋, so bins hold ⌊n/b⌋ or ⌈n/b⌉ items; then every run of equal confidences joins the bin of its
lowest-ranked member (ties are never split, so under ties a bin can hold more, or nothing).

ECE is biased upward by sampling noise: |acc(B) − conf(B)| of a perfectly calibrated model is
|noise| > 0, so a perfectly calibrated model shows ECE ≈ 0.07 at n = 200. Beside every ECE go
`noise_floor_ece` (that ECE for the same confidences), a bootstrap interval, and a debiased estimate
(Kumar, Liang & Ma 2019, "Verified Uncertainty Calibration", NeurIPS, §5): `squared_ce_debiased`
subtracts each bin's estimated variance from its squared gap — unbiased for the binned squared error,
so ≈ 0 for a calibrated model — and `ece_debiased` applies their Gaussian bias correction to the ℓ1
ECE, which shrinks the bias but cannot remove it near 0 (no estimator of |μ| is unbiased at μ = 0).

AUROC and bootstrap intervals live in lab.metrics.discrimination (re-exported here).
"""

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from lab.metrics.discrimination import auroc_ci, bootstrap_ci


def _inputs(confidence: ArrayLike, correct: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    c = np.asarray(confidence, dtype=np.float64).ravel()
    y = np.asarray(correct, dtype=np.float64).ravel()
    if c.shape != y.shape:
        raise ValueError(f"confidence and correct differ in length: {c.size} vs {y.size}")
    if c.size == 0:
        raise ValueError("no items: confidence is empty")
    if np.any((c < 0) | (c > 1)) or not np.all(np.isfinite(c)):
        raise ValueError("confidences must lie in [0, 1]")
    if not np.all((y == 0) | (y == 1)):
        raise ValueError("correct must be 0/1 (or boolean)")
    return c, y


def bin_indices(confidence: NDArray[np.float64], n_bins: int, scheme: str) -> NDArray[np.int64]:
    """The bin of each item. equal_width: bin k holds e_k ≤ c < e_{k+1} (e_k = k/b from np.linspace), and
    the last bin also holds c = 1. equal_mass: rank i (ascending, ties in input order) → bin ⌊i·b/n⌋, then
    every run of equal confidences → the bin of its lowest rank (see the module docstring)."""
    if n_bins < 1:
        raise ValueError(f"n_bins must be ≥ 1, got {n_bins}")
    confidence = np.asarray(confidence, dtype=np.float64)
    if scheme == "equal_width":
        edges = np.linspace(0.0, 1.0, n_bins + 1)
        return np.clip(np.searchsorted(edges, confidence, side="right") - 1, 0, n_bins - 1)
    if scheme == "equal_mass":
        order = np.argsort(confidence, kind="stable")
        sorted_bins = np.arange(confidence.size) * n_bins // confidence.size
        # Equal confidences share a bin (the lowest their run reaches): splitting ties is arbitrary.
        sorted_c = confidence[order]
        first_of_run = np.r_[0, np.nonzero(np.diff(sorted_c))[0] + 1]
        run = np.repeat(np.arange(first_of_run.size), np.diff(np.r_[first_of_run, confidence.size]))
        sorted_bins = sorted_bins[first_of_run][run]
        bins = np.empty(confidence.size, dtype=np.int64)
        bins[order] = sorted_bins
        return bins
    raise ValueError(f"scheme must be 'equal_width' or 'equal_mass', got {scheme!r}")


@dataclass
class Reliability:
    """Per-bin data of a reliability diagram (empty bins omitted)."""

    bin: NDArray[np.int64]
    count: NDArray[np.int64]
    confidence: NDArray[np.float64]  # mean confidence in the bin
    accuracy: NDArray[np.float64]  # share correct in the bin


def reliability(
    confidence: ArrayLike, correct: ArrayLike, n_bins: int = 15, scheme: str = "equal_width"
) -> Reliability:
    c, y = _inputs(confidence, correct)
    bins = bin_indices(c, n_bins, scheme)
    count = np.bincount(bins, minlength=n_bins)
    used = np.nonzero(count)[0]
    conf = np.bincount(bins, weights=c, minlength=n_bins)[used] / count[used]
    acc = np.bincount(bins, weights=y, minlength=n_bins)[used] / count[used]
    return Reliability(used, count[used], conf, acc)


def ece(confidence: ArrayLike, correct: ArrayLike, n_bins: int = 15, scheme: str = "equal_width") -> float:
    """The plug-in ECE, Σ_m (|B_m|/n)·|acc(B_m) − conf(B_m)| (biased upward: see `ece_debiased`)."""
    r = reliability(confidence, correct, n_bins, scheme)
    return float(np.sum(r.count / r.count.sum() * np.abs(r.accuracy - r.confidence)))


def rms_calibration_error(
    confidence: ArrayLike, correct: ArrayLike, n_bins: int = 15, scheme: str = "equal_width"
) -> float:
    r = reliability(confidence, correct, n_bins, scheme)
    return float(np.sqrt(np.sum(r.count / r.count.sum() * (r.accuracy - r.confidence) ** 2)))


def mce(confidence: ArrayLike, correct: ArrayLike, n_bins: int = 15, scheme: str = "equal_width") -> float:
    r = reliability(confidence, correct, n_bins, scheme)
    return float(np.max(np.abs(r.accuracy - r.confidence)))


def squared_ce(confidence: ArrayLike, correct: ArrayLike, n_bins: int = 15, scheme: str = "equal_width") -> float:
    """The plug-in squared calibration error Σ_m (|B_m|/n)(acc(B_m) − conf(B_m))² (= RMS²)."""
    r = reliability(confidence, correct, n_bins, scheme)
    return float(np.sum(r.count / r.count.sum() * (r.accuracy - r.confidence) ** 2))


def squared_ce_debiased(
    confidence: ArrayLike, correct: ArrayLike, n_bins: int = 15, scheme: str = "equal_width"
) -> float:
    """Kumar, Liang & Ma 2019 §5 (their `unbiased_square_ce`):
    Σ_m (|B_m|/n) [(acc(B_m) − conf(B_m))² − acc(B_m)(1 − acc(B_m)) / (|B_m| − 1)].
    The subtracted term is the unbiased estimate of Var(acc(B_m)), so for a calibrated model the estimate
    is 0 in expectation — and can be negative. A bin of one item has no variance estimate and contributes
    0, as in their code."""
    r = reliability(confidence, correct, n_bins, scheme)
    many = r.count >= 2
    gap = (r.accuracy - r.confidence) ** 2
    variance = np.zeros_like(gap)
    variance[many] = r.accuracy[many] * (1 - r.accuracy[many]) / (r.count[many] - 1)
    return float(np.sum(np.where(many, r.count / r.count.sum() * (gap - variance), 0.0)))


def ece_debiased(
    confidence: ArrayLike,
    correct: ArrayLike,
    n_bins: int = 15,
    scheme: str = "equal_width",
    n_sim: int = 1000,
    seed: int = 0,
) -> float:
    """Kumar, Liang & Ma 2019 §5, Gaussian bias correction of the ℓ1 ECE (their `normal_debiased_ce`):
    draw each bin's accuracy from N(acc_m, acc_m(1 − acc_m)/|B_m|), take the mean ECE of the draws, Ê*,
    and return 2·ECE − Ê* (the bootstrap bias correction). It removes most of the bias where the gaps are
    large against their noise and part of it near 0. A bin of one item has zero estimated variance and is
    left uncorrected (their code refuses such bins)."""
    r = reliability(confidence, correct, n_bins, scheme)
    weight = r.count / r.count.sum()
    plug_in = float(np.sum(weight * np.abs(r.accuracy - r.confidence)))
    sd = np.sqrt(r.accuracy * (1 - r.accuracy) / r.count)
    draws = np.random.default_rng(seed).normal(r.accuracy, sd, (n_sim, len(sd)))
    resampled = float(np.mean(np.abs(draws - r.confidence) @ weight))
    return 2 * plug_in - resampled


@dataclass
class Brier:
    score: float
    reliability: float  # Σ (n_m/n)(conf_m − acc_m)²: lower is better calibrated
    resolution: float  # Σ (n_m/n)(acc_m − ā)²: higher separates right from wrong better
    uncertainty: float  # ā(1 − ā)


def brier(confidence: ArrayLike, correct: ArrayLike, n_bins: int = 15, scheme: str = "equal_width") -> Brier:
    """Brier score of the confidence as a forecast of correctness, with Murphy's decomposition over bins."""
    c, y = _inputs(confidence, correct)
    r = reliability(c, y, n_bins, scheme)
    weight = r.count / r.count.sum()
    base = y.mean()
    return Brier(
        score=float(np.mean((c - y) ** 2)),
        reliability=float(np.sum(weight * (r.confidence - r.accuracy) ** 2)),
        resolution=float(np.sum(weight * (r.accuracy - base) ** 2)),
        uncertainty=float(base * (1 - base)),
    )


def nll(probabilities: ArrayLike, labels: ArrayLike, eps: float = 1e-12) -> float:
    """Mean −log p(label) in nats over rows of a [n, k] probability matrix."""
    p = np.asarray(probabilities, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.int64)
    return float(-np.mean(np.log(np.clip(p[np.arange(len(labels)), labels], eps, None))))


# --------------------------------------------------------------------------------------------
# Noise floor, temperature, summaries
# --------------------------------------------------------------------------------------------
def noise_floor_ece(
    confidence: ArrayLike, n_bins: int = 15, scheme: str = "equal_width", n_sim: int = 500, seed: int = 0
) -> tuple[float, float]:
    """Mean and 95th percentile of the ECE of a perfectly calibrated model with these confidences
    (correctness drawn as Bernoulli(confidence)): the ECE that noise alone produces."""
    c = np.asarray(confidence, dtype=np.float64).ravel()
    bins = bin_indices(c, n_bins, scheme)
    conf_sum = np.bincount(bins, weights=c, minlength=n_bins)
    rng = np.random.default_rng(seed)
    sims = np.empty(n_sim)
    for k in range(n_sim):  # the bins depend on the confidences only: each draw just recounts the correct ones
        acc_sum = np.bincount(bins, weights=rng.random(c.size) < c, minlength=n_bins)
        sims[k] = np.abs(acc_sum - conf_sum).sum() / c.size
    return float(np.mean(sims)), float(np.quantile(sims, 0.95))


def ece_fields(
    confidence: ArrayLike,
    correct: ArrayLike,
    key: str = "ece",
    n_bins: int = 15,
    scheme: str = "equal_width",
    n_boot: int = 500,
    seed: int = 0,
) -> dict[str, Any]:
    """An ECE and what goes beside it (docs/definitions.md §3): {key, key_ci95 (bootstrap), noise_floor_key (mean ECE of
    a perfectly calibrated model with these confidences), noise_floor_key_p95, key_debiased (Kumar et al.)}."""
    c, y = _inputs(confidence, correct)
    floor, floor_p95 = noise_floor_ece(c, n_bins, scheme, seed=seed)
    interval = bootstrap_ci(lambda a, b: ece(a, b, n_bins, scheme), c, y, n_boot=n_boot, seed=seed)
    return {
        key: ece(c, y, n_bins, scheme),
        f"{key}_ci95": interval.interval,
        f"noise_floor_{key}": floor,
        f"noise_floor_{key}_p95": floor_p95,
        f"{key}_debiased": ece_debiased(c, y, n_bins, scheme, seed=seed),
    }


def softmax(logits: ArrayLike, temperature: float = 1.0) -> NDArray[np.float64]:
    z = np.asarray(logits, dtype=np.float64) / temperature
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def fit_temperature(
    logits: ArrayLike, labels: ArrayLike, bounds: tuple[float, float] = (0.05, 20.0), iterations: int = 100
) -> float:
    """The T > 0 minimising the NLL of softmax(logits / T) (Guo et al. 2017, §4.2), by golden-section
    search on log T (the NLL is convex in 1/T). Fit it on a calibration split, apply it to the test split."""
    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)

    def loss(log_t: float) -> float:
        return nll(softmax(z, float(np.exp(log_t))), y)

    lo, hi = np.log(bounds[0]), np.log(bounds[1])
    ratio = (np.sqrt(5) - 1) / 2
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = loss(a), loss(b)
    for _ in range(iterations):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = loss(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = loss(b)
    return float(np.exp((lo + hi) / 2))


def multiclass_summary(probabilities: ArrayLike, labels: ArrayLike, n_boot: int = 500, seed: int = 0) -> dict:
    """Every calibration number of a k-way choice, from its [n, k] probabilities and the answers: both ECEs
    with their intervals, noise floors and debiased estimates; ece_ci95 / noise_floor_ece are the 15-bin
    equal-width ECE's (the headline binning)."""
    p = np.asarray(probabilities, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    confidence = p.max(axis=1)
    correct = (p.argmax(axis=1) == y).astype(np.float64)
    b = brier(confidence, correct)
    width = ece_fields(confidence, correct, "ece_15_equal_width", 15, "equal_width", n_boot, seed)
    mass = ece_fields(confidence, correct, "ece_10_equal_mass", 10, "equal_mass", n_boot, seed)
    squared = squared_ce_debiased(confidence, correct)
    return {
        "n": int(len(y)),
        "accuracy": float(correct.mean()),
        "mean_confidence": float(confidence.mean()),
        **width,
        **mass,
        "ece_ci95": width["ece_15_equal_width_ci95"],
        "noise_floor_ece": width["noise_floor_ece_15_equal_width"],
        "noise_floor_ece_p95": width["noise_floor_ece_15_equal_width_p95"],
        "rms_ce": rms_calibration_error(confidence, correct),
        "squared_ce_debiased": squared,
        "rms_ce_debiased": float(np.sqrt(max(squared, 0.0))),
        "mce": mce(confidence, correct),
        "brier": b.score,
        "brier_reliability": b.reliability,
        "brier_resolution": b.resolution,
        "brier_uncertainty": b.uncertainty,
        "nll": nll(p, y),
        **auroc_ci(confidence, correct, n_boot=n_boot, seed=seed).fields("auroc_confidence"),
    }
