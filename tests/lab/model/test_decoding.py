"""Sampling: the KV cache equals recomputation, temperature limits, top-k and nucleus on known distributions."""

import pytest
import torch

from lab import HookedTransformer
from lab.hf.convert import from_hf
from lab.model.decoding import Sampling, decode, filter_logits, generate, sample_next
from lab.model.errors import Misuse
from lab.model.kv_cache import KVCache, KVCacheEntry
from tests.builders import hf_model, tiny_config, word_tokenizer

VARIANTS = [
    dict(),
    dict(positions="rotary", mlp="swiglu", n_kv_heads=2, norm="rmsnorm", bias=False),
    dict(positions="sinusoidal", block="post_ln"),
]


@pytest.mark.parametrize("variant", VARIANTS, ids=["learned", "rotary-gqa", "sinusoidal-post-ln"])
def test_kv_cache_gives_the_same_tokens_and_logits_as_recomputing(variant):
    model = HookedTransformer(tiny_config(**variant), seed=2).eval()
    prompt = torch.randint(0, 100, (3, 5), generator=torch.Generator().manual_seed(0))
    cached = decode(model, prompt, 20, temperature=0, use_kv_cache=True)
    fresh = decode(model, prompt, 20, temperature=0, use_kv_cache=False)
    assert torch.equal(cached.tokens, fresh.tokens)
    assert (cached.logits - fresh.logits).abs().max() <= 1e-5


def test_cached_decoding_with_a_pattern_hook_matches_the_fast_path():
    model = HookedTransformer(tiny_config(positions="rotary"), seed=2).eval()
    prompt = torch.randint(0, 100, (2, 6), generator=torch.Generator().manual_seed(1))
    plain = decode(model, prompt, 8, temperature=0)
    with model.hooks(fwd_hooks=[(lambda n: n.endswith("hook_pattern"), lambda x, hook: x)]):
        hooked = decode(model, prompt, 8, temperature=0)
    assert torch.equal(plain.tokens, hooked.tokens)
    assert (plain.logits - hooked.logits).abs().max() <= 1e-5


def test_generation_works_for_models_from_hugging_face(hf_case):
    hf = hf_case.build()
    model = from_hf(hf)
    prompt = torch.randint(0, 100, (2, 4), generator=torch.Generator().manual_seed(0))
    ours = generate(model, prompt, 10, temperature=0)
    with torch.no_grad():
        theirs = hf.generate(
            prompt, max_new_tokens=10, do_sample=False, attention_mask=torch.ones_like(prompt), pad_token_id=0
        )
    assert torch.equal(ours, theirs)


def test_temperature_zero_is_greedy_and_small_temperature_approaches_it():
    logits = torch.tensor([[1.0, 3.0, 2.9, -1.0]])
    assert sample_next(logits, temperature=0).item() == 1
    draws = torch.stack([sample_next(logits, 0.01, generator=torch.Generator().manual_seed(s)) for s in range(50)])
    assert (draws == 1).float().mean() > 0.95


def test_large_temperature_approaches_uniform():
    logits = torch.tensor([0.0, 1.0, 2.0, 3.0])
    kl_to_uniform = []
    for T in (1.0, 10.0, 100.0, 1000.0):
        p = (logits / T).softmax(-1)
        kl_to_uniform.append(float((p * (p * 4).log()).sum()))
    assert all(a > b for a, b in zip(kl_to_uniform, kl_to_uniform[1:]))
    assert kl_to_uniform[-1] < 1e-5


def test_top_p_keeps_the_smallest_set_whose_mass_reaches_p():
    probs = torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15])  # sorted: 0.4, 0.3, 0.15, 0.1, 0.05
    logits = probs.log()

    def kept(p: float) -> set[int]:
        return set(torch.isfinite(filter_logits(logits, top_p=p)).nonzero().flatten().tolist())

    assert kept(0.4) == {1}  # 0.4 reaches 0.4 on its own
    assert kept(0.41) == {1, 3}
    assert kept(0.7) == {1, 3}  # 0.4 + 0.3 = 0.7
    assert kept(0.71) == {1, 3, 4}
    assert kept(0.95) == {1, 3, 4, 2}
    assert kept(1.0) == {0, 1, 2, 3, 4}


def test_top_k_and_samples_follow_the_filtered_distribution():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]]).repeat(4000, 1)
    draws = sample_next(logits, top_k=2, generator=torch.Generator().manual_seed(0))
    assert set(draws.tolist()) == {2, 3}
    expected = torch.tensor([2.0, 3.0]).softmax(-1)[0].item()  # P(token 2) within the top 2
    assert abs((draws == 2).float().mean().item() - expected) < 0.03


def test_a_sampling_draws_as_sample_next_and_forma_s_sampler_refuses_a_frequency_penalty():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]]).repeat(50, 1)
    drawn = Sampling(0.8, top_k=3, top_p=0.9, generator=torch.Generator().manual_seed(0)).draw(logits)
    assert torch.equal(drawn, sample_next(logits, 0.8, 3, 0.9, torch.Generator().manual_seed(0)))
    with pytest.raises(ValueError, match="frequency penalty"):
        Sampling(freq_penalty=1.0).draw(logits)  # TransformerLens's sampler has one (model.generate); Forma's none


def test_seeded_sampling_is_reproducible_and_eos_stops():
    model = HookedTransformer(tiny_config(), seed=0).eval()
    prompt = torch.zeros(2, 3, dtype=torch.long)
    a, b = generate(model, prompt, 10, seed=5), generate(model, prompt, 10, seed=5)
    assert torch.equal(a, b)
    out = decode(model, prompt, 10, temperature=0, eos_token_id=int(model(prompt)[0, -1].argmax()))
    assert out.tokens.shape[1] == 4


def test_bad_generation_arguments():
    model = HookedTransformer(tiny_config(), seed=0)
    prompt = torch.zeros(1, 60, dtype=torch.long)
    with pytest.raises(ValueError, match="longer than the model's context"):
        generate(model, prompt, 10)
    with pytest.raises(ValueError, match="top_p"):
        generate(model, prompt[:, :3], 2, top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        generate(model, prompt[:, :3], 2, temperature=-1)


def test_decoding_into_a_given_cache_fills_it_and_changes_nothing():
    from lab.model.kv_cache import KVCache

    model = HookedTransformer(tiny_config(), seed=2).eval()
    prompt = torch.randint(0, 100, (2, 5), generator=torch.Generator().manual_seed(0))
    cache = KVCache.empty(model.cfg.n_layers)
    given = decode(model, prompt, 7, temperature=0, kv_cache=cache)
    assert torch.equal(given.tokens, decode(model, prompt, 7, temperature=0).tokens)
    assert cache.length == 5 + 7 - 1  # the last token is drawn, never read back
    with pytest.raises(ValueError, match="empty KVCache"):
        decode(model, prompt, 2, kv_cache=cache)
    with pytest.raises(ValueError, match="use_kv_cache"):
        decode(model, prompt, 2, use_kv_cache=False, kv_cache=KVCache.empty(model.cfg.n_layers))


@pytest.mark.parametrize("variant", VARIANTS, ids=["learned", "rotary-gqa", "sinusoidal-post-ln"])
def test_decoding_logits_are_the_uncached_forward_passes(variant):
    """Each step's logits (the final norm and unembedding at the last position only, keys from a preallocated
    cache) equal those the full forward pass over the finished sequence gives at that position."""
    model = HookedTransformer(tiny_config(**variant), seed=2).eval()
    prompt = torch.randint(0, 100, (3, 5), generator=torch.Generator().manual_seed(0))
    for use_kv_cache in (True, False):
        out = decode(model, prompt, 12, temperature=0, use_kv_cache=use_kv_cache)
        with torch.no_grad():
            full = model(out.tokens)[:, prompt.shape[1] - 1 : -1]
        assert (out.logits - full).abs().max() <= 1e-5


def test_next_token_logits_are_the_last_position_of_forward_and_hooks_see_every_position(model, tokens):
    with torch.no_grad():
        full = model(tokens)
        assert (model.next_token_logits(tokens) - full[:, -1]).abs().max() <= 1e-5
        cache = KVCache.empty(model.cfg.n_layers)
        model.next_token_logits(tokens[:, :-3], cache)
        assert (model.next_token_logits(tokens[:, -3:], cache) - full[:, -1]).abs().max() <= 1e-5
        seen = {}
        hooks = [
            (name, lambda x, hook: seen.__setitem__(hook.name, x.shape))
            for name in ("ln_final.hook_normalized", "unembed.hook_out")
        ]
        with model.hooks(fwd_hooks=hooks):
            hooked = model.next_token_logits(tokens)
    assert seen == {
        "ln_final.hook_normalized": (*tokens.shape, model.cfg.d_model),
        "unembed.hook_out": (*tokens.shape, model.cfg.d_vocab),
    }
    assert (hooked - full[:, -1]).abs().max() <= 1e-5


def test_a_cache_with_capacity_writes_every_step_in_place():
    entry = KVCacheEntry(capacity=10)
    steps = [torch.randn(2, n, 3, 4) for n in (4, 1, 1, 1, 1, 1, 1)]
    buffer = None
    for i, k in enumerate(steps):
        keys, values = entry.append(k, -k)
        buffer = entry._keys.data_ptr() if buffer is None else buffer
        assert entry._keys.data_ptr() == buffer  # never moved into a larger buffer
        assert torch.equal(keys, torch.cat(steps[: i + 1], dim=1)) and torch.equal(values, -keys)
    entry.append(torch.randn(2, 2, 3, 4), torch.randn(2, 2, 3, 4))  # past the capacity: it grows, keeping the prefix
    assert entry.length == 12 and torch.equal(entry.keys[:, :10], torch.cat(steps, dim=1))


def test_generate_keeps_no_logits_and_gives_the_tokens_decode_gives(model):
    prompt = torch.randint(0, 100, (2, 5), generator=torch.Generator().manual_seed(0))
    kept = decode(model, prompt, 6, temperature=0)
    bare = decode(model, prompt, 6, temperature=0, keep_logits=False)
    assert bare.logits is None and torch.equal(bare.tokens, kept.tokens)
    assert torch.equal(generate(model, prompt, 6, temperature=0), kept.tokens)


# --- model.generate: TransformerLens's arguments ---------------------------------------------------
@pytest.fixture
def worded(tmp_path):
    """A LLaMA-shaped model from a Hugging Face folder with a word-level tokenizer (w0 … w95, BOS, EOS, pad)."""
    from lab.hf.loading import load_hf

    hf_model("llama").save_pretrained(tmp_path)
    word_tokenizer(tmp_path)
    return load_hf(tmp_path)


def test_model_generate_takes_text_and_gives_text_or_tokens(worded):
    text = worded.generate("w1 w2 w3", max_new_tokens=4, do_sample=False, stop_at_eos=False, verbose=False)
    tokens = worded.generate("w1 w2 w3", max_new_tokens=4, do_sample=False, stop_at_eos=False, return_type="tokens")
    assert isinstance(text, str) and text.startswith("w1 w2 w3")
    assert tokens.tolist()[0][:4] == [2, 5, 6, 7]  # the BOS first: a Hugging Face model whose tokenizer has one
    assert text == worded.tokenizer.decode(tokens[0].tolist(), skip_special_tokens=True)
    greedy = decode(worded, worded.to_tokens("w1 w2 w3"), 4, temperature=0).tokens
    assert torch.equal(tokens, greedy)
    assert torch.equal(worded.generate(greedy[:, :4], 4, do_sample=False, stop_at_eos=False), greedy)


def test_model_generate_pads_a_batch_of_texts_on_the_left_and_each_row_is_its_text_alone(worded):
    texts = ["w1 w2 w3 w4 w5", "w7 w8"]
    batch = worded.generate(texts, 5, do_sample=False, stop_at_eos=False, return_type="tokens")
    for row, text in zip(batch, texts):
        alone = worded.generate(text, 5, do_sample=False, stop_at_eos=False, return_type="tokens")[0]
        assert torch.equal(row[-alone.shape[0] :], alone)
        assert set(row[: len(row) - alone.shape[0]].tolist()) <= {worded.pad_token_id()}
    for use_cache in (True, False):  # the padding masked with the KV cache and without it alike
        again = worded.generate(
            texts, 5, do_sample=False, stop_at_eos=False, return_type="tokens", use_past_kv_cache=use_cache
        )
        assert torch.equal(again, batch)


def test_model_generate_stops_at_eos_and_samples_as_transformer_lens_does(worded):
    prompt = worded.to_tokens("w1 w2")
    first = int(decode(worded, prompt, 1, temperature=0).tokens[0, -1])
    stopped = worded.generate(prompt, 6, do_sample=False, eos_token_id=first)
    assert stopped.shape[1] == prompt.shape[1] + 1  # the EOS ends the only row
    a = worded.generate(prompt, 6, stop_at_eos=False, seed=3, top_k=5, freq_penalty=1.0)
    assert torch.equal(a, worded.generate(prompt, 6, stop_at_eos=False, seed=3, top_k=5, freq_penalty=1.0))
    torch.manual_seed(0)
    b = worded.generate(prompt, 6, stop_at_eos=False, temperature=0.7)
    torch.manual_seed(0)
    assert torch.equal(b, worded.generate(prompt, 6, stop_at_eos=False, temperature=0.7))


def test_model_generate_refuses_what_transformer_lens_refuses(model):
    prompt = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(AssertionError, match="eos_token_id"):  # a Misuse: a ValueError as well
        model.generate(prompt, 3)
    with pytest.raises(Misuse, match="no tokenizer"):
        model.generate("hello", 3)
    with pytest.raises(ValueError, match="return_type"):
        model.generate(prompt, 3, stop_at_eos=False, return_type="logits")
    assert model.generate(prompt, 3, stop_at_eos=False).shape == (1, 6)


def test_model_generate_from_embeddings_continues_as_from_the_ids(worded):
    """Token embeddings in: the same greedy continuation as from the ids, returned as the new ids, or as the
    embeddings of the whole sequence."""
    prompt = worded.to_tokens("w1 w2 w3")
    from_ids = worded.generate(prompt, 4, do_sample=False, stop_at_eos=False)
    embeds = worded.embed(prompt).detach()
    for use_cache in (True, False):
        new = worded.generate(
            embeds, 4, do_sample=False, stop_at_eos=False, return_type="tokens", use_past_kv_cache=use_cache
        )
        assert torch.equal(new, from_ids[:, prompt.shape[1] :])
    out = worded.generate(embeds, 4, do_sample=False, stop_at_eos=False)
    assert out.shape == (1, prompt.shape[1] + 4, worded.cfg.d_model)
    with torch.inference_mode():
        assert torch.equal(out, worded.embed(from_ids))
