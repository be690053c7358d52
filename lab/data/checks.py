"""A source's arguments and token arrays, checked before anything is drawn (lab.data.sources, lab.data.mechanisms):
integers, concentrations and probabilities in range, a dict's kind and keys, token arrays in the vocabulary, and
size limits checked before anything is allocated — each refusal one line that names the source and the value."""

import math
import numbers
from typing import Any

import numpy as np

from lab.data.draws import IntArray

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


def check_kind(owner: str, data: dict[str, Any], kind: str, known: set[str]) -> None:
    if not isinstance(data, dict):
        raise ValueError(f"{owner}: expected a mapping, got {type(data).__name__}")
    if data.get("kind") != kind:
        raise ValueError(f"{owner}: expected kind {kind!r}, got {data.get('kind')!r}")
    unknown = sorted(set(data) - known - {"kind"})
    if unknown:
        raise ValueError(f"{owner}: unknown keys {unknown}; known keys are {sorted(known)}")


def check_open_unit(owner: str, name: str, value: Any, high: float = 1.0) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not (0.0 < value < high):
        raise ValueError(f"{owner}: {name} must be a number in (0, {high:g}), got {value!r}")
    return float(value)
