"""A model too large for the machine is refused before anything is allocated, with the numbers that say why;
on the meta device any size builds (shapes only), and the parameter counts the check uses are exact."""

import pytest
import torch

import lab.model.memory_check as memory
from lab import HookedTransformer, ModelConfig
from lab.model.encoder_decoder import EncoderDecoder, EncoderDecoderConfig
from tests.builders import tiny_config

ABSURD = [dict(n_layers=10**9), dict(d_vocab=10**12), dict(d_model=2**20, n_heads=2**10, n_ctx=2**20)]


@pytest.mark.parametrize("changes", ABSURD, ids=["1e9-layers", "1e12-vocab", "wide"])
def test_an_absurd_size_is_refused_at_once_naming_parameters_and_memory(changes):
    cfg = tiny_config(**changes)
    with pytest.raises(ValueError) as err:
        HookedTransformer(cfg)
    message = str(err.value)
    assert f"{cfg.n_params():,} parameters" in message and "GiB (torch.float32)" in message
    assert "GiB available" in message


def test_the_check_compares_with_what_is_available(monkeypatch):
    cfg = tiny_config()
    needed = (cfg.n_params() + cfg.n_buffer_elements()) * 4
    monkeypatch.setattr(memory, "available_memory", lambda device: needed - 1)
    with pytest.raises(ValueError, match="0.0 GiB available"):
        HookedTransformer(cfg)
    monkeypatch.setattr(memory, "available_memory", lambda device: needed)
    HookedTransformer(cfg)
    monkeypatch.setattr(memory, "available_memory", lambda device: None)  # unknown: no check
    HookedTransformer(cfg)


def test_the_encoder_decoder_is_checked_too():
    cfg = EncoderDecoderConfig(
        d_vocab_src=10, d_vocab_tgt=10, d_model=64, n_heads=4, n_encoder_layers=10**9, n_decoder_layers=1, n_ctx=8
    )
    with pytest.raises(ValueError, match=f"EncoderDecoder of {cfg.n_params():,} parameters"):
        EncoderDecoder(cfg)


def test_any_size_builds_on_the_meta_device():
    cfg = ModelConfig(d_vocab=10**6, d_model=2**14, n_layers=8, n_heads=128, n_ctx=2**15, positions="rotary")
    with torch.device("meta"):
        model = HookedTransformer(cfg)
    assert cfg.n_params() > 10**10
    assert sum(p.numel() for p in model.parameters()) == cfg.n_params()
    assert sum(b.numel() for b in model.buffers()) == cfg.n_buffer_elements()


@pytest.mark.parametrize(
    "changes",
    [
        dict(),
        dict(positions="rotary", n_kv_heads=2, mlp="swiglu", bias=False),
        dict(positions="sinusoidal", norm="rmsnorm", tied_embeddings=True),
    ],
)
def test_buffer_count_is_exact(changes):
    cfg = tiny_config(**changes)
    assert sum(b.numel() for b in HookedTransformer(cfg).buffers()) == cfg.n_buffer_elements()


@pytest.mark.parametrize(
    "changes",
    [
        dict(),
        dict(positions="learned", block="pre_ln", norm="rmsnorm", bias=False),
        dict(mlp="swiglu", positions="none", d_head=8),
    ],
)
def test_encoder_decoder_parameter_and_buffer_counts_are_exact(changes):
    cfg = EncoderDecoderConfig(
        **(
            dict(
                d_vocab_src=30, d_vocab_tgt=20, d_model=32, n_heads=4, n_encoder_layers=2, n_decoder_layers=3, n_ctx=16
            )
            | changes
        )
    )
    model = EncoderDecoder(cfg)
    assert sum(p.numel() for p in model.parameters()) == cfg.n_params()
    assert sum(b.numel() for b in model.buffers()) == cfg.n_buffer_elements()
