"""Padded batches: which positions of a batch are padding, where each real token sits, and what that does to
the positions, the attention and the loss, as TransformerLens's HookedTransformer does it.

A batch of texts of different lengths is padded to one length, on the right (the default) or on the left. An
attention mask m [batch, pos] marks the real tokens (1) and the padding (0). With a mask:

    position of token t in its row   p_t = (Σ_{s ≤ t} m_s) − 1, and 0 for leading padding
    query i sees key j               iff  j is causally visible from i  and  m_j = 1
    a query that sees no key at all  attends to nothing: its pattern is 0 and its z is 0
    learned / sinusoidal positions   W_pos[p_t], and 0 at padding

so that a real token's every activation is what it would be with its text alone. TransformerLens uses a mask
when the tokenizer pads on the left, when one is passed, or with a KV cache; on the right, padding comes after
every real token and causal attention already keeps it out of their results, so it runs with none (and so does
Forma, for the same numbers at every position). The loss is taken over real next tokens only:
m_t ∧ m_{t+1}.
"""

from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Bool, Int
from torch import Tensor


@dataclass(frozen=True)
class Padding:
    """What a padded pass needs beyond the tokens: the keys' mask (the cached prefix's and this pass's) and the
    position of each new token within its own text."""

    keys: Bool[Tensor, "batch key_pos"]  # True where the key is a real token
    positions: Int[Tensor, "batch pos"]  # p_t of each token of this pass
    offset: int  # how many positions the KV cache held before this pass

    @property
    def new(self) -> Bool[Tensor, "batch pos"]:
        """The mask of this pass's own tokens."""
        return self.keys[:, self.offset :]

    def visible(self, causal: Bool[Tensor, "q_pos key_pos"]) -> Bool[Tensor, "batch 1 q_pos key_pos"]:
        """Which key each query sees: causally visible and a real token."""
        return causal[None, None] & self.keys[:, None, None, :]


def offset_positions(mask: Tensor, offset: int) -> Int[Tensor, "batch pos"]:
    """p_t = (Σ_{s ≤ t} m_s) − 1 for the positions from `offset` on; 0 for leading padding (TransformerLens's
    get_offset_position_ids)."""
    return (mask.long().cumsum(dim=1) - 1).clamp_min(0)[:, offset:]


def padding_of(
    mask: Tensor | None, cached: Tensor | None, offset: int, shape: tuple[int, int], device: torch.device
) -> Padding | None:
    """The Padding of a pass over `shape` = (batch, pos) new tokens, from this pass's mask and the cache's (either
    may be None: every token real; `mask` may also span the cached positions and the new, as TransformerLens's
    does). None when neither says anything: the unpadded fast paths run."""
    if mask is None and cached is None:
        return None
    batch, length = shape
    if offset and mask is not None and mask.shape[-1] == offset + length:  # the cached positions' and the new
        keys = check_mask(mask, (batch, offset + length)).to(device)
        return Padding(keys, offset_positions(keys, offset), offset)
    if mask is None:
        mask = torch.ones(batch, length, dtype=torch.bool, device=device)
    mask = check_mask(mask, shape).to(device)
    if offset:
        if cached is None:
            cached = torch.ones(batch, offset, dtype=torch.bool, device=device)
        keys = torch.cat((cached.to(device), mask), dim=1)
    else:
        keys = mask
    return Padding(keys, offset_positions(keys, offset), offset)


def check_mask(mask: Any, shape: tuple[int, int]) -> Bool[Tensor, "batch pos"]:
    """An attention mask as booleans, after checking that it is one: a [batch, pos] tensor of 0/1 (or booleans)
    the shape of the tokens."""
    if not isinstance(mask, Tensor):
        raise ValueError(f"attention_mask must be a tensor [batch, pos] of 0/1, got {type(mask).__name__}")
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"attention_mask has shape {tuple(mask.shape)}; the tokens have shape {tuple(shape)}")
    if mask.dtype != torch.bool:
        if mask.is_floating_point() or bool(((mask != 0) & (mask != 1)).any()):
            raise ValueError("attention_mask holds values other than 0 and 1 (1: a real token, 0: padding)")
        mask = mask.bool()
    return mask


def padding_mask(
    tokens: Tensor, pad_id: int | None, side: str, bos_id: int | None = None, prepend_bos: bool = False
) -> Bool[Tensor, "batch pos"]:
    """The mask TransformerLens infers from padded token ids (utils.get_attention_mask): on the right the trailing
    run of pad ids is padding, on the left the leading run, except a first BOS that shares the pad's id when the
    text was given one."""
    if pad_id is None:
        return torch.ones_like(tokens, dtype=torch.bool)
    real = tokens != pad_id
    if side == "right":
        return real.flip(1).cumsum(1).flip(1) > 0
    mask = real.cumsum(1) > 0
    if prepend_bos and bos_id == pad_id:  # the BOS that starts each text is a real token
        leading = (~mask).sum(1)
        rows = torch.arange(tokens.shape[0], device=tokens.device)
        mask[rows[leading > 0], leading[leading > 0] - 1] = True
    return mask
