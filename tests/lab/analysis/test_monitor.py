"""The monitor (lab.analysis.monitor): signals read on the KV-cached decoding path equal the same signals recomputed
from one forward pass over the finished sequence; the hooks change nothing and leave nothing behind; memory stays
bounded; the answer-level rules agree with the token-level stopping rule."""

import math

import pytest
import torch

from lab import HookedTransformer
from lab.analysis.monitor import (
    LinearReadout,
    Monitor,
    abstain_at,
    answer_lengths,
    claim_risk,
    output_signals,
    sample_continuations,
)
from lab.model.decoding import decode
from tests.builders import VOCAB, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


PROMPT = torch.randint(0, VOCAB, (3, 6), generator=torch.Generator().manual_seed(0))
SUBJECT = [1, 2]


@pytest.fixture
def model() -> HookedTransformer:
    return HookedTransformer(tiny_config(n_layers=4), seed=3).eval()


def readouts(model: HookedTransformer) -> tuple[LinearReadout, LinearReadout]:
    g = torch.Generator().manual_seed(5)
    d = model.cfg.d_model
    probe = LinearReadout("blocks.1.hook_resid_post", torch.randn(d, generator=g) / 8, 0.1)
    p_ik = LinearReadout("blocks.2.hook_resid_pre", torch.randn(d, generator=g) / 8, -0.2, position=2)
    return probe, p_ik


def reference(
    model: HookedTransformer, tokens: torch.Tensor, prompt_length: int, probe: LinearReadout, p_ik: LinearReadout
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The signals from one ordinary forward pass over the whole sequence, at the positions that produced each token."""
    with torch.inference_mode():
        logits, cache = model.run_with_cache(tokens)
    produced = torch.arange(prompt_length - 1, tokens.shape[1] - 1)
    log_p = logits[:, produced].double().log_softmax(-1)
    p = log_p.exp()
    top = p.topk(2, dim=-1).values
    middle = cache["blocks.1.hook_resid_post"][:, produced]
    log_q = (model.ln_final(middle) @ model.W_U + model.b_U).double().log_softmax(-1)
    patterns = torch.stack([cache[f"blocks.{l}.attn.hook_pattern"] for l in (2, 3)])  # the upper half of 4
    attention = patterns[:, :, :, produced][..., SUBJECT].sum(-1).mean(dim=(0, 2))  # [batch, new]
    signals = {
        "max_prob": top[..., 0],
        "entropy": -(p * log_p).sum(-1),
        "margin": top[..., 0] - top[..., 1],
        "lens_kl": (p * (log_p - log_q)).sum(-1),
        "subject_attention": attention,
        "probe": torch.sigmoid(middle.double() @ probe.weight.double() + probe.bias),
    }
    readout = cache[p_ik.hook][:, p_ik.position].double() @ p_ik.weight.double() + p_ik.bias
    return signals, torch.sigmoid(readout)


@pytest.mark.parametrize(
    "variant", [{}, dict(positions="rotary", n_kv_heads=2, norm="rmsnorm", mlp="swiglu")], ids=["learned", "rotary-gqa"]
)
@pytest.mark.parametrize("use_kv_cache", [True, False], ids=["kv-cache", "recompute"])
def test_signals_read_while_decoding_equal_a_forward_pass_over_the_result(variant, use_kv_cache):
    model = HookedTransformer(tiny_config(n_layers=4, **variant), seed=3).eval()
    probe, p_ik = readouts(model)
    monitor = Monitor(model, probe=probe, p_ik=p_ik)
    out = monitor.generate(PROMPT, 12, subject=SUBJECT, use_kv_cache=use_kv_cache)
    expected, expected_p_ik = reference(model, out.tokens, PROMPT.shape[1], probe, p_ik)
    assert set(out.signals) == set(expected)
    for name, value in expected.items():
        assert out.signals[name].shape == (3, 12)
        assert (out.signals[name].double() - value).abs().max() <= 1e-5, name
    assert (out.prompt_signals["p_ik"].double() - expected_p_ik).abs().max() <= 1e-6


def test_the_monitor_changes_no_token_and_no_logit(model):
    probe, p_ik = readouts(model)
    plain = decode(model, PROMPT, 10, temperature=0.7, seed=4)
    monitored = Monitor(model, probe=probe, p_ik=p_ik).generate(PROMPT, 10, subject=SUBJECT, temperature=0.7, seed=4)
    assert torch.equal(plain.tokens, monitored.tokens)
    with torch.inference_mode():
        assert (model(monitored.tokens) - model(plain.tokens)).abs().max() == 0


def test_no_hook_is_left_behind_even_when_a_readout_fails(model):
    bad = LinearReadout("blocks.1.hook_resid_post", torch.zeros(model.cfg.d_model + 1), 0.0)
    monitor = Monitor(model, probe=bad)
    with pytest.raises(ValueError, match="features"):
        monitor.generate(PROMPT, 4, subject=SUBJECT)
    assert all(not point.fwd_hooks for point in model.hook_dict.values())
    assert monitor.held() == {}
    torch.testing.assert_close(
        decode(model, PROMPT, 4, temperature=0).tokens, Monitor(model, attention=False).generate(PROMPT, 4).tokens
    )


def test_memory_between_steps_does_not_grow_with_the_generation(model):
    probe, _ = readouts(model)
    monitor = Monitor(model, probe=probe)
    held = []
    original = monitor._on_logits

    def spy(logits, hook):
        original(logits, hook)
        held.append(monitor.held())

    monitor._on_logits = spy
    monitor.generate(PROMPT, 20, subject=SUBJECT)
    assert len(held) == 20 and all(h == {"blocks.1.hook_resid_post": (3, model.cfg.d_model)} for h in held)


def test_output_signals_of_known_distributions():
    uniform = output_signals(torch.zeros(2, 8))
    assert torch.allclose(uniform["max_prob"], torch.full((2,), 1 / 8))
    assert torch.allclose(uniform["entropy"], torch.full((2,), math.log(8)))
    assert torch.equal(uniform["margin"], torch.zeros(2))
    sharp = output_signals(torch.tensor([[math.log(0.7), math.log(0.2), math.log(0.1)]]))
    assert torch.allclose(sharp["margin"], torch.tensor([0.5])) and torch.allclose(
        sharp["max_prob"], torch.tensor([0.7])
    )


def test_the_claim_is_as_risky_as_its_riskiest_token_and_abstention_stops_there():
    new = torch.tensor([[5, 6, 9, 9], [9, 6, 7, 8], [5, 6, 7, 8]])
    lengths = answer_lengths(new, stop_ids={9})
    assert lengths.tolist() == [2, 1, 4]  # an empty answer keeps its first token
    series = torch.tensor([[0.9, 0.4, 0.1, 0.1], [0.3, 0.2, 0.2, 0.2], [0.8, 0.9, 0.7, 0.2]])
    risk = claim_risk(series, lengths, sign=-1)  # risk = −max_prob: the least confident token counts
    assert torch.allclose(risk, torch.tensor([-0.4, -0.3, -0.2], dtype=torch.float64))
    for row in range(3):
        for threshold in (-0.5, -0.35, -0.25, 0.0):
            token_risk = (-series[row]).tolist()
            stops = abstain_at(token_risk, int(lengths[row]), threshold)
            assert (stops is None) == (float(risk[row]) <= threshold)


def test_sampled_continuations_are_draws_at_temperature_one(model):
    samples = sample_continuations(model, PROMPT[:1], k=6, max_new_tokens=5, seed=0)
    assert samples.shape == (1, 6, 5)
    again = decode(model, PROMPT[:1].repeat(6, 1), 5, temperature=1.0, seed=0).tokens[:, 6:]
    assert torch.equal(samples[0], again)


def test_bad_arguments_are_named(model):
    with pytest.raises(ValueError, match="middle_layer"):
        Monitor(model, middle_layer=7)
    with pytest.raises(ValueError, match="attention_layers"):
        Monitor(model, attention_layers=[4])
    with pytest.raises(ValueError, match="subject"):
        Monitor(model).generate(PROMPT, 2)
    with pytest.raises(ValueError, match="subject mask"):
        Monitor(model).generate(PROMPT, 2, subject=torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(KeyError, match="unknown hook name"):
        Monitor(model, probe=LinearReadout("blocks.9.hook_resid_post", torch.zeros(64), 0.0))
    with pytest.raises(ValueError, match="position"):
        Monitor(model, p_ik=LinearReadout("blocks.0.hook_resid_post", torch.zeros(64), 0.0))


def test_a_model_without_forma_hooks_gets_its_output_signals(model):
    class Wrapped(torch.nn.Module):  # anything with cfg and a forward on ids, like a TransformerBridge
        def __init__(self, inner):
            super().__init__()
            self.inner, self.cfg = inner, inner.cfg

        def forward(self, tokens):
            return self.inner(tokens)

    monitor = Monitor(Wrapped(model))
    assert monitor.token_signals == ("max_prob", "entropy", "margin")
    assert "not a Forma HookedTransformer" in monitor.unavailable["lens_kl"]
    out = monitor.generate(PROMPT, 6)
    full = Monitor(model, lens=False, attention=False).generate(PROMPT, 6)
    assert torch.equal(out.tokens, full.tokens)
    for name in ("max_prob", "entropy", "margin"):
        assert (out.signals[name] - full.signals[name]).abs().max() <= 1e-5
    with pytest.raises(ValueError, match="residual stream"):
        Monitor(Wrapped(model), probe=readouts(model)[0])
