"""Cross-fitting by group: when every item needs a held-out score (a monitor's signal on each question of a small
file), the groups are dealt into K folds and each fold is scored by the probe fitted on the other K − 1; a fold
whose training groups hold fewer than MIN_PER_CLASS of either class leaves the readout "not enough data", said
in words, and nothing is scored."""

from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import Tensor

from lab.analysis.probes.fitting import Kind, as_features
from lab.analysis.probes.probe import fit_probe
from lab.analysis.probes.splits import group_ids_of, group_kfold
from lab.metrics.discrimination import MIN_PER_CLASS


@dataclass(frozen=True)
class CrossFitted:
    """Held-out scores from `cross_fit_probe`: scores[i] is the output of the probe fitted without row i's group
    (P(y = classes[1]) for a classifier), or None with `why` when a fold could not be fitted."""

    scores: np.ndarray | None  # [rows], float64
    folds: list[np.ndarray]  # the groups (their values) each fold's probe scores; disjoint, together every group
    regularization: list[float]  # each fold's cross-validated regularisation
    why: str | None = None


def cross_fit_probe(
    X: Any,
    y: Any,
    groups: Any,
    n_folds: int = 5,
    *,
    kind: Kind = "logistic",
    seed: int = 0,
    min_per_class: int = MIN_PER_CLASS,
    n_bootstrap: int = 200,
    **options: Any,
) -> CrossFitted:
    """K-fold cross-fitting by group: the groups are dealt into `n_folds` folds (`group_kfold`, independently of the
    labels), and the rows of fold k are scored by the probe `fit_probe` fits on the rows of the other folds — its
    regularisation cross-validated within them. Every row gets a score from a probe that never saw its group.

    A classifier needs, in every fold's training rows, at least `min_per_class` groups holding each class; otherwise
    (or with fewer groups than folds, or constant features) nothing is scored and `why` says so in words. `options`
    go to `fit_probe` (its regularisation grid, …)."""
    X = as_features(X)
    y = np.asarray(y.detach().cpu() if isinstance(y, Tensor) else y)
    if not (isinstance(n_folds, int) and n_folds >= 2):
        raise ValueError(f"n_folds must be an integer ≥ 2, got {n_folds!r}")
    if groups is None:
        raise ValueError("cross_fit_probe needs groups: the folds are by group")
    values = np.asarray(groups.cpu() if isinstance(groups, Tensor) else groups)
    ids = group_ids_of(values, X.shape[0])
    if y.shape != (X.shape[0],):
        raise ValueError(f"y must have one label per row of X ({X.shape[0]}), got shape {y.shape}")
    names = np.unique(values)
    if len(names) < n_folds:
        return CrossFitted(None, [], [], f"{len(names)} groups cannot be dealt into {n_folds} folds")
    folds = group_kfold(ids, n_folds, seed=seed)
    scored = [names[np.unique(ids[held])] for _, held in folds]
    if kind == "logistic" or (kind == "mlp" and (y.dtype == bool or np.issubdtype(y.dtype, np.integer))):
        for k, (train, _) in enumerate(folds):
            counts = {label: len(np.unique(ids[train][y[train] == label])) for label in np.unique(y)}
            if len(counts) < 2 or min(counts.values()) < min_per_class:
                shown = ", ".join(f"{n} with label {label!r}" for label, n in counts.items())
                n_train = len(np.unique(ids[train]))
                return CrossFitted(
                    None,
                    scored,
                    [],
                    f"fold {k + 1} of {n_folds} is fitted on {n_train} groups "
                    f"({shown}): a probe needs at least {min_per_class} groups of each class",
                )
    scores = np.full(X.shape[0], np.nan)
    regularization = []
    for k, (train, held) in enumerate(folds):
        result = fit_probe(
            X, y, kind, groups=ids, split=(train, held), seed=seed + k, n_bootstrap=n_bootstrap, **options
        )
        if result.constant:
            return CrossFitted(None, scored, [], f"fold {k + 1} of {n_folds}: constant features on its training rows")
        if result.test_scores.ndim != 1:
            raise ValueError("cross_fit_probe scores one number per row: give a binary or regression task")
        scores[held] = result.test_scores.numpy()
        regularization.append(result.regularization)
    return CrossFitted(scores, scored, regularization)
