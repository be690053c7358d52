"""Activation patching: which activations carry the difference between a clean and a corrupted input?

Run the clean prompt and cache an activation; run the corrupted prompt with one cell of that
activation replaced by its clean value; measure how much of the clean behaviour comes back
(Meng et al. 2022 "causal tracing"; Heimersheim & Nanda 2024, "How to use and interpret activation
patching", whose terms we follow):

    denoising (default)   clean → corrupted run: is this cell *sufficient* to restore the behaviour?
    noising               corrupted → clean run: is this cell *necessary* for it?

Cells:
    by position        component ∈ resid_pre | attn_out | mlp_out | resid_post: one (layer, position) of
                       blocks.{l}.hook_{component}, [batch, pos, d_model], patched at a time
    by head            blocks.{l}.attn.hook_z, [batch, pos, head, d_head]: one (layer, head) at every position
    by head and pos    blocks.{l}.attn.hook_z: one (layer, head, position)

The metric is a callback on the patched run's logits [batch, pos, d_vocab] returning a scalar; the
default is the logit difference logit(answer) − logit(wrong) at the last position, averaged over the
batch. A metric may declare the positions it reads (`metric.positions`, as `logit_diff` does): the fast
path then unembeds only those, and hands the metric logits that are NaN elsewhere. `PatchingResult.values` is [layer,
cell] — a heatmap — ([layer, head, pos] by head and
position) and `normalized()` maps it to (patched − corrupted) / (clean − corrupted): 0 = nothing
restored, 1 = fully restored.

Two ways to compute the same numbers:

    exhaustive   every patched run starts from the embedding; several cells of one layer share a pass,
                 the target batch repeated once per cell along the batch axis (`max_batch` rows at
                 most). Any model with TransformerLens hooks; the reference the fast path is tested
                 against.
    fast         (Forma's HookedTransformer, the default there) a patch at (layer l, position p)
                 changes nothing before block l, and, attention being causal, nothing at positions
                 before p in any layer. So the patched run starts at block l from the target run's
                 residual stream entering it (blocks.l.hook_resid_pre), and runs only positions p … T − 1,
                 attending to the target run's keys and values of positions < p as a KV cache; the
                 logits at positions < p are the target run's, and of the rest only those the metric
                 reads are computed. Cells are sorted by position and batched
                 (`max_batch` rows), each row joining the pass at its own layer. Equal to the exhaustive
                 path to float round-off (tested to 1e-5).
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lab.model.kv_cache import KVCache, KVCacheEntry
from lab.model.transformer import HookedTransformer

__all__ = [
    "COMPONENTS",
    "MetricFn",
    "PatchingResult",
    "logit_diff",
    "patch_heads",
    "patch_heads_by_position",
    "patch_positions",
    "reads",
]

COMPONENTS = {
    "resid_pre": "blocks.{layer}.hook_resid_pre",
    "attn_out": "blocks.{layer}.hook_attn_out",
    "mlp_out": "blocks.{layer}.hook_mlp_out",
    "resid_post": "blocks.{layer}.hook_resid_post",
    "z": "blocks.{layer}.attn.hook_z",
}
AXES = ("pos", "head", "head_pos")

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

    metric.positions = (position,)  # what it reads: the fast sweeps unembed only there (see `reads`)
    return metric


def reads(metric: MetricFn, n_pos: int) -> list[int] | None:
    """The logit positions a metric declares it reads (its `positions` attribute, as `logit_diff` sets it), in
    [0, n_pos); None when it declares none, and may read every position."""
    declared = getattr(metric, "positions", None)
    if declared is None:
        return None
    bad = [p for p in declared if not -n_pos <= p < n_pos]
    if bad:
        raise ValueError(f"the metric reads positions {bad}, out of range for inputs of {n_pos} positions")
    return sorted({p % n_pos for p in declared})


@dataclass
class PatchingResult:
    """values[layer, cell]: the metric with that one cell patched; clean and corrupted: unpatched runs.

    axis "pos": values [layer, position]; "head": [layer, head] (every position of the head patched);
    "head_pos": [layer, head, position]. `cells` lists the positions (pos, head_pos) or heads (head)."""

    values: Float[Tensor, "layer ..."]
    clean: float
    corrupted: float
    component: str  # resid_pre | attn_out | mlp_out | resid_post | z
    axis: str  # pos | head | head_pos: what the axes after the layer index
    cells: list[int]  # the positions or heads of the last axis
    direction: str  # denoise | noise

    def normalized(self) -> Float[Tensor, "layer ..."]:
        """(values − corrupted) / (clean − corrupted): 1 where the patch restores the clean metric.

        With noising, 1 means the clean behaviour survives the patch and 0 that the patch destroys it.
        """
        gap = self.clean - self.corrupted
        if gap == 0:
            raise ValueError("the clean and corrupted runs give the same metric: nothing to normalise by")
        return (self.values - self.corrupted) / gap


class Cell(NamedTuple):
    """One patch: values[row, column] ← the metric with `head` (None: every head) at `pos` (None: every
    position) of the activation at `layer` taken from the source run."""

    row: int
    column: int
    layer: int
    head: int | None
    pos: int | None

    @property
    def start(self) -> int:
        """The first position the patch can change (causal attention leaves the ones before it alone)."""
        return 0 if self.pos is None else self.pos


def put_cell(activation: Tensor, saved: Tensor, cell: Cell, rows: slice, offset: int = 0) -> None:
    """Write the source run's value of `cell` into rows `rows` of `activation`, in place; `activation` holds
    positions offset … T − 1 (`saved`, all of them)."""
    if cell.head is None:
        activation[rows, cell.pos - offset] = saved[:, cell.pos]
    elif cell.pos is None:
        activation[rows, :, cell.head] = saved[:, :, cell.head]
    else:
        activation[rows, cell.pos - offset, cell.head] = saved[:, cell.pos, cell.head]


def check_inputs(model: Any, clean: Tensor, corrupted: Tensor) -> tuple[Tensor, Tensor]:
    clean = clean[None] if clean.ndim == 1 else clean
    corrupted = corrupted[None] if corrupted.ndim == 1 else corrupted
    if clean.shape != corrupted.shape:
        raise ValueError(
            f"clean {tuple(clean.shape)} and corrupted {tuple(corrupted.shape)} inputs must have "
            "the same shape: patching swaps activations position by position"
        )
    if hasattr(model, "check_tokens"):
        clean, corrupted = model.check_tokens(clean), model.check_tokens(corrupted)
    return clean, corrupted


def resolve_metric(metric: MetricFn | None, answer: Any, wrong: Any) -> MetricFn:
    if metric is not None:
        return metric
    if answer is None or wrong is None:
        raise ValueError("give a metric callback, or answer and wrong token ids for the default logit difference")
    return logit_diff(answer, wrong)


def runs_fast(model: Any) -> bool:
    """Whether the fast path applies: Forma's HookedTransformer with no hook of the caller's attached (the fast
    path skips the layers and positions a patch cannot change, where such a hook would have acted)."""
    if not isinstance(model, HookedTransformer):
        return False
    hooked = any(hp._forward_hooks or hp._backward_hooks for hp in model.hook_dict.values())
    return not hooked and not model._forward_pre_hooks and not model._forward_hooks


def _grid(
    model: Any, axis: str, n_pos: int, positions: Sequence[int] | None
) -> tuple[list[int], list[tuple[int | None, int | None]]]:
    """The cells a sweep's `axis` names, and each column's (head, position) to patch (None: all of it)."""
    if axis == "head":
        heads = list(range(model.cfg.n_heads))
        return heads, [(h, None) for h in heads]
    cells = _positions(n_pos, positions)
    if axis == "pos":
        return cells, [(None, p) for p in cells]
    return cells, [(h, p) for h in range(model.cfg.n_heads) for p in cells]


@dataclass(frozen=True)
class Sweep:
    """What one patching sweep patches: `component` at each cell of `axis` ("pos", "head" or "head_pos") over
    `positions` and `layers` (None: all), in `direction`, `max_batch` patched rows a forward pass, every pass from
    the embedding when `exhaustive`. patch_positions, patch_heads and patch_heads_by_position each make one."""

    component: str
    axis: str
    positions: Sequence[int] | None
    layers: Sequence[int] | None
    direction: str
    max_batch: int
    exhaustive: bool

    def __post_init__(self) -> None:
        if self.component not in COMPONENTS:
            raise ValueError(f"component must be one of {sorted(COMPONENTS)}, got {self.component!r}")
        if self.direction not in ("denoise", "noise"):
            raise ValueError(f"direction must be 'denoise' (clean into corrupted) or 'noise', got {self.direction!r}")
        if isinstance(self.max_batch, bool) or not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise ValueError(f"max_batch must be a positive integer (rows per forward pass), got {self.max_batch!r}")


@torch.inference_mode()
def _patch(model: Any, clean: Any, corrupted: Any, sweep: Sweep, metric: MetricFn) -> PatchingResult:
    """The sweep behind patch_positions, patch_heads and patch_heads_by_position."""
    clean, corrupted = check_inputs(model, clean, corrupted)
    cells, columns = _grid(model, sweep.axis, clean.shape[1], sweep.positions)
    layers = _layers(model, sweep.layers)
    component, direction = sweep.component, sweep.direction
    names = [COMPONENTS[component].format(layer=layer) for layer in layers]
    if hasattr(model, "check_hook_names"):
        model.check_hook_names(names)
    source, target = (clean, corrupted) if direction == "denoise" else (corrupted, clean)
    source_logits, cache = model.run_with_cache(source, names_filter=names)
    saved = {layer: cache[name] for layer, name in zip(layers, names)}
    todo = [Cell(i, j, layer, head, pos) for i, layer in enumerate(layers) for j, (head, pos) in enumerate(columns)]
    values = torch.empty(len(layers), len(columns))
    run = _sweep_exhaustive if sweep.exhaustive or not runs_fast(model) else _sweep_fast
    target_logits = run(model, target, component, saved, todo, metric, sweep.max_batch, values)
    clean_logits, corrupted_logits = (
        (source_logits, target_logits) if direction == "denoise" else (target_logits, source_logits)
    )
    if sweep.axis == "head_pos":
        values = values.view(len(layers), -1, len(cells))
    return PatchingResult(
        values,
        float(metric(clean_logits)),
        float(metric(corrupted_logits)),
        component,
        sweep.axis,
        list(cells),
        direction,
    )


def _chunks(cells: list[Cell], per_pass: int) -> list[list[Cell]]:
    return [cells[start : start + per_pass] for start in range(0, len(cells), per_pass)]


def _sweep_exhaustive(
    model: Any,
    target: Tensor,
    component: str,
    saved: dict[int, Tensor],
    cells: list[Cell],
    metric: MetricFn,
    max_batch: int,
    values: Tensor,
) -> Tensor:
    """Every patched run from the embedding, the cells of one layer `max_batch` rows to a pass; returns the
    target run's logits."""
    b = target.shape[0]
    for layer in dict.fromkeys(cell.layer for cell in cells):
        name = COMPONENTS[component].format(layer=layer)
        for chunk in _chunks([cell for cell in cells if cell.layer == layer], max(1, max_batch // b)):

            def put(activation: Tensor, hook: Any, chunk: list[Cell] = chunk, layer: int = layer) -> Tensor:
                patched = activation.clone()
                for k, cell in enumerate(chunk):
                    put_cell(patched, saved[layer], cell, slice(k * b, (k + 1) * b))
                return patched

            with model.hooks(fwd_hooks=[(name, put)]):
                logits = model(target.repeat(len(chunk), 1))
            for k, cell in enumerate(chunk):
                values[cell.row, cell.column] = float(metric(logits[k * b : (k + 1) * b]))
    return model(target)


def _sweep_fast(
    model: Any,
    target: Tensor,
    component: str,
    saved: dict[int, Tensor],
    cells: list[Cell],
    metric: MetricFn,
    max_batch: int,
    values: Tensor,
) -> Tensor:
    """Each patched run from its own layer and first changed position on (see the module's docstring); returns
    the target run's logits.

    A pass takes up to max_batch // batch cells of neighbouring first positions; it starts at the smallest, P,
    with the target run's keys and values of positions < P as every layer's KV cache. Its rows join at the
    cell's layer, from the target run's blocks.{layer}.hook_resid_pre at positions P … T − 1, and the cell is
    written in by a hook on that block's component. The unembedding runs at the positions the metric reads
    (`reads`), or at every position ≥ P when it declares none."""
    b, n_layers = target.shape[0], model.cfg.n_layers
    kv = KVCache.empty(n_layers)
    entering = sorted({cell.layer for cell in cells})
    target_logits, cache = model.run_with_cache(
        target, names_filter=[f"blocks.{layer}.hook_resid_pre" for layer in entering], kv_cache=kv
    )
    resid_pre = {layer: cache[f"blocks.{layer}.hook_resid_pre"] for layer in entering}
    read = reads(metric, target.shape[1])
    ordered = sorted(cells, key=lambda cell: (cell.start, cell.layer))
    for chunk in _chunks(ordered, max(1, max_batch // b)):
        first = min(cell.start for cell in chunk)
        rows: list[Cell] = []  # the chunk's cells in the order their rows joined the pass
        x: Tensor | None = None
        for layer in range(min(cell.layer for cell in chunk), n_layers):
            joining = [cell for cell in chunk if cell.layer == layer]
            if joining:
                fresh = resid_pre[layer][:, first:].repeat(len(joining), 1, 1)
                x = fresh if x is None else torch.cat([x, fresh])
            entry = _prefix(kv, layer, first, x.shape[0] // b)
            if joining:
                start = len(rows)

                def put(
                    activation: Tensor, hook: Any, joining: list[Cell] = joining, start: int = start, first: int = first
                ) -> Tensor:
                    for k, cell in enumerate(joining):
                        put_cell(
                            activation, saved[cell.layer], cell, slice((start + k) * b, (start + k + 1) * b), first
                        )
                    return activation

                rows += joining
                with model.hooks(fwd_hooks=[(COMPONENTS[component].format(layer=layer), put)]):
                    x = model.blocks[layer](x, entry)
            else:
                x = model.blocks[layer](x, entry)
        _score(model, metric, read, target_logits, x, first, rows, values)
    return target_logits


def _prefix(kv: KVCache, layer: int, first: int, copies: int) -> KVCacheEntry | None:
    """The KV cache a pass from position `first` on reads at `layer`: positions < first are the target run's in
    every row (`copies` of the batch), its keys and values; None when the pass starts at 0."""
    if first == 0:
        return None
    prefix = kv.entries[layer]
    return KVCacheEntry(
        prefix.keys[:, :first].repeat(copies, 1, 1, 1), prefix.values[:, :first].repeat(copies, 1, 1, 1)
    )


def _score(
    model: Any,
    metric: MetricFn,
    read: list[int] | None,
    target_logits: Tensor,
    x: Tensor,
    first: int,
    rows: list[Cell],
    values: Tensor,
) -> None:
    """Unembed a pass's residual stream `x` (positions `first` … T − 1) at the positions the metric reads, and
    write each row's cell its metric of the patched logits (the target run's before `first`)."""
    b = target_logits.shape[0]
    if read is None:
        logits = model.unembed(model.ln_final(x))  # [rows·batch, T − first, d_vocab]
        for k, cell in enumerate(rows):
            patched = torch.cat([target_logits[:, :first], logits[k * b : (k + 1) * b]], dim=1)
            values[cell.row, cell.column] = float(metric(patched))
        return
    late = [p for p in read if p >= first]  # the positions the metric reads that the patch can change
    early = [p for p in read if p < first]
    logits = model.unembed(model.ln_final(x[:, [p - first for p in late]]))
    for k, cell in enumerate(rows):
        patched = torch.full_like(target_logits, float("nan"))  # what the metric says it never reads
        patched[:, early] = target_logits[:, early]
        patched[:, late] = logits[k * b : (k + 1) * b]
        values[cell.row, cell.column] = float(metric(patched))


def _layers(model: Any, layers: Sequence[int] | None) -> list[int]:
    n_layers = model.cfg.n_layers
    chosen = list(range(n_layers)) if layers is None else [int(l) for l in layers]
    bad = [l for l in chosen if not 0 <= l < n_layers]
    if bad:
        raise ValueError(f"layers {bad} out of range for a model with {n_layers} layers")
    return chosen


def _positions(n_pos: int, positions: Sequence[int] | None) -> list[int]:
    if positions is None:
        return list(range(n_pos))
    bad = [p for p in positions if not -n_pos <= p < n_pos]
    if bad:
        raise ValueError(f"positions {bad} out of range for inputs of {n_pos} positions")
    return [p % n_pos for p in positions]


def patch_positions(
    model: Any,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    component: Literal["resid_pre", "attn_out", "mlp_out", "resid_post"] = "resid_pre",
    metric: MetricFn | None = None,
    *,
    answer: Any = None,
    wrong: Any = None,
    layers: Sequence[int] | None = None,
    positions: Sequence[int] | None = None,
    direction: Literal["denoise", "noise"] = "denoise",
    max_batch: int = 64,
    exhaustive: bool = False,
) -> PatchingResult:
    """Patch one (layer, position) of `component` at a time; values is [layer, position].

    exhaustive=True runs every patched pass from the embedding (the reference; what any other model gets)."""
    if component == "z":
        raise ValueError("hook_z is patched by head: use patch_heads or patch_heads_by_position")
    sweep = Sweep(component, "pos", positions, layers, direction, max_batch, exhaustive)
    return _patch(model, clean, corrupted, sweep, resolve_metric(metric, answer, wrong))


def patch_heads(
    model: Any,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: MetricFn | None = None,
    *,
    answer: Any = None,
    wrong: Any = None,
    layers: Sequence[int] | None = None,
    direction: Literal["denoise", "noise"] = "denoise",
    max_batch: int = 64,
    exhaustive: bool = False,
) -> PatchingResult:
    """Patch one head's output z (every position) at a time; values is [layer, head]."""
    sweep = Sweep("z", "head", None, layers, direction, max_batch, exhaustive)
    return _patch(model, clean, corrupted, sweep, resolve_metric(metric, answer, wrong))


def patch_heads_by_position(
    model: Any,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: MetricFn | None = None,
    *,
    answer: Any = None,
    wrong: Any = None,
    layers: Sequence[int] | None = None,
    positions: Sequence[int] | None = None,
    direction: Literal["denoise", "noise"] = "denoise",
    max_batch: int = 64,
    exhaustive: bool = False,
) -> PatchingResult:
    """Patch one head's z at one position at a time; values is [layer, head, position] (TransformerLens's
    get_act_patch_attn_head_out_by_pos gives the same numbers as [layer, position, head])."""
    sweep = Sweep("z", "head_pos", positions, layers, direction, max_batch, exhaustive)
    return _patch(model, clean, corrupted, sweep, resolve_metric(metric, answer, wrong))
