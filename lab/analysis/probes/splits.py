"""Group-aware splits: train / test, train / validation / test and k folds, every group (the entity a row is
about) wholly on one side, so that no probe can score by recognising an entity it was fitted on."""

from collections.abc import Sequence
from typing import Any

import numpy as np
from torch import Tensor


def group_ids_of(groups: Any, n: int | None) -> np.ndarray:
    if groups is None:
        if n is None:
            raise ValueError("without groups, give the number of rows n (every row is its own group)")
        return np.arange(n)
    groups = np.asarray(groups.cpu() if isinstance(groups, Tensor) else groups)
    if groups.shape != (n,):
        raise ValueError(f"groups must have one entry per row ({n}), got shape {groups.shape}")
    return np.unique(groups, return_inverse=True)[1]


def group_split(
    groups: Any, test_fraction: float = 0.25, seed: int = 0, n: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, test rows) with every group wholly on one side; about `test_fraction` of groups test.

    groups=None (with n) treats every row as its own group.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}")
    ids = group_ids_of(groups, len(groups) if groups is not None else n)
    n_groups = int(ids.max()) + 1
    if n_groups < 2:
        raise ValueError("a train/test split needs at least two groups")
    order = np.random.default_rng(seed).permutation(n_groups)
    n_test = min(n_groups - 1, max(1, round(test_fraction * n_groups)))
    is_test = np.zeros(n_groups, dtype=bool)
    is_test[order[:n_test]] = True
    return np.flatnonzero(~is_test[ids]), np.flatnonzero(is_test[ids])


def group_partition(
    groups: Any, fractions: Sequence[float] = (0.4, 0.3, 0.3), seed: int = 0, n: int | None = None
) -> tuple[np.ndarray, ...]:
    """Rows split into len(fractions) parts (train, validation, test by default) with every group wholly in
    one part: the groups are shuffled once (seed) and cut at the cumulative fractions, each part ≥ 1 group."""
    fractions = tuple(float(f) for f in fractions)
    if len(fractions) < 2 or any(f <= 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
        raise ValueError(f"fractions must be ≥ 2 positive shares summing to 1, got {fractions}")
    ids = group_ids_of(groups, len(groups) if groups is not None else n)
    n_groups = int(ids.max()) + 1
    if n_groups < len(fractions):
        raise ValueError(f"a split into {len(fractions)} parts needs at least {len(fractions)} groups, got {n_groups}")
    order = np.random.default_rng(seed).permutation(n_groups)
    cuts = np.round(np.cumsum(fractions)[:-1] * n_groups).astype(int)
    for j in range(len(cuts)):  # every part keeps at least one group
        cuts[j] = min(max(cuts[j], (cuts[j - 1] if j else 0) + 1), n_groups - (len(cuts) - j))
    part_of_group = np.empty(n_groups, dtype=int)
    part_of_group[order] = np.searchsorted(cuts, np.arange(n_groups), side="right")
    part = part_of_group[ids]
    return tuple(np.flatnonzero(part == k) for k in range(len(fractions)))


def group_kfold(
    groups: Any, n_folds: int = 5, seed: int = 0, n: int | None = None
) -> list[tuple[np.ndarray, np.ndarray]]:
    """k (train rows, validation rows) folds; each group is in exactly one validation fold."""
    ids = group_ids_of(groups, len(groups) if groups is not None else n)
    n_groups = int(ids.max()) + 1
    if n_folds < 2 or n_folds > n_groups:
        raise ValueError(f"n_folds must lie in [2, number of groups = {n_groups}], got {n_folds}")
    fold_of_group = np.empty(n_groups, dtype=int)
    fold_of_group[np.random.default_rng(seed).permutation(n_groups)] = np.arange(n_groups) % n_folds
    fold = fold_of_group[ids]
    return [(np.flatnonzero(fold != k), np.flatnonzero(fold == k)) for k in range(n_folds)]
