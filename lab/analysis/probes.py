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
   resampling groups rather than rows when groups are given (rows of one entity are not independent).
5. Controls: the same probe on shuffled labels (chance: AUROC ≈ 0.5, R² ≤ 0), and on the activations of
   a randomly initialised model of the same shape (`random_model`): what a probe finds there comes
   from the input tokens, not from anything the model learned (Hewitt & Liang 2019 argue for such
   controls; "Designing and Interpreting Probes with Control Tasks").

A linear probe's direction w (in activation space, undoing the standardisation) becomes a steering
vector with `steering_vector`; add it with `lab.analysis.steering.steer`.
"""

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

__all__ = ["Metric", "ProbeResult", "accuracy", "auroc", "bootstrap_ci", "fit_probe", "fit_probes", "group_kfold",
           "group_split", "probe_table", "r2_score", "random_model", "shuffled_control", "steering_vector"]

Kind = Literal["ridge", "logistic", "mlp"]
# Default regularisation grids, for standardised features. Ridge: α multiplies ‖w‖² against a *summed*
# squared error, so useful values scale with the number of rows; logistic and MLP: λ against a *mean* loss.
RIDGE_ALPHAS = tuple(10.0 ** k for k in range(-2, 6))
LOGISTIC_LAMBDAS = tuple(10.0 ** k for k in range(-5, 2))
MLP_DECAYS = (1e-4, 1e-2, 1e-1)


class Metric(NamedTuple):
    """A test-set metric and its bootstrap 95% interval."""

    value: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}]"


# --------------------------------------------------------------------------------------------
# Metrics (pure functions on numpy arrays)
# --------------------------------------------------------------------------------------------
def accuracy(y_true: Any, y_pred: Any) -> float:
    """Share of exact matches."""
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    return float((y_true == y_pred).mean())


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing their average rank."""
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    # Boundaries of runs of equal values; each run gets the mean of the ranks it spans.
    starts = np.r_[0, np.flatnonzero(sorted_x[1:] != sorted_x[:-1]) + 1]
    ends = np.r_[starts[1:], len(x)]
    ranks_sorted = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    ranks = np.empty(len(x))
    ranks[order] = ranks_sorted
    return ranks


def auroc(y_true: Any, scores: Any) -> float:
    """Area under the ROC curve = P(score of a random positive > score of a random negative), ties ½.

    Binary labels (0/1 or bool): the Mann–Whitney U statistic / (n₊ n₋). Multi-class labels with a
    [n, k] score matrix: the mean one-vs-rest AUROC over classes. NaN when a class is absent.
    """
    y_true, scores = np.asarray(y_true), np.asarray(scores, dtype=float)
    if scores.ndim == 2:
        values = [auroc(y_true == c, scores[:, c]) for c in range(scores.shape[1])]
        return float(np.mean(values))
    positive = y_true.astype(bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = _average_ranks(scores)
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def r2_score(y_true: Any, y_pred: Any) -> float:
    """Coefficient of determination 1 − Σ(y − ŷ)² / Σ(y − ȳ)² (can be negative)."""
    y_true, y_pred = np.asarray(y_true, dtype=float), np.asarray(y_pred, dtype=float)
    total = ((y_true - y_true.mean()) ** 2).sum()
    return float(1.0 - ((y_true - y_pred) ** 2).sum() / total) if total > 0 else float("nan")


def bootstrap_ci(metric: Callable[..., float], *arrays: Any, groups: Any = None, n_bootstrap: int = 1000,
                 level: float = 0.95, seed: int = 0) -> Metric:
    """metric(*arrays) with a percentile bootstrap interval; resamples whole groups when `groups` is given."""
    arrays = tuple(np.asarray(a) for a in arrays)
    value = metric(*arrays)
    n = len(arrays[0])
    rng = np.random.default_rng(seed)
    inverse = None
    if groups is not None:
        _, inverse = np.unique(np.asarray(groups), return_inverse=True)
        n_groups = int(inverse.max()) + 1
    samples = np.empty(n_bootstrap)
    for b in range(n_bootstrap):
        if inverse is None:
            index = rng.integers(0, n, n)
        else:  # draw groups with replacement; each row appears as often as its group was drawn
            drawn = np.bincount(rng.integers(0, n_groups, n_groups), minlength=n_groups)
            index = np.repeat(np.arange(n), drawn[inverse])
        samples[b] = metric(*(a[index] for a in arrays))
    if np.all(np.isnan(samples)):
        return Metric(float(value), float("nan"), float("nan"))
    tail = (1.0 - level) / 2 * 100
    low, high = np.nanpercentile(samples, [tail, 100 - tail])
    return Metric(float(value), float(low), float(high))


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
    s = fit.scores(X)
    if fit.task == "regression":
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
    fitted: _Fitted = field(repr=False)

    def predict_scores(self, X: Any) -> Tensor:
        """The probe's output for new rows (same feature space as it was fitted on)."""
        return self.fitted.scores(_features(X))

    @property
    def weight(self) -> Tensor:
        """w in activation space (the standardisation undone): the probe reads x·w + bias."""
        if self.kind == "mlp":
            raise ValueError("an MLP probe has no single direction; use a ridge or logistic probe")
        return self.fitted.params["w"] / (self.fitted.std if self.fitted.params["w"].ndim == 1 else self.fitted.std[:, None])

    @property
    def bias(self) -> Tensor:
        """b in activation space: b_std − Σ_i (mean_i / std_i) w_std,i."""
        if self.kind == "mlp":
            raise ValueError("an MLP probe has no single bias; use predict_scores")
        return self.fitted.params["b"] - (self.fitted.mean / self.fitted.std) @ self.fitted.params["w"]

    @property
    def direction(self) -> Tensor:
        """The unit vector w / ‖w‖ in activation space (binary or regression probes)."""
        w = self.weight
        if w.ndim != 1:
            raise ValueError("a multi-class probe has one direction per class: use result.weight[:, c]")
        return w / w.norm().clamp_min(1e-12)

    def __str__(self) -> str:
        parts = ", ".join(f"{k} {v}" for k, v in self.metrics.items())
        return f"{self.kind} probe (reg {self.regularization:g}): {parts}"


def _features(X: Any) -> Tensor:
    X = torch.as_tensor(X.detach() if isinstance(X, Tensor) else np.asarray(X)).cpu().double()
    return X.reshape(X.shape[0], -1)  # rows × features: [rows, head, d_head] flattens to one vector


def fit_probe(X: Any, y: Any, kind: Kind = "logistic", *, groups: Any = None, test_fraction: float = 0.25,
              n_folds: int = 5, grid: Sequence[float] | None = None, split: tuple[Any, Any] | None = None,
              n_bootstrap: int = 1000, seed: int = 0, mlp_hidden: int = 64, mlp_steps: int = 300,
              task: str | None = None) -> ProbeResult:
    """Fit one probe on activations X [rows, ...] against labels y [rows], and score it on held-out groups.

    kind: "ridge" (regression), "logistic" (classification) or "mlp" (either; `task` defaults to
    classification for integer/bool labels). groups: an entity id per row; no group is on both sides
    of any split. split: (train rows, test rows) to reuse one split across probes (else `group_split`).
    grid: regularisation candidates (defaults RIDGE_ALPHAS, LOGISTIC_LAMBDAS, MLP_DECAYS).
    """
    if kind not in ("ridge", "logistic", "mlp"):
        raise ValueError(f"kind must be 'ridge', 'logistic' or 'mlp', got {kind!r}")
    X = _features(X)
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
    folds = group_kfold(group_ids[train], min(n_folds, len(np.unique(group_ids[train]))), seed=seed + 1)
    cv_loss, best, fitted = _cross_validate(kind, task, X[train], y_t[train], n_classes, folds, grid, mlp_hidden,
                                            mlp_steps, seed)

    scores = fitted.scores(X[test])
    y_test, s_test = y_t[test].numpy(), scores.numpy()
    test_groups = group_ids[test] if groups is not None else None
    boot = dict(groups=test_groups, n_bootstrap=n_bootstrap, seed=seed)
    metrics: dict[str, Metric] = {}
    if task == "classification":
        predicted = (s_test > 0.5).astype(int) if s_test.ndim == 1 else s_test.argmax(axis=1)
        metrics["accuracy"] = bootstrap_ci(accuracy, y_test, predicted, **boot)
        metrics["auroc"] = bootstrap_ci(auroc, y_test, s_test, **boot)
    else:
        metrics["r2"] = bootstrap_ci(r2_score, y_test, s_test, **boot)
        if set(np.unique(y_test).tolist()) <= {0.0, 1.0}:  # a ridge probe on 0/1 labels also ranks them
            metrics["auroc"] = bootstrap_ci(auroc, y_test, s_test, **boot)
    return ProbeResult(kind, task, float(best), cv_loss, metrics, train, test, scores, classes, fitted)


def fit_probes(activations: Mapping[str, Any], y: Any, kind: Kind = "logistic", *, groups: Any = None,
               test_fraction: float = 0.25, seed: int = 0, **options: Any) -> dict[str, ProbeResult]:
    """One probe per hook (or layer) on the same grouped split: {name: ProbeResult}.

    `activations` is a mapping name → [rows, ...] (an `Activations`' `.acts`, or a dict you build).
    """
    acts = getattr(activations, "acts", activations)
    if not acts:
        raise ValueError("no activations to probe")
    n = len(next(iter(acts.values())))
    split = group_split(_group_ids(groups, n), test_fraction, seed)
    return {name: fit_probe(X, y, kind, groups=groups, split=split, seed=seed, **options) for name, X in acts.items()}


def probe_table(results: Mapping[str, ProbeResult]) -> list[dict[str, Any]]:
    """Rows {hook, kind, regularization, metric, value, low, high} for a DataFrame or a plot."""
    return [{"hook": name, "kind": r.kind, "regularization": r.regularization, "metric": metric,
             "value": m.value, "low": m.low, "high": m.high}
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
    from lab.model import HookedTransformer

    if not isinstance(model, HookedTransformer):
        raise TypeError(f"random_model needs a HookedTransformer, got {type(model).__name__}")
    device = model.W_E.device
    return HookedTransformer(model.cfg, seed=seed, tokenizer=model.tokenizer).to(device).eval()


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
