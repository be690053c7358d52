"""Misuse that used to pass silently (or fail deep inside torch) is a ValueError naming the problem: a hook's
return value, a names_filter entry, a loss with nothing to predict, sampling arguments out of range, and a KV
cache that a failing step would leave half-written."""

import math

import pytest
import torch

from lab import HookedTransformer, KVCache
from lab.model.decoding import decode, sample_next
from lab.model.encoder_decoder import EncoderDecoder, EncoderDecoderConfig
from tests.builders import tiny_config

PROMPT = torch.randint(0, 100, (2, 5), generator=torch.Generator().manual_seed(0))


def no_hooks_attached(model) -> bool:
    return not any(hp.fwd_hooks or hp.bwd_hooks for hp in model.hook_dict.values())


# --- what a hook returns ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, replace, words",
    [
        ("blocks.0.hook_resid_pre", lambda x: x[:, :-1], "shape (2, 4, 64) for the activation of shape (2, 5, 64)"),
        ("blocks.0.hook_resid_pre", lambda x: x[:, :1], "same shape (no broadcasting)"),
        ("blocks.1.attn.hook_pattern", lambda x: x[:, :1], "shape (2, 1, 5, 5)"),  # used to broadcast over heads
        ("blocks.0.mlp.hook_post", lambda x: 3, "returned a value of type int, not a tensor"),
        ("blocks.0.mlp.hook_post", lambda x: "x", "returned a value of type str, not a tensor"),
        ("hook_embed", lambda x: x.double(), "torch.float64 tensor"),
        ("hook_embed", lambda x: x.long(), "keep the dtype and device"),
    ],
)
def test_a_hook_must_return_none_or_a_stand_in_for_its_activation(model, name, replace, words):
    for attach in ("run_with_hooks", "hooks", "add_hook"):
        with pytest.raises(ValueError) as err:
            if attach == "run_with_hooks":
                model.run_with_hooks(PROMPT, fwd_hooks=[(name, lambda x, hook: replace(x))])
            elif attach == "hooks":
                with model.hooks(fwd_hooks=[(name, lambda x, hook: replace(x))]):
                    model(PROMPT)
            else:
                model.add_hook(name, lambda x, hook: replace(x))
                try:
                    model(PROMPT)
                finally:
                    model.reset_hooks()
        assert f"the hook on {name}" in str(err.value) and words in str(err.value), attach
        assert no_hooks_attached(model)


def test_a_replacement_of_the_right_kind_still_flows_and_none_keeps_the_activation(model):
    plain = model(PROMPT)
    assert torch.equal(
        model.run_with_hooks(PROMPT, fwd_hooks=[("blocks.0.hook_resid_pre", lambda x, hook: None)]), plain
    )
    assert torch.equal(
        model.run_with_hooks(PROMPT, fwd_hooks=[("blocks.0.hook_resid_pre", lambda x, hook: x.clone())]), plain
    )
    zeroed = model.run_with_hooks(PROMPT, fwd_hooks=[("blocks.1.hook_mlp_out", lambda x, hook: torch.zeros_like(x))])
    assert not torch.equal(zeroed, plain)


def test_the_check_covers_backward_hooks_and_names_a_non_function():
    model = HookedTransformer(tiny_config(), seed=1)
    with pytest.raises(ValueError, match="must be a function"):
        model.add_hook("hook_embed", 3)
    model.add_hook("blocks.0.hook_resid_post", lambda grad, hook: grad[:, :1], dir="bwd")
    try:
        with pytest.raises(ValueError, match="for the gradient of shape"):
            model.loss(PROMPT).backward()
    finally:
        model.reset_hooks()


def test_list_hooks_shows_the_callers_function(model):
    def mine(x, hook):
        return None

    with model.hooks(fwd_hooks=[("hook_embed", mine)]):
        assert model.list_hooks()["hook_embed"][0].user_hook is mine


def test_the_encoder_decoder_checks_its_hooks_too():
    model = EncoderDecoder(
        EncoderDecoderConfig(
            d_vocab_src=20, d_vocab_tgt=20, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, n_ctx=8
        )
    )
    src, tgt = torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="the hook on hook_encoder_out returned shape"):
        model.run_with_hooks(src, tgt, fwd_hooks=[("hook_encoder_out", lambda x, hook: x[:, :1])])


# --- names ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("names_filter", [[5], ["hook_embed", 5], (None,)])
def test_run_with_cache_refuses_a_name_that_is_not_a_string(model, names_filter):
    with pytest.raises(ValueError, match="hook names are strings"):
        model.run_with_cache(PROMPT, names_filter=names_filter)


def test_a_hook_name_that_is_neither_a_string_nor_a_predicate_is_refused(model):
    with pytest.raises(ValueError, match="hook name or a predicate"):
        model.run_with_hooks(PROMPT, fwd_hooks=[(5, lambda x, hook: None)])
    assert no_hooks_attached(model)


# --- loss -----------------------------------------------------------------------------------------
def test_loss_of_one_token_is_an_error_not_nan(model):
    with pytest.raises(ValueError, match="at least 2 tokens"):
        model.loss(torch.tensor([[3]]))


# --- sampling arguments -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(top_k=0), "top_k"),
        (dict(top_k=2.5), "top_k"),
        (dict(top_k=True), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_p=math.nan), "top_p"),
        (dict(eos_token_id=100), "eos_token_id"),
        (dict(eos_token_id=-1), "eos_token_id"),
        (dict(eos_token_id=1.0), "eos_token_id"),
        (dict(temperature=math.nan), "temperature"),
        (dict(temperature=math.inf), "temperature"),
        (dict(temperature="1"), "temperature"),
        (dict(max_new_tokens=2.5), "max_new_tokens"),
        (dict(max_new_tokens=None), "max_new_tokens"),
        (dict(max_new_tokens=-1), "max_new_tokens"),
        (dict(seed=1.5), "seed"),
    ],
)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sampling_arguments_are_checked_whatever_the_temperature(model, kwargs, words, temperature):
    arguments = dict(max_new_tokens=3, temperature=temperature) | kwargs
    with pytest.raises(ValueError, match=words):
        decode(model, PROMPT, **arguments)


def test_a_tiny_temperature_is_greedy_not_a_traceback(model):
    greedy = decode(model, PROMPT, 6, temperature=0).tokens
    for temperature in (1e-45, 5e-324, 1e-300):
        assert torch.equal(decode(model, PROMPT, 6, temperature=temperature, seed=0).tokens, greedy)
    assert sample_next(torch.tensor([[0.0, 2.0, 1.0]]), temperature=1e-45).item() == 1


def test_the_encoder_decoder_checks_its_generation_arguments():
    model = EncoderDecoder(
        EncoderDecoderConfig(
            d_vocab_src=20, d_vocab_tgt=20, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, n_ctx=8
        )
    )
    src = torch.zeros(1, 4, dtype=torch.long)
    for kwargs, words in (
        (dict(max_new_tokens=2.5), "max_new_tokens"),
        (dict(bos_token_id=20), "bos_token_id"),
        (dict(eos_token_id=-3), "eos_token_id"),
        (dict(temperature=math.nan), "temperature"),
    ):
        with pytest.raises(ValueError, match=words):
            model.generate(src, **(dict(max_new_tokens=3, bos_token_id=1) | kwargs))


def test_tokens_on_the_meta_device_are_a_clear_error(model):
    with pytest.raises(ValueError, match="meta device"):
        model(torch.zeros(1, 3, dtype=torch.long, device="meta"))


# --- the KV cache after a failing step ----------------------------------------------------------------
class Boom(RuntimeError):
    pass


def raise_in_layer_1(x, hook):
    raise Boom("a hook failed mid-step")


@pytest.mark.parametrize("variant", [dict(), dict(positions="rotary", n_kv_heads=2, mlp="swiglu")])
def test_a_step_that_raises_leaves_the_cache_as_it_was_and_decoding_matches_recompute(variant):
    model = HookedTransformer(tiny_config(**variant), seed=3).eval()
    cache = KVCache.empty(model.cfg.n_layers)
    with torch.inference_mode():
        model(PROMPT, kv_cache=cache)
        assert [e.length for e in cache.entries] == [5, 5]
        step = torch.tensor([[7], [8]])
        for fail_at in ("blocks.1.hook_resid_pre", "unembed.hook_out"):  # after layer 0 wrote its keys; after both
            with pytest.raises(Boom):
                model.run_with_hooks(step, kv_cache=cache, fwd_hooks=[(fail_at, raise_in_layer_1)])
            assert [e.length for e in cache.entries] == [5, 5], fail_at
        cached = model(step, kv_cache=cache)[:, -1]
        fresh = model(torch.cat((PROMPT, step), dim=1))[:, -1]
    assert [e.length for e in cache.entries] == [6, 6]
    assert (cached - fresh).abs().max() <= 1e-5


def test_a_failed_first_step_leaves_an_empty_cache_that_still_works(model):
    cache = KVCache.empty(model.cfg.n_layers)
    with pytest.raises(Boom):
        model.run_with_hooks(PROMPT, kv_cache=cache, fwd_hooks=[("blocks.1.hook_resid_pre", raise_in_layer_1)])
    assert cache.length == 0 and all(e.keys is None for e in cache.entries)
    with torch.inference_mode():
        assert (model(PROMPT, kv_cache=cache) - model(PROMPT)).abs().max() <= 1e-5


def test_a_cache_that_does_not_fit_the_model_or_the_batch_is_refused(model):
    with pytest.raises(ValueError, match="1 layer.*2 layers"):
        model(PROMPT, kv_cache=KVCache.empty(1))
    cache = KVCache.empty(model.cfg.n_layers)
    with torch.inference_mode():
        model(PROMPT, kv_cache=cache)
    with pytest.raises(ValueError, match="batch of 2.*batch of 1"):
        model(torch.tensor([[1]]), kv_cache=cache)
    cache.entries[1].length = 3  # made inconsistent by hand
    with pytest.raises(ValueError, match=r"inconsistent.*\[5, 3\]"):
        model(torch.tensor([[1], [2]]), kv_cache=cache)


def test_the_encoder_decoder_rolls_its_cache_back_too():
    model = EncoderDecoder(
        EncoderDecoderConfig(
            d_vocab_src=20, d_vocab_tgt=20, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=2, n_ctx=8
        )
    ).eval()
    src, tgt = torch.zeros(1, 4, dtype=torch.long), torch.tensor([[1, 2, 3]])
    cache = KVCache.empty(2)
    with torch.inference_mode():
        memory = model.encode(src)
        model.decode(tgt, memory, cache)
        with pytest.raises(Boom):
            with model.hooks(fwd_hooks=[("decoder.1.hook_resid_pre", raise_in_layer_1)]):
                model.decode(torch.tensor([[4]]), memory, cache)
        assert [e.length for e in cache.entries] == [3, 3]
        cached = model.decode(torch.tensor([[4]]), memory, cache)[:, -1]
        fresh = model.decode(torch.tensor([[1, 2, 3, 4]]), memory)[:, -1]
    assert (cached - fresh).abs().max() <= 1e-5
