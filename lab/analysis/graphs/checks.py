"""Checks of a graph against the models it describes.

- `node_residuals`: input − (Σ incoming edges + bias) for every feature and logit node (0 to float round-off).
- `replacement_logits`: the local replacement model run forward — frozen patterns and norm scales, every MLP its
  transcoder (features recomputed from the replacement's own inputs) plus the prompt's error vector — reproduces the
  model's logits on the prompt.
- `frozen_ablation`: a source removed in the frozen replacement with every other source held fixed moves each
  target's input by minus its edge (the meaning of an edge).
- `intervention_agreement`: a feature ablated (or scaled) in the full model — live attention, norms and MLPs —
  moves the logits as the graph predicts: its total effect through the graph's active features (direct edge plus
  the paths through later features, each passing changes at slope 1 while active), compared over the features of
  the top edges into the logits by Pearson correlation and sign agreement.
"""

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from lab.analysis.graphs.attribute import feature_targets, logit_target_vectors
from lab.analysis.graphs.graph import Graph
from lab.analysis.graphs.replacement import LocalReplacement
from lab.analysis.transcoders.model import Transcoders

# what an intervention may hold fixed: hooks by the end of their names ("norms" is every norm, the final one too)
FROZEN_KINDS = {"attention": "hook_pattern", "norms": "hook_scale", "final_norm": "ln_final.hook_scale"}


def node_residuals(graph: Graph) -> Tensor:
    """[n_features + n_logits]: each target node's input less the sum of its incoming edges and its bias."""
    rows = torch.cat([torch.arange(graph.n_features), torch.arange(graph.n_nodes - graph.n_logits, graph.n_nodes)])
    return graph.inputs[rows] - (graph.adjacency[rows].double().sum(1).float() + graph.bias[rows])


@torch.no_grad()
def replacement_logits(model: Any, transcoders: Transcoders, tokens: Tensor) -> Tensor:
    """[pos, d_vocab] logits of the local replacement model of `tokens` (see the module's docstring)."""
    replacement = LocalReplacement(model, transcoders, tokens)
    tc = transcoders.cfg
    acts: dict[int, Tensor] = {}

    def read(x: Tensor, hook: Any, layer: int) -> None:
        acts[layer] = transcoders.activate(transcoders.encode(x.float(), layer), layer)

    def write(out: Tensor, hook: Any, layer: int) -> Tensor:
        total = transcoders.b_dec[layer].float() + replacement.errors[layer].float()
        for source in range(layer + 1) if tc.cross_layer else (layer,):
            total = total + acts[source] @ transcoders.decoder(source, torch.arange(tc.d_features), layer).float()
        return total.to(out.dtype).expand_as(out).contiguous()

    def freeze(value: Tensor, hook: Any) -> Tensor:
        return replacement.cache[hook.name].to(value.dtype)

    hooks = [(name, freeze) for name in replacement.frozen]
    for layer in range(tc.n_layers):
        hooks.append((tc.hook("input", layer), lambda x, hook, layer=layer: read(x, hook, layer)))
        hooks.append((tc.hook("output", layer), lambda out, hook, layer=layer: write(out, hook, layer)))
    with model.hooks(fwd_hooks=hooks):
        return model(tokens.reshape(1, -1))[0]


def source_edit(transcoders: Transcoders, graph: Graph, index: int, factor: float) -> list[tuple[str, Any]]:
    """Hooks adding (factor − 1)·a·W_dec[l → l'] of feature node `index` to every output layer l' it writes."""
    layer, pos, feature = (int(v) for v in graph.features[index])
    return feature_edit(transcoders, layer, pos, feature, (factor - 1.0) * float(graph.activations[index]))


def feature_edit(transcoders: Transcoders, layer: int, pos: int, feature: int, amount: float) -> list[tuple[str, Any]]:
    """Hooks adding amount·W_dec[l → l'] of `feature` of layer l at position `pos` to every output layer l' it
    writes (l alone for per-layer transcoders)."""
    tc = transcoders.cfg
    hooks = []
    for target in range(layer, tc.n_layers) if tc.cross_layer else (layer,):
        delta = amount * transcoders.decoder(layer, torch.tensor([feature]), target)[0].detach()

        def add(out: Tensor, hook: Any, delta: Tensor = delta) -> Tensor:
            out = out.clone()
            out[:, pos] += delta.to(out.dtype)
            return out

        hooks.append((tc.hook("output", target), add))
    return hooks


@torch.no_grad()
def frozen_ablation(model: Any, transcoders: Transcoders, graph: Graph, index: int) -> Tensor:
    """[n_nodes]: how feature node `index`'s removal moves every feature's and logit's input in the frozen
    replacement, all other sources held fixed (0 for sources): minus its column of edges, to float round-off."""
    replacement = LocalReplacement(model, transcoders, graph.tokens, max_features=graph.meta.get("max_feature_nodes"))
    targets = feature_targets(replacement) + logit_target_vectors(replacement, graph.logit_tokens)
    before = replacement.values(targets)
    after = replacement.values(targets, edits=source_edit(transcoders, graph, index, 0.0))
    out = torch.zeros(graph.n_nodes)
    rows = torch.cat([torch.arange(graph.n_features), torch.arange(graph.n_nodes - graph.n_logits, graph.n_nodes)])
    out[rows] = after - before
    return out


def total_effects(graph: Graph, sources: Tensor) -> Tensor:
    """[len(sources), n_logits]: the graph's prediction of how each source node's whole output moves each logit
    node: its direct edge plus its paths through active features (each feature's edges out per unit of activation,
    passing a change in its input at slope 1)."""
    n_f = graph.n_features
    A = graph.adjacency.double()
    per_unit = A[:, :n_f] / graph.activations.double().clamp_min(1e-12)  # the edge of one unit of activation
    change = A[:n_f][:, sources]  # [n_f, k]: the first step into the features
    total = change.clone()
    for _ in range(graph.n_layers):
        change = per_unit[:n_f] @ change
        total += change
    logits = slice(graph.n_nodes - graph.n_logits, graph.n_nodes)
    return (A[logits][:, sources] + per_unit[logits] @ total).T.float()


@torch.no_grad()
def demeaned_logits(model: Any, tokens: Tensor, hooks: list[tuple[str, Any]], targets: Tensor) -> Tensor:
    with model.hooks(fwd_hooks=hooks):
        logits = model(tokens.reshape(1, -1))[0, -1].float()
    return logits[targets] - logits.mean()


def intervention_agreement(
    model: Any,
    transcoders: Transcoders,
    graph: Graph,
    *,
    top: int = 10,
    factor: float = 0.0,
    freeze: Sequence[str] = (),
) -> dict[str, Any]:
    """Ablate (factor 0) or scale each of the `top` features with the largest edges into the logits, in the full
    model, and compare the change of every logit node with the graph's prediction (factor − 1)·total effect.
    freeze: what is held at the prompt's values, leaving the MLPs live: "attention" (the patterns), "norms" (every
    norm's scale), "final_norm" (the final norm's alone); attention and norms together are the graph's own
    assumptions (circuit-tracer's default for its interventions); nothing frozen is the full model. Returns the
    features, both matrices [top, n_logits], and their Pearson correlation and sign agreement (over the pairs the
    graph predicts a change for), and the same for the direct edges alone. A feature whose intervention drives the
    logits non-finite (a model held far from its prompt's values overflows: frozen norm scales with a massive
    activation removed) is left out of both and counted as `non_finite`."""
    logits = slice(graph.n_nodes - graph.n_logits, graph.n_nodes)
    strength = graph.adjacency[logits, : graph.n_features].abs().sum(0)
    chosen = strength.argsort(descending=True)[: min(top, graph.n_features)]
    predicted = (factor - 1.0) * total_effects(graph, chosen)
    direct = (factor - 1.0) * graph.adjacency[logits][:, chosen].T
    unknown = set(freeze) - set(FROZEN_KINDS)
    if unknown:
        raise ValueError(f"freeze names {sorted(FROZEN_KINDS)}, not {sorted(unknown)}")
    frozen: list[tuple[str, Any]] = []
    if freeze:
        replacement = LocalReplacement(model, transcoders, graph.tokens)
        frozen = [
            (name, lambda value, hook, r=replacement: r.cache[hook.name].to(value.dtype))
            for name in replacement.frozen
            if any(name.endswith(FROZEN_KINDS[kind]) for kind in freeze)
        ]
    base = demeaned_logits(model, graph.tokens, frozen, graph.logit_tokens)
    actual = torch.stack(
        [
            demeaned_logits(
                model, graph.tokens, frozen + source_edit(transcoders, graph, int(i), factor), graph.logit_tokens
            )
            - base
            for i in chosen
        ]
    )
    return {
        "features": [graph.node(int(i))["id"] for i in chosen],
        "predicted": predicted,
        "direct": direct,
        "actual": actual,
        **{f"{k}": v for k, v in _agreement(predicted, actual).items()},
        **{f"direct_{k}": v for k, v in _agreement(direct, actual).items()},
    }


def _agreement(predicted: Tensor, actual: Tensor) -> dict[str, float]:
    """Pearson correlation and sign agreement over the pairs the graph predicts a change for, leaving out the
    features whose intervention drove the model's logits non-finite (counted apart: `non_finite`)."""
    finite = actual.isfinite().all(dim=1)
    p, a = predicted[finite].flatten().double(), actual[finite].flatten().double()
    out = {"non_finite": int((~finite).sum())}
    if len(p) == 0:
        return {"correlation": float("nan"), "sign_agreement": float("nan"), "pairs": 0, **out}
    keep = p.abs() > 1e-6 * p.abs().max().clamp_min(1e-30)
    p, a = p[keep], a[keep]
    if len(p) < 2:
        return {"correlation": float("nan"), "sign_agreement": float("nan"), "pairs": int(len(p)), **out}
    correlation = float(torch.corrcoef(torch.stack([p, a]))[0, 1])
    return {
        "correlation": correlation,
        "sign_agreement": float((p.sign() == a.sign()).double().mean()),
        "pairs": int(len(p)),
        **out,
    }
