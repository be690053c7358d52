"""Information measures of discrete distributions (docs/definitions.md §1), in nats unless `base` says otherwise.

For distributions p, q over the same V outcomes (the last axis, or `dim`):

    H(p)     = −Σ_x p(x) log p(x)                 entropy
    H(p, q)  = −Σ_x p(x) log q(x)                 cross-entropy
    KL(p‖q)  =  Σ_x p(x) log(p(x) / q(x))         Kullback–Leibler divergence
             = H(p, q) − H(p)                     (the identity the kl experiment measures)
    PPL      = exp(mean cross-entropy in nats)    perplexity

Zeros follow the limits: 0·log 0 = 0 and 0·log(0/q) = 0, so outcomes p gives no mass never count;
q(x) = 0 where p(x) > 0 gives H(p, q) = KL(p‖q) = +inf. Each term is computed with `torch.xlogy`,
which has exactly these conventions, so no ε is ever added.

Inputs: numpy arrays, torch tensors or nested lists, broadcast against each other. A torch tensor in
gives a torch tensor out (autograd flows; the computation runs in the promoted input dtype, so pass
float64 where 1e-12 matters); anything else is computed in float64 and returned as a numpy array
(0-d for a single distribution). Inputs are checked to be distributions: finite, non-negative and
summing to 1 along `dim` (within 1e-6 in float64, 1e-3 in lower precision).
"""

import math
from typing import Any

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

__all__ = ["cross_entropy", "entropy", "kl", "perplexity", "to_bits", "truncated_context_kl_of"]

NATS_PER_BIT = math.log(2.0)


def _as_tensor(value: Any) -> Tensor:
    if isinstance(value, Tensor):
        return value if value.is_floating_point() else value.double()
    return torch.as_tensor(np.asarray(value, dtype=np.float64))


def _check_distribution(p: Tensor, dim: int, name: str) -> None:
    if p.ndim == 0:
        raise ValueError(f"{name} must have at least one axis (the outcomes), got a scalar")
    values = p.detach()
    if not bool(torch.isfinite(values).all()):
        raise ValueError(f"{name} has non-finite entries")
    if bool((values < 0).any()):
        raise ValueError(f"{name} has negative entries (min {float(values.min()):.3g})")
    tolerance = 1e-6 if values.dtype == torch.float64 else 1e-3
    error = float((values.sum(dim=dim) - 1.0).abs().max()) if values.numel() else 0.0
    if error > tolerance:
        raise ValueError(f"{name} does not sum to 1 along dim {dim}: off by up to {error:.3g}")


def _finish(value: Tensor, torch_in: bool, base: float | None) -> Any:
    if base is not None:
        if not (isinstance(base, (int, float)) and base > 0 and base != 1 and math.isfinite(base)):
            raise ValueError(f"base must be a finite number > 0 other than 1, got {base!r}")
        value = value / math.log(base)
    return value if torch_in else value.detach().cpu().numpy()


def _pair(p: Any, q: Any, dim: int) -> tuple[Tensor, Tensor, bool]:
    torch_in = isinstance(p, Tensor) or isinstance(q, Tensor)
    p_t, q_t = _as_tensor(p), _as_tensor(q)
    dtype = torch.promote_types(p_t.dtype, q_t.dtype)
    p_t, q_t = p_t.to(dtype), q_t.to(dtype)
    if p_t.shape[dim] != q_t.shape[dim]:
        raise ValueError(f"p and q have {p_t.shape[dim]} and {q_t.shape[dim]} outcomes along dim {dim}")
    _check_distribution(p_t, dim, "p")
    _check_distribution(q_t, dim, "q")
    return p_t, q_t, torch_in


def entropy(p: Any, dim: int = -1, base: float | None = None) -> Any:
    """H(p) = −Σ p log p along `dim` (nats; bits with base=2), with 0·log 0 = 0."""
    torch_in = isinstance(p, Tensor)
    p_t = _as_tensor(p)
    _check_distribution(p_t, dim, "p")
    return _finish(-torch.xlogy(p_t, p_t).sum(dim=dim), torch_in, base)


def cross_entropy(p: Any, q: Any, dim: int = -1, base: float | None = None) -> Any:
    """H(p, q) = −Σ p log q along `dim`: the expected loss −E_{x~p} log q(x). +inf where q = 0 < p."""
    p_t, q_t, torch_in = _pair(p, q, dim)
    return _finish(-torch.xlogy(p_t, q_t).sum(dim=dim), torch_in, base)


def kl(p: Any, q: Any, dim: int = -1, base: float | None = None) -> Any:
    """KL(p‖q) = Σ p (log p − log q) along `dim`; ≥ 0, 0 iff p = q, +inf where q = 0 < p."""
    p_t, q_t, torch_in = _pair(p, q, dim)
    # xlogy(p, p) is finite, and −xlogy(p, q) = +inf exactly where q = 0 < p: no inf − inf can arise.
    return _finish((torch.xlogy(p_t, p_t) - torch.xlogy(p_t, q_t)).sum(dim=dim), torch_in, base)


def perplexity(cross_entropy_nats: Any) -> Any:
    """exp(mean of per-token cross-entropies in nats) = (Π_t 1/q(x_t))^(1/N), the geometric mean of inverse
    probabilities; a model that is uniform over V outcomes has perplexity V."""
    torch_in = isinstance(cross_entropy_nats, Tensor)
    values = _as_tensor(cross_entropy_nats)
    if values.numel() == 0:
        raise ValueError("perplexity of no tokens: cross_entropy_nats is empty")
    if bool(torch.isnan(values.detach()).any()) or bool((values.detach() < 0).any()):
        raise ValueError("cross-entropies must be ≥ 0 nats (and not NaN)")
    return _finish(values.mean().exp(), torch_in, None)


def to_bits(nats: Any) -> Any:
    """Nats → bits (divide by ln 2)."""
    return nats / NATS_PER_BIT


def truncated_context_kl_of(joint: Any, vocab_size: int, width: int) -> float:
    """How far the best predictor that sees only the last `width` tokens of an order-k context stays from p:

        KL = H(X | C_{−width:}) − H(X | C) = Σ_{c,x} J(c, x) log(J(c, x)·J(c_{−width:}) / (J(c)·J(c_{−width:}, x)))

    in nats, for the joint J(c, x) = π(c)·p(x|c) over contexts c (base-V index, oldest token first, shape
    [V^k, V]). width = 0 is the best unigram model (the marginal of x), width = k − 1 the best (k−1)-gram.
    """
    J = _as_tensor(joint).double()
    V = vocab_size
    n_contexts = J.shape[0]
    order = round(math.log(n_contexts, V)) if n_contexts > 1 else 0
    if J.ndim != 2 or J.shape[1] != V or V**order != n_contexts:
        raise ValueError(f"joint must be [V^k, V] with V = {vocab_size}, got shape {tuple(J.shape)}")
    if not 0 <= width < order:
        raise ValueError(f"width must be in [0, {order - 1}] for an order-{order} context, got {width}")
    if abs(float(J.sum()) - 1.0) > 1e-6 or bool((J < 0).any()):
        raise ValueError("joint must be a probability distribution over (context, next token)")
    p_context = J.sum(dim=1)  # J(c)
    conditional_full = -(torch.xlogy(J, J).sum() - torch.xlogy(p_context, p_context).sum())  # H(X | C)
    short = J.reshape(V ** (order - width), V**width, V).sum(dim=0)  # J(c_{−width:}, x)
    p_short = short.sum(dim=1)
    conditional_short = -(torch.xlogy(short, short).sum() - torch.xlogy(p_short, p_short).sum())
    return float(conditional_short - conditional_full)


# The temperature that brings a model closest to the truth: min over T of KL(p ‖ softmax(z / T))
T_GRID = tuple(float(t) for t in np.geomspace(0.5, 2.0, 25))  # includes T = 1 (the 13th point)
T_BRACKET = (0.25, 4.0)  # where the golden-section search for the minimising T looks


def temperature_kl(logits: Float[Tensor, "seq pos vocab"], p: Float[Tensor, "seq pos vocab"], T: float) -> float:
    """Mean KL(p ‖ softmax(z / T)) over prefixes."""
    return float(kl(p, torch.softmax(logits / T, dim=-1)).mean())


def temperature_scan(
    logits: Float[Tensor, "seq pos vocab"],
    p: Float[Tensor, "seq pos vocab"],
    grid: tuple[float, ...] = T_GRID,
    bracket: tuple[float, float] = T_BRACKET,
    tolerance: float = 1e-5,
) -> tuple[list[dict[str, float]], dict[str, float]]:
    """KL over the grid, and its minimiser by golden section on log T inside `bracket` (unimodal there:
    convex in β = 1/T). The minimiser is flagged if it lands on the bracket's edge."""
    rows = [{"T": T, "kl_nats": temperature_kl(logits, p, T)} for T in grid]
    ratio = (math.sqrt(5) - 1) / 2
    lo, hi = math.log(bracket[0]), math.log(bracket[1])
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = temperature_kl(logits, p, math.exp(a)), temperature_kl(logits, p, math.exp(b))
    while hi - lo > tolerance:
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = temperature_kl(logits, p, math.exp(a))
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = temperature_kl(logits, p, math.exp(b))
    T_min = math.exp((lo + hi) / 2)
    best = {
        "T": T_min,
        "kl_nats": temperature_kl(logits, p, T_min),
        "kl_at_T1_nats": temperature_kl(logits, p, 1.0),
        "at_bracket_edge": bool(min(abs(math.log(T_min / edge)) for edge in bracket) < 1e-3),
    }
    return rows, best
