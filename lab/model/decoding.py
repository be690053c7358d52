"""Autoregressive sampling: softmax with temperature, top-k, nucleus (top-p), a KV cache, and the one decoding loop
that both model classes run (`HookedTransformer.generate`, `EncoderDecoder.generate`).

    P_T(x) = softmax(z / T)                T → 0: argmax (greedy);  T → ∞: uniform
    top-k:  keep the k largest logits
    top-p:  keep the smallest set of tokens, most probable first, whose mass reaches p
            (Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration", §3.1)

With the KV cache each step feeds only the newest token; without it each step recomputes the whole
prefix. Both give the same logits (to float round-off) and so the same greedy tokens (tested).
"""

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from lab.model.kv_cache import KVCache

# One decoding step: the next token's logits [batch, d_vocab] after the tokens fed in, which continue the cache's
# prefix (the whole sequence so far when there is no cache).
StepFn = Callable[[Int[Tensor, "batch pos"], KVCache | None], Float[Tensor, "batch d_vocab"]]


@dataclass
class Generation:
    tokens: Int[Tensor, "batch pos"]  # the prompt followed by the new tokens
    logits: Float[Tensor, "batch new d_vocab"] | None  # the logits each new token was drawn from (None: not kept)


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_sampling(temperature: Any = 1.0, top_k: Any = None, top_p: Any = None, seed: Any = None) -> None:
    """ValueError for a sampling argument out of range — checked whatever the temperature, so that an argument
    greedy decoding happens not to read is still a mistake reported, not one silently ignored."""
    if not (_is_real(temperature) and math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number ≥ 0 (0 = greedy), got {temperature!r}")
    if top_k is not None and not (_is_int(top_k) and top_k >= 1):
        raise ValueError(f"top_k must be an integer ≥ 1 (or None), got {top_k!r}")
    if top_p is not None and not (_is_real(top_p) and 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must lie in (0, 1] (or be None), got {top_p!r}")
    if seed is not None and not _is_int(seed):
        raise ValueError(f"seed must be an integer (or None), got {seed!r}")


def check_token_id(value: Any, name: str, d_vocab: int, optional: bool = True) -> None:
    """ValueError unless `value` is a token id in [0, d_vocab) (or None, when optional)."""
    if value is None and optional:
        return
    if not (_is_int(value) and 0 <= value < d_vocab):
        raise ValueError(f"{name} must be a token id in [0, d_vocab) = [0, {d_vocab}), got {value!r}")


def check_max_new_tokens(value: Any, prompt_length: int, n_ctx: int) -> None:
    """ValueError unless prompt_length + value new tokens fit the context."""
    if not (_is_int(value) and value >= 0):
        raise ValueError(f"max_new_tokens must be an integer ≥ 0, got {value!r}")
    if prompt_length + value > n_ctx:
        raise ValueError(
            f"prompt of {prompt_length} tokens + {value} new tokens is longer than the model's context n_ctx = {n_ctx}"
        )


def filter_logits(
    logits: Float[Tensor, "... d_vocab"], top_k: int | None = None, top_p: float | None = None
) -> Float[Tensor, "... d_vocab"]:
    """Set to −∞ every logit outside the top-k and outside the nucleus of mass top_p."""
    check_sampling(top_k=top_k, top_p=top_p)
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # the mass of the more probable tokens
        drop_sorted = mass_before >= top_p  # the set already reached p without this token
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next(
    logits: Float[Tensor, "batch d_vocab"],
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Int[Tensor, " batch"]:
    """One token per row from softmax(filtered logits / T); T = 0 takes the argmax.

    The logits are shifted by their maximum before dividing by T, in float64: softmax does not change, and
    for a tiny T (1e-45, or below float32's smallest number) z / T is −∞ or 0 instead of ∞ − ∞ = NaN, so the
    draw tends to the argmax as T → 0. The probabilities go back to float32 for the draw itself.
    """
    check_sampling(temperature, top_k, top_p)
    if temperature == 0:
        return logits.argmax(dim=-1)
    z = logits.double()
    z = (z - z.amax(dim=-1, keepdim=True)) / temperature
    probs = filter_logits(z, top_k, top_p).softmax(dim=-1).float()
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@dataclass(frozen=True)
class Sampling:
    """How each new token is drawn from its logits: softmax(z / T) over the top-k and the nucleus of mass top_p,
    the argmax at T = 0. Forma's sampler (`draw`: `sample_next`, from `generator`, None for torch's global one) is
    the one `sample_tokens` runs; `HookedTransformer.generate` draws with the same settings by TransformerLens's
    (from the global generator, less freq_penalty × each token's count so far). Checked by the callers
    (`check_sampling`), as TransformerLens's generate checks nothing."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    generator: torch.Generator | None = None
    freq_penalty: float = 0.0

    def draw(self, logits: Float[Tensor, "batch d_vocab"]) -> Int[Tensor, " batch"]:
        """One token per row by Forma's sampler (`sample_next`)."""
        if self.freq_penalty != 0:
            raise ValueError("Forma's sampler applies no frequency penalty (TransformerLens's generate does)")
        return sample_next(logits, self.temperature, self.top_k, self.top_p, self.generator)


def sample_tokens(
    step: StepFn,
    tokens: Int[Tensor, "batch pos"],
    max_new_tokens: int,
    d_vocab: int,
    cache: KVCache | None,
    sampling: Sampling,
    eos_token_id: int | None = None,
    keep_logits: bool = True,
) -> Generation:
    """The decoding loop: extend `tokens` by up to `max_new_tokens`, each drawn by `sampling` from the logits
    `step` gives, reading only the newest token when there is a cache and the whole sequence when not.
    keep_logits=False keeps no step's logits (Generation.logits is None), for a caller that wants only tokens.

    Rows that emit `eos_token_id` keep emitting it; decoding stops when every row has. The arguments are checked
    by the callers (`decode`, `EncoderDecoder.generate`), which know the model's context and vocabulary.
    """
    done = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    step_logits = []
    new = tokens  # what the next step must read: everything, or only the newest token
    for _ in range(max_new_tokens):
        logits = step(new, cache)
        if keep_logits:
            step_logits.append(logits)
        next_token = sampling.draw(logits)
        if eos_token_id is not None:
            next_token = torch.where(done, eos_token_id, next_token)
            done |= next_token == eos_token_id
        tokens = torch.cat((tokens, next_token[:, None]), dim=1)
        new = next_token[:, None] if cache is not None else tokens
        if eos_token_id is not None and bool(done.all()):
            break
    if not keep_logits:
        return Generation(tokens, None)
    empty = torch.empty(tokens.shape[0], 0, d_vocab, device=tokens.device)
    return Generation(tokens, torch.stack(step_logits, dim=1) if step_logits else empty)


def seeded_generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    """The sampling generator on the tokens' device, seeded; None (torch's global one) without a seed."""
    return None if seed is None else torch.Generator(device=device).manual_seed(seed)


@torch.inference_mode()
def decode(
    model: nn.Module,
    tokens: Int[Tensor, "batch pos"],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    use_kv_cache: bool = True,
    eos_token_id: int | None = None,
    kv_cache: KVCache | None = None,
    keep_logits: bool = True,
) -> Generation:
    """Extend `tokens` by up to `max_new_tokens` with a `HookedTransformer`, returning the tokens and the logits
    each was drawn from (None with keep_logits=False).

    Rows that emit `eos_token_id` keep emitting it; decoding stops when every row has. `kv_cache`: an empty cache to
    decode into (default a fresh one, with room for the whole sequence from the start, so that no step copies the
    keys into a larger buffer), for a caller that reads the keys and values while they are written. Each step runs
    `model.next_token_logits`, whose final norm and unembedding see the last position only when nothing hooks them.
    """
    tokens = model.check_tokens(tokens)
    check_max_new_tokens(max_new_tokens, tokens.shape[1], model.cfg.n_ctx)
    check_sampling(temperature, top_k, top_p, seed)
    check_token_id(eos_token_id, "eos_token_id", model.cfg.d_vocab)
    if kv_cache is not None and (not use_kv_cache or kv_cache.length != 0):
        raise ValueError("kv_cache must be an empty KVCache (KVCache.empty(n_layers)), and use_kv_cache True")
    fed = tokens.shape[1] + max(max_new_tokens - 1, 0)  # the last token is drawn, never fed back
    cache = (KVCache.empty(model.cfg.n_layers, fed) if kv_cache is None else kv_cache) if use_kv_cache else None
    return sample_tokens(
        model.next_token_logits,
        tokens,
        max_new_tokens,
        model.cfg.d_vocab_out,
        cache,
        Sampling(temperature, top_k, top_p, seeded_generator(seed, tokens.device)),
        eos_token_id,
        keep_logits,
    )


def generate(
    model: nn.Module,
    tokens: Int[Tensor, "batch pos"],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    use_kv_cache: bool = True,
    eos_token_id: int | None = None,
) -> Int[Tensor, "batch pos"]:
    """The prompt followed by up to `max_new_tokens` sampled tokens (a `HookedTransformer`; see `decode`)."""
    return decode(
        model, tokens, max_new_tokens, temperature, top_k, top_p, seed, use_kv_cache, eos_token_id, keep_logits=False
    ).tokens
