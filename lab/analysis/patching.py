"""Activation patching: which activations carry the difference between a clean and a corrupted input?

Run the clean prompt and cache an activation; run the corrupted prompt with one cell of that
activation replaced by its clean value; measure how much of the clean behaviour comes back
(Meng et al. 2022 "causal tracing"; Heimersheim & Nanda 2024, "How to use and interpret activation
patching", whose terms we follow):

    denoising (default)   clean → corrupted run: is this cell *sufficient* to restore the behaviour?
    noising               corrupted → clean run: is this cell *necessary* for it?

Cells:
    by position   component ∈ resid_pre | attn_out | mlp_out | resid_post: one (layer, position) of
                  blocks.{l}.hook_{component}, [batch, pos, d_model], patched at a time
    by head       blocks.{l}.attn.hook_z, [batch, pos, head, d_head]: one (layer, head) at every position

The metric is a callback on the patched run's logits [batch, pos, d_vocab] returning a scalar; the
default is the logit difference logit(answer) − logit(wrong) at the last position, averaged over the
batch. `PatchingResult.values` is [layer, cell] — a heatmap — and `normalized()` maps it to
(patched − corrupted) / (clean − corrupted): 0 = nothing restored, 1 = fully restored.

Several cells of one layer are patched in one forward pass: the target batch is repeated once per
cell along the batch axis (`max_batch` rows at most per pass), which on a CPU is several times
faster than one pass per cell.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor

__all__ = ["COMPONENTS", "MetricFn", "PatchingResult", "logit_diff", "patch_heads", "patch_positions"]

COMPONENTS = {
    "resid_pre": "blocks.{layer}.hook_resid_pre",
    "attn_out": "blocks.{layer}.hook_attn_out",
    "mlp_out": "blocks.{layer}.hook_mlp_out",
    "resid_post": "blocks.{layer}.hook_resid_post",
    "z": "blocks.{layer}.attn.hook_z",
}

MetricFn = Callable[[Tensor], Tensor | float]


def logit_diff(answer: int | Tensor, wrong: int | Tensor, position: int = -1) -> MetricFn:
    """A metric: mean over the batch of logits[b, position, answer_b] − logits[b, position, wrong_b].

    answer, wrong: one token id for every row, or a [batch] tensor of ids (one per prompt).
    """

    def metric(logits: Float[Tensor, "batch pos d_vocab"]) -> Tensor:
        last = logits[:, position]
        rows = torch.arange(last.shape[0], device=last.device)
        a = torch.as_tensor(answer, device=last.device).expand(last.shape[0])
        w = torch.as_tensor(wrong, device=last.device).expand(last.shape[0])
        return (last[rows, a] - last[rows, w]).mean()

    return metric


@dataclass
class PatchingResult:
    """values[layer, cell]: the metric with that one cell patched; clean and corrupted: unpatched runs."""

    values: Float[Tensor, "layer cell"]
    clean: float
    corrupted: float
    component: str  # resid_pre | attn_out | mlp_out | resid_post | z
    axis: str  # "pos" or "head": what the second axis of `values` indexes
    cells: list[int]  # the positions or heads of the second axis
    direction: str  # denoise | noise

    def normalized(self) -> Float[Tensor, "layer cell"]:
        """(values − corrupted) / (clean − corrupted): 1 where the patch restores the clean metric.

        With noising, 1 means the clean behaviour survives the patch and 0 that the patch destroys it.
        """
        gap = self.clean - self.corrupted
        if gap == 0:
            raise ValueError("the clean and corrupted runs give the same metric: nothing to normalise by")
        return (self.values - self.corrupted) / gap


def _check_inputs(model: Any, clean: Tensor, corrupted: Tensor) -> tuple[Tensor, Tensor]:
    clean = clean[None] if clean.ndim == 1 else clean
    corrupted = corrupted[None] if corrupted.ndim == 1 else corrupted
    if clean.shape != corrupted.shape:
        raise ValueError(f"clean {tuple(clean.shape)} and corrupted {tuple(corrupted.shape)} inputs must have "
                         "the same shape: patching swaps activations position by position")
    if hasattr(model, "check_tokens"):
        clean, corrupted = model.check_tokens(clean), model.check_tokens(corrupted)
    return clean, corrupted


def _metric(metric: MetricFn | None, answer: Any, wrong: Any) -> MetricFn:
    if metric is not None:
        return metric
    if answer is None or wrong is None:
        raise ValueError("give a metric callback, or answer and wrong token ids for the default logit difference")
    return logit_diff(answer, wrong)


@torch.inference_mode()
def _patch(model: Any, clean: Tensor, corrupted: Tensor, component: str, axis: str, cells: list[int],
           layers: Sequence[int], metric: MetricFn, direction: str, max_batch: int) -> PatchingResult:
    if component not in COMPONENTS:
        raise ValueError(f"component must be one of {sorted(COMPONENTS)}, got {component!r}")
    if direction not in ("denoise", "noise"):
        raise ValueError(f"direction must be 'denoise' (clean into corrupted) or 'noise', got {direction!r}")
    names = [COMPONENTS[component].format(layer=layer) for layer in layers]
    if hasattr(model, "check_hook_names"):
        model.check_hook_names(names)
    source, target = (clean, corrupted) if direction == "denoise" else (corrupted, clean)
    _, cache = model.run_with_cache(source, names_filter=names)
    clean_value = float(metric(model(clean)))
    corrupted_value = float(metric(model(corrupted)))
    b = target.shape[0]
    per_pass = max(1, max_batch // b)
    values = torch.empty(len(layers), len(cells))
    for i, name in enumerate(names):
        saved = cache[name]
        for start in range(0, len(cells), per_pass):
            chunk = cells[start: start + per_pass]

            def put(activation: Tensor, hook: Any, chunk: list[int] = chunk, saved: Tensor = saved) -> Tensor:
                patched = activation.clone().view(len(chunk), b, *activation.shape[1:])
                for k, cell in enumerate(chunk):
                    if axis == "pos":
                        patched[k, :, cell] = saved[:, cell]
                    else:  # head: every position of one head of hook_z [batch, pos, head, d_head]
                        patched[k, :, :, cell] = saved[:, :, cell]
                return patched.view(activation.shape)

            with model.hooks(fwd_hooks=[(name, put)]):
                logits = model(target.repeat(len(chunk), 1))
            for k in range(len(chunk)):
                values[i, start + k] = float(metric(logits[k * b: (k + 1) * b]))
    return PatchingResult(values, clean_value, corrupted_value, component, axis, list(cells), direction)


def _layers(model: Any, layers: Sequence[int] | None) -> list[int]:
    n_layers = model.cfg.n_layers
    chosen = list(range(n_layers)) if layers is None else [int(l) for l in layers]
    bad = [l for l in chosen if not 0 <= l < n_layers]
    if bad:
        raise ValueError(f"layers {bad} out of range for a model with {n_layers} layers")
    return chosen


def patch_positions(model: Any, clean: Int[Tensor, "batch pos"], corrupted: Int[Tensor, "batch pos"],
                    component: Literal["resid_pre", "attn_out", "mlp_out", "resid_post"] = "resid_pre",
                    metric: MetricFn | None = None, *, answer: Any = None, wrong: Any = None,
                    layers: Sequence[int] | None = None, positions: Sequence[int] | None = None,
                    direction: Literal["denoise", "noise"] = "denoise", max_batch: int = 64) -> PatchingResult:
    """Patch one (layer, position) of `component` at a time; values is [layer, position]."""
    if component == "z":
        raise ValueError("hook_z is patched by head: use patch_heads")
    clean, corrupted = _check_inputs(model, clean, corrupted)
    n_pos = clean.shape[1]
    cells = list(range(n_pos)) if positions is None else [p % n_pos for p in positions]
    return _patch(model, clean, corrupted, component, "pos", cells, _layers(model, layers),
                  _metric(metric, answer, wrong), direction, max_batch)


def patch_heads(model: Any, clean: Int[Tensor, "batch pos"], corrupted: Int[Tensor, "batch pos"],
                metric: MetricFn | None = None, *, answer: Any = None, wrong: Any = None,
                layers: Sequence[int] | None = None, direction: Literal["denoise", "noise"] = "denoise",
                max_batch: int = 64) -> PatchingResult:
    """Patch one head's output z (every position) at a time; values is [layer, head]."""
    clean, corrupted = _check_inputs(model, clean, corrupted)
    cells = list(range(model.cfg.n_heads))
    return _patch(model, clean, corrupted, "z", "head", cells, _layers(model, layers),
                  _metric(metric, answer, wrong), direction, max_batch)
