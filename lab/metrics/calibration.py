"""Calibration metrics (pure numpy): does confidence match accuracy?

Guo et al. 2017 ("On Calibration of Modern Neural Networks", §2); Kadavath et al. 2022
("Language Models (Mostly) Know What They Know", arXiv 2207.05221); Murphy 1973 for the Brier
decomposition. With confidences c_i and correctness y_i ∈ {0, 1} over n items, and bins B_m:

    ECE  = Σ_m (|B_m|/n) · |acc(B_m) − conf(B_m)|          (equal-width: 15 bins; equal-mass: 10)
    RMS  = sqrt(Σ_m (|B_m|/n) · (acc(B_m) − conf(B_m))²)
    MCE  = max_m |acc(B_m) − conf(B_m)|
    Brier = (1/n) Σ_i (c_i − y_i)²  = reliability − resolution + uncertainty (binned; exact when the
            confidences within a bin are equal)

ECE is biased upward by sampling noise: a perfectly calibrated model (y_i ~ Bernoulli(c_i)) shows
ECE ≈ 0.07 at n = 200. `noise_floor_ece` measures that floor for the same confidences, and
`bootstrap_ci` gives an interval for any metric; both belong beside every ECE.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray


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
    """The bin of each item: equal-width bins on [0, 1] (right-closed, bin 0 includes 0), or equal-mass
    bins that each hold ⌊n/b⌋ or ⌈n/b⌉ items in order of confidence (ties kept together)."""
    if n_bins < 1:
        raise ValueError(f"n_bins must be ≥ 1, got {n_bins}")
    if scheme == "equal_width":
        edges = np.linspace(0.0, 1.0, n_bins + 1)
        return np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, n_bins - 1)
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


def reliability(confidence: ArrayLike, correct: ArrayLike, n_bins: int = 15, scheme: str = "equal_width") -> Reliability:
    c, y = _inputs(confidence, correct)
    bins = bin_indices(c, n_bins, scheme)
    count = np.bincount(bins, minlength=n_bins)
    used = np.nonzero(count)[0]
    conf = np.bincount(bins, weights=c, minlength=n_bins)[used] / count[used]
    acc = np.bincount(bins, weights=y, minlength=n_bins)[used] / count[used]
    return Reliability(used, count[used], conf, acc)


def ece(confidence: ArrayLike, correct: ArrayLike, n_bins: int = 15, scheme: str = "equal_width") -> float:
    r = reliability(confidence, correct, n_bins, scheme)
    return float(np.sum(r.count / r.count.sum() * np.abs(r.accuracy - r.confidence)))


def rms_calibration_error(confidence: ArrayLike, correct: ArrayLike, n_bins: int = 15,
                          scheme: str = "equal_width") -> float:
    r = reliability(confidence, correct, n_bins, scheme)
    return float(np.sqrt(np.sum(r.count / r.count.sum() * (r.accuracy - r.confidence) ** 2)))


def mce(confidence: ArrayLike, correct: ArrayLike, n_bins: int = 15, scheme: str = "equal_width") -> float:
    r = reliability(confidence, correct, n_bins, scheme)
    return float(np.max(np.abs(r.accuracy - r.confidence)))


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
    return Brier(score=float(np.mean((c - y) ** 2)),
                 reliability=float(np.sum(weight * (r.confidence - r.accuracy) ** 2)),
                 resolution=float(np.sum(weight * (r.accuracy - base) ** 2)),
                 uncertainty=float(base * (1 - base)))


def nll(probabilities: ArrayLike, labels: ArrayLike, eps: float = 1e-12) -> float:
    """Mean −log p(label) in nats over rows of a [n, k] probability matrix."""
    p = np.asarray(probabilities, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.int64)
    return float(-np.mean(np.log(np.clip(p[np.arange(len(labels)), labels], eps, None))))


def auroc(scores: ArrayLike, labels: ArrayLike) -> float:
    """Area under the ROC curve: P(score of a random positive > score of a random negative), ties ½."""
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels).astype(bool).ravel()
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(s.size, dtype=np.float64)
    sorted_s = s[order]
    # average ranks over ties
    boundaries = np.r_[0, np.nonzero(np.diff(sorted_s))[0] + 1, s.size]
    for start, stop in zip(boundaries[:-1], boundaries[1:]):
        ranks[order[start:stop]] = (start + stop + 1) / 2.0
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def bootstrap_ci(metric: Callable[..., float], *arrays: ArrayLike, n_boot: int = 1000, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of metric(*arrays) over items resampled with replacement."""
    columns = [np.asarray(a) for a in arrays]
    n = len(columns[0])
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(n_boot):
        idx = rng.integers(0, n, n)
        value = metric(*(col[idx] for col in columns))
        if np.isfinite(value):
            values.append(value)
    if not values:
        return float("nan"), float("nan")
    alpha = (1 - level) / 2
    return float(np.quantile(values, alpha)), float(np.quantile(values, 1 - alpha))


def noise_floor_ece(confidence: ArrayLike, n_bins: int = 15, scheme: str = "equal_width", n_sim: int = 500,
                    seed: int = 0) -> tuple[float, float]:
    """Mean and 95th percentile of the ECE of a perfectly calibrated model with these confidences
    (correctness drawn as Bernoulli(confidence)): the ECE that noise alone produces."""
    c = np.asarray(confidence, dtype=np.float64).ravel()
    rng = np.random.default_rng(seed)
    sims = [ece(c, rng.random(c.size) < c, n_bins, scheme) for _ in range(n_sim)]
    return float(np.mean(sims)), float(np.quantile(sims, 0.95))


def softmax(logits: ArrayLike, temperature: float = 1.0) -> NDArray[np.float64]:
    z = np.asarray(logits, dtype=np.float64) / temperature
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def fit_temperature(logits: ArrayLike, labels: ArrayLike, bounds: tuple[float, float] = (0.05, 20.0),
                    iterations: int = 100) -> float:
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
    """Every calibration number of a k-way choice, from its [n, k] probabilities and the answers."""
    p = np.asarray(probabilities, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    confidence = p.max(axis=1)
    correct = (p.argmax(axis=1) == y).astype(np.float64)
    b = brier(confidence, correct)
    floor_mean, floor_p95 = noise_floor_ece(confidence, seed=seed)
    return {
        "n": int(len(y)), "accuracy": float(correct.mean()), "mean_confidence": float(confidence.mean()),
        "ece_15_equal_width": ece(confidence, correct, 15, "equal_width"),
        "ece_10_equal_mass": ece(confidence, correct, 10, "equal_mass"),
        "rms_ce": rms_calibration_error(confidence, correct), "mce": mce(confidence, correct),
        "brier": b.score, "brier_reliability": b.reliability, "brier_resolution": b.resolution,
        "brier_uncertainty": b.uncertainty, "nll": nll(p, y),
        "ece_ci95": list(bootstrap_ci(lambda c, k: ece(c, k), confidence, correct, n_boot=n_boot, seed=seed)),
        "noise_floor_ece": floor_mean, "noise_floor_ece_p95": floor_p95,
        "auroc_confidence": auroc(confidence, correct),
    }
