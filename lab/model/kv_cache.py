"""The key/value cache for autoregressive decoding.

Step t of generation needs k_s, v_s for every s ≤ t; they do not change once computed, so each
layer keeps them and appends the new token's. Decoding with the cache gives the same logits as
recomputing the whole prefix (tested), at O(t) instead of O(t²) work per step.
"""

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class KVCacheEntry:
    """One layer's keys and values, [batch, pos, kv_head, d_head], after rotary where it applies."""

    keys: Tensor | None = None
    values: Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[1]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add this step's keys and values; return all of them (cached prefix first)."""
        if self.keys is None:
            self.keys, self.values = k, v
        else:
            self.keys = torch.cat((self.keys, k), dim=1)
            self.values = torch.cat((self.values, v), dim=1)
        return self.keys, self.values


@dataclass
class KVCache:
    """A KVCacheEntry per layer; `length` is the number of positions already processed."""

    entries: list[KVCacheEntry] = field(default_factory=list)

    @classmethod
    def empty(cls, n_layers: int) -> "KVCache":
        return cls([KVCacheEntry() for _ in range(n_layers)])

    @property
    def length(self) -> int:
        return self.entries[0].length if self.entries else 0
