"""Attribution patching (lab.analysis.attribution) is the first-order Taylor estimate of every activation patch:
exact where the metric is linear in the activation downstream of the cell, exact (the unpatched metric) where
the clean and corrupted activations agree, close to the exhaustive sweep on a small random model, and the
same numbers by every sweep's shape."""

import pytest
import torch

from lab import HookedTransformer, ModelConfig
from lab.analysis.attribution import SWEEPS, attribution_patch
from lab.analysis.patching import logit_diff, patch_heads, patch_heads_by_position, patch_positions
from lab.model.norms import NoNorm
from tests.builders import patchable

VOCAB = 48
METRIC = logit_diff(torch.tensor([3, 5]), torch.tensor([4, 6]))


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def prompts() -> tuple[torch.Tensor, torch.Tensor]:
    clean = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(2))
    corrupted = clean.clone()
    corrupted[:, 2] = (corrupted[:, 2] + 7) % VOCAB
    return clean, corrupted


def scaled(model: HookedTransformer) -> HookedTransformer:
    """Weights large enough that patches move the metric well above float round-off."""
    return patchable(model, unembedding_scale=10.0)


def exhaustive(model, clean, corrupted, direction="denoise") -> dict:
    sweeps = {
        c: patch_positions(model, clean, corrupted, c, METRIC, direction=direction)
        for c in ("resid_pre", "attn_out", "mlp_out", "resid_post")
    }
    sweeps["heads"] = patch_heads(model, clean, corrupted, METRIC, direction=direction)
    sweeps["heads_by_position"] = patch_heads_by_position(model, clean, corrupted, METRIC, direction=direction)
    return sweeps


@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_the_estimate_is_exact_where_the_metric_is_linear_in_the_activation(prompts, direction):
    """A parallel block's last layer writes resid_post = resid_pre + attn_out + mlp_out, and with the final norm
    made the identity the logits are linear in each of them (and in z, through W_O): the first-order estimate
    at the last layer is the patch itself."""
    cfg = ModelConfig(d_vocab=VOCAB, d_model=32, n_layers=2, n_heads=4, n_ctx=16, block="parallel")
    model = scaled(HookedTransformer(cfg, seed=0))
    model.ln_final = NoNorm()
    clean, corrupted = prompts
    estimate = attribution_patch(model, clean, corrupted, METRIC, direction=direction)
    truth = exhaustive(model, clean, corrupted, direction)
    assert set(estimate) == set(SWEEPS)
    for sweep in ("attn_out", "mlp_out", "resid_post", "heads", "heads_by_position"):
        assert estimate[sweep].values.shape == truth[sweep].values.shape, sweep
        assert (estimate[sweep].values[-1] - truth[sweep].values[-1]).abs().max() < 1e-5, sweep
        assert (truth[sweep].values[-1] - truth[sweep].corrupted).abs().max() > 1e-3, sweep  # a real change
        assert estimate[sweep].clean == pytest.approx(truth[sweep].clean, abs=1e-5)
        assert estimate[sweep].corrupted == pytest.approx(truth[sweep].corrupted, abs=1e-5)
    # resid_pre of the last layer feeds its attention and MLP: not linear, and the estimate is only close.
    assert (estimate["resid_pre"].values[-1] - truth["resid_pre"].values[-1]).abs().max() > 1e-6


def test_through_the_final_norm_even_the_last_layer_is_first_order(prompts):
    """The same model with its final LayerNorm kept: the logits divide the stream by its own norm, so the last
    layer's patches are no longer linear in the metric and the estimate differs from the patch itself."""
    cfg = ModelConfig(d_vocab=VOCAB, d_model=32, n_layers=2, n_heads=4, n_ctx=16, block="parallel")
    model = scaled(HookedTransformer(cfg, seed=0))
    clean, corrupted = prompts
    estimate = attribution_patch(model, clean, corrupted, METRIC)
    truth = exhaustive(model, clean, corrupted)
    gap = (estimate["resid_post"].values[-1] - truth["resid_post"].values[-1]).abs().max()
    change = (truth["resid_post"].values[-1] - truth["resid_post"].corrupted).abs().max()
    assert gap > 0.01 * change, (gap, change)


def test_cells_where_clean_and_corrupted_agree_are_estimated_as_no_change(prompts):
    """Before the corrupted position every activation is the same in both runs (causal attention): Δa = 0."""
    model = HookedTransformer(
        ModelConfig(
            d_vocab=VOCAB,
            d_model=32,
            n_layers=2,
            n_heads=4,
            n_ctx=16,
            positions="rotary",
            n_kv_heads=2,
            norm="rmsnorm",
            mlp="swiglu",
        ),
        seed=1,
    )
    clean, corrupted = prompts
    estimate = attribution_patch(model.eval(), clean, corrupted, METRIC)
    for sweep in ("resid_pre", "attn_out", "mlp_out", "resid_post"):
        assert torch.equal(estimate[sweep].values[:, :2], torch.full((2, 2), estimate[sweep].corrupted))
    assert torch.equal(
        estimate["heads_by_position"].values[..., :2], torch.full((2, 4, 2), estimate["heads"].corrupted)
    )
    # heads (every position) is heads by position summed over positions, as the patch of a head is of all of them
    heads, by_pos = estimate["heads"], estimate["heads_by_position"]
    assert torch.allclose(heads.values - heads.corrupted, (by_pos.values - by_pos.corrupted).sum(-1), atol=1e-6)


def test_the_estimate_tracks_the_exhaustive_sweep_on_a_random_model(prompts):
    model = scaled(HookedTransformer(ModelConfig(d_vocab=VOCAB, d_model=32, n_layers=2, n_heads=4, n_ctx=16), seed=2))
    clean, corrupted = prompts
    estimate = attribution_patch(model, clean, corrupted, METRIC)
    truth = exhaustive(model, clean, corrupted)
    for sweep in SWEEPS:
        a, b = (
            (estimate[sweep].values - estimate[sweep].corrupted).flatten(),
            (truth[sweep].values - truth[sweep].corrupted).flatten(),
        )
        assert torch.corrcoef(torch.stack([a, b]))[0, 1] > 0.9, sweep


def test_attribution_leaves_no_hook_and_no_gradient_behind(prompts):
    model = HookedTransformer(ModelConfig(d_vocab=VOCAB, d_model=32, n_layers=1, n_heads=2, n_ctx=16), seed=0).eval()
    clean, corrupted = prompts
    with torch.inference_mode():  # a caller in inference mode still gets gradients inside
        attribution_patch(model, clean, corrupted, METRIC)
    assert all(not hp._forward_hooks for hp in model.hook_dict.values())
    assert all(p.grad is None for p in model.parameters())


def test_bad_input_is_refused_with_the_problem_named(prompts):
    model = HookedTransformer(ModelConfig(d_vocab=VOCAB, d_model=32, n_layers=1, n_heads=2, n_ctx=16), seed=0).eval()
    clean, corrupted = prompts
    with pytest.raises(ValueError, match="same shape"):
        attribution_patch(model, clean, corrupted[:, :4], METRIC)
    with pytest.raises(ValueError, match="direction"):
        attribution_patch(model, clean, corrupted, METRIC, direction="sideways")
    with pytest.raises(ValueError, match="metric callback"):
        attribution_patch(model, clean, corrupted)
    with pytest.raises(ValueError, match="one-element tensor"):
        attribution_patch(model, clean, corrupted, lambda logits: logits[0, -1, 0].item())
    with pytest.raises(ValueError, match="out of range"):
        attribution_patch(model, clean, corrupted + VOCAB, METRIC)
