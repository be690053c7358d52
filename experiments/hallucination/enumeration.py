"""g, the model's distribution over documents, by exact enumeration with shared prefixes (the package docstring),
the documents it samples at T = 1, and the held-out NLL that picks the optimum."""

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from experiments.hallucination.setting import Setting
from lab.model.decoding import decode
from lab.model.kv_cache import KVCache, KVCacheEntry
from lab.model.transformer import HookedTransformer


# --------------------------------------------------------------------------------------------
# g by enumeration
# --------------------------------------------------------------------------------------------
@dataclass
class Enumeration:
    """The model's exact distribution over documents, split by the grammar.

    log_g[i, j, v]: log-probability of the well-formed document (first i, last j, value v);
    prompt_log_p[i, j]: log P(first i, last j, attribute) — the prompt of the singleton variant;
    leaks[k]: probability of leaving the grammar at document position k + 1 (the malformed mass, by where).
    """

    log_g: Float[np.ndarray, "n_first n_last n_values"]
    prompt_log_p: Float[np.ndarray, "n_first n_last"]
    leaks: list[float]

    @property
    def malformed(self) -> float:
        return float(sum(self.leaks))


def _expand(cache: KVCache, rows: Tensor, repeats: int) -> KVCache:
    """A new cache holding `rows` of `cache`, each repeated `repeats` times in place (row-major)."""
    return KVCache(
        [
            KVCacheEntry(e.keys[rows].repeat_interleave(repeats, 0), e.values[rows].repeat_interleave(repeats, 0))
            for e in cache.entries
        ]
    )


def _log_probs(logits: Tensor) -> Tensor:
    # In the model's float32 (≈1e-7 relative per probability); what is gathered from it is summed in float64.
    return logits.log_softmax(dim=-1)


def _leak(log_p: Tensor, allowed: Tensor) -> Tensor:
    """Probability of the tokens outside `allowed` (summed directly, never as 1 − the allowed mass)."""
    return log_p.exp().masked_fill(allowed, 0.0).sum(dim=-1).double()


def _allowed(ids: Tensor, d_vocab: int) -> Tensor:
    mask = torch.zeros(d_vocab, dtype=torch.bool)
    mask[ids] = True
    return mask


def _value_prefixes(value_ids: torch.Tensor, d_vocab: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Value prefixes at each depth t: the distinct first-t-token prefixes, each value's prefix among them, and
    which tokens may follow each ([prefix, vocab])."""
    depths = []
    for t in range(value_ids.shape[1]):
        if t == 0:  # the empty prefix: every value shares it
            prefixes, inverse = value_ids[:1, :0], torch.zeros(len(value_ids), dtype=torch.long)
        else:
            prefixes, inverse = torch.unique(value_ids[:, :t], dim=0, return_inverse=True)
        allowed = torch.zeros(len(prefixes), d_vocab, dtype=torch.bool)
        allowed[inverse, value_ids[:, t]] = True
        depths.append((prefixes, inverse, allowed))
    return depths


@torch.inference_mode()
def enumerate_g(model: HookedTransformer, setting: Setting, firsts_per_chunk: int = 4) -> Enumeration:
    """g over every well-formed factoid, exactly, with shared prefixes (the package's docstring)."""
    model.eval()
    n_first, n_last, n_values = setting.shape
    d_vocab = model.cfg.d_vocab
    first_ok, last_ok = _allowed(setting.first_ids, d_vocab), _allowed(setting.last_ids, d_vocab)
    attribute_ok = _allowed(torch.tensor([setting.attribute_id]), d_vocab)
    value_len = setting.value_ids.shape[1]

    # Positions 0–1: "<bos> First" for every first name, in one batch.
    head = torch.stack((torch.full((n_first,), setting.bos_id), setting.first_ids), dim=1)
    head_cache = KVCache.empty(model.cfg.n_layers)
    head_lp = _log_probs(model(head, kv_cache=head_cache))  # [first, 2, vocab]
    first_lp = head_lp[0, 0, setting.first_ids].double()  # P(First | <bos>), the same in every row
    last_lp = head_lp[:, 1][:, setting.last_ids].double()  # [first, last]
    leaks = [float(_leak(head_lp[0, 0], first_ok)), float((first_lp.exp() * _leak(head_lp[:, 1], last_ok)).sum())]
    leaks += [0.0] * (1 + value_len)

    depths = _value_prefixes(setting.value_ids, d_vocab)

    log_g = np.empty((n_first, n_last, n_values))
    prompt_log_p = np.empty((n_first, n_last))
    for start in range(0, n_first, firsts_per_chunk):
        firsts = torch.arange(start, min(start + firsts_per_chunk, n_first))
        n_pairs = len(firsts) * n_last
        # Positions 2–3: "Last attribute" after every first name of the chunk.
        cache = _expand(head_cache, firsts, n_last)
        tail = torch.stack((setting.last_ids.repeat(len(firsts)), torch.full((n_pairs,), setting.attribute_id)), 1)
        tail_lp = _log_probs(model(tail, kv_cache=cache))  # [pair, 2, vocab]
        name_lp = first_lp[firsts].repeat_interleave(n_last) + last_lp[firsts].reshape(-1)
        leaks[2] += float((name_lp.exp() * _leak(tail_lp[:, 0], attribute_ok)).sum())
        prompt_lp = name_lp + tail_lp[:, 0, setting.attribute_id].double()
        value_lp = torch.zeros(n_pairs, n_values, dtype=torch.float64)
        for t in range(value_len):
            prefixes, inverse, allowed = depths[t]
            if t == 0:
                next_lp = tail_lp[:, 1][:, None, :]  # [pair, 1, vocab]
            else:  # Positions 4+: each distinct value prefix after every pair, on the pair's cache.
                prefix_cache = _expand(cache, torch.arange(n_pairs), len(prefixes))
                tokens = prefixes.repeat(n_pairs, 1)
                next_lp = _log_probs(model(tokens, kv_cache=prefix_cache)[:, -1]).view(n_pairs, len(prefixes), -1)
            # The mass of each prefix (one value stands for all that share it) times its leak.
            representative = torch.zeros(len(prefixes), dtype=torch.long).scatter_(0, inverse, torch.arange(n_values))
            prefix_mass = (prompt_lp[:, None] + value_lp[:, representative]).exp()
            leak = _leak(next_lp, allowed[None])  # [pair, prefix]
            leaks[3 + t] += float((prefix_mass * leak).sum())
            value_lp += next_lp[:, inverse, setting.value_ids[:, t]].double()  # gather [pair, value]
        log_g[firsts.numpy()] = (prompt_lp[:, None] + value_lp).view(len(firsts), n_last, n_values).numpy()
        prompt_log_p[firsts.numpy()] = prompt_lp.view(len(firsts), n_last).numpy()
    return Enumeration(log_g, prompt_log_p, leaks)


@torch.inference_mode()
def sample_documents(model: HookedTransformer, setting: Setting, n: int, seed: int) -> dict[str, int]:
    """Draw n documents at T = 1 from the full softmax (no top-k, no top-p) and judge each with
    `FactWorld.classify_bare` (the constant "." the documents leave out is put back for it)."""
    model.eval()
    prompt = torch.full((n, 1), setting.bos_id)
    tokens = decode(model, prompt, setting.doc_len - 1, temperature=1.0, seed=seed).tokens[:, 1:]
    words = [[setting.tokenizer.id_to_token(int(i)) for i in row] for row in tokens]
    verdicts = [setting.world.classify_bare(" ".join(w) + " .") for w in words]
    return {kind: verdicts.count(kind) for kind in ("fact", "hallucination", "malformed")}


@torch.inference_mode()
def heldout_nll(model: HookedTransformer, rows: Tensor) -> float:
    """Mean −log P(document) in nats over held-out documents (every position after <bos>)."""
    model.eval()
    log_p = model(rows).double().log_softmax(-1)[:, :-1]
    return float(-log_p.gather(-1, rows[:, 1:, None]).sum(dim=(1, 2)).mean())
