"""Logit lens, direct logit attribution and residual norms: exact identities on random models."""

import pytest
import torch

from lab import HookedTransformer
from lab.analysis.lens import direct_logit_attribution, logit_lens, residual_norms
from tests.conftest import tiny_config

VARIANTS = [dict(), dict(positions="rotary", norm="rmsnorm", mlp="swiglu", bias=False, n_kv_heads=2),
            dict(tied_embeddings=True, positions="sinusoidal")]


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
