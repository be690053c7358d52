"""The public probe: `fit_probe` fits one probe (ridge, logistic or MLP; in memory, or out of core from an
ActivationStore's shards) with its regularisation cross-validated on grouped folds of the training rows and
scores it on held-out groups with bootstrap intervals (`ProbeResult`); `fit_probes` one per hook on one split,
`probe_table` their rows, and `steering_vector` a linear probe's direction as a vector to add."""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from lab.analysis.activations.store import ActivationStore, StoredRows
from lab.analysis.probes.fitting import (
    LOGISTIC_LAMBDAS,
    MLP_DECAYS,
    RIDGE_ALPHAS,
    Fitted,
    Kind,
    accuracy,
    as_features,
    feature_rank,
    r2_score,
)
from lab.analysis.probes.in_memory import MLPTraining, cross_validate
from lab.analysis.probes.out_of_core import cross_validate_streamed
from lab.analysis.probes.shards import streamed_scores
from lab.analysis.probes.splits import group_ids_of, group_kfold, group_split
from lab.metrics.discrimination import Metric, auroc_ci, bootstrap_ci


@dataclass
class ProbeResult:
    """A probe fitted on the training rows with the cross-validated regularisation, scored on the test rows."""

    kind: str  # ridge | logistic | mlp
    task: str  # classification | regression
    regularization: float  # the chosen α (ridge), λ (logistic) or weight decay (mlp)
    cv_loss: dict[float, float]  # mean held-out loss per candidate, from grouped k-fold CV
    # test: accuracy and auroc (classification), r2 (regression; ridge also auroc on 0/1 labels)
    metrics: dict[str, Metric]
    train_index: np.ndarray
    test_index: np.ndarray
    test_scores: Tensor  # probe output on the test rows: P(y = classes[1]), [n, k] probabilities, or ŷ
    classes: np.ndarray | None  # label values in the order of the probe's outputs (classification)
    fitted: Fitted | None = field(repr=False)  # None when the features are constant (nothing was fitted)
    feature_rank: int = -1  # numerical rank of the centred training features (`feature_rank`)
    n_features: int = 0

    @property
    def constant(self) -> bool:
        """The training features do not vary (rank 0): the probe is flagged, not fitted, not scored."""
        return self.feature_rank == 0

    def _require_fit(self) -> Fitted:
        if self.fitted is None:
            raise ValueError("constant features (rank 0 on the training rows): this probe was not fitted")
        return self.fitted

    def predict_scores(self, X: Any) -> Tensor:
        """The probe's output for new rows (same feature space as it was fitted on)."""
        return self._require_fit().scores(as_features(X))

    @property
    def weight(self) -> Tensor:
        """w in activation space (the standardisation undone): the probe reads x·w + bias."""
        if self.kind == "mlp":
            raise ValueError("an MLP probe has no single direction; use a ridge or logistic probe")
        self._require_fit()
        w = self.fitted.params["w"]
        return w / (self.fitted.std if w.ndim == 1 else self.fitted.std[:, None])

    @property
    def bias(self) -> Tensor:
        """b in activation space: b_std − Σ_i (mean_i / std_i) w_std,i."""
        if self.kind == "mlp":
            raise ValueError("an MLP probe has no single bias; use predict_scores")
        self._require_fit()
        return self.fitted.params["b"] - (self.fitted.mean / self.fitted.std) @ self.fitted.params["w"]

    @property
    def direction(self) -> Tensor:
        """The unit vector w / ‖w‖ in activation space (binary or regression probes)."""
        w = self.weight
        if w.ndim != 1:
            raise ValueError("a multi-class probe has one direction per class: use result.weight[:, c]")
        return w / w.norm().clamp_min(1e-12)

    def __str__(self) -> str:
        if self.constant:
            return f"{self.kind} probe: constant features (rank 0 on the training rows), not scored"
        parts = ", ".join(f"{k} {v}" for k, v in self.metrics.items())
        return f"{self.kind} probe (reg {self.regularization:g}): {parts}"


_DEFAULT_GRIDS = {"ridge": RIDGE_ALPHAS, "logistic": LOGISTIC_LAMBDAS, "mlp": MLP_DECAYS}  # each kind's candidates


def fit_probe(
    X: Any,
    y: Any,
    kind: Kind = "logistic",
    *,
    groups: Any = None,
    test_fraction: float = 0.25,
    n_folds: int = 5,
    grid: Sequence[float] | None = None,
    split: tuple[Any, Any] | None = None,
    n_bootstrap: int = 1000,
    seed: int = 0,
    mlp_hidden: int = 64,
    mlp_steps: int = 300,
    task: str | None = None,
) -> ProbeResult:
    """Fit one probe on activations X [rows, ...] against labels y [rows], and score it on held-out groups.

    kind: "ridge" (regression), "logistic" (classification) or "mlp" (either; `task` defaults to
    classification for integer/bool labels). X may also be rows left on disk — `store[name]` of an
    `ActivationStore`, or a store of one hook: a ridge or logistic probe is then fitted out of core, a shard
    at a time (the same probe as in memory; see `out_of_core`). groups: an entity id per row; no group is on both sides
    of any split. split: (train rows, test rows) to reuse one split across probes (else `group_split`).
    grid: regularisation candidates (defaults RIDGE_ALPHAS, LOGISTIC_LAMBDAS, MLP_DECAYS).
    """
    if kind not in ("ridge", "logistic", "mlp"):
        raise ValueError(f"kind must be 'ridge', 'logistic' or 'mlp', got {kind!r}")
    X, stored, n_features = _rows(X, kind)
    task, classes, y_t = _labels(y, X.shape[0], kind, task)
    n_classes = 0 if classes is None else len(classes)
    grid = tuple(grid if grid is not None else _DEFAULT_GRIDS[kind])
    group_ids = group_ids_of(groups, X.shape[0])
    train, test = _split(group_ids, split, groups is not None, test_fraction, seed)

    # Cross-validate the regularisation on the training rows only, folds grouped like the split.
    def grouped_folds() -> list[tuple[np.ndarray, np.ndarray]]:
        return group_kfold(group_ids[train], min(n_folds, len(np.unique(group_ids[train]))), seed=seed + 1)

    if stored:  # one shard's rows in memory at a time (see `out_of_core`); the rank comes from the same pass
        cv_loss, best, fitted, rank = cross_validate_streamed(
            kind, X, y_t, n_classes, train, test, grouped_folds(), grid
        )
    else:
        rank = feature_rank(X[train])
    if rank == 0:  # flagged, not scored: a probe on constant features can only return its prior
        return _unscored(kind, task, train, test, classes, n_features)
    if stored:
        scores = streamed_scores(X, test, [fitted])[0]
    else:
        cv_loss, best, fitted = cross_validate(
            kind, task, X[train], y_t[train], n_classes, grouped_folds(), grid, MLPTraining(mlp_hidden, mlp_steps, seed)
        )
        scores = fitted.scores(X[test])
    test_groups = group_ids[test] if groups is not None else None
    boot = dict(groups=test_groups, n_boot=n_bootstrap, seed=seed)
    metrics = _test_metrics(task, y_t[test].numpy(), scores.numpy(), boot)
    return ProbeResult(
        kind, task, float(best), cv_loss, metrics, train, test, scores, classes, fitted, rank, n_features
    )


def _split(
    group_ids: np.ndarray, split: tuple[Any, Any] | None, grouped: bool, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, test rows): the given split (ValueError when it puts a group on both sides), else
    `group_split`'s."""
    if split is None:
        return group_split(group_ids, test_fraction, seed)
    train, test = (np.asarray(s) for s in split)
    if grouped and set(group_ids[train]) & set(group_ids[test]):
        raise ValueError("the given split puts a group on both sides")
    return train, test


def _rows(X: Any, kind: Kind) -> tuple[Any, bool, int]:
    """(the rows, whether they stay on disk, features per row) of activations in memory or in a store."""
    if isinstance(X, ActivationStore):
        if len(X.names) != 1:
            raise ValueError(f"{X.directory} holds {len(X.names)} hooks {X.names}: fit on one, store[name]")
        X = X[X.names[0]]
    if isinstance(X, StoredRows):
        if kind == "mlp":
            raise ValueError("an MLP probe is fitted in memory: give store.load(name)[name], not the store")
        return X, True, int(np.prod(X.shape[1:]))
    X = as_features(X)
    return X, False, X.shape[1]


def _labels(y: Any, n_rows: int, kind: Kind, task: str | None) -> tuple[str, Any, Tensor]:
    """(task, the classes or None, the labels as a tensor: class indices, or float64 targets)."""
    y_raw = np.asarray(y.detach().cpu() if isinstance(y, Tensor) else y)
    if y_raw.shape != (n_rows,):
        raise ValueError(f"y must have one label per row of X ({n_rows}), got shape {y_raw.shape}")
    if task is None:
        integer = y_raw.dtype == bool or np.issubdtype(y_raw.dtype, np.integer)
        task = "regression" if kind == "ridge" or (kind == "mlp" and not integer) else "classification"
    if kind == "logistic" and task != "classification":
        raise ValueError("a logistic probe classifies: give integer or bool labels")
    if kind == "ridge" and task != "regression":
        raise ValueError("a ridge probe regresses; use kind='logistic' to classify")
    if task != "classification":
        return task, None, torch.as_tensor(y_raw.astype(float), dtype=torch.float64)
    classes, labels = np.unique(y_raw, return_inverse=True)
    if len(classes) < 2:
        raise ValueError(f"classification needs at least two label values, got {classes.tolist()}")
    return task, classes, torch.as_tensor(labels, dtype=torch.long)


def _unscored(kind: Kind, task: str, train: Any, test: Any, classes: Any, n_features: int) -> ProbeResult:
    """The result of a probe on constant features (rank 0 on the training rows): flagged, not scored."""
    why = "constant features (rank 0 on the training rows): not scored"
    blank = Metric(float("nan"), float("nan"), float("nan"), why_no_interval=why)
    names = ["accuracy", "auroc"] if task == "classification" else ["r2"]
    scores = torch.full((len(test),), float("nan"), dtype=torch.float64)
    return ProbeResult(
        kind, task, float("nan"), {}, {name: blank for name in names}, train, test, scores, classes, None, 0, n_features
    )


def _test_metrics(task: str, y_test: Any, s_test: Any, boot: dict[str, Any]) -> dict[str, Metric]:
    """Accuracy and AUROC of a classifier, R² of a regression (and AUROC when its labels are 0/1), each with its
    bootstrap interval over the test groups."""
    metrics: dict[str, Metric] = {}
    if task == "classification":
        predicted = (s_test > 0.5).astype(int) if s_test.ndim == 1 else s_test.argmax(axis=1)
        metrics["accuracy"] = bootstrap_ci(accuracy, y_test, predicted, **boot)
        metrics["auroc"] = auroc_ci(s_test, y_test, **boot)
    else:
        metrics["r2"] = bootstrap_ci(r2_score, y_test, s_test, **boot)
        if set(np.unique(y_test).tolist()) <= {0.0, 1.0}:  # a ridge probe on 0/1 labels also ranks them
            metrics["auroc"] = auroc_ci(s_test, y_test.astype(int), **boot)
    return metrics


def fit_probes(
    activations: Mapping[str, Any],
    y: Any,
    kind: Kind = "logistic",
    *,
    groups: Any = None,
    test_fraction: float = 0.25,
    seed: int = 0,
    **options: Any,
) -> dict[str, ProbeResult]:
    """One probe per hook (or layer) on the same grouped split: {name: ProbeResult}.

    `activations` is a mapping name → [rows, ...] (an `Activations`' `.acts`, or a dict you build).
    """
    if isinstance(activations, ActivationStore):  # each hook fitted out of core, shard by shard
        activations = {name: activations[name] for name in activations.names}
    acts = getattr(activations, "acts", activations)
    if not acts:
        raise ValueError("no activations to probe")
    n = len(next(iter(acts.values())))
    split = group_split(group_ids_of(groups, n), test_fraction, seed)
    return {name: fit_probe(X, y, kind, groups=groups, split=split, seed=seed, **options) for name, X in acts.items()}


def probe_table(results: Mapping[str, ProbeResult]) -> list[dict[str, Any]]:
    """Rows {hook, kind, regularization, metric, value, low, high, n_pos, n_neg, constant} for a DataFrame or a plot."""
    return [
        {
            "hook": name,
            "kind": r.kind,
            "regularization": r.regularization,
            "metric": metric,
            "value": m.value,
            "low": m.low,
            "high": m.high,
            "n_pos": m.n_pos,
            "n_neg": m.n_neg,
            "constant": r.constant,
        }
        for name, r in results.items()
        for metric, m in r.metrics.items()
    ]


def steering_vector(result: ProbeResult, X: Any = None, y: Any = None) -> Float[Tensor, "*shape"]:
    """The probe's unit direction in activation space, as float32.

    With activations X and binary labels y it is scaled by the gap between the class means along it,
    (mean x|y=1 − mean x|y=0)·u, so adding it once moves a typical negative row to a typical positive
    one along the probe's direction. Multi-dimensional activations (e.g. [head, d_head]) need X for
    the shape; a 1-D activation gets a [d] vector.
    """
    u = result.direction
    scale = 1.0
    if X is not None:
        Xf = as_features(X)
        if Xf.shape[1] != u.shape[0]:
            raise ValueError(f"X has {Xf.shape[1]} features per row; the probe was fitted on {u.shape[0]}")
        if y is None:
            raise ValueError("scaling by the class-mean gap needs the labels y as well as X")
        labels = np.asarray(y.detach().cpu() if isinstance(y, Tensor) else y)
        values = np.unique(labels)
        if len(values) != 2:
            raise ValueError(f"scaling by the class-mean gap needs binary labels, got {values.tolist()}")
        positive = torch.as_tensor(labels == values[1])
        scale = float((Xf[positive].mean(0) - Xf[~positive].mean(0)) @ u)
        u = u.reshape(tuple(np.shape(X)[1:]))  # e.g. back to [head, d_head]
    if not math.isfinite(scale):
        raise ValueError("the class-mean gap along the probe direction is not finite")
    return (scale * u).float()
