"""lab.analysis.transcoders.features: a feature's card, each number checked against a direct recomputation."""

import pytest
import torch

from lab.analysis.transcoders.features import feature_card, virtual_weights
from tests.builders import random_transcoders, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

WINDOWS = torch.randint(0, 50, (6, 16), generator=torch.Generator().manual_seed(0))


@torch.no_grad()
def direct_activation(model, transcoders, layer: int, feature: int, window: int, pos: int) -> float:
    """The feature's activation at one position, the model run on that window alone and its input hook read."""
    hook = transcoders.cfg.hook("input", layer)
    _, cache = model.run_with_cache(WINDOWS[window : window + 1], names_filter=[hook])
    x = cache[hook][0, pos]
    return float(transcoders.activate(transcoders.encode(x, layer), layer)[feature])


@torch.no_grad()
def every_activation(model, transcoders, layer: int, feature: int) -> torch.Tensor:
    """[windows, positions] in one forward pass over every window (the card runs them in chunks)."""
    hook = transcoders.cfg.hook("input", layer)
    _, cache = model.run_with_cache(WINDOWS, names_filter=[hook])
    return transcoders.activate(transcoders.encode(cache[hook], layer), layer)[..., feature]


@torch.no_grad()
def busy_feature(model, transcoders, layer: int) -> int:
    """A feature of `layer` that fires at some positions and not at others (the properties need both)."""
    _, cache = model.run_with_cache(WINDOWS, names_filter=[transcoders.cfg.hook("input", layer)])
    acts = transcoders.activate(transcoders.encode(cache[transcoders.cfg.hook("input", layer)], layer), layer)
    share = (acts > 0).double().mean(dim=(0, 1))
    return int((share - 0.4).abs().argmin())


@pytest.mark.parametrize("activation", ["relu", "topk"])
def test_the_histogram_counts_every_position_and_the_top_contexts_are_the_largest_recomputed(activation):
    """The counts sum to windows × positions, the firing share is the share above 0; the top contexts are the n
    largest activations of one unchunked pass, each equal to the activation recomputed at its window and position
    (top-k: over the layer's every feature), with the tokens around it from that window."""
    model = tiny_model()
    tc = random_transcoders(model, activation=activation)
    feature = busy_feature(model, tc, 1)
    card = feature_card(model, tc, 1, feature, WINDOWS, n_top=5)
    assert sum(card.counts) == card.positions == WINDOWS.numel()
    assert len(card.edges) == len(card.counts) + 1
    every = every_activation(model, tc, 1, feature)
    assert 0 < card.firing_share < 1
    assert card.firing_share == pytest.approx(float((every > 0).double().mean()))
    assert len(card.top) == 5
    largest = every.flatten().sort(descending=True).values[:5]
    torch.testing.assert_close(torch.tensor([c.activation for c in card.top]), largest)
    for c in card.top:
        assert c.activation == pytest.approx(direct_activation(model, tc, 1, feature, c.window, c.pos), abs=1e-5)
        assert c.tokens[c.pos - c.start] == int(WINDOWS[c.window, c.pos])
        assert c.tokens == WINDOWS[c.window, c.start : c.start + len(c.tokens)].tolist()


def test_each_quantile_bins_contexts_lie_in_it_and_the_seed_draws_them():
    """The bins' edges are the nonzero activations' quantiles, their counts sum to the positions that fire, each
    context drawn lies in its bin and is its recomputed activation; the same seed draws the same, another seed may
    not."""
    model = tiny_model()
    tc = random_transcoders(model)
    feature = busy_feature(model, tc, 2)
    card = feature_card(model, tc, 2, feature, WINDOWS, n_quantiles=4, per_bin=3, seed=1)
    every = every_activation(model, tc, 2, feature)
    nonzero = every[every > 0].double()
    assert len(card.quantiles) == 4
    assert sum(b.count for b in card.quantiles) == len(nonzero)
    assert card.quantiles[0].low == pytest.approx(float(nonzero.min()))
    assert card.quantiles[-1].high == pytest.approx(float(nonzero.max()))
    for b in card.quantiles:
        assert 0 < len(b.contexts) <= 3
        for c in b.contexts:
            assert b.low <= c.activation <= b.high
            assert c.activation == pytest.approx(float(every[c.window, c.pos]), abs=1e-6)
    again = feature_card(model, tc, 2, feature, WINDOWS, n_quantiles=4, per_bin=3, seed=1)
    assert again.quantiles == card.quantiles
    draws = [feature_card(model, tc, 2, feature, WINDOWS, n_quantiles=4, per_bin=3, seed=s).quantiles for s in (2, 3)]
    assert any(d != card.quantiles for d in draws)


@pytest.mark.parametrize("cross_layer", [False, True])
def test_virtual_weights_are_decoder_dot_encoder_and_point_the_right_way_in_time(cross_layer):
    """reads_from lists earlier layers' features, writes_to later layers', each weight the dot product of the
    writer's decoder rows (every layer before the reader that it writes, for a cross-layer transcoder) with the
    reader's encoder column, computed here coordinate by coordinate in a loop; they are the largest by magnitude."""
    model = tiny_model()
    tc = random_transcoders(model, cross_layer=cross_layer, d_features=8)
    layer, feature = 1, 3

    def weight(source: int, j: int, reader: int, i: int) -> float:
        total = 0.0
        for target in range(source, reader):
            if target - source < tc.W_dec[source].shape[1]:
                row, column = tc.W_dec[source][j, target - source].detach(), tc.W_enc[reader][:, i].detach()
                total += sum(float(row[d]) * float(column[d]) for d in range(tc.cfg.d_model))
        return total

    card = feature_card(model, tc, layer, feature, WINDOWS, n_connections=5)
    assert card.reads_from and card.writes_to
    assert all(c.layer < layer for c in card.reads_from) and all(c.layer > layer for c in card.writes_to)
    for c in card.reads_from:
        assert c.weight == pytest.approx(weight(c.layer, c.feature, layer, feature), abs=1e-5)
    for c in card.writes_to:
        assert c.weight == pytest.approx(weight(layer, feature, c.layer, c.feature), abs=1e-5)
    reads, writes = virtual_weights(tc, layer, feature)
    assert abs(card.reads_from[0].weight) == pytest.approx(float(reads[:layer].abs().max()))
    assert abs(card.writes_to[0].weight) == pytest.approx(float(writes[layer + 1 :].abs().max()))
    assert len(card.reads_from) == 5 and len(card.writes_to) == 5  # 8 features in each neighbouring layer
    first = feature_card(model, tc, 0, feature, WINDOWS)
    last = feature_card(model, tc, 2, feature, WINDOWS)
    assert first.reads_from == [] and last.writes_to == []


@pytest.mark.parametrize("architecture", ["gpt2", "llama"])
def test_the_logits_are_the_decoder_through_the_final_norms_gain_and_the_unembedding(architecture):
    """promoted and suppressed are the largest and smallest of (d − mean d) ⊙ w · W_U (LayerNorm) or d ⊙ w · W_U
    (RMSNorm), less their mean over the vocabulary, with d the feature's decoder row and w the final norm's gain
    (random here, so that it counts)."""
    model = tiny_model(architecture)
    with torch.no_grad():
        model.ln_final.w.copy_(torch.rand(model.cfg.d_model, generator=torch.Generator().manual_seed(1)) + 0.5)
    tc = random_transcoders(model)
    card = feature_card(model, tc, 2, 5, WINDOWS, n_logits=4)
    d = tc.W_dec[2][5, 0].detach()
    if architecture == "gpt2":
        d = d - d.mean()
    logits = (d * model.ln_final.w.detach()) @ model.W_U.detach()
    logits = logits - logits.mean()
    order = logits.argsort(descending=True)
    assert [t for t, _ in card.promoted] == order[:4].tolist()
    assert [t for t, _ in card.suppressed] == order.flip(0)[:4].tolist()
    torch.testing.assert_close(torch.tensor([v for _, v in card.promoted]), logits[order[:4]])


def test_a_feature_the_set_does_not_have_is_one_clear_error():
    model = tiny_model()
    tc = random_transcoders(model)
    with pytest.raises(ValueError, match="no feature 64 of layer 0"):
        feature_card(model, tc, 0, 64, WINDOWS)
    with pytest.raises(ValueError, match="layers 0 … 2"):
        feature_card(model, tc, 3, 0, WINDOWS)
