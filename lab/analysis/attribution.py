"""Attribution patching: every activation patch at once, to first order, from one forward and one backward pass.

The patch of one cell c (a set of coordinates of one activation a, all batch rows) changes the metric m by

    m(patched_c) − m(target)  ≈  Σ_{i ∈ c} (a_source,i − a_target,i) · ∂m/∂a_i |_target

(Nanda 2023, "Attribution patching: activation patching at industrial scale"; Syed, Rager & Conmy 2023,
"Attribution patching outperforms automated circuit discovery"). Denoising (the default) takes the
gradient at the corrupted run and the clean run's activations as the source; noising swaps the two. So
one clean forward, one corrupted forward and one backward estimate every cell of every sweep that
`lab.analysis.patching` runs one pass per cell for:

    resid_pre, attn_out, mlp_out, resid_post    [layer, position]: c = (layer, position, every d_model)
    heads                                       [layer, head]: c = (layer, head, every position and d_head) of z
    heads_by_position                           [layer, head, position]: c = (layer, head, position) of z

The estimate is exact only where the metric is linear in the activation downstream of the cell: the last
layer of a model whose logits are a linear map of its residual stream, which a final LayerNorm or RMSNorm is
not (it divides the stream by its own norm), so with the usual final norm even the last layer's estimate is
first-order (tests/lab/analysis/test_attribution.py holds both). Everywhere else it is a first-order approximation, good
where the patch is a small step (it misses saturation, e.g. of attention patterns, and the final norm's
rescaling). Each estimate is returned as the patched
metric it stands for, m(target) + the sum above, in a `PatchingResult`, so that `normalized()` and a
comparison with the exhaustive sweep read the same way.

Works on any model with TransformerLens hooks (`hooks()`, `run_with_cache`): Forma's HookedTransformer
or a TransformerBridge.
"""

from typing import Any, Literal

import torch
from jaxtyping import Int
from torch import Tensor

from lab.analysis.patching import COMPONENTS, MetricFn, PatchingResult, check_inputs, resolve_metric

__all__ = ["SWEEPS", "attribution_patch"]

SWEEPS = ("resid_pre", "attn_out", "mlp_out", "resid_post", "heads", "heads_by_position")


def attribution_patch(
    model: Any,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: MetricFn | None = None,
    *,
    answer: Any = None,
    wrong: Any = None,
    direction: Literal["denoise", "noise"] = "denoise",
) -> dict[str, PatchingResult]:
    """The first-order estimate of every patch of every sweep in SWEEPS, keyed by sweep (see the module's
    docstring): values[layer, cell] ≈ what patch_positions (or patch_heads, patch_heads_by_position) gives."""
    if direction not in ("denoise", "noise"):
        raise ValueError(f"direction must be 'denoise' (clean into corrupted) or 'noise', got {direction!r}")
    clean, corrupted = check_inputs(model, clean, corrupted)
    metric = resolve_metric(metric, answer, wrong)
    n_layers = model.cfg.n_layers
    names = {
        component: [template.format(layer=layer) for layer in range(n_layers)]
        for component, template in COMPONENTS.items()
    }
    every = [name for layer_names in names.values() for name in layer_names]
    if hasattr(model, "check_hook_names"):
        model.check_hook_names(every)
    source, target = (clean, corrupted) if direction == "denoise" else (corrupted, clean)
    with torch.inference_mode(False), torch.no_grad():
        source_logits, source_cache = model.run_with_cache(source, names_filter=every)
        source_value = float(metric(source_logits))
    target_value, activations, grads = _target_gradients(model, target, metric, every)
    with torch.no_grad():

        def effect(name: str) -> Tensor:
            """(a_source − a_target) · ∂m/∂a at every coordinate, summed over the batch: [pos, ...]."""
            grad = grads[name]
            if grad is None:  # the metric does not read this activation at all
                return torch.zeros(activations[name].shape[1:-1])
            return ((source_cache[name] - activations[name]) * grad).sum(dim=-1).sum(dim=0).float().cpu()

        results = {}
        positions = list(range(clean.shape[1]))
        for component in ("resid_pre", "attn_out", "mlp_out", "resid_post"):
            values = target_value + torch.stack([effect(name) for name in names[component]])  # [layer, pos]
            results[component] = _result(values, component, "pos", positions, direction, source_value, target_value)
        z = torch.stack([effect(name) for name in names["z"]]).transpose(1, 2)  # [layer, head, pos]
        heads = list(range(z.shape[1]))
        results["heads"] = _result(
            target_value + z.sum(dim=2), "z", "head", heads, direction, source_value, target_value
        )
        results["heads_by_position"] = _result(
            target_value + z, "z", "head_pos", positions, direction, source_value, target_value
        )
    return results


def _target_gradients(
    model: Any, target: Tensor, metric: MetricFn, every: list[str]
) -> tuple[float, dict[str, Tensor], dict[str, Tensor | None]]:
    """The metric on the target run, each hooked activation of it, and the metric's gradient with respect to each
    (None where the metric does not read it), from one backward pass."""
    activations: dict[str, Tensor] = {}
    deltas: dict[str, Tensor] = {}

    def tap(activation: Tensor, hook: Any, name: str) -> Tensor:
        # a + δ with δ = 0 a leaf: ∂m/∂δ = ∂m/∂a, whether or not the weights require grad, and the graph
        # upstream of a (which earlier activations' gradients flow through) stays whole.
        delta = torch.zeros_like(activation, requires_grad=True)
        activations[name], deltas[name] = activation.detach(), delta
        return activation + delta

    hooks = [(name, lambda activation, hook, name=name: tap(activation, hook, name)) for name in every]
    with torch.inference_mode(False), torch.enable_grad():
        with model.hooks(fwd_hooks=hooks):
            value = metric(model(target))
        if not isinstance(value, Tensor) or value.numel() != 1 or not value.requires_grad:
            raise ValueError(
                "attribution patching differentiates the metric: it must return a one-element tensor "
                "computed from the logits (not a float)"
            )
        grads = dict(
            zip(every, torch.autograd.grad(value.reshape(()), [deltas[name] for name in every], allow_unused=True))
        )
    return float(value.detach()), activations, grads


def _result(
    values: Tensor,
    component: str,
    axis: str,
    cells: list[int],
    direction: str,
    source_value: float,
    target_value: float,
) -> PatchingResult:
    clean, corrupted = (source_value, target_value) if direction == "denoise" else (target_value, source_value)
    return PatchingResult(values, clean, corrupted, component, axis, cells, direction)
