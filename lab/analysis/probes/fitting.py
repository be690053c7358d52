"""What every probe fit shares: the fitted probe on standardised features (`Fitted`), features as float64
rows, their standardisation and numerical rank (`feature_rank`), the held-out loss that chooses the
regularisation, the regularisation grids, when a logistic fit takes Newton steps, the thread setting for
small ops, and the test metrics accuracy and R² (AUROC, bootstrap intervals and Metric live in
lab.metrics.discrimination, with one argument order: scores, labels)."""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

Kind = Literal["ridge", "logistic", "mlp"]
# Default regularisation grids, for standardised features. Ridge: α multiplies ‖w‖² against a *summed*
# squared error, so useful values scale with the number of rows; logistic and MLP: λ against a *mean* loss.
RIDGE_ALPHAS = tuple(10.0**k for k in range(-2, 6))
LOGISTIC_LAMBDAS = tuple(10.0**k for k in range(-5, 2))
MLP_DECAYS = (1e-4, 1e-2, 1e-1)

NEWTON_MAX_PARAMS = 2048  # above this many parameters the Hessian solve costs more than L-BFGS
FEATURE_RTOL = 1e-6  # float32 activations carry ~6e-8 relative rounding; variation below 1e-6 of scale is noise


def newton_fits(n_params: int) -> bool:
    """Whether a logistic fit of `n_params` parameters ([features + 1] × outputs) takes damped Newton steps,
    else L-BFGS: one rule, read here at every fit, for the in-memory and the out-of-core fit alike."""
    return n_params <= NEWTON_MAX_PARAMS


def accuracy(y_true: Any, y_pred: Any) -> float:
    """Share of exact matches."""
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    return float((y_true == y_pred).mean())


def r2_score(y_true: Any, y_pred: Any) -> float:
    """Coefficient of determination 1 − Σ(y − ŷ)² / Σ(y − ȳ)² (can be negative)."""
    y_true, y_pred = np.asarray(y_true, dtype=float), np.asarray(y_pred, dtype=float)
    total = ((y_true - y_true.mean()) ** 2).sum()
    return float(1.0 - ((y_true - y_pred) ** 2).sum() / total) if total > 0 else float("nan")


@dataclass
class Fitted:
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


def standardise(X: Tensor) -> tuple[Tensor, Tensor]:
    return X.mean(dim=0), X.std(dim=0, correction=0).clamp_min(1e-8)


def as_features(X: Any) -> Tensor:
    X = torch.as_tensor(X.detach() if isinstance(X, Tensor) else np.asarray(X)).cpu().double()
    return X.reshape(X.shape[0], -1)  # rows × features: [rows, head, d_head] flattens to one vector


def feature_rank(X: Any, rtol: float = FEATURE_RTOL) -> int:
    """Numerical rank of the centred features X − mean: singular values above rtol × the largest singular value
    of X itself (the features' scale, so that rounding noise around a constant row counts as no variation).
    0 means the features are constant — zero variance, or variation only at rounding level."""
    X = as_features(X)
    if X.shape[0] < 2:
        return 0
    scale = float(torch.linalg.matrix_norm(X, ord=2))
    if scale == 0.0:
        return 0
    singular = torch.linalg.svdvals(X - X.mean(dim=0))
    return int((singular > rtol * scale).sum())


def held_out_loss(fit: Fitted, X: Tensor, y: Tensor) -> float:
    """Held-out loss used to choose the regularisation: squared error or cross-entropy (nats)."""
    return loss_of_scores(fit.task, fit.scores(X), y)


def loss_of_scores(task: str, s: Tensor, y: Tensor) -> float:
    if task == "regression":
        return float(((s - y) ** 2).mean())
    eps = 1e-12
    if s.ndim == 1:
        return float(-(y * (s + eps).log() + (1 - y) * (1 - s + eps).log()).mean())
    return float(-(s[torch.arange(len(y)), y] + eps).log().mean())


@contextmanager
def threads_for(work: int) -> Iterator[None]:
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
