"""Logit lens, direct logit attribution and residual norms: exact identities on random models."""

import pytest
import torch

from lab import HookedTransformer
from lab.analysis.lens import direct_logit_attribution, logit_lens, residual_norms
from tests.builders import tiny_config

VARIANTS = [
    dict(),
    dict(positions="rotary", norm="rmsnorm", mlp="swiglu", bias=False, n_kv_heads=2),
    dict(tied_embeddings=True, positions="sinusoidal"),
]


@pytest.mark.parametrize("variant", VARIANTS, ids=["gpt2-like", "llama-like", "tied-sinusoidal"])
def test_attribution_parts_sum_to_the_logit(variant, tokens):
    model = HookedTransformer(tiny_config(**variant), seed=4).eval()
    with torch.no_grad():  # give the biases something to attribute
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    for position in (0, 7, -1):
        attribution = direct_logit_attribution(model, tokens[0], target=13, position=position)
        assert len(attribution.labels) == len(attribution.values)
        assert abs(attribution.values.sum().item() - attribution.logit) < 1e-4
    assert "L1H3" in attribution.labels and "L1 mlp" in attribution.labels


def test_logit_lens_last_layer_is_the_model(tokens):
    model = HookedTransformer(tiny_config(), seed=4).eval()
    lens = logit_lens(model, tokens)
    assert lens.shape == (model.cfg.n_layers + 1, *tokens.shape, model.cfg.d_vocab)
    assert (lens[-1] - model(tokens).log_softmax(-1)).abs().max() < 1e-5
    assert torch.allclose(lens.exp().sum(-1), torch.ones(lens.shape[:-1]), atol=1e-5)


def test_residual_norms(tokens):
    model = HookedTransformer(tiny_config(), seed=4).eval()
    norms = residual_norms(model, tokens)
    _, cache = model.run_with_cache(tokens)
    assert torch.allclose(norms[1], cache["blocks.1.hook_resid_pre"].norm(dim=-1))
    assert torch.allclose(norms[-1], cache["blocks.1.hook_resid_post"].norm(dim=-1))


def test_bad_target_is_a_clear_error(tokens):
    model = HookedTransformer(tiny_config())
    with pytest.raises(ValueError, match="target token id 500"):
        direct_logit_attribution(model, tokens[0], target=500)


@pytest.mark.parametrize("kind", ["markov", "hmm"])
def test_ground_truth_lens_at_the_output_is_the_kl_experiments_kl(kind):
    """The last row of the ground-truth lens is the model's own KL(p ‖ P_θ) as the KL decomposition measures it
    (experiments.kl: model_logits → decompose), prefix by prefix; each row's mean over the headline region is
    the kl experiment's ground_truth_lens entry for that layer."""
    from experiments.kl.measure import HeldOut, decompose, model_logits
    from experiments.kl.measure import ground_truth_lens as experiment_lens
    from lab.analysis.lens import ground_truth_lens
    from lab.data.sources import HiddenMarkovSource, MarkovSource

    source = MarkovSource(8, order=2, seed=0) if kind == "markov" else HiddenMarkovSource(3, 8, seed=0)
    model = HookedTransformer(tiny_config(d_vocab=8, n_ctx=16), seed=2).eval()
    held_out = HeldOut.draw(source, 5, 12, seed=1)
    lens = ground_truth_lens(model, held_out.tokens, source.conditionals(held_out.tokens.numpy()))
    assert lens.kl_nats.shape == (model.cfg.n_layers + 1, 5, 12) and len(lens.labels) == model.cfg.n_layers + 1
    exact = decompose(model_logits(model, held_out.tokens), held_out).kl
    assert torch.allclose(lens.kl_nats[-1, :, :-1], exact, atol=1e-9)
    assert (lens.kl_nats >= -1e-12).all()
    assert torch.allclose(lens.log_probs[-1].float(), model(held_out.tokens).log_softmax(-1), atol=1e-5)
    region = held_out.regions()["complete" if kind == "markov" else "all"]
    for row, entry in zip(lens.kl_nats[:, :, :-1], experiment_lens(model, held_out)):
        assert row[:, region].mean().item() == pytest.approx(entry["kl_nats"], abs=1e-6)


def test_ground_truth_lens_names_a_p_of_the_wrong_shape(tokens):
    from lab.analysis.lens import ground_truth_lens

    model = HookedTransformer(tiny_config())
    with pytest.raises(ValueError, match=r"must be \[batch, pos, d_vocab\] = \[3, 24, 100\]"):
        ground_truth_lens(model, tokens, torch.full((3, 23, 100), 0.01))
    with pytest.raises(ValueError, match="sum to 1"):
        ground_truth_lens(model, tokens, torch.full((3, 24, 100), 0.02))


def test_world_source_rebuilds_the_source_a_folder_records(tmp_path):
    from lab.data.sources import MarkovSource
    from lab.runs import write_json
    from lab.zoo.worlds import world_source

    source = MarkovSource(8, order=2, seed=3)
    assert world_source(tmp_path) is None  # no world.json: not a source world
    write_json(tmp_path / "world.json", {"spec": {"kind": "markov"}, "source": source.to_dict()})
    tokens = source.sample(2, 6, seed=0)
    assert (world_source(tmp_path).conditionals(tokens) == source.conditionals(tokens)).all()
    write_json(tmp_path / "world.json", {"kind": "facts"})
    assert world_source(tmp_path) is None
    write_json(tmp_path / "world.json", {"source": {"kind": "unicorn"}})
    with pytest.raises(ValueError, match="world.json: its source cannot be rebuilt"):
        world_source(tmp_path)
