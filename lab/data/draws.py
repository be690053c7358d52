"""What every source with a known law draws and estimates (lab.data.sources, lab.data.mechanisms): categorical draws
by inversion, entropies, the stationary law of a small chain, and the Monte-Carlo estimate of an entropy rate with
its standard error. Their arguments are checked in lab.data.checks."""

import math
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


def entropy_nats(probs: FloatArray) -> FloatArray:
    """H(p) = −Σ p log p along the last axis, with 0 log 0 = 0."""
    logs = np.log(np.where(probs > 0, probs, 1.0))
    return -(probs * logs).sum(axis=-1)


def draw_categorical(rng: np.random.Generator, cumulative: FloatArray) -> IntArray:
    """One draw per row of a batch of cumulative distributions `(n, V)` by inversion."""
    u = rng.random(cumulative.shape[0])[:, None] * cumulative[:, -1:]
    draws = (cumulative < u).sum(axis=1)
    return np.minimum(draws, cumulative.shape[1] - 1).astype(np.int64)


def stationary_of(transition: FloatArray) -> FloatArray:
    """Stationary law of a small dense row-stochastic matrix: the left eigenvector for eigenvalue 1."""
    n = transition.shape[0]
    # Solve π (A − I) = 0 with Σ π = 1 as one least-squares system (exact for an irreducible chain).
    system = np.vstack([transition.T - np.eye(n), np.ones((1, n))])
    rhs = np.zeros(n + 1)
    rhs[-1] = 1.0
    pi, *_ = np.linalg.lstsq(system, rhs, rcond=None)
    pi = np.clip(pi, 0.0, None)
    return pi / pi.sum()


class EntropyEstimate(NamedTuple):
    """A Monte-Carlo estimate in nats per token with its standard error (unpacks as a pair)."""

    value: float
    standard_error: float


def monte_carlo_rate(conditionals: FloatArray, tokens: IntArray, burn_in: int) -> EntropyEstimate:
    """Mean of −log p(x_{t+1}|x_{≤t}) over positions t ≥ burn_in; SE from per-sequence means."""
    nll = -np.log(np.take_along_axis(conditionals[:, :-1], tokens[:, 1:, None], axis=2)[..., 0])
    per_sequence = nll[:, burn_in:].mean(axis=1)
    n = per_sequence.shape[0]
    se = float(per_sequence.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
    return EntropyEstimate(float(per_sequence.mean()), se)


def burn_in_rate(source: Any, n: int, length: int, seed: int, burn_in: int | None) -> EntropyEstimate:
    """Monte-Carlo estimate of a hidden-state source's entropy rate in nats per token, with its standard error.

    Averages −log p(x_{t+1}|x_{≤t}) over positions t ≥ burn_in (default length // 2) of `n` sequences the source
    draws. Each term's expectation H(X_{t+1}|X_{≤t}) decreases to the rate as t grows, so the estimate is biased
    upward by at most H(X_{burn_in+1}|X_{≤burn_in}) − rate; the standard error counts sequences, not tokens, since
    tokens within one sequence are correlated.
    """
    burn_in = length // 2 if burn_in is None else burn_in
    if not 0 <= burn_in < length - 1:
        raise ValueError(f"burn_in must be in [0, length − 1), got {burn_in} for length {length}")
    tokens = source.sample(n, length, seed=seed)
    return monte_carlo_rate(source.conditionals(tokens), tokens, burn_in=burn_in)


def every_earlier_position(tokens: IntArray) -> NDArray[np.bool_]:
    """(batch, length, length): row t marks every position ≤ t."""
    length = tokens.shape[1]
    return np.broadcast_to(np.tri(length, dtype=bool), (tokens.shape[0], length, length)).copy()
