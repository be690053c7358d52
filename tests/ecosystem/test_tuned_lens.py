"""lab.analysis.tuned_lens: the untrained tuned lens is the logit lens; a fitted one is the tuned-lens package's
translator on the same weights, and fits the model at least as well as the package's own training does."""

import numpy as np
import pytest
import torch

from benchmarks.tuned_lens import train_package_lens
from lab import HookedTransformer, ModelConfig
from lab.analysis.lens import logit_lens
from lab.analysis.tuned_lens import TunedLens, fit_tuned_lens
from lab.hf.convert import to_hf
from lab.metrics.grades import lens_grades

pytestmark = pytest.mark.usefixtures("one_thread")


def model() -> HookedTransformer:
    """A random GPT-2-shaped model whose layers move the residual stream enough that reading an early layer as the
    last one (the logit lens) is far from the model; b_U = 0, as every Hugging Face head has it."""
    cfg = ModelConfig(d_vocab=40, d_model=32, n_layers=3, n_heads=4, n_ctx=12, mlp="gelu_tanh")
    m = HookedTransformer(cfg, seed=3).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith(("W_O", "W_out")):
                p.mul_(6.0)
    return m


def tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 40, (n, 12), generator=torch.Generator().manual_seed(seed))


def test_the_zero_translator_is_the_logit_lens():
    m = model()
    lens = TunedLens(torch.zeros(3, 32, 32), torch.zeros(3, 32), [], 0)
    assert torch.allclose(lens.log_probs(m, tokens(4, 0)), logit_lens(m, tokens(4, 0)), atol=1e-5)


def test_a_fitted_lens_reads_the_model_better_than_the_logit_lens_on_held_out_text():
    m = model()
    lens = fit_tuned_lens(m, tokens(64, 1))
    held_out = tokens(32, 2)
    final = logit_lens(m, held_out)[-1].exp()

    def kl(log_probs: torch.Tensor) -> torch.Tensor:  # KL(P_θ ‖ lens) per layer
        return (final * (final.log() - log_probs)).sum(-1).mean(dim=(1, 2))

    tuned, logit = kl(lens.log_probs(m, held_out)), kl(logit_lens(m, held_out))
    assert (tuned[:-1] < 0.7 * logit[:-1]).all(), (tuned, logit)
    assert torch.equal(lens.log_probs(m, held_out)[-1], logit_lens(m, held_out)[-1])  # the output row is the model


@pytest.fixture
def tuned_lens_package(monkeypatch):
    """tuned-lens 0.2 beside TransformerLens 4: its probe for TransformerLens's removed HookedTransformer switched
    off (docs/ecosystem.md)."""
    from tuned_lens import model_surgery

    monkeypatch.setattr(model_surgery, "_transformer_lens_available", False)


def test_the_translator_is_the_packages_on_the_same_weights(tuned_lens_package):
    """Forma's x + x A + b read through the final norm and unembedding is tuned-lens's h + translator(h) read
    through its Unembed, given the package's translator weights (A = Wᵀ)."""
    from tuned_lens.nn import TunedLens as PackageLens

    m = model()
    hf = to_hf(m)
    theirs = PackageLens.from_model(hf, bias=True)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for translator in theirs.layer_translators:
            translator.weight.copy_(0.1 * torch.randn(translator.weight.shape, generator=g))
            translator.bias.copy_(0.1 * torch.randn(translator.bias.shape, generator=g))
    ours = TunedLens(
        torch.stack([t.weight.detach().T for t in theirs.layer_translators]),
        torch.stack([t.bias.detach() for t in theirs.layer_translators]),
        [],
        0,
    )
    text = tokens(3, 4)
    with torch.no_grad():
        hidden = hf(text, output_hidden_states=True).hidden_states
        read = ours.log_probs(m, text)
        for layer in range(3):
            assert (theirs(hidden[layer], layer).log_softmax(-1) - read[layer]).abs().max() < 1e-4


def test_formas_fit_reaches_the_packages_kl_within_its_interval(tuned_lens_package):
    """The package's translator trained by its recipe (benchmarks.tuned_lens.train_package_lens) and Forma's fit on
    the same tokens: on
    held-out tokens Forma's KL(P_θ ‖ lens) is at or below the upper end of the package's 95% interval at every
    layer (benchmarks/tuned_lens.py times both)."""
    m = model()
    fit, held_out = tokens(128, 5), tokens(64, 6)
    hf = to_hf(m)
    theirs = train_package_lens(hf, fit, 200, 16)
    ours = fit_tuned_lens(m, fit)
    with torch.no_grad():
        hidden = hf(held_out, output_hidden_states=True).hidden_states
        package = torch.stack([theirs(hidden[l], l).log_softmax(-1) for l in range(3)] + [logit_lens(m, held_out)[-1]])
    p = logit_lens(m, held_out)[-1].exp().double().numpy()
    theirs_kl = lens_grades(package.double().numpy(), p, n_boot=300)
    ours_kl = lens_grades(ours.log_probs(m, held_out).double().numpy(), p, n_boot=300)
    for layer in range(3):
        assert ours_kl[layer]["kl_true"].value.value <= theirs_kl[layer]["kl_true"].value.high, layer
    assert np.isfinite([g["kl_true"].value.high for g in theirs_kl]).all()


def test_a_fit_of_some_layers_leaves_the_others_at_the_logit_lens():
    m = model()
    lens = fit_tuned_lens(m, tokens(64, 1), layers=[1])
    held_out = tokens(16, 2)
    assert torch.count_nonzero(lens.A[[0, 2]]) == 0 and torch.count_nonzero(lens.b[[0, 2]]) == 0
    assert torch.count_nonzero(lens.A[1]) > 0
    assert np.isnan(lens.train_kl_nats[0]) and np.isfinite(lens.train_kl_nats[1]) and np.isnan(lens.train_kl_nats[2])
    read, logit = lens.log_probs(m, held_out), logit_lens(m, held_out)
    assert torch.allclose(read[[0, 2, 3]], logit[[0, 2, 3]], atol=1e-5)
    final = logit[-1].exp()
    assert (final * (logit[-1] - read[1])).sum(-1).mean() < 0.7 * (final * (logit[-1] - logit[1])).sum(-1).mean()
    with pytest.raises(ValueError, match="layers"):
        fit_tuned_lens(m, tokens(4, 1), layers=[3])


def _kl_to_model(m: HookedTransformer, lens: TunedLens, text: torch.Tensor) -> torch.Tensor:
    """Each layer's KL(P_θ ‖ lens) on `text`, averaged over positions, recomputed from the lens's own readings."""
    read = lens.log_probs(m, text)
    return (read[-1].exp() * (read[-1] - read[:-1])).sum(-1).flatten(1).mean(-1)


def test_validation_tokens_stop_each_layer_at_its_best_iterate():
    """Fitted on 4 tokens, each layer keeps the iterate of lowest KL on the validation sequences: its recorded KL is
    the kept translator's (recomputed), no worse than the logit lens's (iteration 0), and a fit stopped at that
    iteration keeps the same translator; at least one layer stops before the last iteration."""
    m = model()
    fit, validation = tokens(1, 1)[:, :4], tokens(16, 2)
    full = fit_tuned_lens(m, fit, max_iter=60, weight_decay=0.0)
    stopped = fit_tuned_lens(m, fit, max_iter=60, weight_decay=0.0, validation=validation)
    assert full.validation_kl_nats is None and full.stopped_at is None
    recomputed = _kl_to_model(m, stopped, validation)
    torch.testing.assert_close(recomputed, torch.tensor(stopped.validation_kl_nats), atol=1e-5, rtol=1e-4)
    zero = TunedLens(torch.zeros(3, 32, 32), torch.zeros(3, 32), [], 0)
    assert (recomputed <= _kl_to_model(m, zero, validation) + 1e-7).all()  # the logit lens is a candidate
    layer = min(range(3), key=lambda l: stopped.stopped_at[l])
    assert 0 < stopped.stopped_at[layer] < 60, stopped.stopped_at
    shorter = fit_tuned_lens(m, fit, max_iter=stopped.stopped_at[layer], weight_decay=0.0, validation=validation)
    assert torch.equal(shorter.A[layer], stopped.A[layer]) and torch.equal(shorter.b[layer], stopped.b[layer])
    assert not torch.equal(stopped.A[layer], full.A[layer])
