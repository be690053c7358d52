"""Autoregressive sampling: softmax with temperature, top-k, nucleus (top-p), and a KV cache.

    P_T(x) = softmax(z / T)                T → 0: argmax (greedy);  T → ∞: uniform
    top-k:  keep the k largest logits
    top-p:  keep the smallest set of tokens, most probable first, whose mass reaches p
            (Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration", §3.1)

With the KV cache each step feeds only the newest token; without it each step recomputes the whole
prefix. Both give the same logits (to float round-off) and so the same greedy tokens (tested).
"""

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lab.model import HookedTransformer, KVCache


@dataclass
class Generation:
    tokens: Int[Tensor, "batch pos"]  # the prompt followed by the new tokens
    logits: Float[Tensor, "batch new d_vocab"]  # the logits each new token was drawn from


def filter_logits(logits: Float[Tensor, "... d_vocab"], top_k: int | None = None,
                  top_p: float | None = None) -> Float[Tensor, "... d_vocab"]:
    """Set to −∞ every logit outside the top-k and outside the nucleus of mass top_p."""
    if top_k is not None:
        if top_k < 1:
            raise ValueError(f"top_k must be ≥ 1, got {top_k}")
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1], got {top_p}")
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # the mass of the more probable tokens
        drop_sorted = mass_before >= top_p  # the set already reached p without this token
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next(logits: Float[Tensor, "batch d_vocab"], temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> Int[Tensor, "batch"]:
    """One token per row from softmax(filtered logits / T); T = 0 takes the argmax."""
    if temperature < 0:
        raise ValueError(f"temperature must be ≥ 0, got {temperature}")
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = filter_logits(logits.float() / temperature, top_k, top_p).softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.inference_mode()
def decode(model: HookedTransformer, tokens: Int[Tensor, "batch pos"], max_new_tokens: int, temperature: float = 1.0,
           top_k: int | None = None, top_p: float | None = None, seed: int | None = None, use_kv_cache: bool = True,
           eos_token_id: int | None = None) -> Generation:
    """Extend `tokens` by up to `max_new_tokens`, returning the tokens and the logits each was drawn from.

    Rows that emit `eos_token_id` keep emitting it; decoding stops when every row has.
    """
    tokens = model.check_tokens(tokens)
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be ≥ 0, got {max_new_tokens}")
    if tokens.shape[1] + max_new_tokens > model.cfg.n_ctx:
        raise ValueError(f"prompt of {tokens.shape[1]} tokens + {max_new_tokens} new tokens is longer than "
                         f"the model's context n_ctx = {model.cfg.n_ctx}")
    generator = None
    if seed is not None:
        generator = torch.Generator(device=tokens.device).manual_seed(seed)
    cache = KVCache.empty(model.cfg.n_layers) if use_kv_cache else None
    done = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    step_logits = []
    new = tokens  # what the next forward pass must read: everything, or only the newest token
    for _ in range(max_new_tokens):
        logits = model(new, kv_cache=cache)[:, -1]
        step_logits.append(logits)
        next_token = sample_next(logits, temperature, top_k, top_p, generator)
        if eos_token_id is not None:
            next_token = torch.where(done, eos_token_id, next_token)
            done |= next_token == eos_token_id
        tokens = torch.cat((tokens, next_token[:, None]), dim=1)
        new = next_token[:, None] if use_kv_cache else tokens
        if eos_token_id is not None and bool(done.all()):
            break
    empty = torch.empty(tokens.shape[0], 0, model.cfg.d_vocab, device=tokens.device)
    return Generation(tokens, torch.stack(step_logits, dim=1) if step_logits else empty)


def generate(model: HookedTransformer, tokens: Int[Tensor, "batch pos"], max_new_tokens: int,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
             use_kv_cache: bool = True, eos_token_id: int | None = None) -> Int[Tensor, "batch pos"]:
    """The prompt followed by up to `max_new_tokens` sampled tokens."""
    return decode(model, tokens, max_new_tokens, temperature, top_k, top_p, seed, use_kv_cache, eos_token_id).tokens
