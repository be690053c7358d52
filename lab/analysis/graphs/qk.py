"""Attention explained: which features make a head attend where it does. An edge through attention in the graph
carries value-side information with the pattern frozen; what set the pattern is the score

    score(t, s) = ⟨q_t, k_s⟩ / √d_head       (q_t of head h at the query position, k_s of its key/value head)

In the frozen replacement q_t and k_s are linear in the sources (as every node input is), q_t = Σ_i q_i + q_bias and
k_s = Σ_j k_j + k_bias, each q_i (k_j) the source's contribution found by d_head backward passes. So the score is
exactly a sum over (query source, key source) pairs plus the bias terms:

    score = Σ_ij ⟨q_i, k_j⟩/√d + ⟨q_bias, k⟩/√d + ⟨q − q_bias, k_bias⟩/√d

`qk_attribution` returns every source's share on each side and the strongest pairs, with node ids as the graph's.
Rotary heads are read after the rotation (hook_rot_q, hook_rot_k), where the score is formed.
"""

import math
from typing import Any

import torch

from lab.analysis.graphs.graph import Graph
from lab.analysis.graphs.replacement import LocalReplacement, Target
from lab.analysis.transcoders.model import Transcoders


def _side_targets(model: Any, layer: int, which: str, head: int, pos: int) -> list[Target]:
    attn = model.blocks[layer].attn
    rotary = getattr(attn, "rotates", False)
    hook = f"blocks.{layer}.attn.hook_{'rot_' if rotary else ''}{which}"
    heads = attn.n_heads if which == "q" else attn.n_kv_heads
    targets = []
    for j in range(attn.d_head):
        vector = torch.zeros(heads, attn.d_head)
        vector[head, j] = 1.0
        targets.append(Target(hook, pos, vector))
    return targets


@torch.no_grad()
def qk_attribution(
    model: Any,
    transcoders: Transcoders,
    graph: Graph,
    layer: int,
    head: int,
    query_pos: int,
    key_pos: int,
    *,
    top: int = 10,
    batch_size: int = 128,
) -> dict[str, Any]:
    """The score of head `head` of layer `layer` from `query_pos` to `key_pos`, split over pairs of source nodes."""
    if not 0 <= key_pos <= query_pos < graph.n_pos:
        raise ValueError(f"need 0 <= key_pos <= query_pos < {graph.n_pos} (a causal head), got {key_pos}, {query_pos}")
    attn = model.blocks[layer].attn
    if not 0 <= head < attn.n_heads:
        raise ValueError(f"layer {layer} has {attn.n_heads} heads, not head {head}")
    kv_head = head * attn.n_kv_heads // attn.n_heads
    replacement = LocalReplacement(model, transcoders, graph.tokens, batch_size=batch_size)
    q_targets = _side_targets(model, layer, "q", head, query_pos)
    k_targets = _side_targets(model, layer, "k", kv_head, key_pos)
    with torch.enable_grad():
        q_parts = replacement.rows(q_targets).double()  # [d_head, n_sources]: column i is source i's q_i
        k_parts = replacement.rows(k_targets).double()
    q_total, k_total = replacement.values(q_targets).double(), replacement.values(k_targets).double()
    q_bias = replacement.values(q_targets, sources=False).double()
    k_bias = replacement.values(k_targets, sources=False).double()
    scale = 1.0 / math.sqrt(attn.d_head)
    actual = _score(model, graph.tokens, layer, head, query_pos, key_pos)
    q_live = torch.nonzero(q_parts.abs().sum(0) > 0).flatten()
    k_live = torch.nonzero(k_parts.abs().sum(0) > 0).flatten()
    pairs = scale * q_parts[:, q_live].T @ k_parts[:, k_live]  # [q sources, k sources]
    bias_terms = scale * (float(q_bias @ k_total) + float((q_total - q_bias) @ k_bias))
    ids = graph.node_ids()
    flat = pairs.flatten()
    best = flat.abs().argsort(descending=True)[:top]
    top_pairs = [
        {"query": ids[int(q_live[i // len(k_live)])], "key": ids[int(k_live[i % len(k_live)])], "score": float(flat[i])}
        for i in best.tolist()
    ]
    query_side = scale * q_parts.T @ k_total  # each query source with the whole key
    key_side = scale * k_parts.T @ q_total
    return {
        "layer": layer,
        "head": head,
        "query_pos": query_pos,
        "key_pos": key_pos,
        "score": actual,
        "pairs_sum": float(pairs.sum()),
        "bias_terms": bias_terms,
        "reconstructed": float(pairs.sum()) + bias_terms,
        "top_pairs": top_pairs,
        "query_sources": _ranked(query_side, ids, top),
        "key_sources": _ranked(key_side, ids, top),
    }


def _score(model: Any, tokens: torch.Tensor, layer: int, head: int, query_pos: int, key_pos: int) -> float:
    """The model's own attention score of the head from query_pos to key_pos (hook_attn_scores) on `tokens`."""
    cached = {}

    def keep(value: torch.Tensor, hook: Any) -> None:
        cached["scores"] = value

    with model.hooks(fwd_hooks=[(f"blocks.{layer}.attn.hook_attn_scores", keep)]):
        model(tokens.reshape(1, -1))
    return float(cached["scores"][0, head, query_pos, key_pos])


def _ranked(values: torch.Tensor, ids: list[str], top: int) -> list[dict[str, Any]]:
    order = values.abs().argsort(descending=True)[:top]
    return [{"node": ids[int(i)], "score": float(values[i])} for i in order.tolist() if float(values[i]) != 0.0]
