"""Rows read a shard at a time from an ActivationStore (`StoredRows`): each part's sums in one pass (count, Σx,
Σx², Σxxᵀ, Σxy), the rank of a union of parts from its Gram matrix, and a fit's scores on chosen rows. What the
out-of-core probes (`out_of_core`) are built from; memory is one shard plus [features]² per part."""

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from lab.analysis.activations.store import StoredRows
from lab.analysis.probes.fitting import FEATURE_RTOL, Fitted


# Rows are labelled by part: fold k of the cross-validation (0..K-1, training rows), K (test rows), or -1
# (in neither). Every fit is over a union of parts, so one pass over the shards gives each part's sums and
# every fold's statistics are sums of parts. Memory: one shard's rows plus [features]² per part (ridge).
def shard_rows(X: StoredRows) -> Iterator[tuple[int, Tensor]]:
    """(first row, float64 [rows, features]) per shard, in row order."""
    start = 0
    for chunk in X.chunks():
        yield start, chunk.reshape(chunk.shape[0], -1).double()
        start += chunk.shape[0]


@dataclass
class PartSums:
    """Per-part sums of the shifted rows x − c (c: the first shard's mean, so that the one-pass variance
    Σx²/n − x̄² does not cancel): count, Σx, Σx², and for ridge Σxxᵀ, Σx·y, Σy."""

    shift: Tensor
    count: np.ndarray
    s1: Tensor  # [parts, features]
    s2: Tensor  # [parts, features]
    gram: Tensor | None  # [parts, features, features] (ridge), or [features, features] over the training parts
    xy: Tensor | None  # [parts, features]
    y1: Tensor | None  # [parts]

    def moments(self, parts: Sequence[int]) -> tuple[int, Tensor, Tensor]:
        """(rows, mean, std) of the union of `parts`, as `standardise` computes them on those rows."""
        idx = list(parts)
        n = int(self.count[idx].sum())
        m = self.s1[idx].sum(0) / n
        var = (self.s2[idx].sum(0) / n - m**2).clamp_min(0)
        return n, m + self.shift, var.sqrt().clamp_min(1e-8)


def part_sums(
    X: StoredRows, part: np.ndarray, n_parts: int, train_parts: Sequence[int], y: Tensor | None, per_part_gram: bool
) -> PartSums:
    d = int(np.prod(X.shape[1:]))
    s = PartSums(
        torch.zeros(0),
        np.zeros(n_parts, dtype=np.int64),
        torch.zeros(n_parts, d, dtype=torch.float64),
        torch.zeros(n_parts, d, dtype=torch.float64),
        torch.zeros((n_parts, d, d) if per_part_gram else (d, d), dtype=torch.float64),
        torch.zeros(n_parts, d, dtype=torch.float64) if y is not None else None,
        torch.zeros(n_parts, dtype=torch.float64) if y is not None else None,
    )
    for start, chunk in shard_rows(X):
        if not len(s.shift):
            s.shift = chunk.mean(0)
        here = part[start : start + len(chunk)]
        for p in np.unique(here[here >= 0]):
            sel = torch.as_tensor(here == p)
            Xp = chunk[sel] - s.shift
            s.count[p] += len(Xp)
            s.s1[p] += Xp.sum(0)
            s.s2[p] += (Xp**2).sum(0)
            if per_part_gram:
                s.gram[p] += Xp.T @ Xp
            elif p in train_parts:
                s.gram += Xp.T @ Xp
            if y is not None:
                yp = y[start : start + len(chunk)][sel]
                s.xy[p] += Xp.T @ yp
                s.y1[p] += yp.sum()
    return s


def streamed_rank(s: PartSums, parts: Sequence[int]) -> int:
    """`feature_rank` of the rows of `parts` from their Gram matrix: the centred singular values are the
    square roots of the centred Gram's eigenvalues, the scale is ‖X‖₂ = √λ_max(XᵀX) of the unshifted rows.
    (Eigenvalues carry an error of ~ε·λ_max, i.e. singular values ~√ε·‖X‖₂ ≈ 1.5e-8·‖X‖₂, below rtol.)"""
    idx = list(parts)
    n = int(s.count[idx].sum())
    if n < 2:
        return 0
    gram = s.gram[idx].sum(0) if s.gram.ndim == 3 else s.gram
    s1 = s.s1[idx].sum(0)
    raw = gram + torch.outer(s.shift, s1) + torch.outer(s1, s.shift) + n * torch.outer(s.shift, s.shift)
    scale = float(torch.linalg.eigvalsh(raw)[-1].clamp_min(0).sqrt())
    if scale == 0.0:
        return 0
    centred = gram - torch.outer(s1, s1) / n
    singular = torch.linalg.eigvalsh(centred).clamp_min(0).sqrt()
    return int((singular > FEATURE_RTOL * scale).sum())


def streamed_scores(X: StoredRows, rows: np.ndarray, fits: Sequence[Fitted]) -> list[Tensor]:
    """Each fit's scores on `rows` (in the order given), one pass over the shards."""
    order = np.full(len(X), -1)
    order[rows] = np.arange(len(rows))
    out: list[list[Tensor]] = [[] for _ in fits]
    where: list[np.ndarray] = []
    for start, chunk in shard_rows(X):
        at = order[start : start + len(chunk)]
        sel = at >= 0
        if sel.any():
            where.append(at[sel])
            for j, fit in enumerate(fits):
                out[j].append(fit.scores(chunk[torch.as_tensor(sel)]))
    if not where:
        return [torch.zeros(0, dtype=torch.float64) for _ in fits]
    inverse = torch.as_tensor(np.argsort(np.concatenate(where)))
    return [torch.cat(parts)[inverse] for parts in out]
