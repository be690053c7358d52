"""`HookedTransformer.generate` with TransformerLens's arguments and behaviour: text or ids in, text or ids out,
greedy or sampled by TransformerLens's own sampler (`transformer_lens.utilities.sample_logits`: temperature,
top-k, top-p, frequency penalty), stopping at EOS, batches of texts padded on the left.

The same torch seed gives TransformerLens's tokens; `seed=` draws from a seed of its own (the global generator
untouched). Forma's own decoding loop (`lab.model.decoding`: `decode`, `generate`) is the one its experiments
use, with its own sampler; both take their settings as one `Sampling` and read `next_token_logits` and a KV cache.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor
from transformer_lens.utilities import sample_logits

from lab.model.decoding import Sampling, check_max_new_tokens
from lab.model.errors import Misuse
from lab.model.kv_cache import KVCache
from lab.model.tokenization import is_text

RETURN_TYPES = ("input", "str", "tokens", "embeds")


@torch.inference_mode()
def generate(
    model: Any,
    input: str | list[str] | Tensor = "",
    max_new_tokens: int = 10,
    stop_at_eos: bool = True,
    eos_token_id: int | list[int] | None = None,
    do_sample: bool = True,
    top_k: int | None = None,
    top_p: float | None = None,
    temperature: float = 1.0,
    freq_penalty: float = 0.0,
    use_past_kv_cache: bool = True,
    prepend_bos: bool | None = None,
    padding_side: str | None = None,
    return_type: str | None = "input",
    verbose: bool = True,
    *,
    seed: int | None = None,
) -> Any:
    """Extend the input by up to max_new_tokens tokens, as TransformerLens's HookedTransformer.generate does.

    input: a text, a list of texts (padded on the left, so that every row's last token is real), [batch, pos] ids, or
    [batch, pos, d_model] token embeddings (positions are added to them). Rows that emit an EOS token (eos_token_id,
    else the tokenizer's; a list stops at any of them) keep emitting it, and decoding stops when every row has, unless
    stop_at_eos=False. do_sample=False (or temperature 0) takes the argmax. return_type "input" gives what came in (text
    for text, ids for ids, embeddings for embeddings); "str" decodes (special tokens left out, one string for one row);
    "tokens" the ids; "embeds" the embeddings of the whole sequence. From embeddings, "str" and "tokens" are of the new
    tokens only, as in TransformerLens. verbose is accepted for TransformerLens's code; Forma prints no progress bar."""
    text = _check(input, return_type)
    if isinstance(input, Tensor) and input.is_floating_point():
        return _from_embeddings(
            model,
            input,
            max_new_tokens,
            _stop_tokens(model, stop_at_eos, eos_token_id),
            # TransformerLens applies no frequency penalty from embeddings
            Sampling(temperature if do_sample else 0.0, top_k, top_p),
            use_past_kv_cache,
            return_type,
            seed,
        )
    tokens, mask = _tokens(model, input, text, prepend_bos, padding_side)
    check_max_new_tokens(max_new_tokens, tokens.shape[1], model.cfg.n_ctx)
    with _seeded(seed, tokens.device):
        out = _decode(
            model,
            tokens,
            mask,
            max_new_tokens,
            _stop_tokens(model, stop_at_eos, eos_token_id),
            Sampling(temperature if do_sample else 0.0, top_k, top_p, freq_penalty=freq_penalty),
            use_past_kv_cache,
        )
    return _returned(model, out, return_type, "str" if text else "tokens")


def _check(input: Any, return_type: str | None) -> bool:
    """Misuse for a return_type or an input generate does not take; whether the input is text."""
    if return_type not in RETURN_TYPES:
        raise Misuse(f"return_type must be one of {list(RETURN_TYPES)}, got {return_type!r}")
    text = is_text(input)
    if not text and not isinstance(input, Tensor):
        raise Misuse(f"input must be a string, a list of strings or a tensor of token ids, got {type(input).__name__}")
    return text


def _tokens(
    model: Any, input: Any, text: bool, prepend_bos: bool | None, padding_side: str | None
) -> tuple[Tensor, Tensor | None]:
    """The input's ids, and its padding mask (None where no row is padded): texts tokenized (a batch padded on
    the left), ids checked with their padding inferred."""
    if text:
        batched = isinstance(input, list) and len(input) > 1
        tokens, mask = model.tokenize(input, prepend_bos, "left" if batched else padding_side)
    else:
        tokens = model.check_tokens(input)
        mask = None if model.tokenizer is None else model.inferred_padding(tokens, prepend_bos, padding_side)
    if mask is not None and bool(mask.all()):
        mask = None
    return tokens, mask


@contextmanager
def _seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Draw from `seed` (the global generators left as they were); from the global generator when None."""
    with torch.random.fork_rng(devices=[] if device.type == "cpu" else [device], enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        yield


def _returned(model: Any, tokens: Tensor, return_type: str | None, came_in: str) -> Any:
    """The tokens as return_type asks ("input": as `came_in`)."""
    return_type = came_in if return_type == "input" else return_type
    if return_type == "tokens":
        return tokens
    if return_type == "embeds":
        return model.embed(tokens)
    texts = [model.tokenizer.decode(row.tolist(), skip_special_tokens=True) for row in tokens]
    return texts[0] if len(texts) == 1 else texts


def _from_embeddings(
    model: Any,
    embeds: Tensor,
    max_new_tokens: int,
    stop: list[int],
    sampling: Sampling,
    use_past_kv_cache: bool,
    return_type: str | None,
    seed: int | None,
) -> Any:
    """Decoding from [batch, pos, d_model] token embeddings: positions added (or given to the attention, shortformer
    positions), then the blocks (hook_embed does not
    fire: the embeddings are given); each new token's embedding is W_E's row."""
    if embeds.ndim != 3 or embeds.shape[-1] != model.cfg.d_model:
        raise Misuse(f"embeddings must be [batch, pos, d_model = {model.cfg.d_model}], got {tuple(embeds.shape)}")
    check_max_new_tokens(max_new_tokens, embeds.shape[1], model.cfg.n_ctx)
    batch = embeds.shape[0]
    cache = KVCache.empty(model.cfg.n_layers, embeds.shape[1] + max_new_tokens) if use_past_kv_cache else None
    finished = torch.zeros(batch, dtype=torch.bool, device=embeds.device)
    new, sampled_tokens = embeds, []
    with _seeded(seed, embeds.device):
        for _ in range(max_new_tokens):
            offset = 0 if cache is None else cache.length
            positions = model.pos_embed(new[..., 0], offset)
            positions = None if positions is None else model.hook_pos_embed(positions.clone())
            into_attention = positions is not None and model.pos_embed.into_attention  # shortformer
            x = new if positions is None or into_attention else new + positions
            logits = model._run(
                None, x, cache, 0, model.cfg.n_layers, slice(-1, None), None, positions if into_attention else None
            )[:, -1]
            sampled = _draw(sampling, logits)
            if stop:
                sampled = sampled.masked_fill(finished, stop[0])
                finished |= torch.isin(sampled, torch.tensor(stop, device=sampled.device))
            sampled_tokens.append(sampled)
            step = model.embed(sampled[:, None])
            embeds = torch.cat((embeds, step), dim=1)
            new = step if cache is not None else embeds
            if stop and bool(finished.all()):
                break
    if return_type in ("input", "embeds"):
        return embeds
    return _returned(model, torch.stack(sampled_tokens, dim=1), return_type, "tokens")


def _draw(sampling: Sampling, logits: Tensor, tokens: Tensor | None = None) -> Tensor:
    """One token per row from [batch, d_vocab] logits by TransformerLens's sampler (`sample_logits`), the argmax at
    temperature 0 (do_sample=False comes as 0); `tokens`, the sequence so far, for the frequency penalty."""
    if sampling.temperature == 0:
        return logits.argmax(dim=-1)
    return sample_logits(
        logits,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        temperature=sampling.temperature,
        freq_penalty=sampling.freq_penalty,
        tokens=tokens,
    )


def _stop_tokens(model: Any, stop_at_eos: bool, eos_token_id: int | list[int] | None) -> list[int]:
    """The ids that end a row (the first of them pads a finished row); none without stop_at_eos."""
    if not stop_at_eos:
        return []
    if eos_token_id is None:
        eos_token_id = getattr(model.tokenizer, "eos_token_id", None)
        if eos_token_id is None and hasattr(model.tokenizer, "token_to_id"):  # Forma's own tokenizer
            eos_token_id = model.tokenizer.token_to_id("<eos>")
    if eos_token_id is None:
        raise Misuse(
            "Must pass a eos_token_id if stop_at_eos is True and the model has no tokenizer or its tokenizer "
            "has no EOS token"
        )
    stop = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    for token in stop:
        if not isinstance(token, int) or not 0 <= token < model.cfg.d_vocab:
            raise ValueError(f"eos_token_id must be token ids in [0, {model.cfg.d_vocab}), got {eos_token_id!r}")
    return stop


def _decode(
    model: Any,
    tokens: Int[Tensor, "batch pos"],
    mask: Tensor | None,
    max_new_tokens: int,
    stop: list[int],
    sampling: Sampling,
    use_past_kv_cache: bool,
) -> Int[Tensor, "batch pos"]:
    """TransformerLens's decoding loop over `model.next_token_logits`, with Forma's KV cache (room for the whole
    sequence from the start) carrying the padding mask; without the cache each step reruns the whole sequence
    with the mask extended by the tokens drawn so far."""
    batch = tokens.shape[0]
    cache = KVCache.empty(model.cfg.n_layers, tokens.shape[1] + max_new_tokens) if use_past_kv_cache else None
    finished = torch.zeros(batch, dtype=torch.bool, device=tokens.device)
    stops = torch.tensor(stop, device=tokens.device)
    sequence, new = tokens, tokens
    for _ in range(max_new_tokens):
        step_mask = mask if cache is None or cache.length == 0 else None
        logits = model.next_token_logits(new, cache, attention_mask=step_mask)
        sampled = _draw(sampling, logits, sequence)
        if stop:
            sampled = sampled.masked_fill(finished, stop[0])
            finished |= torch.isin(sampled, stops)
        sequence = torch.cat((sequence, sampled[:, None]), dim=1)
        if mask is not None:
            mask = torch.cat((mask, torch.ones_like(mask[:, :1])), dim=1)
        new = sampled[:, None] if cache is not None else sequence
        if stop and bool(finished.all()):
            break
    return sequence
