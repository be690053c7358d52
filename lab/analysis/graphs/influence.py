"""Influence and pruning, as the paper defines them (Ameisen et al. 2025, §"Graph pruning"; circuit-tracer's
graph.py): with Â the adjacency's absolute values, each row normalised to sum to 1 (a target's inputs as shares),
and w the logit nodes' probabilities, a node's influence is its total share in the logits over every path,

    influence = w (Â + Â² + Â³ + …)           (finite: the graph has no cycles)

Nodes are kept in order of influence until `node_threshold` of the total is kept (tokens and logits always stay);
then each edge is scored by its share times its target's influence (plus its weight for logits) on the graph of
kept nodes, and edges are kept until `edge_threshold` of the total edge score is; nodes left without a kept edge
out (or, for features, in) go, repeatedly. The paper's thresholds are 0.8 and 0.98.

Also here: the replacement and completeness scores (the share of the path influence from the tokens rather than
the error nodes; the influence-weighted share of each node's inputs that come from non-error nodes), and the
share of the tokens' path influence at chosen positions (`position_share`), the graph's grade on a world whose
relevant positions are known.
"""

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from lab.analysis.graphs.graph import Graph


def normalized(adjacency: Tensor) -> Tensor:
    magnitude = adjacency.abs()
    return magnitude / magnitude.sum(dim=1, keepdim=True).clamp_min(1e-10)


def path_influence(shares: Tensor, weights: Tensor, max_iter: int = 1000) -> Tensor:
    """w (A + A² + …) for a nilpotent A (an acyclic graph), by repeated products until nothing is left."""
    current = weights @ shares
    total = current.clone()
    for _ in range(max_iter):
        if not bool(current.any()):
            return total
        current = current @ shares
        total += current
    raise RuntimeError("influence did not converge: the adjacency has a cycle")


def logit_weights(graph: Graph) -> Tensor:
    weights = torch.zeros(graph.n_nodes)
    weights[graph.n_nodes - graph.n_logits :] = graph.logit_probs.float()
    return weights


def node_influence(graph: Graph) -> Tensor:
    return path_influence(normalized(graph.adjacency.float()), logit_weights(graph))


def _threshold(scores: Tensor, share: float) -> Tensor:
    """The smallest score among the top scores that together hold `share` of the total."""
    ordered = scores.flatten().sort(descending=True).values
    cumulative = ordered.cumsum(0) / ordered.sum().clamp_min(1e-30)
    index = min(int(torch.searchsorted(cumulative, torch.tensor(share, dtype=cumulative.dtype))), len(ordered) - 1)
    return ordered[index]


@dataclass(frozen=True)
class Pruned:
    """What pruning keeps, and the shares it keeps."""

    node_mask: Tensor  # [n_nodes] bool
    edge_mask: Tensor  # [n_nodes, n_nodes] bool
    cumulative: Tensor  # [n_nodes]: each node's cumulative influence share when nodes are ranked by influence
    node_share: float  # share of the total node influence held by the kept nodes
    edge_share: float  # share of the total edge score held by the kept edges


def prune(graph: Graph, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> Pruned:
    """The paper's pruning (circuit-tracer's `prune_graph`), reporting the shares of influence kept."""
    for name, value in (("node_threshold", node_threshold), ("edge_threshold", edge_threshold)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must lie in [0, 1], got {value}")
    n_keep_always = graph.n_logits + graph.n_pos
    weights = logit_weights(graph)
    influence = path_influence(normalized(graph.adjacency.float()), weights)
    node_mask = influence >= _threshold(influence, node_threshold)
    node_mask[-n_keep_always:] = True
    pruned = graph.adjacency.float().clone()
    pruned[~node_mask] = 0
    pruned[:, ~node_mask] = 0
    shares = normalized(pruned)
    edge_scores = shares * (path_influence(shares, weights) + weights)[:, None]
    edge_mask = edge_scores >= _threshold(edge_scores, edge_threshold)
    before = None
    while before is None or not torch.equal(before, node_mask):
        before = node_mask.clone()
        edge_mask[~node_mask] = False
        edge_mask[:, ~node_mask] = False
        node_mask[:-n_keep_always] &= edge_mask[:, :-n_keep_always].any(0)  # a kept feature or error has an edge out
        node_mask[: graph.n_features] &= edge_mask[: graph.n_features].any(1)  # and a kept feature an edge in
    ordered, index = influence.sort(descending=True)
    cumulative = torch.zeros_like(influence)
    cumulative[index] = ordered.cumsum(0) / ordered.sum().clamp_min(1e-30)
    total = float(influence[: -graph.n_logits].sum())
    node_share = float(influence[: -graph.n_logits][node_mask[: -graph.n_logits]].sum()) / total if total else 1.0
    edge_total = float(edge_scores.sum())
    edge_share = float(edge_scores[edge_mask].sum()) / edge_total if edge_total else 1.0
    return Pruned(node_mask, edge_mask, cumulative, node_share, edge_share)


def graph_scores(graph: Graph) -> dict[str, float]:
    """The replacement score (the tokens' share of the path influence that tokens and error nodes carry to the
    logits) and the completeness score (the influence-weighted share of nodes' inputs from non-error nodes)."""
    shares = normalized(graph.adjacency.float())
    weights = logit_weights(graph)
    influence = path_influence(shares, weights)
    errors = slice(graph.n_features, graph.n_features + graph.n_layers * graph.n_pos)
    tokens = slice(errors.stop, errors.stop + graph.n_pos)
    token, error = float(influence[tokens].sum()), float(influence[errors].sum())
    output = influence + weights
    complete = float(((1 - shares[:, errors].sum(-1)) * output).sum() / output.sum())
    return {"replacement": token / (token + error) if token + error else float("nan"), "completeness": complete}


def position_influence(graph: Graph) -> Tensor:
    """[n_pos]: the path influence on the logits of the token embedding at each position, as shares summing to 1.
    Every path from the prompt to the logits starts at a token embedding (error nodes aside), so this is where the
    graph says the prediction's information comes from."""
    influence = node_influence(graph)
    start = graph.token_index(0)
    tokens = influence[start : start + graph.n_pos]
    return tokens / tokens.sum().clamp_min(1e-30)


def position_share(graph: Graph, relevant: Iterable[int]) -> float:
    """The share of the tokens' path influence at the `relevant` positions (negative ones count from the end): 1
    when the graph routes the prediction through them alone. The graph-side grade on a world with known relevant
    positions (the last k tokens of an order-k Markov source, the copied token, the subject's name)."""
    relevant = [int(p) for p in relevant]
    if not relevant:
        raise ValueError("name at least one relevant position")
    for p in relevant:
        if not -graph.n_pos <= p < graph.n_pos:
            raise ValueError(f"position {p} is outside a prompt of {graph.n_pos} tokens")
    positions = sorted({p % graph.n_pos for p in relevant})
    return float(position_influence(graph)[positions].sum())
