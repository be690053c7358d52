"""Probes: what can be read off an activation, measured honestly.

    ridge      ŷ = x·w + b,          w = argmin ‖Xw + b − y‖² + α‖w‖²          (regression; R²)
    logistic   P(y = 1 | x) = σ(x·w + b), w = argmin mean CE + ½λ‖w‖²         (classification; accuracy, AUROC)
               (k > 2 classes: softmax over x·W + b)
    mlp        P(y | x) = softmax(W₂ ReLU(W₁x + b₁) + b₂), AdamW with weight decay λ
               (or a regression output). A linear probe can miss what a small nonlinear one finds: a
               model's confidence may be a max over many value directions, not one direction
               (shared/SCIENCE.md §3) — compare both, and both with the model's own readout.

Honesty, in order:
1. Features are standardised with the statistics of the rows a probe is fitted on, never the test rows.
2. Splits are by group (`groups[i]`, e.g. the person a fact is about): no group is on both sides of
   the train/test split or of any cross-validation fold, so a probe cannot score by recognising an
   entity it was fitted on.
3. The regularisation strength is chosen by k-fold (grouped) cross-validation on the training rows
   only, by held-out loss (squared error or cross-entropy, the proper scores the probes minimise).
4. Test metrics carry bootstrap 95% intervals (percentile method, Efron & Tibshirani 1993 §13.3),
   resampling groups rather than rows when groups are given (rows of one entity are not independent);
   an AUROC's interval is stratified (positives and negatives resampled separately), comes with n_pos /
   n_neg, and is refused below MIN_PER_CLASS of either class (`lab.metrics.calibration.auroc_ci`).
5. Features without variation on the training rows (numerical rank 0: `feature_rank`) are flagged
   `constant` and not scored: a probe on them can only return its prior, AUROC exactly 0.5.
6. Controls: the same probe on shuffled labels (chance: AUROC ≈ 0.5, R² ≤ 0), and on the activations of
   a randomly initialised model of the same shape (`random_model`): what a probe finds there comes
   from the input tokens, not from anything the model learned (Hewitt & Liang 2019 argue for such
   controls; "Designing and Interpreting Probes with Control Tasks").
7. Choosing among readouts (probes, layers, lens readouts) is done on a validation split and the chosen
   one is reported on a separate test split (`group_partition`, `judge_readouts`); the model's own
   confidence is the baseline beside it, never a candidate. The verdict "carries the signal" needs the
   chosen readout's test interval to lie above both controls' intervals; too few items is "not enough
   data", said in words.
8. Cross-fitting (`cross_fit_probe`): when every item needs a held-out score (a monitor's signal on each question
   of a small file), the groups are dealt into K folds and each fold is scored by the probe fitted on the other
   K − 1; a fold whose training groups hold fewer than MIN_PER_CLASS of either class makes the whole readout
   "not enough data", said in words, and nothing is scored.

Linear probes also fit out of core: `fit_probe(store[name], y)` on an `ActivationStore` reads the
rows a shard at a time — ridge from per-fold sums (Σx, Σx², Σxxᵀ, Σxy), logistic by the same damped
Newton (or L-BFGS) steps with each gradient and Hessian summed over the shards — so memory is one shard
plus [features]² per fold, and the probe is the one the in-memory fit finds.

A linear probe's direction w (in activation space, undoing the standardisation) becomes a steering
vector with `steering_vector`; add it with `lab.analysis.steering.steer`.
"""

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from lab.analysis.activations import ActivationStore, StoredRows
from lab.metrics.calibration import MIN_PER_CLASS, Metric, auroc, auroc_ci, bootstrap_ci
from lab.model import HookedTransformer

__all__ = ["MIN_PER_CLASS", "CrossFitted", "Metric", "ProbeResult", "accuracy", "auroc", "auroc_ci", "bootstrap_ci",
           "cross_fit_probe", "feature_rank", "fit_probe", "fit_probes", "group_kfold", "group_partition", "group_split",
           "judge_readouts", "metric_of", "probe_table", "r2_score", "random_model", "shuffled_control", "steering_vector"]

Kind = Literal["ridge", "logistic", "mlp"]
# Default regularisation grids, for standardised features. Ridge: α multiplies ‖w‖² against a *summed*
# squared error, so useful values scale with the number of rows; logistic and MLP: λ against a *mean* loss.
RIDGE_ALPHAS = tuple(10.0 ** k for k in range(-2, 6))
LOGISTIC_LAMBDAS = tuple(10.0 ** k for k in range(-5, 2))
MLP_DECAYS = (1e-4, 1e-2, 1e-1)


# --------------------------------------------------------------------------------------------
# Metrics (pure functions on numpy arrays). AUROC, bootstrap intervals and Metric live in
# lab.metrics.calibration, with one argument order (scores, labels); they are re-exported here.
# --------------------------------------------------------------------------------------------
def accuracy(y_true: Any, y_pred: Any) -> float:
    """Share of exact matches."""
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    return float((y_true == y_pred).mean())


def r2_score(y_true: Any, y_pred: Any) -> float:
    """Coefficient of determination 1 − Σ(y − ŷ)² / Σ(y − ȳ)² (can be negative)."""
    y_true, y_pred = np.asarray(y_true, dtype=float), np.asarray(y_pred, dtype=float)
    total = ((y_true - y_true.mean()) ** 2).sum()
    return float(1.0 - ((y_true - y_pred) ** 2).sum() / total) if total > 0 else float("nan")


# --------------------------------------------------------------------------------------------
# Group-aware splits
# --------------------------------------------------------------------------------------------
def _group_ids(groups: Any, n: int | None) -> np.ndarray:
    if groups is None:
        if n is None:
            raise ValueError("without groups, give the number of rows n (every row is its own group)")
        return np.arange(n)
    groups = np.asarray(groups.cpu() if isinstance(groups, Tensor) else groups)
    if groups.shape != (n,):
        raise ValueError(f"groups must have one entry per row ({n}), got shape {groups.shape}")
    return np.unique(groups, return_inverse=True)[1]


def group_split(groups: Any, test_fraction: float = 0.25, seed: int = 0,
                n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, test rows) with every group wholly on one side; about `test_fraction` of groups test.

    groups=None (with n) treats every row as its own group.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}")
    ids = _group_ids(groups, len(groups) if groups is not None else n)
    n_groups = int(ids.max()) + 1
    if n_groups < 2:
        raise ValueError("a train/test split needs at least two groups")
    order = np.random.default_rng(seed).permutation(n_groups)
    n_test = min(n_groups - 1, max(1, round(test_fraction * n_groups)))
    is_test = np.zeros(n_groups, dtype=bool)
    is_test[order[:n_test]] = True
    return np.flatnonzero(~is_test[ids]), np.flatnonzero(is_test[ids])


def group_partition(groups: Any, fractions: Sequence[float] = (0.4, 0.3, 0.3), seed: int = 0,
                    n: int | None = None) -> tuple[np.ndarray, ...]:
    """Rows split into len(fractions) parts (train, validation, test by default) with every group wholly in
    one part: the groups are shuffled once (seed) and cut at the cumulative fractions, each part ≥ 1 group."""
    fractions = tuple(float(f) for f in fractions)
    if len(fractions) < 2 or any(f <= 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
        raise ValueError(f"fractions must be ≥ 2 positive shares summing to 1, got {fractions}")
    ids = _group_ids(groups, len(groups) if groups is not None else n)
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


def group_kfold(groups: Any, n_folds: int = 5, seed: int = 0, n: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """k (train rows, validation rows) folds; each group is in exactly one validation fold."""
    ids = _group_ids(groups, len(groups) if groups is not None else n)
    n_groups = int(ids.max()) + 1
    if n_folds < 2 or n_folds > n_groups:
        raise ValueError(f"n_folds must lie in [2, number of groups = {n_groups}], got {n_folds}")
    fold_of_group = np.empty(n_groups, dtype=int)
    fold_of_group[np.random.default_rng(seed).permutation(n_groups)] = np.arange(n_groups) % n_folds
    fold = fold_of_group[ids]
    return [(np.flatnonzero(fold != k), np.flatnonzero(fold == k)) for k in range(n_folds)]


# --------------------------------------------------------------------------------------------
# Fitting (float64; features standardised with the statistics of the rows being fitted)
# --------------------------------------------------------------------------------------------
@dataclass
class _Fitted:
    """A fitted probe on standardised features; `scores` gives P(y = 1), class probabilities, or ŷ."""

    kind: str
    task: str
    mean: Tensor  # [features]
    std: Tensor  # [features]
    params: dict[str, Tensor]  # w, b (linear) or W1, b1, W2, b2 (mlp)

    def scores(self, X: Tensor) -> Tensor:
        Z = (X - self.mean) / self.std
        p = self.params
        if self.kind == "mlp":
            out = torch.relu(Z.float() @ p["W1"] + p["b1"]) @ p["W2"] + p["b2"]
            out = out.double()
        else:
            out = Z @ p["w"] + p["b"]
        if out.ndim == 2 and out.shape[1] == 1:  # regression, or the single logit of a binary classifier
            out = out[:, 0]
        if self.task == "regression":
            return out
        return torch.sigmoid(out) if out.ndim == 1 else out.softmax(dim=-1)


def _standardise(X: Tensor) -> tuple[Tensor, Tensor]:
    return X.mean(dim=0), X.std(dim=0, correction=0).clamp_min(1e-8)


def _fit_ridge(X: Tensor, y: Tensor, alphas: Sequence[float]) -> list[_Fitted]:
    """Closed form for every α from one SVD: w = V diag(s / (s² + α)) Uᵀ (y − ȳ), b = ȳ."""
    mean, std = _standardise(X)
    U, s, Vh = torch.linalg.svd((X - mean) / std, full_matrices=False)
    y_mean = y.mean()
    Uty = U.T @ (y - y_mean)
    return [_Fitted("ridge", "regression", mean, std, {"w": Vh.T @ (s / (s**2 + a) * Uty), "b": y_mean})
            for a in alphas]


NEWTON_MAX_PARAMS = 2048  # above this many parameters the Hessian solve costs more than L-BFGS


def _logistic_objective(A: Tensor, Y: Tensor, T: Tensor, pen: Tensor) -> float:
    logits = A @ T
    if T.shape[1] == 1:
        data = (F.softplus(logits[:, 0]) - Y[:, 0] * logits[:, 0]).mean()
    else:
        data = (torch.logsumexp(logits, dim=1) - (Y * logits).sum(dim=1)).mean()
    return float(data + 0.5 * (pen[:, None] * T**2).sum())


def _newton_logistic(features: Tensor, y: Tensor, out_dim: int, lam: float, T: Tensor,
                     max_iter: int = 100) -> Tensor:
    """Damped Newton (Armijo backtracking) on mean cross-entropy + ½λ‖w‖², float64; returns
    [features + 1, out] with the bias in the last row. The objective is strictly convex for λ > 0, so
    this converges in a few to a few dozen steps where first-order methods take hundreds."""
    n, r = features.shape
    A = torch.cat([features, torch.ones(n, 1, dtype=torch.float64)], dim=1)
    Y = y[:, None].double() if out_dim == 1 else F.one_hot(y, out_dim).double()
    # The bias gets a negligible penalty so that the softmax's shift-invariance leaves H invertible.
    pen = torch.cat([torch.full((r,), float(lam), dtype=torch.float64), torch.tensor([1e-9], dtype=torch.float64)])
    f = _logistic_objective(A, Y, T, pen)
    for _ in range(max_iter):
        logits = A @ T
        if out_dim == 1:
            P = torch.sigmoid(logits)
            H = (A * (P * (1 - P) / n)).T @ A + torch.diag(pen)
        else:
            P = logits.softmax(dim=1)
            S = torch.diag_embed(P) - P[:, :, None] * P[:, None, :]  # [n, k, k]
            H = torch.empty(r + 1, out_dim, r + 1, out_dim, dtype=torch.float64)
            for c in range(out_dim):  # block (c, e) is Aᵀ diag(S[:, c, e]) A: k² matrix products
                for e in range(c, out_dim):
                    H[:, c, :, e] = H[:, e, :, c] = (A * (S[:, c, e] / n)[:, None]).T @ A
            H = H.reshape((r + 1) * out_dim, (r + 1) * out_dim) + torch.diag(pen.repeat_interleave(out_dim))
        G = A.T @ (P - Y) / n + pen[:, None] * T
        step = torch.linalg.solve(H, G.reshape(-1)).reshape(T.shape)
        decrease = float((G * step).sum())
        if decrease < 1e-12:  # Newton decrement²: at the optimum to machine precision
            break
        t = 1.0
        while t > 1e-10:
            candidate = T - t * step
            f_new = _logistic_objective(A, Y, candidate, pen)
            if f_new <= f - 1e-4 * t * decrease:
                break
            t *= 0.5
        T, f = candidate, f_new
    return T


def _lbfgs_logistic(Z: Tensor, y: Tensor, out_dim: int, lam: float, T: Tensor) -> Tensor:
    """L-BFGS fallback for wide features or many classes (same objective, same [features + 1, out] layout)."""
    T = T.clone().requires_grad_(True)
    optimizer = torch.optim.LBFGS([T], lr=1, max_iter=300, tolerance_grad=1e-9, tolerance_change=1e-12,
                                  history_size=20, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        optimizer.zero_grad()
        logits = Z @ T[:-1] + T[-1]
        if out_dim == 1:
            loss = F.binary_cross_entropy_with_logits(logits[:, 0], y.double())
        else:
            loss = F.cross_entropy(logits, y)
        loss = loss + 0.5 * lam * (T[:-1] ** 2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(closure)
    return T.detach()


def _fit_logistic(X: Tensor, y: Tensor, n_classes: int, lambdas: Sequence[float]) -> list[_Fitted]:
    """One fit per λ, warm-started from the strongest penalty to the weakest."""
    mean, std = _standardise(X)
    Z = (X - mean) / std
    out_dim = 1 if n_classes == 2 else n_classes
    # With an L2 penalty w lies in the row space of Z: when there are more features than rows, fit in
    # the SVD coordinates Z = U S Vᵀ (features U S) and map back with V.
    basis = None
    features = Z
    if Z.shape[1] > Z.shape[0]:
        U, s, Vh = torch.linalg.svd(Z, full_matrices=False)
        features, basis = U * s, Vh.T
    r = features.shape[1]
    newton = (r + 1) * out_dim <= NEWTON_MAX_PARAMS
    T = torch.zeros(r + 1, out_dim, dtype=torch.float64)
    fitted = {}
    for lam in sorted(lambdas, reverse=True):
        with _threads_for(features.shape[0] * (r + 1) ** 2 * out_dim**2):
            T = (_newton_logistic if newton else _lbfgs_logistic)(features, y, out_dim, lam, T)
        w, b = T[:-1], T[-1]
        if basis is not None:
            w = basis @ w
        fitted[lam] = _Fitted("logistic", "classification", mean, std,
                              {"w": w[:, 0] if out_dim == 1 else w, "b": b[0] if out_dim == 1 else b})
    return [fitted[lam] for lam in lambdas]


def _train_mlps(Z: Tensor, y: Tensor, rows: Tensor, decays: Tensor, task: str, out_dim: int, hidden: int,
                steps: int, seed: int) -> dict[str, Tensor]:
    """Train N one-hidden-layer ReLU networks at once, network k on the rows where rows[k] is True with
    decoupled weight decay decays[k] (AdamW, Loshchilov & Hutter 2019), full batch, lr 1e-2.

    Batching every (fold, decay) pair into one set of batched matmuls costs about as much wall time as
    one network: on a CPU the per-step overhead, not the arithmetic, dominates at probe sizes.
    """
    N, d = len(decays), Z.shape[1]
    generator = torch.Generator().manual_seed(seed)

    def uniform(shape: tuple[int, ...], fan_in: int) -> Tensor:  # nn.Linear's default init, shared by all N
        bound = 1.0 / math.sqrt(fan_in)
        return ((torch.rand(shape[1:], generator=generator) * 2 - 1) * bound).expand(shape).clone()

    params = {"W1": uniform((N, d, hidden), d), "b1": uniform((N, 1, hidden), d),
              "W2": uniform((N, hidden, out_dim), hidden), "b2": uniform((N, 1, out_dim), hidden)}
    for p in params.values():
        p.requires_grad_(True)
    weight = rows.float() / rows.float().sum(dim=1, keepdim=True)  # [N, n]: each network's mean over its rows
    # Adam written out (Kingma & Ba 2015, Alg. 1, their defaults β = (0.9, 0.999), ε = 1e-8): torch.optim's
    # first step imports the compiler stack, seconds of start-up that a probe does not need.
    lr, beta1, beta2, eps = 1e-2, 0.9, 0.999, 1e-8
    moments = {name: (torch.zeros_like(p), torch.zeros_like(p)) for name, p in params.items()}
    target = y.float()
    with torch.enable_grad(), _threads_for(N * Z.shape[0] * max(d, hidden)):
        for step in range(1, steps + 1):
            out = torch.relu(Z @ params["W1"] + params["b1"]) @ params["W2"] + params["b2"]  # [N, n, out]
            if task == "regression":
                row_loss = (out[..., 0] - target) ** 2
            elif out_dim == 1:
                row_loss = F.binary_cross_entropy_with_logits(out[..., 0], target.expand(N, -1), reduction="none")
            else:
                row_loss = F.cross_entropy(out.transpose(1, 2), y.expand(N, -1), reduction="none")
            grads = torch.autograd.grad((row_loss * weight).sum(), list(params.values()))
            with torch.no_grad():
                for (name, p), g in zip(params.items(), grads):
                    if name in ("W1", "W2"):  # decoupled decay on the weights, not the biases
                        p.mul_(1 - lr * decays[:, None, None])
                    m, v = moments[name]
                    m.mul_(beta1).add_(g, alpha=1 - beta1)
                    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                    denom = (v / (1 - beta2**step)).sqrt_().add_(eps)
                    p.addcdiv_(m, denom, value=-lr / (1 - beta1**step))
    return {name: p.detach() for name, p in params.items()}


@contextmanager
def _threads_for(work: int) -> Iterator[None]:
    """One intra-op thread for small batched ops, restored afterwards: below a few million multiply-adds
    an op finishes before a second thread is useful, and on a loaded machine the threads' hand-offs
    cost more than the arithmetic (measured ~4× slower for a probe-sized MLP with 2 threads on 2 busy cores)."""
    before = torch.get_num_threads()
    small = work < 2**22
    if small:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if small:
            torch.set_num_threads(before)


def _cross_validate_mlp(X: Tensor, y: Tensor, task: str, n_classes: int, folds: list[tuple[np.ndarray, np.ndarray]],
                        decays: Sequence[float], hidden: int, steps: int,
                        seed: int) -> tuple[dict[float, float], float, _Fitted]:
    """Every (fold, decay) network and every final (all training rows, decay) network in one batched run.
    The standardisation uses all training rows' feature statistics (no labels; the test rows are never seen)."""
    mean, std = _standardise(X)
    Z = ((X - mean) / std).float()
    n, G = X.shape[0], len(decays)
    masks = [np.isin(np.arange(n), tr) for tr, _ in folds] + [np.ones(n, dtype=bool)]
    rows = torch.as_tensor(np.repeat(np.stack(masks), G, axis=0))  # network k: mask k // G, decay k % G
    decay_of = torch.tensor(list(decays) * len(masks), dtype=torch.float32)
    out_dim = 1 if task == "regression" or n_classes == 2 else n_classes
    params = _train_mlps(Z, y, rows, decay_of, task, out_dim, hidden, steps, seed)

    def network(k: int) -> _Fitted:
        return _Fitted("mlp", task, mean, std, {name: p[k, 0] if name.startswith("b") else p[k]
                                                for name, p in params.items()})

    cv_loss = {g: 0.0 for g in decays}
    for f, (_, val) in enumerate(folds):
        for j, g in enumerate(decays):
            cv_loss[g] += _loss(network(f * G + j), X[val], y[val]) / len(folds)
    best = min(decays, key=lambda g: (cv_loss[g], -g))
    return cv_loss, best, network(len(folds) * G + list(decays).index(best))


def _loss(fit: _Fitted, X: Tensor, y: Tensor) -> float:
    """Held-out loss used to choose the regularisation: squared error or cross-entropy (nats)."""
    return _loss_of_scores(fit.task, fit.scores(X), y)


def _loss_of_scores(task: str, s: Tensor, y: Tensor) -> float:
    if task == "regression":
        return float(((s - y) ** 2).mean())
    eps = 1e-12
    if s.ndim == 1:
        return float(-(y * (s + eps).log() + (1 - y) * (1 - s + eps).log()).mean())
    return float(-(s[torch.arange(len(y)), y] + eps).log().mean())


def _cross_validate(kind: str, task: str, X: Tensor, y: Tensor, n_classes: int,
                    folds: list[tuple[np.ndarray, np.ndarray]], grid: Sequence[float], mlp_hidden: int,
                    mlp_steps: int, seed: int) -> tuple[dict[float, float], float, _Fitted]:
    """(mean held-out loss per candidate, the best candidate, the probe refitted on all rows with it)."""
    if kind == "mlp":
        return _cross_validate_mlp(X, y, task, n_classes, folds, grid, mlp_hidden, mlp_steps, seed)

    def fit(rows: np.ndarray, candidates: Sequence[float]) -> list[_Fitted]:
        if kind == "ridge":
            return _fit_ridge(X[rows], y[rows].double(), candidates)
        return _fit_logistic(X[rows], y[rows], n_classes, candidates)

    cv_loss = {g: 0.0 for g in grid}
    for train, val in folds:
        for g, fitted in zip(grid, fit(train, grid)):
            cv_loss[g] += _loss(fitted, X[val], y[val]) / len(folds)
    best = min(grid, key=lambda g: (cv_loss[g], -g))  # ties: the stronger regularisation
    return cv_loss, best, fit(np.arange(X.shape[0]), [best])[0]


# --------------------------------------------------------------------------------------------
# Fitting out of core: the rows stay in an ActivationStore and are read a shard at a time
# --------------------------------------------------------------------------------------------
# Rows are labelled by part: fold k of the cross-validation (0..K-1, training rows), K (test rows), or -1
# (in neither). Every fit is over a union of parts, so one pass over the shards gives each part's sums and
# every fold's statistics are sums of parts. Memory: one shard's rows plus [features]² per part (ridge).
def _chunks(X: StoredRows) -> Iterator[tuple[int, Tensor]]:
    """(first row, float64 [rows, features]) per shard, in row order."""
    start = 0
    for chunk in X.chunks():
        yield start, chunk.reshape(chunk.shape[0], -1).double()
        start += chunk.shape[0]


@dataclass
class _PartSums:
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
        """(rows, mean, std) of the union of `parts`, as `_standardise` computes them on those rows."""
        idx = list(parts)
        n = int(self.count[idx].sum())
        m = self.s1[idx].sum(0) / n
        var = (self.s2[idx].sum(0) / n - m**2).clamp_min(0)
        return n, m + self.shift, var.sqrt().clamp_min(1e-8)


def _part_sums(X: StoredRows, part: np.ndarray, n_parts: int, train_parts: Sequence[int], y: Tensor | None,
               per_part_gram: bool) -> _PartSums:
    d = int(np.prod(X.shape[1:]))
    s = _PartSums(torch.zeros(0), np.zeros(n_parts, dtype=np.int64), torch.zeros(n_parts, d, dtype=torch.float64),
                  torch.zeros(n_parts, d, dtype=torch.float64),
                  torch.zeros((n_parts, d, d) if per_part_gram else (d, d), dtype=torch.float64),
                  torch.zeros(n_parts, d, dtype=torch.float64) if y is not None else None,
                  torch.zeros(n_parts, dtype=torch.float64) if y is not None else None)
    for start, chunk in _chunks(X):
        if not len(s.shift):
            s.shift = chunk.mean(0)
        here = part[start: start + len(chunk)]
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
                yp = y[start: start + len(chunk)][sel]
                s.xy[p] += Xp.T @ yp
                s.y1[p] += yp.sum()
    return s


def _streamed_rank(s: _PartSums, parts: Sequence[int]) -> int:
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


def _streamed_ridge(s: _PartSums, parts: Sequence[int], alphas: Sequence[float]) -> list[_Fitted]:
    """`_fit_ridge` from sums: with Z the standardised rows, w = (ZᵀZ + αI)⁻¹ Zᵀ(y − ȳ), b = ȳ, where
    ZᵀZ = D⁻¹(Σx'x'ᵀ − n x̄'x̄'ᵀ)D⁻¹ and Zᵀ(y − ȳ) = D⁻¹(Σx'y − n x̄'ȳ) (x' = x − c, D = diag(std)); one
    eigendecomposition of ZᵀZ serves every α."""
    idx = list(parts)
    n, mean, std = s.moments(idx)
    m = s.s1[idx].sum(0) / n
    y_mean = s.y1[idx].sum() / n
    ztz = (s.gram[idx].sum(0) - n * torch.outer(m, m)) / torch.outer(std, std)
    zty = (s.xy[idx].sum(0) - n * m * y_mean) / std
    lam, Q = torch.linalg.eigh(ztz)
    qty = Q.T @ zty
    return [_Fitted("ridge", "regression", mean, std, {"w": Q @ (qty / (lam.clamp_min(0) + a)), "b": y_mean})
            for a in alphas]


@dataclass
class _Streamed:
    """One logistic fit in progress: the parts it is fitted on, its standardisation, its parameters."""

    parts: list[int]
    mean: Tensor
    std: Tensor
    n: int
    T: Tensor  # [features + 1, out], the bias in the last row
    f: float = math.nan
    done: bool = False


def _logistic_pass(X: StoredRows, part: np.ndarray, y: Tensor, out_dim: int, fits: Sequence[_Streamed],
                   Ts: Sequence[Tensor], derivatives: bool) -> list[tuple[float, Tensor | None, Tensor | None]]:
    """Mean cross-entropy at Ts[i] for each fit (without the penalty), and with `derivatives` its gradient
    Aᵀ(P − Y)/n and Hessian (as `_newton_logistic` forms them), in one pass over the shards."""
    sums: list[list[Any]] = [[0.0, None, None] for _ in fits]
    for start, chunk in _chunks(X):
        here = torch.as_tensor(part[start: start + len(chunk)])
        labels = y[start: start + len(chunk)]
        for i, (fit, T) in enumerate(zip(fits, Ts)):
            sel = torch.isin(here, torch.as_tensor(fit.parts))
            if not bool(sel.any()):
                continue
            Z = (chunk[sel] - fit.mean) / fit.std
            A = torch.cat([Z, torch.ones(len(Z), 1, dtype=torch.float64)], dim=1)
            Y = labels[sel][:, None].double() if out_dim == 1 else F.one_hot(labels[sel], out_dim).double()
            logits = A @ T
            if out_dim == 1:
                sums[i][0] += float((F.softplus(logits[:, 0]) - Y[:, 0] * logits[:, 0]).sum())
            else:
                sums[i][0] += float((torch.logsumexp(logits, dim=1) - (Y * logits).sum(dim=1)).sum())
            if not derivatives:
                continue
            k = A.shape[1]
            if out_dim == 1:
                P = torch.sigmoid(logits)
                H = (A * (P * (1 - P))).T @ A
            else:
                P = logits.softmax(dim=1)
                S = torch.diag_embed(P) - P[:, :, None] * P[:, None, :]  # [n, c, e]
                # Block (c, e) is Aᵀ diag(S[:, c, e]) A: all k² blocks from one product, laid out [i, c, j, e].
                H = (A.T @ (A[:, :, None] * S.reshape(len(A), 1, -1)).reshape(len(A), -1))
                H = H.reshape(k, k, out_dim, out_dim).permute(0, 2, 1, 3).reshape(k * out_dim, k * out_dim)
            G = A.T @ (P - Y)
            sums[i][1] = G if sums[i][1] is None else sums[i][1] + G
            sums[i][2] = H if sums[i][2] is None else sums[i][2] + H
    return [(total / fit.n, None if G is None else G / fit.n, None if H is None else H / fit.n)
            for fit, (total, G, H) in zip(fits, sums)]


def _streamed_newton(X: StoredRows, part: np.ndarray, y: Tensor, out_dim: int, lam: float, fits: Sequence[_Streamed],
                     max_iter: int = 100) -> None:
    """`_newton_logistic` for several fits in lockstep, each pass over the shards serving all of them:
    the same damped Newton steps, Armijo backtracking and stopping rule, per fit. The full step is
    evaluated with its gradient and Hessian, which the next step reuses when it is accepted (it nearly
    always is), so an iteration costs one pass."""
    r = fits[0].T.shape[0] - 1
    pen = torch.cat([torch.full((r,), float(lam), dtype=torch.float64), torch.tensor([1e-9], dtype=torch.float64)])
    diagonal = torch.diag(pen.repeat_interleave(out_dim))

    def objective(data: float, T: Tensor) -> float:
        return data + 0.5 * float((pen[:, None] * T**2).sum())

    state: dict[int, tuple[Tensor, Tensor]] = {}  # fit → (G, H) of the objective at its current T
    for i, (fit, (data, G, H)) in enumerate(zip(fits, _logistic_pass(X, part, y, out_dim, fits, [f.T for f in fits],
                                                                     True))):
        fit.f, fit.done = objective(data, fit.T), False
        state[i] = (G + pen[:, None] * fit.T, H + diagonal)
    for _ in range(max_iter):
        missing = [i for i, fit in enumerate(fits) if not fit.done and i not in state]
        if missing:  # after a backtracked step: the derivatives at the accepted point
            for i, (_, G, H) in zip(missing, _logistic_pass(X, part, y, out_dim, [fits[i] for i in missing],
                                                            [fits[i].T for i in missing], True)):
                state[i] = (G + pen[:, None] * fits[i].T, H + diagonal)
        steps = {}
        for i, fit in enumerate(fits):
            if fit.done:
                continue
            G, H = state.pop(i)
            step = torch.linalg.solve(H, G.reshape(-1)).reshape(fit.T.shape)
            decrease = float((G * step).sum())
            if decrease < 1e-12:  # Newton decrement²: at the optimum to machine precision
                fit.done = True
            else:
                steps[i] = (step, decrease)
        if not steps:
            break
        order = list(steps)
        full = _logistic_pass(X, part, y, out_dim, [fits[i] for i in order], [fits[i].T - steps[i][0] for i in order],
                              True)
        searching = []
        for i, (data, G, H) in zip(order, full):
            step, decrease = steps[i]
            T_new = fits[i].T - step
            f_new = objective(data, T_new)
            if f_new <= fits[i].f - 1e-4 * decrease:
                fits[i].T, fits[i].f = T_new, f_new
                state[i] = (G + pen[:, None] * T_new, H + diagonal)
            else:
                searching.append((i, 0.5))
        while searching:  # backtracking: one pass evaluates every fit's current candidate
            candidates = [fits[i].T - t * steps[i][0] for i, t in searching]
            values = _logistic_pass(X, part, y, out_dim, [fits[i] for i, _ in searching], candidates, False)
            still = []
            for (i, t), T_new, (data, _, _) in zip(searching, candidates, values):
                f_new = objective(data, T_new)
                if f_new <= fits[i].f - 1e-4 * t * steps[i][1] or t * 0.5 <= 1e-10:
                    fits[i].T, fits[i].f = T_new, f_new
                else:
                    still.append((i, t * 0.5))
            searching = still


def _streamed_lbfgs(X: StoredRows, part: np.ndarray, y: Tensor, out_dim: int, lam: float, fit: _Streamed) -> None:
    """`_lbfgs_logistic` with the loss and its gradient summed over the shards at every evaluation."""
    T = fit.T.clone().requires_grad_(True)
    optimizer = torch.optim.LBFGS([T], lr=1, max_iter=300, tolerance_grad=1e-9, tolerance_change=1e-12,
                                  history_size=20, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        value = T.detach()
        data, G = _gradient_pass(X, part, y, out_dim, fit, value)
        T.grad = G + lam * torch.cat([value[:-1], torch.zeros_like(value[-1:])])
        return torch.tensor(data + 0.5 * lam * float((value[:-1] ** 2).sum()), dtype=torch.float64)

    optimizer.step(closure)
    fit.T = T.detach()


def _gradient_pass(X: StoredRows, part: np.ndarray, y: Tensor, out_dim: int, fit: _Streamed,
                   T: Tensor) -> tuple[float, Tensor]:
    """Mean cross-entropy and its gradient Aᵀ(P − Y)/n, without the Hessian (for L-BFGS)."""
    total, G = 0.0, torch.zeros_like(T)
    for start, chunk in _chunks(X):
        sel = torch.isin(torch.as_tensor(part[start: start + len(chunk)]), torch.as_tensor(fit.parts))
        if not bool(sel.any()):
            continue
        A = torch.cat([(chunk[sel] - fit.mean) / fit.std, torch.ones(int(sel.sum()), 1, dtype=torch.float64)], dim=1)
        labels = y[start: start + len(chunk)][sel]
        Y = labels[:, None].double() if out_dim == 1 else F.one_hot(labels, out_dim).double()
        logits = A @ T
        if out_dim == 1:
            total += float((F.softplus(logits[:, 0]) - Y[:, 0] * logits[:, 0]).sum())
            P = torch.sigmoid(logits)
        else:
            total += float((torch.logsumexp(logits, dim=1) - (Y * logits).sum(dim=1)).sum())
            P = logits.softmax(dim=1)
        G += A.T @ (P - Y)
    return total / fit.n, G / fit.n


def _streamed_logistic(X: StoredRows, part: np.ndarray, y: Tensor, n_classes: int, s: _PartSums,
                       fold_parts: Sequence[Sequence[int]], lambdas: Sequence[float]) -> list[list[_Fitted]]:
    """`_fit_logistic` on each union of parts in `fold_parts`, for every λ (warm-started from the strongest
    penalty to the weakest), all fits of one λ in lockstep. Newton while (features + 1)·out ≤
    NEWTON_MAX_PARAMS, else L-BFGS, as in memory (in memory a wide, short X is first reduced to its row
    space; here the fit is in the full feature space: the same optimum, since w lies in that row space)."""
    out_dim = 1 if n_classes == 2 else n_classes
    d = s.s1.shape[1]
    fits = []
    for parts in fold_parts:
        n, mean, std = s.moments(parts)
        fits.append(_Streamed(list(parts), mean, std, n, torch.zeros(d + 1, out_dim, dtype=torch.float64)))
    newton = (d + 1) * out_dim <= NEWTON_MAX_PARAMS
    fitted: dict[float, list[_Fitted]] = {}
    for lam in sorted(lambdas, reverse=True):
        if newton:
            _streamed_newton(X, part, y, out_dim, lam, fits)
        else:
            for fit in fits:
                _streamed_lbfgs(X, part, y, out_dim, lam, fit)
        fitted[lam] = [_Fitted("logistic", "classification", fit.mean, fit.std,
                               {"w": fit.T[:-1, 0] if out_dim == 1 else fit.T[:-1],
                                "b": fit.T[-1, 0] if out_dim == 1 else fit.T[-1]}) for fit in fits]
    return [[fitted[lam][j] for lam in lambdas] for j in range(len(fold_parts))]


def _streamed_scores(X: StoredRows, rows: np.ndarray, fits: Sequence[_Fitted]) -> list[Tensor]:
    """Each fit's scores on `rows` (in the order given), one pass over the shards."""
    order = np.full(len(X), -1)
    order[rows] = np.arange(len(rows))
    out: list[list[Tensor]] = [[] for _ in fits]
    where: list[np.ndarray] = []
    for start, chunk in _chunks(X):
        at = order[start: start + len(chunk)]
        sel = at >= 0
        if sel.any():
            where.append(at[sel])
            for j, fit in enumerate(fits):
                out[j].append(fit.scores(chunk[torch.as_tensor(sel)]))
    if not where:
        return [torch.zeros(0, dtype=torch.float64) for _ in fits]
    inverse = torch.as_tensor(np.argsort(np.concatenate(where)))
    return [torch.cat(parts)[inverse] for parts in out]


def _cross_validate_streamed(kind: str, X: StoredRows, y: Tensor, n_classes: int, train: np.ndarray, test: np.ndarray,
                             folds: list[tuple[np.ndarray, np.ndarray]],
                             grid: Sequence[float]) -> tuple[dict[float, float], float, _Fitted, int]:
    """`_cross_validate` (and `feature_rank` of the training rows) with the rows read shard by shard.
    Returns (cv loss per candidate, the best candidate, the refitted probe, the rank)."""
    K = len(folds)
    part = np.full(len(X), -1)
    for k, (_, val) in enumerate(folds):
        part[train[val]] = k
    part[test] = K
    train_parts = list(range(K))
    s = _part_sums(X, part, K + 1, train_parts, y.double() if kind == "ridge" else None, per_part_gram=kind == "ridge")
    rank = _streamed_rank(s, train_parts)
    if rank == 0:
        return {}, math.nan, None, 0
    fold_parts = [[p for p in train_parts if p != k] for k in range(K)]
    if kind == "ridge":
        per_fold = [_streamed_ridge(s, parts, grid) for parts in fold_parts]
    else:
        per_fold = _streamed_logistic(X, part, y, n_classes, s, fold_parts, grid)
    cv_loss = {g: 0.0 for g in grid}
    for k, (_, val) in enumerate(folds):  # held-out loss: a pass scoring fold k's rows with its K fits
        rows = train[val]
        scores = _streamed_scores(X, rows, per_fold[k])
        for g, fit, sc in zip(grid, per_fold[k], scores):
            cv_loss[g] += _loss_of_scores(fit.task, sc, y[rows]) / K
    best = min(grid, key=lambda g: (cv_loss[g], -g))
    if kind == "ridge":
        final = _streamed_ridge(s, train_parts, [best])[0]
    else:
        final = _streamed_logistic(X, part, y, n_classes, s, [train_parts], [best])[0][0]
    return cv_loss, best, final, rank


# --------------------------------------------------------------------------------------------
# The public probe
# --------------------------------------------------------------------------------------------
@dataclass
class ProbeResult:
    """A probe fitted on the training rows with the cross-validated regularisation, scored on the test rows."""

    kind: str  # ridge | logistic | mlp
    task: str  # classification | regression
    regularization: float  # the chosen α (ridge), λ (logistic) or weight decay (mlp)
    cv_loss: dict[float, float]  # mean held-out loss per candidate, from grouped k-fold CV
    metrics: dict[str, Metric]  # test: accuracy and auroc (classification), r2 (regression; ridge also auroc on 0/1 labels)
    train_index: np.ndarray
    test_index: np.ndarray
    test_scores: Tensor  # probe output on the test rows: P(y = classes[1]), [n, k] probabilities, or ŷ
    classes: np.ndarray | None  # label values in the order of the probe's outputs (classification)
    fitted: _Fitted | None = field(repr=False)  # None when the features are constant (nothing was fitted)
    feature_rank: int = -1  # numerical rank of the centred training features (`feature_rank`)
    n_features: int = 0

    @property
    def constant(self) -> bool:
        """The training features do not vary (rank 0): the probe is flagged, not fitted, not scored."""
        return self.feature_rank == 0

    def _require_fit(self) -> _Fitted:
        if self.fitted is None:
            raise ValueError("constant features (rank 0 on the training rows): this probe was not fitted")
        return self.fitted

    def predict_scores(self, X: Any) -> Tensor:
        """The probe's output for new rows (same feature space as it was fitted on)."""
        return self._require_fit().scores(_features(X))

    @property
    def weight(self) -> Tensor:
        """w in activation space (the standardisation undone): the probe reads x·w + bias."""
        if self.kind == "mlp":
            raise ValueError("an MLP probe has no single direction; use a ridge or logistic probe")
        self._require_fit()
        return self.fitted.params["w"] / (self.fitted.std if self.fitted.params["w"].ndim == 1 else self.fitted.std[:, None])

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


def _features(X: Any) -> Tensor:
    X = torch.as_tensor(X.detach() if isinstance(X, Tensor) else np.asarray(X)).cpu().double()
    return X.reshape(X.shape[0], -1)  # rows × features: [rows, head, d_head] flattens to one vector


FEATURE_RTOL = 1e-6  # float32 activations carry ~6e-8 relative rounding; variation below 1e-6 of scale is noise


def feature_rank(X: Any, rtol: float = FEATURE_RTOL) -> int:
    """Numerical rank of the centred features X − mean: singular values above rtol × the largest singular value
    of X itself (the features' scale, so that rounding noise around a constant row counts as no variation).
    0 means the features are constant — zero variance, or variation only at rounding level."""
    X = _features(X)
    if X.shape[0] < 2:
        return 0
    scale = float(torch.linalg.matrix_norm(X, ord=2))
    if scale == 0.0:
        return 0
    singular = torch.linalg.svdvals(X - X.mean(dim=0))
    return int((singular > rtol * scale).sum())


def fit_probe(X: Any, y: Any, kind: Kind = "logistic", *, groups: Any = None, test_fraction: float = 0.25,
              n_folds: int = 5, grid: Sequence[float] | None = None, split: tuple[Any, Any] | None = None,
              n_bootstrap: int = 1000, seed: int = 0, mlp_hidden: int = 64, mlp_steps: int = 300,
              task: str | None = None) -> ProbeResult:
    """Fit one probe on activations X [rows, ...] against labels y [rows], and score it on held-out groups.

    kind: "ridge" (regression), "logistic" (classification) or "mlp" (either; `task` defaults to
    classification for integer/bool labels). X may also be rows left on disk — `store[name]` of an
    `ActivationStore`, or a store of one hook: a ridge or logistic probe is then fitted out of core, a shard
    at a time (the same probe as in memory; see "Fitting out of core"). groups: an entity id per row; no group is on both sides
    of any split. split: (train rows, test rows) to reuse one split across probes (else `group_split`).
    grid: regularisation candidates (defaults RIDGE_ALPHAS, LOGISTIC_LAMBDAS, MLP_DECAYS).
    """
    if kind not in ("ridge", "logistic", "mlp"):
        raise ValueError(f"kind must be 'ridge', 'logistic' or 'mlp', got {kind!r}")
    if isinstance(X, ActivationStore):
        if len(X.names) != 1:
            raise ValueError(f"{X.directory} holds {len(X.names)} hooks {X.names}: fit on one, store[name]")
        X = X[X.names[0]]
    stored = isinstance(X, StoredRows)
    if stored and kind == "mlp":
        raise ValueError("an MLP probe is fitted in memory: give store.load(name)[name], not the store")
    X = X if stored else _features(X)
    n_features = int(np.prod(X.shape[1:])) if stored else X.shape[1]
    y_raw = np.asarray(y.detach().cpu() if isinstance(y, Tensor) else y)
    if y_raw.shape != (X.shape[0],):
        raise ValueError(f"y must have one label per row of X ({X.shape[0]}), got shape {y_raw.shape}")
    if task is None:
        integer = y_raw.dtype == bool or np.issubdtype(y_raw.dtype, np.integer)
        task = "regression" if kind == "ridge" or (kind == "mlp" and not integer) else "classification"
    if kind == "logistic" and task != "classification":
        raise ValueError("a logistic probe classifies: give integer or bool labels")
    if kind == "ridge" and task != "regression":
        raise ValueError("a ridge probe regresses; use kind='logistic' to classify")
    classes = None
    if task == "classification":
        classes, labels = np.unique(y_raw, return_inverse=True)
        if len(classes) < 2:
            raise ValueError(f"classification needs at least two label values, got {classes.tolist()}")
        y_t = torch.as_tensor(labels, dtype=torch.long)
    else:
        y_t = torch.as_tensor(y_raw.astype(float), dtype=torch.float64)
    n_classes = 0 if classes is None else len(classes)
    grid = tuple(grid if grid is not None else
                 {"ridge": RIDGE_ALPHAS, "logistic": LOGISTIC_LAMBDAS, "mlp": MLP_DECAYS}[kind])

    group_ids = _group_ids(groups, X.shape[0])
    if split is None:
        train, test = group_split(group_ids, test_fraction, seed)
    else:
        train, test = (np.asarray(s) for s in split)
        if groups is not None and set(group_ids[train]) & set(group_ids[test]):
            raise ValueError("the given split puts a group on both sides")

    # Cross-validate the regularisation on the training rows only, folds grouped like the split.
    def grouped_folds() -> list[tuple[np.ndarray, np.ndarray]]:
        return group_kfold(group_ids[train], min(n_folds, len(np.unique(group_ids[train]))), seed=seed + 1)

    if stored:  # one shard's rows in memory at a time (see "Fitting out of core"); the rank comes from the same pass
        cv_loss, best, fitted, rank = _cross_validate_streamed(kind, X, y_t, n_classes, train, test, grouped_folds(),
                                                               grid)
    else:
        rank = feature_rank(X[train])
    if rank == 0:  # flagged, not scored: a probe on constant features can only return its prior
        why = "constant features (rank 0 on the training rows): not scored"
        blank = Metric(float("nan"), float("nan"), float("nan"), why_no_interval=why)
        names = ["accuracy", "auroc"] if task == "classification" else ["r2"]
        return ProbeResult(kind, task, float("nan"), {}, {name: blank for name in names}, train, test,
                           torch.full((len(test),), float("nan"), dtype=torch.float64), classes, None, 0, n_features)
    if stored:
        scores = _streamed_scores(X, test, [fitted])[0]
    else:
        cv_loss, best, fitted = _cross_validate(kind, task, X[train], y_t[train], n_classes, grouped_folds(), grid,
                                                mlp_hidden, mlp_steps, seed)
        scores = fitted.scores(X[test])
    y_test, s_test = y_t[test].numpy(), scores.numpy()
    test_groups = group_ids[test] if groups is not None else None
    boot = dict(groups=test_groups, n_boot=n_bootstrap, seed=seed)
    metrics: dict[str, Metric] = {}
    if task == "classification":
        predicted = (s_test > 0.5).astype(int) if s_test.ndim == 1 else s_test.argmax(axis=1)
        metrics["accuracy"] = bootstrap_ci(accuracy, y_test, predicted, **boot)
        metrics["auroc"] = auroc_ci(s_test, y_test, **boot)
    else:
        metrics["r2"] = bootstrap_ci(r2_score, y_test, s_test, **boot)
        if set(np.unique(y_test).tolist()) <= {0.0, 1.0}:  # a ridge probe on 0/1 labels also ranks them
            metrics["auroc"] = auroc_ci(s_test, y_test.astype(int), **boot)
    return ProbeResult(kind, task, float(best), cv_loss, metrics, train, test, scores, classes, fitted, rank,
                       n_features)


def fit_probes(activations: Mapping[str, Any], y: Any, kind: Kind = "logistic", *, groups: Any = None,
               test_fraction: float = 0.25, seed: int = 0, **options: Any) -> dict[str, ProbeResult]:
    """One probe per hook (or layer) on the same grouped split: {name: ProbeResult}.

    `activations` is a mapping name → [rows, ...] (an `Activations`' `.acts`, or a dict you build).
    """
    if isinstance(activations, ActivationStore):  # each hook fitted out of core, shard by shard
        activations = {name: activations[name] for name in activations.names}
    acts = getattr(activations, "acts", activations)
    if not acts:
        raise ValueError("no activations to probe")
    n = len(next(iter(acts.values())))
    split = group_split(_group_ids(groups, n), test_fraction, seed)
    return {name: fit_probe(X, y, kind, groups=groups, split=split, seed=seed, **options) for name, X in acts.items()}


@dataclass(frozen=True)
class CrossFitted:
    """Held-out scores from `cross_fit_probe`: scores[i] is the output of the probe fitted without row i's group
    (P(y = classes[1]) for a classifier), or None with `why` when a fold could not be fitted."""

    scores: np.ndarray | None  # [rows], float64
    folds: list[np.ndarray]  # the groups (their values) each fold's probe scores; disjoint, together every group
    regularization: list[float]  # each fold's cross-validated regularisation
    why: str | None = None


def cross_fit_probe(X: Any, y: Any, groups: Any, n_folds: int = 5, *, kind: Kind = "logistic", seed: int = 0,
                    min_per_class: int = MIN_PER_CLASS, n_bootstrap: int = 200, **options: Any) -> CrossFitted:
    """K-fold cross-fitting by group: the groups are dealt into `n_folds` folds (`group_kfold`, independently of the
    labels), and the rows of fold k are scored by the probe `fit_probe` fits on the rows of the other folds — its
    regularisation cross-validated within them. Every row gets a score from a probe that never saw its group.

    A classifier needs, in every fold's training rows, at least `min_per_class` groups holding each class; otherwise
    (or with fewer groups than folds, or constant features) nothing is scored and `why` says so in words. `options`
    go to `fit_probe` (its regularisation grid, …)."""
    X = _features(X)
    y = np.asarray(y.detach().cpu() if isinstance(y, Tensor) else y)
    if not (isinstance(n_folds, int) and n_folds >= 2):
        raise ValueError(f"n_folds must be an integer ≥ 2, got {n_folds!r}")
    if groups is None:
        raise ValueError("cross_fit_probe needs groups: the folds are by group")
    values = np.asarray(groups.cpu() if isinstance(groups, Tensor) else groups)
    ids = _group_ids(values, X.shape[0])
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
                return CrossFitted(None, scored, [], f"fold {k + 1} of {n_folds} is fitted on {n_train} groups "
                                   f"({shown}): a probe needs at least {min_per_class} groups of each class")
    scores = np.full(X.shape[0], np.nan)
    regularization = []
    for k, (train, held) in enumerate(folds):
        result = fit_probe(X, y, kind, groups=ids, split=(train, held), seed=seed + k, n_bootstrap=n_bootstrap,
                           **options)
        if result.constant:
            return CrossFitted(None, scored, [], f"fold {k + 1} of {n_folds}: constant features on its training rows")
        if result.test_scores.ndim != 1:
            raise ValueError("cross_fit_probe scores one number per row: give a binary or regression task")
        scores[held] = result.test_scores.numpy()
        regularization.append(result.regularization)
    return CrossFitted(scores, scored, regularization)


def probe_table(results: Mapping[str, ProbeResult]) -> list[dict[str, Any]]:
    """Rows {hook, kind, regularization, metric, value, low, high, n_pos, n_neg, constant} for a DataFrame or a plot."""
    return [{"hook": name, "kind": r.kind, "regularization": r.regularization, "metric": metric,
             "value": m.value, "low": m.low, "high": m.high, "n_pos": m.n_pos, "n_neg": m.n_neg,
             "constant": r.constant}
            for name, r in results.items() for metric, m in r.metrics.items()]


# --------------------------------------------------------------------------------------------
# Controls
# --------------------------------------------------------------------------------------------
def shuffled_control(X: Any, y: Any, kind: Kind = "logistic", *, seed: int = 0, **options: Any) -> ProbeResult:
    """The same probe fitted and scored on labels permuted across rows: what chance looks like here."""
    y = np.asarray(y.detach().cpu() if isinstance(y, Tensor) else y)
    permuted = y[np.random.default_rng(seed + 12345).permutation(len(y))]
    return fit_probe(X, permuted, kind, seed=seed, **options)


def random_model(model: Any, seed: int = 1) -> Any:
    """A randomly initialised model of the same shape (same config and tokenizer, fresh weights), eval mode."""
    if not isinstance(model, HookedTransformer):
        raise TypeError(f"random_model needs a HookedTransformer, got {type(model).__name__}")
    device = model.W_E.device
    return HookedTransformer(model.cfg, seed=seed, tokenizer=model.tokenizer).to(device).eval()


# --------------------------------------------------------------------------------------------
# Choosing a readout on validation, judging it on test
# --------------------------------------------------------------------------------------------
VERDICTS = ("carries the signal", "no signal beyond its controls", "not enough data", "nothing to score",
            "no verdict")


def metric_of(row: Mapping[str, Any], key: str) -> Metric | None:
    """The Metric a row carries under `key` (Metric.fields' layout), or None when the row has none."""
    if row.get(key) is None:
        return None
    interval = row.get(f"{key}_ci95")
    low, high = (interval if interval else (float("nan"), float("nan")))
    return Metric(float(row[key]), float(low), float(high), row.get(f"{key}_n_pos"), row.get(f"{key}_n_neg"),
                  row.get(f"{key}_why_no_interval"))


def _name(row: Mapping[str, Any]) -> str:
    return f"{row['readout']} at the {row['position']}, layer {row['layer']}"


def judge_readouts(rows: Sequence[Mapping[str, Any]], what: str, baseline: Metric | None = None,
                   min_per_class: int = MIN_PER_CLASS) -> dict[str, Any]:
    """Choose the readout with the highest validation AUROC among the candidates and judge it on the test split.

    Each row: readout, position, layer, candidate (False for the baseline's own family, which is reported
    beside, never chosen), constant (flagged, not scored), validation_auroc (+ _n_pos, _n_neg), auroc on
    the test split (+ _ci95, _n_pos, _n_neg, _why_no_interval), and the same for control_shuffled_auroc and
    control_untrained_auroc (None when no untrained model could be built). Verdicts (VERDICTS):
    "carries the signal" when the chosen readout's test interval lies wholly above both controls'
    intervals; "no signal beyond its controls" otherwise; "not enough data" when the validation split
    holds fewer than `min_per_class` of either class, or the chosen readout or a control has no interval
    (too few of a class in the test split); "nothing to score" when every candidate is constant; "no
    verdict" when the untrained-model control is missing. The sentence says which, and why, in words.
    """
    out: dict[str, Any] = {"what": what, "min_per_class": min_per_class, "chosen": None,
                           "baseline": None if baseline is None else baseline.fields("auroc")}
    base = "" if baseline is None else f" Baseline (the model's own confidence, not a candidate): {baseline}"

    def verdict(name: str, sentence: str, carries: bool | None) -> dict[str, Any]:
        compare = ""
        if baseline is not None and out["chosen"] is not None and np.isfinite(baseline.value):
            side = "above" if baseline.value > out["chosen"]["auroc"] else "not above"
            compare = f" — its estimate is {side} the chosen readout's"
        tail = f"{base}{compare}." if base else ""
        return out | {"verdict": name, "carries_signal": carries, "sentence": f"{what}: {sentence}.{tail}"}

    scored = [r for r in rows if r.get("candidate", True) and not r.get("constant", False)]
    flagged = sum(1 for r in rows if r.get("candidate", True) and r.get("constant", False))
    out["n_candidates"], out["n_constant"] = len(scored), flagged
    if rows:
        first = rows[0]
        n_pos, n_neg = first.get("validation_auroc_n_pos"), first.get("validation_auroc_n_neg")
        if n_pos is not None and min(n_pos, n_neg) < min_per_class:
            return verdict("not enough data", f"not enough data — the validation split holds {n_pos} right and "
                           f"{n_neg} wrong answers; choosing a readout and judging it needs at least {min_per_class} "
                           f"of each in the validation and in the test split", None)
    if not scored:
        return verdict("nothing to score", f"nothing to score — every candidate readout ({flagged}) has constant "
                       "features", None)
    chosen = max(scored, key=lambda r: (np.nan_to_num(r["validation_auroc"], nan=-1.0)))
    test = metric_of(chosen, "auroc")
    shuffled = metric_of(chosen, "control_shuffled_auroc")
    untrained = metric_of(chosen, "control_untrained_auroc")
    out["chosen"] = {k: chosen[k] for k in ("readout", "position", "layer") if k in chosen} | {
        **{k: chosen.get(k) for k in ("validation_auroc", "validation_auroc_n_pos", "validation_auroc_n_neg")},
        **test.fields("auroc"),
        **(shuffled.fields("control_shuffled_auroc") if shuffled else {}),
        **(untrained.fields("control_untrained_auroc") if untrained else {"control_untrained_auroc": None})}
    said = (f"{_name(chosen)} (chosen on the validation split, AUROC {chosen['validation_auroc']:.3f}) scores "
            f"{test} on the test split; shuffled labels {shuffled}; untrained model "
            f"{untrained if untrained else 'not run'}")
    refused = [m.why_no_interval for m in (test, shuffled, untrained) if m is not None and m.why_no_interval]
    if refused:
        return verdict("not enough data", f"not enough data — {refused[0]}; {said}", None)
    if untrained is None:
        return verdict("no verdict", f"no verdict — there is no untrained-model control; {said}", None)
    margin = test.low - max(shuffled.high, untrained.high)
    out["chosen"]["margin_over_controls"] = margin
    if margin > 0:
        return verdict("carries the signal", f"carries the signal — {said}: its interval lies above both "
                       f"controls' by {margin:.3f}", True)
    return verdict("no signal beyond its controls", f"no signal beyond its controls — {said}: its interval "
                   "does not clear both controls' intervals", False)


# --------------------------------------------------------------------------------------------
# Probe → steering vector
# --------------------------------------------------------------------------------------------
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
        Xf = _features(X)
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
