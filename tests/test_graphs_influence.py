"""lab.analysis.graphs.influence: influence, pruning and the share of influence by position."""

import pytest
import torch

from lab.analysis.graphs.graph import Graph
from lab.analysis.graphs.influence import graph_scores, node_influence, position_share, prune


def chain() -> Graph:
    """Two tokens, one layer, two features: token 0 → feature 0 → logit; token 1 → feature 1 → logit, with the
    second path four times as strong, and nothing else."""
    n = 2 + 2 + 2 + 1  # features, errors (1 layer × 2 positions), tokens, logit
    A = torch.zeros(n, n)
    A[0, 4] = 1.0  # token 0 → feature 0
    A[1, 5] = 2.0  # token 1 → feature 1
    A[6, 0] = 1.0  # feature 0 → logit
    A[6, 1] = 4.0  # feature 1 → logit
    return Graph(tokens=torch.tensor([7, 8]), features=torch.tensor([[0, 0, 3], [0, 1, 5]]),
                 activations=torch.ones(2), logit_tokens=torch.tensor([9]), logit_probs=torch.tensor([1.0]),
                 adjacency=A, inputs=torch.zeros(n), bias=torch.zeros(n), n_layers=1)


def test_influence_is_the_path_share_into_the_logits():
    g = chain()
    influence = node_influence(g)
    torch.testing.assert_close(influence[:2], torch.tensor([0.2, 0.8]))  # the logit's inputs as shares
    torch.testing.assert_close(influence[4:6], torch.tensor([0.2, 0.8]))  # each token through its feature alone
    assert position_share(g, [1]) == pytest.approx(0.8) and position_share(g, [-2, -1]) == pytest.approx(1.0)
    assert graph_scores(g)["replacement"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="outside a prompt of 2 tokens"):
        position_share(g, [2])


def test_pruning_keeps_the_strong_path_and_reports_the_shares():
    g = chain()
    pruned = prune(g, node_threshold=0.7, edge_threshold=0.7)
    assert pruned.node_mask.tolist() == [False, True, False, False, True, True, True]
    assert pruned.node_share == pytest.approx((0.8 + 0.2 + 0.8) / 2.0)  # feature 1 and the tokens (always kept)
    everything = prune(g, 1.0, 1.0)
    assert everything.node_share == pytest.approx(1.0) and everything.edge_share == pytest.approx(1.0)
    with pytest.raises(ValueError, match="node_threshold must lie in"):
        prune(g, 1.5)
