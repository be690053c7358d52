"""lab.analysis.jacobian_lens: TransformerLens 4.3's JacobianLens (the reference estimator, on a raw
TransformerBridge over the same weights) fits the same matrices; the identity transport is the logit lens; each
matrix is the mean Jacobian it claims to be, by finite differences."""

import tempfile

import pytest
import torch

from lab import HookedTransformer, ModelConfig
from lab.analysis.jacobian_lens import JacobianLens, fit_jacobian_lens
from lab.analysis.lens import logit_lens
from lab.data.tokenizers import to_hf_tokenizer, word_level
from lab.hf.convert import to_hf

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB = 36


def model(kind: str = "gpt2") -> HookedTransformer:
    shapes = {
        "gpt2": {"mlp": "gelu_tanh"},
        "llama": {"positions": "rotary", "norm": "rmsnorm", "mlp": "swiglu", "n_kv_heads": 2, "bias": False},
    }
    cfg = ModelConfig(d_vocab=VOCAB, d_model=16, n_layers=3, n_heads=4, n_ctx=12, **shapes[kind])
    m = HookedTransformer(cfg, seed=2).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith(("W_O", "W_out")):
                p.mul_(4.0)
    return m


def prompts(n: int, length: int = 10) -> torch.Tensor:
    return torch.randint(4, VOCAB, (n, length), generator=torch.Generator().manual_seed(n))


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("skip", [0, 3])
def test_transformer_lens_fits_the_same_matrices(kind, skip):
    """JacobianLens.fit (TransformerLens 4.3, the reference estimator) on a raw TransformerBridge over the exported
    weights: its layer l (the output of block l) is Forma's blocks.(l+1).hook_resid_pre."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformer_lens.tools.analysis import JacobianLens as Reference

    m = model(kind)
    tokenizer = to_hf_tokenizer(word_level([f"w{i}" for i in range(VOCAB - 4)]), tempfile.mkdtemp())
    name = "gpt2" if kind == "gpt2" else "LlamaForCausalLM"
    bridge = TransformerBridge.boot_transformers(name, hf_model=to_hf(m), tokenizer=tokenizer, device="cpu").eval()
    bridge.cfg.default_prepend_bos = False
    ids = prompts(4)
    text = [" ".join(f"w{int(i) - 4}" for i in row) for row in ids]
    assert torch.equal(bridge.to_tokens(text[0])[0], ids[0])
    reference = Reference.fit(
        bridge, text, corpus="forma-test", skip_first_positions=skip, dim_batch=16, show_progress=False
    )
    ours = fit_jacobian_lens(m, ids, skip_first_positions=skip, prompts_per_pass=3)
    assert reference.source_layers == [0, 1] and ours.targets == "later"
    for layer in reference.source_layers:
        assert torch.allclose(ours.J[layer + 1], reference.jacobians[layer], atol=1e-5), layer


def test_the_two_variants_differ_only_where_attention_carries_a_position_to_later_ones():
    """A model whose attention writes nothing: no position reaches a later one, so summing over later targets adds
    nothing and the two variants are one matrix."""
    m = model()
    ids = prompts(3)
    assert not torch.allclose(fit_jacobian_lens(m, ids).J, fit_jacobian_lens(m, ids, targets="same").J, atol=1e-4)
    with torch.no_grad():
        for block in m.blocks:
            block.attn.W_O.zero_()
    assert torch.allclose(fit_jacobian_lens(m, ids).J, fit_jacobian_lens(m, ids, targets="same").J, atol=1e-6)
    with pytest.raises(ValueError, match="targets must be"):
        fit_jacobian_lens(m, ids, targets="earlier")


def test_the_identity_transport_is_the_logit_lens():
    m = model()
    identity = JacobianLens(torch.eye(16).expand(3, 16, 16).clone(), 1, 0)
    assert torch.allclose(identity.log_probs(m, prompts(2)), logit_lens(m, prompts(2)), atol=1e-5)


@pytest.mark.parametrize("targets", ["later", "same"])
def test_each_matrix_is_the_mean_jacobian_by_finite_differences(targets):
    """J_l v = mean over source positions t of Σ_{t' ≥ t} d x^(final)_{t'} / dε when x^(l)_t moves by ε v (central
    differences in float64, one prompt); the same-position variant keeps t' = t only."""
    m = model().double()
    ids = prompts(1, 6)
    lens = fit_jacobian_lens(m, ids, targets=targets, prompts_per_pass=1)
    assert lens.targets == targets
    v = torch.randn(16, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    valid = range(5)
    for layer in range(3):

        def final(shift: float, t: int, layer: int = layer) -> torch.Tensor:
            def move(x, hook):
                x = x.clone()
                x[:, t] += shift * v
                return x

            with torch.no_grad():
                return m.run_with_hooks(ids, fwd_hooks=[(f"blocks.{layer}.hook_resid_pre", move)], stop_at_layer=3)[0]

        eps = 1e-5
        moved = [(final(eps, t) - final(-eps, t)) / (2 * eps) for t in valid]
        columns = [m_t[t] if targets == "same" else m_t[list(valid)].sum(0) for t, m_t in zip(valid, moved)]
        expected = torch.stack(columns).mean(0)
        assert torch.allclose(lens.J[layer].double() @ v, expected, atol=1e-5), layer
