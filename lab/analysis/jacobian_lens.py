"""The Jacobian lens: read layer l's residual stream through the mean Jacobian that carries it to the final one.

Gurnee et al. 2026, "Verbalizable Representations Form a Global Workspace in Language Models" (Transformer
Circuits Thread), with the estimator of Anthropic's Apache-2.0 reference implementation (anthropics/jacobian-lens),
as TransformerLens 4.3 re-implements it for its TransformerBridge (`transformer_lens.tools.analysis.JacobianLens`,
whose `fit` this module follows and is tested against on the same weights):

    J_l = E_prompt [ (1/|V|) Σ_{t ∈ V} Σ_{t' ∈ V, t' ≥ t} ∂x^(final)_{t'} / ∂x^(l)_t ],

where x^(final) is the residual stream after the last block (before the final norm), x^(l) layer l's residual
stream, and V the valid positions: all but the first `skip_first_positions` and the last. Effects on every later
target position are summed for each source position; source positions and prompts are averaged. The lens reads

    P^(l)_J = softmax(LN_final(J_l x^(l)) W_U + b_U),

and J = I gives the logit lens. The same-position variant (`targets="same"`) keeps only t' = t,

    J^same_l = E_prompt [ (1/|V|) Σ_{t ∈ V} ∂x^(final)_t / ∂x^(l)_t ],

the map that carries a position's stream to its own final stream: the summed one also adds what a source position
does to later positions' outputs, which on a world that copies earlier tokens (induction) is mostly the copy a
later position makes of it — a direction that says what comes after a later occurrence, not what comes next here.
The reference fits the outputs of blocks 0 … n − 2 (its layer l is Forma's
blocks.(l+1).hook_resid_pre); Forma fits every block's input, the embeddings (resid_pre 0) included, with the same
estimator, and the last row is the model's output. The fit is exact: one forward pass per prompt, replicated
d_model times along the batch, and one backward pass whose cotangent is a one-hot output dimension per row at
every valid target position (causal attention keeps earlier targets from reaching a source).
"""

from dataclasses import dataclass
from typing import Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lab.analysis.lens import read_out, residual_stack
from lab.model.transformer import HookedTransformer

__all__ = ["JacobianLens", "fit_jacobian_lens"]


@dataclass
class JacobianLens:
    """J[l]: the mean Jacobian of the final residual stream with respect to blocks.l.hook_resid_pre."""

    J: Float[Tensor, "layer d_model d_model"]  # J[l][i, j] = mean ∂x^(final)_i / ∂x^(l)_j
    n_prompts: int
    skip_first_positions: int
    targets: Literal["later", "same"] = "later"  # summed over every later position (the reference's), or the same

    def transport(self, residual: Float[Tensor, "layer ... d_model"]) -> Float[Tensor, "layer ... d_model"]:
        """Rows l < n_layers carried to the final basis, J_l x; a last (output) row, if present, left as it is."""
        n = self.J.shape[0]
        moved = torch.einsum("lij,l...j->l...i", self.J.to(residual), residual[:n])
        return torch.cat([moved, residual[n:]]) if residual.shape[0] > n else moved

    @torch.inference_mode()
    def log_probs(
        self, model: HookedTransformer, tokens: Int[Tensor, "batch pos"]
    ) -> Float[Tensor, "layer batch pos d_vocab"]:
        """Log-probabilities of the Jacobian lens at every layer's input, and the model's own in the last row."""
        if self.J.shape[0] != model.cfg.n_layers or self.J.shape[1] != model.cfg.d_model:
            raise ValueError(
                f"this Jacobian lens has {self.J.shape[0]} matrices of width {self.J.shape[1]}; the "
                f"model has {model.cfg.n_layers} layers of width {model.cfg.d_model}"
            )
        stack = residual_stack(model, model.check_tokens(tokens))
        return read_out(model, self.transport(stack)).log_softmax(dim=-1)


def fit_jacobian_lens(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    *,
    skip_first_positions: int = 0,
    prompts_per_pass: int = 8,
    targets: Literal["later", "same"] = "later",
) -> JacobianLens:
    """Fit J_l for every layer on the prompts `tokens` (one prompt per row, all of one length) as the module's
    docstring defines it; `prompts_per_pass` prompts (each replicated d_model times) share a pass. `targets="same"`
    fits the same-position variant instead: only ∂x^(final)_t / ∂x^(l)_t, each source position's effect on its own
    output (one backward pass per target position)."""
    tokens = model.check_tokens(tokens)
    n_prompts, length = tokens.shape
    if skip_first_positions < 0 or length <= skip_first_positions + 1:
        raise ValueError(
            f"prompts of {length} tokens have no valid position once the first {skip_first_positions} "
            "and the last are left out"
        )
    if prompts_per_pass < 1:
        raise ValueError(f"prompts_per_pass must be ≥ 1, got {prompts_per_pass}")
    if targets not in ("later", "same"):
        raise ValueError(f"targets must be 'later' (summed over later positions) or 'same', got {targets!r}")
    n_layers, d = model.cfg.n_layers, model.cfg.d_model
    valid = torch.arange(skip_first_positions, length - 1, device=tokens.device)
    total = torch.zeros(n_layers, d, d, dtype=torch.float64)
    frozen = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in frozen:
            p.requires_grad_(False)  # the graph is rooted at the residual stream, not the weights
        for start in range(0, n_prompts, prompts_per_pass):
            total += _chunk_jacobians(model, tokens[start : start + prompts_per_pass], valid, targets == "same")
    finally:
        for p, flag in frozen:
            p.requires_grad_(flag)
    return JacobianLens((total / n_prompts).float(), n_prompts, skip_first_positions, targets)


def _chunk_jacobians(model: HookedTransformer, chunk: Tensor, valid: Tensor, same: bool) -> Tensor:
    """[layer, d, d]: the chunk's prompts' mean Jacobians over the valid source positions, summed over prompts —
    each source's effect on every valid target (same=False) or on its own position only (same=True)."""
    n_layers, d = model.cfg.n_layers, model.cfg.d_model
    names = [f"blocks.{layer}.hook_resid_pre" for layer in range(n_layers)]
    rows = chunk.repeat_interleave(d, dim=0)  # prompt p's row i carries output dimension i
    deltas: dict[str, Tensor] = {}

    def tap(activation: Tensor, hook, deltas=deltas) -> Tensor:
        # x + δ with δ = 0 a leaf: ∂(final)/∂δ is the Jacobian with respect to x through every later block.
        deltas[hook.name] = torch.zeros_like(activation, requires_grad=True)
        return activation + deltas[hook.name]

    out = torch.zeros(n_layers, d, d, dtype=torch.float64)
    with torch.inference_mode(False), torch.enable_grad():
        with model.hooks(fwd_hooks=[(name, tap) for name in names]):
            final = model(rows, stop_at_layer=n_layers)  # [rows, pos, d_model], before the final norm
        dims = torch.arange(d, device=final.device).repeat(len(chunk))
        # One backward pass with a one-hot cotangent at every valid target (causal attention keeps earlier targets
        # from reaching a source), or one per target, read at that target's own position.
        passes = [valid] if not same else [valid[i : i + 1] for i in range(len(valid))]
        for k, at in enumerate(passes):
            cotangent = torch.zeros_like(final)
            cotangent[torch.arange(len(rows))[:, None], at[None, :], dims[:, None]] = 1.0
            grads = torch.autograd.grad(
                final, [deltas[name] for name in names], grad_outputs=cotangent, retain_graph=k < len(passes) - 1
            )
            sources = valid if not same else at
            for layer, grad in enumerate(grads):
                per_prompt = grad[:, sources].double().sum(dim=1).reshape(len(chunk), d, d)  # [prompt, i, j]
                out[layer] += per_prompt.sum(dim=0).cpu() / len(valid)
    return out
