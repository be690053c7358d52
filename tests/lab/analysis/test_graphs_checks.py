"""lab.analysis.graphs.checks and .qk: the graph against the full model, and the attention score's split."""

import math

import pytest
import torch

from lab.analysis.graphs.attribute import attribute
from lab.analysis.graphs.checks import intervention_agreement
from lab.analysis.graphs.qk import qk_attribution
from tests.builders import exact_transcoders, random_transcoders, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")
TOKENS = torch.randint(0, 50, (12,), generator=torch.Generator().manual_seed(2))


def test_steering_a_feature_moves_the_logits_as_the_graph_predicts():
    """Exact transcoders (the neurons themselves) and a small step (each feature scaled by 0.9). With the attention
    patterns and norm scales held (the graph's own assumption), only the ReLUs' switching departs from the graph:
    the agreement is near perfect. In the full model the patterns and scales respond too, which the graph leaves
    out by design; the agreement is lower but still strong."""
    model = tiny_model(mlp="relu")
    tc = exact_transcoders(model)
    graph = attribute(model, tc, TOKENS)
    frozen = intervention_agreement(model, tc, graph, top=8, factor=0.9, freeze=("attention", "norms"))
    assert frozen["pairs"] >= 8 * graph.n_logits // 2
    assert frozen["correlation"] > 0.99 and frozen["sign_agreement"] > 0.9, frozen
    live = intervention_agreement(model, tc, graph, top=8, factor=0.9)
    assert live["actual"].abs().max() > 1e-3  # the steps move the logits measurably
    assert 0.8 < live["correlation"] < frozen["correlation"] and live["sign_agreement"] > 0.7, live


def test_ablation_agreement_is_reported_per_prompt_with_the_direct_edges_beside():
    model = tiny_model("llama")
    tc = random_transcoders(model, cross_layer=True)
    graph = attribute(model, tc, TOKENS)
    result = intervention_agreement(model, tc, graph, top=5)
    assert result["predicted"].shape == result["actual"].shape == (5, graph.n_logits)
    assert -1 <= result["correlation"] <= 1 and 0 <= result["sign_agreement"] <= 1
    assert {"direct_correlation", "direct_sign_agreement"} <= set(result)
    assert result["non_finite"] == 0
    with pytest.raises(ValueError, match="freeze names"):
        intervention_agreement(model, tc, graph, top=5, freeze=("patterns",))


def test_a_feature_whose_intervention_drives_the_logits_non_finite_is_counted_and_left_out():
    """A model pushed far from its prompt's values can overflow (on smollm2: a massive activation removed under
    frozen norm scales). Such a feature's row is left out of the agreement and counted, never a NaN correlation."""
    model = tiny_model("llama")
    tc = random_transcoders(model)
    graph = attribute(model, tc, TOKENS)
    blown = intervention_agreement(model, tc, graph, top=5, factor=1e38, freeze=("attention", "norms"))
    finite = blown["actual"].isfinite().all(dim=1)
    assert 0 < int(finite.sum()) < 5  # some features' steps overflow the model, some do not
    assert blown["non_finite"] == 5 - int(finite.sum())
    assert blown["pairs"] > 0 and math.isfinite(blown["correlation"]) and math.isfinite(blown["sign_agreement"])


@pytest.mark.parametrize("architecture", ["gpt2", "llama"])
def test_the_qk_split_sums_to_the_attention_score(architecture):
    model = tiny_model(architecture)
    tc = random_transcoders(model)
    graph = attribute(model, tc, TOKENS)
    for layer, head, query, key in ((1, 0, 11, 4), (2, 3, 9, 9)):
        result = qk_attribution(model, tc, graph, layer, head, query, key)
        assert result["reconstructed"] == pytest.approx(result["score"], abs=1e-5)
        assert abs(result["pairs_sum"]) > 1e-4 and result["top_pairs"]
        ids = set(graph.node_ids())
        assert all(p["query"] in ids and p["key"] in ids for p in result["top_pairs"])
        key_positions = {graph.node(graph.node_ids().index(s["node"]))["pos"] for s in result["key_sources"]}
        assert max(key_positions) <= key
    with pytest.raises(ValueError, match="key_pos <= query_pos"):
        qk_attribution(model, tc, graph, 1, 0, 3, 5)
