"""The explicit attention path's scores, written out: hook_attn_scores holds q kᵀ / √d_head + M exactly as
the equation says (M the causal, windowed mask in absolute positions), computed here from the hooked q and k
with plain tensor operations, with and without a KV cache prefix."""

import math

import pytest
import torch

from lab import HookedTransformer
from lab.model.kv_cache import KVCache
from tests.builders import VOCAB, tiny_config

VARIANTS = {
    "gpt2-like": dict(),
    "gqa-rotary": dict(positions="rotary", n_kv_heads=2, mlp="swiglu", norm="rmsnorm", bias=False),
    "window": dict(positions="rotary", sliding_window=5),
    "d_head-12": dict(d_model=48, n_heads=4),  # √12 is no power of two: the scale rounds differently
}


def literal_scores(q: torch.Tensor, k: torch.Tensor, offset: int, window: int) -> torch.Tensor:
    """q kᵀ / √d_head + M from q [batch, q_pos, head, d_head] and k [batch, k_pos, kv_head, d_head]."""
    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    i = torch.arange(q.shape[1])[:, None] + offset
    j = torch.arange(k.shape[1])[None, :]
    return scores.masked_fill(~((j <= i) & (j > i - window)), float("-inf"))


@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())
def test_attention_scores_hook_holds_the_equation(variant):
    model = HookedTransformer(tiny_config(**variant), seed=3).eval()
    tokens = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(4))
    q_name = "rot_q" if model.cfg.positions == "rotary" else "q"
    k_name = "rot_k" if model.cfg.positions == "rotary" else "k"
    window = model.cfg.sliding_window or model.cfg.n_ctx
    kv_cache = KVCache.empty(model.cfg.n_layers)
    with torch.no_grad():
        model(tokens[:, :7], kv_cache=kv_cache)  # a cached prefix of 7: the new queries sit at 7 … 11
        _, cache = model.run_with_cache(tokens[:, 7:], kv_cache=kv_cache)
        _, full = model.run_with_cache(tokens)
    for layer in range(model.cfg.n_layers):
        a = f"blocks.{layer}.attn."
        expected = literal_scores(full[a + f"hook_{q_name}"], full[a + f"hook_{k_name}"], 0, window)
        got = full[a + "hook_attn_scores"]
        assert torch.equal(got.isinf(), expected.isinf())
        assert (got - expected)[~expected.isinf()].abs().max() <= 1e-5
        # with the cache: the 5 new queries against all 12 keys, the same rows of the full pass's scores
        assert torch.equal(cache[a + "hook_attn_scores"].isinf(), got[:, :, 7:].isinf())
        finite = ~got[:, :, 7:].isinf()
        assert (cache[a + "hook_attn_scores"] - got[:, :, 7:])[finite].abs().max() <= 1e-5


@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())
def test_pattern_and_z_hooks_hold_the_equation(variant):
    """hook_pattern = softmax(hook_attn_scores) and hook_z^h = A^h v^⌊h / group⌋: query head h reads key/value head
    ⌊h · n_kv_heads / n_heads⌋, written here with the keys and values repeated per query head."""
    model = HookedTransformer(tiny_config(**variant), seed=3).eval()
    tokens = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(4))
    kv_cache = KVCache.empty(model.cfg.n_layers)
    with torch.no_grad():
        model(tokens[:, :7], kv_cache=kv_cache)
        _, cached = model.run_with_cache(tokens[:, 7:], kv_cache=kv_cache)
        _, full = model.run_with_cache(tokens)
    group = model.cfg.n_heads // model.cfg.n_kv_heads
    for layer in range(model.cfg.n_layers):
        a = f"blocks.{layer}.attn."
        pattern = full[a + "hook_pattern"]
        assert (pattern - full[a + "hook_attn_scores"].softmax(dim=-1)).abs().max() <= 1e-6
        v = full[a + "hook_v"].repeat_interleave(group, dim=2)  # [batch, k_pos, head, d_head]
        assert (full[a + "hook_z"] - torch.einsum("bhqk,bkhd->bqhd", pattern, v)).abs().max() <= 1e-5
        # the 5 new queries against the 7 cached keys and their own: the same rows as the full pass's
        assert (cached[a + "hook_pattern"] - pattern[:, :, 7:]).abs().max() <= 1e-5
        assert (cached[a + "hook_z"] - full[a + "hook_z"][:, 7:]).abs().max() <= 1e-5
