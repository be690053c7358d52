"""What every source with a known law shares (lab.data.sources, lab.data.mechanisms): checks of its arguments
and of token arrays, size limits checked before anything is allocated, categorical draws by inversion, the
stationary law of a small chain, and the Monte-Carlo estimate of an entropy rate with its standard error."""

import math
import numbers
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

# Size limits, checked before anything is allocated (a world of V^(k+1) laws grows fast: order 12 over
# 32 symbols would be 3.7e19 of them). A probability table of MAX_TABLE_ENTRIES float64 entries is
# 256 MiB, and the chain keeps two (the laws and their cumulative sums) plus a power-iteration
# temporary; MAX_SAMPLE_TOKENS int64 ids are 1 GiB.
MAX_TABLE_ENTRIES = 2**25
MAX_SAMPLE_TOKENS = 2**27


def check_int(owner: str, name: str, value: Any, minimum: int = 1) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{owner}: {name} must be an integer ≥ {minimum}, got {value!r}")
    return int(value)


def check_size(owner: str, what: str, entries: int, limit: int, advice: str) -> None:
    if entries > limit:
        raise ValueError(
            f"{owner}: {what} = {entries:,} entries ({_bytes(entries * 8)} as 64-bit numbers) "
            f"exceeds the limit of {limit:,} ({_bytes(limit * 8)}); {advice}"
        )


def check_sample(owner: str, n: Any, length: Any, width: int = 0) -> tuple[int, int]:
    """(n, length) of a draw of `n` sequences of `length` tokens, each a positive integer, refused above
    MAX_SAMPLE_TOKENS entries: n × max(length, width), where a source draws `width` columns whatever the length
    (an order-k chain's first k tokens, the induction world's permutation of the vocabulary)."""
    n, length = check_int(owner, "n", n), check_int(owner, "length", length)
    columns = max(length, width)
    advice = "draw fewer or shorter sequences"
    check_size(owner, f"n × length = {n:,} × {columns}", n * columns, MAX_SAMPLE_TOKENS, advice)
    return n, length


def _bytes(n: float) -> str:
    """A byte count in binary units: 256 MiB, 2.62e+05 PiB."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    for unit in units:
        if n < 1024:
            return f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} PiB"


def check_concentration(owner: str, value: Any) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"{owner}: concentration must be a finite number > 0, got {value!r}")
    return float(value)


def as_tokens(tokens: Any, vocab_size: int) -> IntArray:
    """Validate and view `tokens` as an int64 `(batch, length)` array (a 1-D array is one sequence)."""
    array = np.asarray(tokens)
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2 or array.shape[1] < 1:
        raise ValueError(f"tokens must have shape (batch, length ≥ 1), got {array.shape}")
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"tokens must be integers, got dtype {array.dtype}")
    if array.size and (array.min() < 0 or array.max() >= vocab_size):
        raise ValueError(f"tokens must lie in [0, {vocab_size}), got range [{array.min()}, {array.max()}]")
    return array.astype(np.int64, copy=False)


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


def check_kind(owner: str, data: dict[str, Any], kind: str, known: set[str]) -> None:
    if not isinstance(data, dict):
        raise ValueError(f"{owner}: expected a mapping, got {type(data).__name__}")
    if data.get("kind") != kind:
        raise ValueError(f"{owner}: expected kind {kind!r}, got {data.get('kind')!r}")
    unknown = sorted(set(data) - known - {"kind"})
    if unknown:
        raise ValueError(f"{owner}: unknown keys {unknown}; known keys are {sorted(known)}")


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


def check_open_unit(owner: str, name: str, value: Any, high: float = 1.0) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not (0.0 < value < high):
        raise ValueError(f"{owner}: {name} must be a number in (0, {high:g}), got {value!r}")
    return float(value)


def every_earlier_position(tokens: IntArray) -> NDArray[np.bool_]:
    """(batch, length, length): row t marks every position ≤ t."""
    length = tokens.shape[1]
    return np.broadcast_to(np.tri(length, dtype=bool), (tokens.shape[0], length, length)).copy()
