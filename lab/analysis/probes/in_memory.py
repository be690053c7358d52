"""Fitting in memory (float64; features standardised with the statistics of the rows being fitted): ridge in
closed form for every α from one SVD, logistic by damped Newton (L-BFGS for wide features or many classes),
warm-started along the λ grid, small MLPs for every (fold, decay) pair as one batched network, and the grouped
cross-validation that chooses among them by held-out loss."""

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from lab.analysis.probes.fitting import Fitted, held_out_loss, newton_fits, standardise, threads_for


def _fit_ridge(X: Tensor, y: Tensor, alphas: Sequence[float]) -> list[Fitted]:
    """Closed form for every α from one SVD: w = V diag(s / (s² + α)) Uᵀ (y − ȳ), b = ȳ."""
    mean, std = standardise(X)
    U, s, Vh = torch.linalg.svd((X - mean) / std, full_matrices=False)
    y_mean = y.mean()
    Uty = U.T @ (y - y_mean)
    return [Fitted("ridge", "regression", mean, std, {"w": Vh.T @ (s / (s**2 + a) * Uty), "b": y_mean}) for a in alphas]


def _logistic_objective(A: Tensor, Y: Tensor, T: Tensor, pen: Tensor) -> float:
    logits = A @ T
    if T.shape[1] == 1:
        data = (F.softplus(logits[:, 0]) - Y[:, 0] * logits[:, 0]).mean()
    else:
        data = (torch.logsumexp(logits, dim=1) - (Y * logits).sum(dim=1)).mean()
    return float(data + 0.5 * (pen[:, None] * T**2).sum())


def _newton_logistic(features: Tensor, y: Tensor, out_dim: int, lam: float, T: Tensor, max_iter: int = 100) -> Tensor:
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
    optimizer = torch.optim.LBFGS(
        [T],
        lr=1,
        max_iter=300,
        tolerance_grad=1e-9,
        tolerance_change=1e-12,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

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


def _fit_logistic(X: Tensor, y: Tensor, n_classes: int, lambdas: Sequence[float]) -> list[Fitted]:
    """One fit per λ, warm-started from the strongest penalty to the weakest."""
    mean, std = standardise(X)
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
    newton = newton_fits((r + 1) * out_dim)
    T = torch.zeros(r + 1, out_dim, dtype=torch.float64)
    fitted = {}
    for lam in sorted(lambdas, reverse=True):
        with threads_for(features.shape[0] * (r + 1) ** 2 * out_dim**2):
            T = (_newton_logistic if newton else _lbfgs_logistic)(features, y, out_dim, lam, T)
        w, b = T[:-1], T[-1]
        if basis is not None:
            w = basis @ w
        fitted[lam] = Fitted(
            "logistic",
            "classification",
            mean,
            std,
            {"w": w[:, 0] if out_dim == 1 else w, "b": b[0] if out_dim == 1 else b},
        )
    return [fitted[lam] for lam in lambdas]


@dataclass(frozen=True)
class MLPTraining:
    """How an MLP probe is trained: one hidden ReLU layer of `hidden` units, `steps` full-batch steps, its
    initialisation drawn from `seed`."""

    hidden: int
    steps: int
    seed: int


def _train_mlps(
    Z: Tensor, y: Tensor, rows: Tensor, decays: Tensor, task: str, out_dim: int, mlp: MLPTraining
) -> dict[str, Tensor]:
    """Train N one-hidden-layer ReLU networks at once, network k on the rows where rows[k] is True with
    decoupled weight decay decays[k] (AdamW, Loshchilov & Hutter 2019), full batch, lr 1e-2.

    Batching every (fold, decay) pair into one set of batched matmuls costs about as much wall time as
    one network: on a CPU the per-step overhead, not the arithmetic, dominates at probe sizes.
    """
    N, d, hidden = len(decays), Z.shape[1], mlp.hidden
    generator = torch.Generator().manual_seed(mlp.seed)

    def uniform(shape: tuple[int, ...], fan_in: int) -> Tensor:  # nn.Linear's default init, shared by all N
        bound = 1.0 / math.sqrt(fan_in)
        return ((torch.rand(shape[1:], generator=generator) * 2 - 1) * bound).expand(shape).clone()

    params = {
        "W1": uniform((N, d, hidden), d),
        "b1": uniform((N, 1, hidden), d),
        "W2": uniform((N, hidden, out_dim), hidden),
        "b2": uniform((N, 1, out_dim), hidden),
    }
    for p in params.values():
        p.requires_grad_(True)
    weight = rows.float() / rows.float().sum(dim=1, keepdim=True)  # [N, n]: each network's mean over its rows
    # Adam written out (Kingma & Ba 2015, Alg. 1, their defaults β = (0.9, 0.999), ε = 1e-8): torch.optim's
    # first step imports the compiler stack, seconds of start-up that a probe does not need.
    lr, beta1, beta2, eps = 1e-2, 0.9, 0.999, 1e-8
    moments = {name: (torch.zeros_like(p), torch.zeros_like(p)) for name, p in params.items()}
    target = y.float()
    with torch.enable_grad(), threads_for(N * Z.shape[0] * max(d, hidden)):
        for step in range(1, mlp.steps + 1):
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


def _cross_validate_mlp(
    X: Tensor,
    y: Tensor,
    task: str,
    n_classes: int,
    folds: list[tuple[np.ndarray, np.ndarray]],
    decays: Sequence[float],
    mlp: MLPTraining,
) -> tuple[dict[float, float], float, Fitted]:
    """Every (fold, decay) network and every final (all training rows, decay) network in one batched run.
    The standardisation uses all training rows' feature statistics (no labels; the test rows are never seen)."""
    mean, std = standardise(X)
    Z = ((X - mean) / std).float()
    n, G = X.shape[0], len(decays)
    masks = [np.isin(np.arange(n), tr) for tr, _ in folds] + [np.ones(n, dtype=bool)]
    rows = torch.as_tensor(np.repeat(np.stack(masks), G, axis=0))  # network k: mask k // G, decay k % G
    decay_of = torch.tensor(list(decays) * len(masks), dtype=torch.float32)
    out_dim = 1 if task == "regression" or n_classes == 2 else n_classes
    params = _train_mlps(Z, y, rows, decay_of, task, out_dim, mlp)

    def network(k: int) -> Fitted:
        return Fitted(
            "mlp", task, mean, std, {name: p[k, 0] if name.startswith("b") else p[k] for name, p in params.items()}
        )

    cv_loss = {g: 0.0 for g in decays}
    for f, (_, val) in enumerate(folds):
        for j, g in enumerate(decays):
            cv_loss[g] += held_out_loss(network(f * G + j), X[val], y[val]) / len(folds)
    best = min(decays, key=lambda g: (cv_loss[g], -g))
    return cv_loss, best, network(len(folds) * G + list(decays).index(best))


def cross_validate(
    kind: str,
    task: str,
    X: Tensor,
    y: Tensor,
    n_classes: int,
    folds: list[tuple[np.ndarray, np.ndarray]],
    grid: Sequence[float],
    mlp: MLPTraining,
) -> tuple[dict[float, float], float, Fitted]:
    """(mean held-out loss per candidate, the best candidate, the probe refitted on all rows with it); `mlp` is
    read by kind "mlp" alone."""
    if kind == "mlp":
        return _cross_validate_mlp(X, y, task, n_classes, folds, grid, mlp)

    def fit(rows: np.ndarray, candidates: Sequence[float]) -> list[Fitted]:
        if kind == "ridge":
            return _fit_ridge(X[rows], y[rows].double(), candidates)
        return _fit_logistic(X[rows], y[rows], n_classes, candidates)

    cv_loss = {g: 0.0 for g in grid}
    for train, val in folds:
        for g, fitted in zip(grid, fit(train, grid)):
            cv_loss[g] += held_out_loss(fitted, X[val], y[val]) / len(folds)
    best = min(grid, key=lambda g: (cv_loss[g], -g))  # ties: the stronger regularisation
    return cv_loss, best, fit(np.arange(X.shape[0]), [best])[0]
