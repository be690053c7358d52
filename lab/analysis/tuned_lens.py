"""The tuned lens: one affine translator per layer, trained so that each layer's reading matches the model's own.

Belrose et al. 2023, "Eliciting Latent Predictions from Transformers with the Tuned Lens" (arXiv 2303.08112,
§3): the logit lens reads layer l's residual stream x^(l) as if it were the last, LN_final(x^(l)) W_U + b_U;
the tuned lens first moves it by a learned affine map,

    P^(l)_tuned = softmax(LN_final(x^(l) + x^(l) A_l + b_l) W_U + b_U),

with A_l, b_l initialised to zero (so training starts from the logit lens) and trained to minimise the
distillation loss of the paper's eq. 3, the KL from the model's final distribution,

    L_l = E_{x, t} KL(P_θ(· | x_≤t) ‖ P^(l)_tuned),

one layer at a time (the layers share nothing). The model is frozen. Row l < n_layers reads
blocks.l.hook_resid_pre (the embeddings for l = 0); the last row is the model's output, as in `logit_lens`.

How Forma fits it: the residual streams and the model's log-probabilities are computed once, and the translators
minimise Σ_l (L_l + ½λ‖A_l‖²) on them by L-BFGS (full batch, strong-Wolfe line search; the objective is smooth,
the translators small, and no parameter is shared between layers, so each is its own term's minimiser): no
forward pass of the model is repeated, and one evaluation reads every layer at once. The tuned-lens
package trains the same translator by SGD with Nesterov momentum over fresh forward passes of the model;
benchmarks/tuned_lens.py holds the two side by side (held-out KL and wall time, on the same model and tokens).
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lab.analysis.lens import read_out, residual_stack
from lab.model.transformer import HookedTransformer

__all__ = ["TunedLens", "fit_tuned_lens"]


@dataclass
class TunedLens:
    """The translators of every layer: x ↦ x + x A[l] + b[l] before the model's final norm and unembedding."""

    A: Float[Tensor, "layer d_model d_model"]
    b: Float[Tensor, "layer d_model"]
    train_kl_nats: list[float]  # L_l on the fitting tokens at the optimum, per layer (NaN for a layer not fitted)
    evaluations: int  # L-BFGS function evaluations (each reads every layer)
    # Fitted with validation tokens (early stopping): L_l on them at the iterate kept, and that iterate (0: the logit
    # lens), per layer (NaN and -1 for a layer not fitted); None without.
    validation_kl_nats: list[float] | None = None
    stopped_at: list[int] | None = None

    def translate(self, residual: Float[Tensor, "layer ... d_model"]) -> Float[Tensor, "layer ... d_model"]:
        """Rows l < n_layers moved by their translator; a last (output) row, if present, left as it is."""
        n = self.A.shape[0]
        A, b = self.A.to(residual), self.b.to(residual)
        moved = (
            residual[:n] + torch.einsum("l...d,lde->l...e", residual[:n], A) + b.view(n, *[1] * (residual.ndim - 2), -1)
        )
        return torch.cat([moved, residual[n:]]) if residual.shape[0] > n else moved

    @torch.inference_mode()
    def log_probs(
        self, model: HookedTransformer, tokens: Int[Tensor, "batch pos"]
    ) -> Float[Tensor, "layer batch pos d_vocab"]:
        """Log-probabilities of the tuned lens at every layer's input, and the model's own in the last row."""
        if self.A.shape[0] != model.cfg.n_layers or self.A.shape[1] != model.cfg.d_model:
            raise ValueError(
                f"this tuned lens has {self.A.shape[0]} translators of width {self.A.shape[1]}; the model "
                f"has {model.cfg.n_layers} layers of width {model.cfg.d_model}"
            )
        stack = residual_stack(model, model.check_tokens(tokens))
        return read_out(model, self.translate(stack)).log_softmax(dim=-1)


def _kl_from(target_log_probs: Tensor, logits: Tensor) -> Tensor:
    """KL(target ‖ softmax(logits)) averaged over rows, per leading index: [layer, rows, vocab] → [layer]."""
    return (target_log_probs.exp() * (target_log_probs - logits.log_softmax(dim=-1))).sum(dim=-1).mean(dim=-1)


def fit_tuned_lens(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    *,
    weight_decay: float = 1e-4,
    max_iter: int = 100,
    tolerance: float = 1e-7,
    layers: Sequence[int] | None = None,
    validation: Int[Tensor, "batch pos"] | None = None,
) -> TunedLens:
    """Train a tuned lens on `tokens` (say, a few hundred sequences of the model's world) as the module's
    docstring describes: the translators minimise Σ_l KL(P_θ ‖ P^(l)_tuned) + ½·weight_decay·‖A_l‖², every
    position of every sequence, by full-batch L-BFGS (at most `max_iter` iterations) from the logit lens (A = 0,
    b = 0). The layers share no parameter, so the sum is minimised where each term is; one pass reads every
    layer at once. `layers` fits only those layers' translators (the others stay zero: the logit lens there, and
    NaN in train_kl_nats): on a model with a large vocabulary each layer's term costs a full unembedding of every
    position. `validation` (tokens the fit does not read) stops early: L-BFGS runs one iteration at a time, and each
    layer keeps the iterate of lowest L_l on them, the logit lens (iteration 0) included, so that a fit on few
    tokens does not overfit its layers (validation_kl_nats and stopped_at say where each stopped)."""
    if weight_decay < 0 or max_iter < 1:
        raise ValueError(f"weight_decay must be ≥ 0 and max_iter ≥ 1, got {weight_decay} and {max_iter}")
    tokens = model.check_tokens(tokens)
    n_layers, d_model = model.cfg.n_layers, model.cfg.d_model
    chosen = list(range(n_layers)) if layers is None else sorted(set(layers))
    if not chosen or not all(0 <= layer < n_layers for layer in chosen):
        raise ValueError(f"layers must be a non-empty set of layers in [0, {n_layers}), got {layers!r}")
    with torch.inference_mode():
        stack = residual_stack(model, tokens).flatten(1, 2)  # [layer + 1, rows, d_model]
        target = read_out(model, stack[-1]).log_softmax(dim=-1)
    x, target = stack[chosen].clone(), target.clone()  # out of inference mode, for autograd
    A = torch.zeros(len(chosen), d_model, d_model, requires_grad=True)
    b = torch.zeros(len(chosen), 1, d_model, requires_grad=True)
    optimizer = torch.optim.LBFGS(
        [A, b],
        lr=1.0,
        max_iter=max_iter if validation is None else 1,
        # one iteration a call: a line search of its own budget (the default, 5/4 of max_iter, would leave it none)
        max_eval=None if validation is None else 25,
        tolerance_grad=tolerance,
        tolerance_change=1e-12,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

    def objective() -> Tensor:
        optimizer.zero_grad()
        loss = _kl_from(target, read_out(model, x + x @ A + b)).sum() + 0.5 * weight_decay * A.square().sum()
        loss.backward()
        return loss

    frozen = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in frozen:
            p.requires_grad_(False)
        with torch.enable_grad():
            if validation is None:
                optimizer.step(objective)
                kept = (A.detach(), b.detach(), None, None)
            else:
                kept = _early_stopped(model, optimizer, objective, (A, b), validation, chosen, max_iter)
        A_kept, b_kept, validation_kl, stopped = kept
        with torch.no_grad():
            kls = _kl_from(target, read_out(model, x + x @ A_kept + b_kept)).tolist()
    finally:
        for p, flag in frozen:
            p.requires_grad_(flag)
    evaluations = int(optimizer.state_dict()["state"][0]["func_evals"])
    full_A, full_b = torch.zeros(n_layers, d_model, d_model), torch.zeros(n_layers, d_model)
    full_A[chosen], full_b[chosen] = A_kept, b_kept[:, 0]
    return TunedLens(
        full_A,
        full_b,
        _per_layer(kls, chosen, n_layers, float("nan")),
        evaluations,
        None if validation_kl is None else _per_layer(validation_kl, chosen, n_layers, float("nan")),
        None if stopped is None else _per_layer(stopped, chosen, n_layers, -1),
    )


def _per_layer(values: Sequence, chosen: Sequence[int], n_layers: int, missing: float | int) -> list:
    out = [missing] * n_layers
    for layer, value in zip(chosen, values):
        out[layer] = value
    return out


def _early_stopped(
    model: HookedTransformer,
    optimizer: torch.optim.LBFGS,
    objective,
    parameters: tuple[Tensor, Tensor],
    validation: Tensor,
    chosen: Sequence[int],
    max_iter: int,
) -> tuple[Tensor, Tensor, list[float], list[int]]:
    """`max_iter` L-BFGS iterations of `objective`, one at a time; each layer's translator kept at the iterate of
    lowest KL on the validation tokens (iteration 0, A = b = 0, the logit lens, among them). Returns the kept A and
    b, each layer's validation KL there and the iteration."""
    A, b = parameters
    with torch.inference_mode():
        stack = residual_stack(model, model.check_tokens(validation)).flatten(1, 2)
        target = read_out(model, stack[-1]).log_softmax(dim=-1)
    vx, target = stack[chosen].clone(), target.clone()

    def validation_kl() -> Tensor:
        with torch.no_grad():
            return _kl_from(target, read_out(model, vx + vx @ A + b))

    best, best_A, best_b = validation_kl(), A.detach().clone(), b.detach().clone()
    stopped = torch.zeros(len(chosen), dtype=torch.long)
    for iteration in range(1, max_iter + 1):
        optimizer.step(objective)
        kl = validation_kl()
        better = kl < best
        best, stopped = torch.where(better, kl, best), torch.where(better, iteration, stopped)
        best_A[better], best_b[better] = A.detach()[better], b.detach()[better]
    return best_A, best_b, best.tolist(), stopped.tolist()
