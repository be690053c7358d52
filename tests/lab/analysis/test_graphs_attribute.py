"""lab.analysis.graphs.attribute and .replacement: the graph is exact in the local replacement model."""

import math

import pytest
import torch

from lab.analysis.graphs.attribute import attribute, logit_targets
from lab.analysis.graphs.checks import frozen_ablation, node_residuals, replacement_logits
from lab.analysis.graphs.replacement import LocalReplacement
from tests.builders import ARCHITECTURES, exact_transcoders, random_transcoders, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")
TOKENS = torch.randint(0, 50, (14,), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("cross_layer", [False, True], ids=["per-layer", "cross-layer"])
@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_each_node_input_is_its_edges_plus_its_bias_and_the_replacement_gives_the_logits(architecture, cross_layer):
    model = tiny_model(architecture)
    tc = random_transcoders(model, cross_layer=cross_layer)
    graph = attribute(model, tc, TOKENS, batch_size=16)
    assert graph.n_features > 50  # features at every layer take part
    scale = graph.inputs.abs().max()
    assert node_residuals(graph).abs().max() < 1e-5 * scale
    assert graph.adjacency[: graph.n_features, : graph.n_features].abs().max() > 1e-3 * scale  # edges between features
    logits = model(TOKENS[None])[0]
    torch.testing.assert_close(replacement_logits(model, tc, TOKENS), logits, atol=1e-5, rtol=1e-5)
    last = logits[-1]
    torch.testing.assert_close(graph.inputs[-graph.n_logits :], last[graph.logit_tokens] - last.mean())


def test_an_edge_is_what_removing_its_source_does_with_every_other_source_held():
    model = tiny_model("llama")
    tc = random_transcoders(model, cross_layer=True)
    graph = attribute(model, tc, TOKENS)
    strongest = graph.adjacency[:, : graph.n_features].abs().sum(0).argsort(descending=True)[:3]
    for index in strongest.tolist():
        moved = frozen_ablation(model, tc, graph, index)
        assert moved.abs().max() > 1e-3
        torch.testing.assert_close(moved, -graph.adjacency[:, index], atol=2e-6, rtol=1e-4)


def test_chunks_of_positions_give_the_same_graph_as_one_batch(monkeypatch):
    """… and share forward passes: a chunk reuses the pass over any prefix at most twice its own, so n tokens take at
    most ⌈log₂ n⌉ + 1 forward passes however many chunks there are."""
    model = tiny_model()
    tc = random_transcoders(model)
    lengths = []
    run = LocalReplacement.run
    monkeypatch.setattr(
        LocalReplacement, "run", lambda self, length, *a, **k: lengths.append(length) or run(self, length, *a, **k)
    )
    small = attribute(model, tc, TOKENS, batch_size=7)
    passes = lengths[:-2]  # the last two: each node's input and bias over the whole prompt (LocalReplacement.values)
    assert small.n_nodes > 8 * 7 and len(passes) <= math.ceil(math.log2(len(TOKENS))) + 1, passes
    whole = attribute(model, tc, TOKENS, batch_size=4096)
    torch.testing.assert_close(small.adjacency, whole.adjacency, atol=1e-6, rtol=1e-5)
    # causal: no edge from a later position into an earlier one
    pos = torch.tensor([graph_pos(small, i) for i in range(small.n_nodes)])
    later = pos[None, :] > pos[:, None]
    assert small.adjacency[later].abs().max() == 0


@pytest.mark.parametrize("cross_layer", [False, True], ids=["per-layer", "cross-layer"])
def test_a_node_budget_keeps_the_largest_features_and_folds_the_rest_into_the_error_nodes(cross_layer):
    model = tiny_model("llama")
    tc = random_transcoders(model, cross_layer=cross_layer)
    whole = attribute(model, tc, TOKENS)
    budget = whole.n_features // 4
    graph = attribute(model, tc, TOKENS, max_feature_nodes=budget)
    assert graph.n_features == budget and graph.meta["n_active_features"] == whole.n_features
    layer, feature = whole.features[:, 0], whole.features[:, 2]
    score = whole.activations * tc.decoder_norms().detach()[layer, feature]
    largest = {tuple(f) for f in whole.features[score.argsort(descending=True)[:budget]].tolist()}
    assert {tuple(f) for f in graph.features.tolist()} == largest
    assert node_residuals(graph).abs().max() < 1e-5 * graph.inputs.abs().max()  # still exact: the rest are errors
    kept_rows = [whole.features.tolist().index(f) for f in graph.features.tolist()]
    torch.testing.assert_close(graph.inputs[: graph.n_features], whole.inputs[kept_rows])
    torch.testing.assert_close(graph.inputs[-graph.n_logits :], whole.inputs[-whole.n_logits :])
    # a dropped feature's output now flows through the error nodes: into each logit, the error edges gain its edge
    n_err = graph.n_layers * graph.n_pos
    dropped = [i for i, f in enumerate(whole.features.tolist()) if tuple(f) not in largest]
    logits_now, logits_then = graph.adjacency[-graph.n_logits :], whole.adjacency[-whole.n_logits :]
    errors_then = logits_then[:, whole.n_features : whole.n_features + n_err].sum(1)
    torch.testing.assert_close(
        logits_now[:, graph.n_features : graph.n_features + n_err].sum(1),
        errors_then + logits_then[:, dropped].sum(1),
        atol=1e-5,
        rtol=1e-4,
    )
    assert logits_then[:, dropped].abs().sum() > 0.1 * errors_then.abs().sum()  # the folded part is not negligible
    index = int(graph.adjacency[:, : graph.n_features].abs().sum(0).argmax())
    torch.testing.assert_close(
        frozen_ablation(model, tc, graph, index), -graph.adjacency[:, index], atol=2e-6, rtol=1e-4
    )
    same = attribute(model, tc, TOKENS, max_feature_nodes=whole.n_features)
    torch.testing.assert_close(same.adjacency, whole.adjacency)
    with pytest.raises(ValueError, match="max_features is a whole number"):
        attribute(model, tc, TOKENS, max_feature_nodes=-1)


def graph_pos(graph, index):
    return graph.node(index)["pos"]


def test_exact_transcoders_leave_the_error_nodes_empty():
    model = tiny_model(mlp="relu")
    graph = attribute(model, exact_transcoders(model), TOKENS)
    errors = slice(graph.n_features, graph.n_features + graph.n_layers * graph.n_pos)
    assert graph.adjacency[:, errors].abs().max() < 1e-5 * graph.adjacency.abs().max()


def test_logit_targets_and_bad_prompts():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    tokens, p = logit_targets(probs, 10, 0.9)
    assert tokens.tolist() == [0, 1, 2] and torch.allclose(p.sum(), torch.tensor(0.95))
    assert logit_targets(probs, 2, 0.99)[0].tolist() == [0, 1]
    model = tiny_model()
    tc = random_transcoders(model)
    with pytest.raises(ValueError, match="more than the model's n_ctx"):
        attribute(model, tc, torch.zeros(33, dtype=torch.long))
    with pytest.raises(ValueError, match="non-empty list of token ids"):
        attribute(model, tc, [])
    with pytest.raises(ValueError, match="do not fit a model"):
        attribute(tiny_model(n_layers=2), tc, TOKENS)
    with pytest.raises(ValueError, match="post-LN"):
        attribute(tiny_model(block="post_ln"), tc, TOKENS)
