"""Finite-memory baselines (pure numpy): what a reader that remembers only the last k tokens can predict.

A probe's reading of a hidden state (a hidden-Markov belief η_t) means geometry only where it beats a reader with
a short memory, since a belief that the last few tokens fix is a lookup table of them, not a state the model had to
build. The lookup of the last k tokens predicts, at every position t, the mean target of the training rows whose
window of the last k tokens is the same,

    ŷ_t = mean { y_s : s a training row, x_{s−k+1 … s} = x_{t−k+1 … t} },

with the window padded by a mark before the sequence's start (so that at t < k the window is the whole prefix,
which fixes a belief exactly, as a model that knows the position would). A window the training rows never hold
backs off to the last k − 1 tokens, then k − 2, …, and finally the training rows' mean: the baseline is as strong
as the data allow, never undefined.
"""

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["last_tokens_lookup"]

START = -1  # the mark of a position before the sequence's start


def _windows(tokens: np.ndarray, k: int) -> np.ndarray:
    """[batch · pos, k]: each position's last k tokens, oldest first, START before the sequence's start."""
    batch, length = tokens.shape
    padded = np.concatenate([np.full((batch, k), START, dtype=np.int64), tokens], axis=1)
    return np.stack([padded[:, i + 1 : i + 1 + length] for i in range(k)], axis=-1).reshape(batch * length, k)


def last_tokens_lookup(tokens: ArrayLike, targets: ArrayLike, train: ArrayLike, k: int) -> np.ndarray:
    """Predictions [batch · pos, d] of the lookup of the last `k` tokens (the module's docstring) for every row
    (position) of `tokens` [batch, pos], fitted on the rows `train` (indices into batch · pos, row-major) of
    `targets` [batch, pos, d] or [batch · pos, d]."""
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [batch, pos], got shape {tokens.shape}")
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    rows = tokens.size
    y = np.asarray(targets, dtype=np.float64).reshape(rows, -1)
    train = np.asarray(train, dtype=np.int64)
    if len(train) == 0 or train.min() < 0 or train.max() >= rows:
        raise ValueError(f"train must be non-empty row indices below {rows}")
    is_train = np.zeros(rows, dtype=bool)
    is_train[train] = True
    predicted = np.full(y.shape, np.nan)
    done = np.zeros(rows, dtype=bool)
    windows = _windows(tokens, k)
    for j in range(k, 0, -1):  # the last j tokens, backing off while a window is unseen
        _, key = np.unique(windows[:, k - j :], axis=0, return_inverse=True)
        key = key.ravel()
        sums = np.zeros((key.max() + 1, y.shape[1]))
        np.add.at(sums, key[is_train], y[is_train])
        counts = np.bincount(key[is_train], minlength=key.max() + 1)
        now = ~done & (counts[key] > 0)
        predicted[now] = sums[key[now]] / counts[key[now], None]
        done |= now
    predicted[~done] = y[is_train].mean(axis=0)
    return predicted
