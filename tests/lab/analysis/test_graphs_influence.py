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
    return Graph(
        tokens=torch.tensor([7, 8]),
        features=torch.tensor([[0, 0, 3], [0, 1, 5]]),
        activations=torch.ones(2),
        logit_tokens=torch.tensor([9]),
        logit_probs=torch.tensor([1.0]),
        adjacency=A,
        inputs=torch.zeros(n),
        bias=torch.zeros(n),
        n_layers=1,
    )


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


@pytest.mark.usefixtures("one_thread")
def test_on_an_order_2_markov_world_the_influence_runs_through_the_last_two_tokens(tmp_path):
    """A model trained on an order-2 Markov source (the next token depends on the last two alone), transcoders
    trained on its harvest: in every prompt's graph the last two positions carry the most token influence, and
    together most of it (chance: 2 of 12)."""
    from lab import HookedTransformer, ModelConfig
    from lab.analysis.activations.store import save_activations
    from lab.analysis.graphs.attribute import attribute
    from lab.analysis.graphs.influence import position_influence
    from lab.analysis.transcoders.model import TranscoderConfig
    from lab.analysis.transcoders.train import TranscoderTraining, train_transcoders
    from lab.data.sources import MarkovSource
    from lab.train.batches import TokenStream
    from lab.train.config import TrainConfig
    from lab.train.loop import train

    source = MarkovSource(vocab_size=8, order=2, concentration=0.3, seed=0)
    data = TokenStream(
        torch.from_numpy(source.sample(512, 64, seed=1)), torch.from_numpy(source.sample(32, 64, seed=2))
    )
    model = HookedTransformer(ModelConfig(d_vocab=8, d_model=32, n_layers=2, n_heads=2, n_ctx=16, mlp="relu"), seed=0)
    train(
        model,
        TrainConfig(
            steps=300,
            batch_size=32,
            seq_len=16,
            lr=1e-2,
            min_lr=1e-3,
            warmup_steps=20,
            eval_interval=100,
            eval_batches=2,
        ),
        data,
        progress=False,
    )
    model.eval()
    cfg = TranscoderConfig(d_model=32, n_layers=2, d_features=128, activation="topk", k=8)
    store = save_activations(
        model,
        torch.from_numpy(source.sample(128, 16, seed=3)).long(),
        cfg.hooks(),
        tmp_path / "h",
        positions="all",
        progress=False,
    )
    transcoders = train_transcoders(store, cfg, TranscoderTraining(steps=300, batch_size=128, lr=3e-3), tmp_path / "t")
    shares = []
    for prompt in torch.from_numpy(source.sample(6, 12, seed=4)).long():
        graph = attribute(model, transcoders, prompt)
        by_position = position_influence(graph)
        assert set(by_position.topk(2).indices.tolist()) == {10, 11}, by_position
        shares.append(position_share(graph, [-2, -1]))
    assert sum(shares) / len(shares) > 0.6, shares
