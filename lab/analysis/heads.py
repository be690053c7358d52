"""Head detectors: how much of each attention head's weight falls where a head of a named kind attends.

A kind of head is a 0/1 detection pattern D over (query i, key j), j ≤ i, read from the tokens t:

    previous-token    D[i, j] = [j = i − 1]
    duplicate-token   D[i, j] = [j < i and t_j = t_i]                  (an earlier occurrence of the same token)
    induction         D[i, j] = [1 ≤ j ≤ i and t_{j−1} = t_i, j − 1 < i] (the token after an earlier occurrence)

These are TransformerLens's head_detector patterns (get_previous_token_head_detection_pattern, …). The score
of head h with attention pattern A_h (rows sum to 1) is the share of its attention that D covers, averaged
over the queries D scores — those with at least one key, Q = {(b, i) : Σ_j D_b[i, j] > 0}:

    score_h = (1 / |Q|) Σ_{(b, i) ∈ Q} Σ_j A_h[b, i, j] D_b[i, j]        ∈ [0, 1]

so a head whose attention is exactly the pattern scores 1 and one that never attends there scores 0.
TransformerLens's detect_head (error_measure="mul", no exclusions) divides the same sum by every query of
its one sequence, n = Σ_{i,j} A_h[i, j], so on one sequence detect_head = score_h · |Q| / n (tested on the
same weights). The per-query average is used here because queries with nothing to find (the first
position for a previous-token head, the first copy of a repeated sequence for an induction head) would
otherwise cap the score below 1 by an amount that depends on the sequence, not the head.

Induction and duplicate-token heads show on a repeated random sequence (Olsson et al. 2022, "In-context
learning and induction heads", §2): `repeated_tokens` draws one, and `detect_heads` scores every head of
a model on it.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

__all__ = [
    "HEAD_KINDS",
    "HeadScores",
    "detect_heads",
    "duplicate_token_pattern",
    "head_scores",
    "induction_pattern",
    "pattern_scores",
    "previous_token_pattern",
    "repeated_tokens",
]


def _check(tokens: Tensor) -> Tensor:
    tokens = tokens[None] if tokens.ndim == 1 else tokens
    if tokens.ndim != 2 or tokens.shape[1] < 2:
        raise ValueError(f"tokens must have shape [batch, pos] with pos ≥ 2, got {tuple(tokens.shape)}")
    return tokens


def previous_token_pattern(tokens: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch pos pos"]:
    """D[b, i, j] = [j = i − 1]: the key just before the query."""
    tokens = _check(tokens)
    n = tokens.shape[1]
    return torch.ones(n, n, dtype=torch.bool, device=tokens.device).tril(-1).triu(-1).expand(tokens.shape[0], n, n)


def duplicate_token_pattern(tokens: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch pos pos"]:
    """D[b, i, j] = [j < i and t_j = t_i]: every earlier occurrence of the query's token."""
    tokens = _check(tokens)
    same = tokens[:, :, None] == tokens[:, None, :]
    return same & torch.ones_like(same[0]).tril(-1)


def induction_pattern(tokens: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch pos pos"]:
    """D[b, i, j] = [t_{j−1} = t_i, j − 1 < i]: the token that followed an earlier occurrence of the query's
    token (the duplicate-token pattern shifted one key to the right)."""
    duplicate = duplicate_token_pattern(tokens)
    shifted = torch.zeros_like(duplicate)
    shifted[:, :, 1:] = duplicate[:, :, :-1]
    return shifted


HEAD_KINDS: dict[str, Callable[[Tensor], Tensor]] = {
    "previous_token": previous_token_pattern,
    "duplicate_token": duplicate_token_pattern,
    "induction": induction_pattern,
}


def pattern_scores(
    patterns: Float[Tensor, "batch head pos pos"], detection: Bool[Tensor, "batch pos pos"]
) -> Float[Tensor, " head"]:
    """score_h = mean over the scored queries (those with a key in `detection`) of Σ_j A_h[i, j] D[i, j]."""
    if patterns.ndim != 4 or patterns.shape[0] != detection.shape[0] or patterns.shape[2:] != detection.shape[1:]:
        raise ValueError(
            f"attention patterns {tuple(patterns.shape)} [batch, head, query, key] do not match the "
            f"detection pattern {tuple(detection.shape)} [batch, query, key]"
        )
    scored = detection.any(dim=-1)  # [batch, query]
    if not scored.any():
        raise ValueError(
            "no query has a key in the detection pattern (for duplicate-token and induction heads the "
            "tokens need a repeat): nothing to score"
        )
    captured = (patterns * detection[:, None].to(patterns.dtype)).sum(dim=-1)  # [batch, head, query]
    return (captured * scored[:, None]).sum(dim=(0, 2)) / scored.sum()


@torch.inference_mode()
def head_scores(model: Any, tokens: Int[Tensor, "batch pos"], kind: str) -> Float[Tensor, "layer head"]:
    """`pattern_scores` of every head of `model` (a HookedTransformer, or anything with hook_pattern hooks) on
    `tokens`, for one of HEAD_KINDS."""
    return _scores(model, _check(tokens), [kind])[kind]


def _scores(model: Any, tokens: Tensor, kinds: list[str]) -> dict[str, Tensor]:
    unknown = [kind for kind in kinds if kind not in HEAD_KINDS]
    if unknown:
        raise ValueError(f"unknown head kind {unknown[0]!r}: one of {sorted(HEAD_KINDS)}")
    if hasattr(model, "check_tokens"):
        tokens = model.check_tokens(tokens)
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(model.cfg.n_layers)]
    _, cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
    detections = {kind: HEAD_KINDS[kind](tokens.cpu()) for kind in kinds}
    out = {}
    for kind, detection in detections.items():
        out[kind] = torch.stack([pattern_scores(cache[name].float().cpu(), detection) for name in names])
    return out


def repeated_tokens(
    d_vocab: int, length: int, batch: int = 1, seed: int = 0, low: int = 0
) -> Int[Tensor, "batch two_length"]:
    """`batch` sequences of `length` token ids drawn uniformly from [low, d_vocab), each followed by itself:
    [x_0 … x_{L−1} x_0 … x_{L−1}]. Same seed, same tokens."""
    if length < 1 or batch < 1:
        raise ValueError(f"length and batch must be ≥ 1, got length={length}, batch={batch}")
    if not 0 <= low < d_vocab:
        raise ValueError(f"low must be in [0, d_vocab = {d_vocab}), got {low}")
    first = torch.randint(low, d_vocab, (batch, length), generator=torch.Generator().manual_seed(seed))
    return torch.cat([first, first], dim=1)


@dataclass
class HeadScores:
    """Every head's score for each kind, [layer, head], on the repeated random sequences `tokens`."""

    previous_token: Float[Tensor, "layer head"]
    duplicate_token: Float[Tensor, "layer head"]
    induction: Float[Tensor, "layer head"]
    tokens: Int[Tensor, "batch pos"]

    def __post_init__(self) -> None:
        shapes = {tuple(self.previous_token.shape), tuple(self.duplicate_token.shape), tuple(self.induction.shape)}
        if len(shapes) != 1:
            raise ValueError(f"every kind's scores must have one shape [layer, head], got {sorted(shapes)}")


def detect_heads(model: Any, length: int | None = None, batch: int = 8, seed: int = 0, low: int = 0) -> HeadScores:
    """Previous-token, duplicate-token and induction scores of every head on `batch` repeated random sequences
    of 2 × `length` tokens (default: as long as the context allows, at most 2 × 32)."""
    length = min(32, model.cfg.n_ctx // 2) if length is None else length
    if 2 * length > model.cfg.n_ctx:
        raise ValueError(f"2 × length = {2 * length} tokens do not fit the model's context of {model.cfg.n_ctx}")
    tokens = repeated_tokens(model.cfg.d_vocab, length, batch, seed, low)
    with torch.inference_mode():
        scores = _scores(model, tokens, list(HEAD_KINDS))
    return HeadScores(scores["previous_token"], scores["duplicate_token"], scores["induction"], tokens)
