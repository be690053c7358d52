"""Fitting out of core: the rows stay in an ActivationStore and are read a shard at a time. Ridge from the
per-part sums (one eigendecomposition serves every α), logistic by the same damped Newton steps as in memory
(or L-BFGS) with each gradient and Hessian summed over the shards, several fits in lockstep so that one pass
serves them all; and the grouped cross-validation over them. The probe is the one the in-memory fit finds."""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from lab.analysis.activations.store import StoredRows
from lab.analysis.probes.fitting import Fitted, loss_of_scores, newton_fits
from lab.analysis.probes.shards import PartSums, part_sums, shard_rows, streamed_rank, streamed_scores


def _streamed_ridge(s: PartSums, parts: Sequence[int], alphas: Sequence[float]) -> list[Fitted]:
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
    return [
        Fitted("ridge", "regression", mean, std, {"w": Q @ (qty / (lam.clamp_min(0) + a)), "b": y_mean}) for a in alphas
    ]


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


def _logistic_pass(
    X: StoredRows,
    part: np.ndarray,
    y: Tensor,
    out_dim: int,
    fits: Sequence[_Streamed],
    Ts: Sequence[Tensor],
    derivatives: bool,
) -> list[tuple[float, Tensor | None, Tensor | None]]:
    """Mean cross-entropy at Ts[i] for each fit (without the penalty), and with `derivatives` its gradient
    Aᵀ(P − Y)/n and Hessian (as `_newton_logistic` forms them), in one pass over the shards."""
    sums: list[list[Any]] = [[0.0, None, None] for _ in fits]
    for start, chunk in shard_rows(X):
        here = torch.as_tensor(part[start : start + len(chunk)])
        labels = y[start : start + len(chunk)]
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
                H = A.T @ (A[:, :, None] * S.reshape(len(A), 1, -1)).reshape(len(A), -1)
                H = H.reshape(k, k, out_dim, out_dim).permute(0, 2, 1, 3).reshape(k * out_dim, k * out_dim)
            G = A.T @ (P - Y)
            sums[i][1] = G if sums[i][1] is None else sums[i][1] + G
            sums[i][2] = H if sums[i][2] is None else sums[i][2] + H
    return [
        (total / fit.n, None if G is None else G / fit.n, None if H is None else H / fit.n)
        for fit, (total, G, H) in zip(fits, sums)
    ]


def _streamed_newton(
    X: StoredRows, part: np.ndarray, y: Tensor, out_dim: int, lam: float, fits: Sequence[_Streamed], max_iter: int = 100
) -> None:
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
    for i, (fit, (data, G, H)) in enumerate(
        zip(fits, _logistic_pass(X, part, y, out_dim, fits, [f.T for f in fits], True))
    ):
        fit.f, fit.done = objective(data, fit.T), False
        state[i] = (G + pen[:, None] * fit.T, H + diagonal)
    for _ in range(max_iter):
        missing = [i for i, fit in enumerate(fits) if not fit.done and i not in state]
        if missing:  # after a backtracked step: the derivatives at the accepted point
            for i, (_, G, H) in zip(
                missing,
                _logistic_pass(X, part, y, out_dim, [fits[i] for i in missing], [fits[i].T for i in missing], True),
            ):
                state[i] = (G + pen[:, None] * fits[i].T, H + diagonal)
        steps = _newton_steps(fits, state)
        if not steps:
            break
        order = list(steps)
        full = _logistic_pass(
            X, part, y, out_dim, [fits[i] for i in order], [fits[i].T - steps[i][0] for i in order], True
        )
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


def _newton_steps(
    fits: Sequence[_Streamed], state: dict[int, tuple[Tensor, Tensor]]
) -> dict[int, tuple[Tensor, float]]:
    """Each unfinished fit's Newton step and decrement² from its gradient and Hessian (taken out of `state`); a fit
    whose decrement² is below machine precision is done instead."""
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
    return steps


def _streamed_lbfgs(X: StoredRows, part: np.ndarray, y: Tensor, out_dim: int, lam: float, fit: _Streamed) -> None:
    """`_lbfgs_logistic` with the loss and its gradient summed over the shards at every evaluation."""
    T = fit.T.clone().requires_grad_(True)
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
        value = T.detach()
        data, G = _gradient_pass(X, part, y, out_dim, fit, value)
        T.grad = G + lam * torch.cat([value[:-1], torch.zeros_like(value[-1:])])
        return torch.tensor(data + 0.5 * lam * float((value[:-1] ** 2).sum()), dtype=torch.float64)

    optimizer.step(closure)
    fit.T = T.detach()


def _gradient_pass(
    X: StoredRows, part: np.ndarray, y: Tensor, out_dim: int, fit: _Streamed, T: Tensor
) -> tuple[float, Tensor]:
    """Mean cross-entropy and its gradient Aᵀ(P − Y)/n, without the Hessian (for L-BFGS)."""
    total, G = 0.0, torch.zeros_like(T)
    for start, chunk in shard_rows(X):
        sel = torch.isin(torch.as_tensor(part[start : start + len(chunk)]), torch.as_tensor(fit.parts))
        if not bool(sel.any()):
            continue
        A = torch.cat([(chunk[sel] - fit.mean) / fit.std, torch.ones(int(sel.sum()), 1, dtype=torch.float64)], dim=1)
        labels = y[start : start + len(chunk)][sel]
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


def _streamed_logistic(
    X: StoredRows,
    part: np.ndarray,
    y: Tensor,
    n_classes: int,
    s: PartSums,
    fold_parts: Sequence[Sequence[int]],
    lambdas: Sequence[float],
) -> list[list[Fitted]]:
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
    newton = newton_fits((d + 1) * out_dim)
    fitted: dict[float, list[Fitted]] = {}
    for lam in sorted(lambdas, reverse=True):
        if newton:
            _streamed_newton(X, part, y, out_dim, lam, fits)
        else:
            for fit in fits:
                _streamed_lbfgs(X, part, y, out_dim, lam, fit)
        fitted[lam] = [
            Fitted(
                "logistic",
                "classification",
                fit.mean,
                fit.std,
                {"w": fit.T[:-1, 0] if out_dim == 1 else fit.T[:-1], "b": fit.T[-1, 0] if out_dim == 1 else fit.T[-1]},
            )
            for fit in fits
        ]
    return [[fitted[lam][j] for lam in lambdas] for j in range(len(fold_parts))]


def cross_validate_streamed(
    kind: str,
    X: StoredRows,
    y: Tensor,
    n_classes: int,
    train: np.ndarray,
    test: np.ndarray,
    folds: list[tuple[np.ndarray, np.ndarray]],
    grid: Sequence[float],
) -> tuple[dict[float, float], float, Fitted, int]:
    """`cross_validate` (and `feature_rank` of the training rows) with the rows read shard by shard.
    Returns (cv loss per candidate, the best candidate, the refitted probe, the rank)."""
    K = len(folds)
    part = np.full(len(X), -1)
    for k, (_, val) in enumerate(folds):
        part[train[val]] = k
    part[test] = K
    train_parts = list(range(K))
    s = part_sums(X, part, K + 1, train_parts, y.double() if kind == "ridge" else None, per_part_gram=kind == "ridge")
    rank = streamed_rank(s, train_parts)
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
        scores = streamed_scores(X, rows, per_fold[k])
        for g, fit, sc in zip(grid, per_fold[k], scores):
            cv_loss[g] += loss_of_scores(fit.task, sc, y[rows]) / K
    best = min(grid, key=lambda g: (cv_loss[g], -g))
    if kind == "ridge":
        final = _streamed_ridge(s, train_parts, [best])[0]
    else:
        final = _streamed_logistic(X, part, y, n_classes, s, [train_parts], [best])[0][0]
    return cv_loss, best, final, rank
