"""The key/value cache for autoregressive decoding.

Step t of generation needs k_s, v_s for every s ≤ t; they do not change once computed, so each
layer keeps them and appends the new token's. Decoding with the cache gives the same logits as
recomputing the whole prefix (tested), at O(t) instead of O(t²) work per step.
"""

from dataclasses import dataclass, field

import torch
from torch import Tensor


class KVCacheEntry:
    """One layer's keys and values, [batch, pos, kv_head, d_head], after rotary where it applies.

    They live in buffers with room to spare that double when full, so a decoding step writes its key
    and value in place instead of copying the whole prefix (amortised O(1) per step, not O(t)).
    `capacity`: the positions the first buffers hold (a decoding loop that knows its length asks for all of
    it, and no step ever copies the prefix). `keys` and `values` are views of the filled part.
    """

    def __init__(self, keys: Tensor | None = None, values: Tensor | None = None, capacity: int = 0):
        if (keys is None) != (values is None) or (keys is not None and keys.shape[:2] != values.shape[:2]):
            raise ValueError("KVCacheEntry needs keys and values of the same batch and length, or neither")
        self._keys, self._values = keys, values  # the buffers; a given prefix is never written into
        self.length = 0 if keys is None else keys.shape[1]
        self.capacity = capacity

    @property
    def keys(self) -> Tensor | None:
        return None if self._keys is None else self._keys[:, : self.length]

    @property
    def values(self) -> Tensor | None:
        return None if self._values is None else self._values[:, : self.length]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add this step's keys and values; return all of them (cached prefix first)."""
        if self._keys is None and k.shape[1] >= self.capacity:
            self._keys, self._values, self.length = k, v, k.shape[1]
            return k, v
        if self._keys is None:  # the first step, into buffers of the capacity asked for
            self._keys, self._values = (x.new_empty((x.shape[0], self.capacity, *x.shape[2:])) for x in (k, v))
        end = self.length + k.shape[1]
        if end > self._keys.shape[1]:  # full: move into buffers twice as long (or long enough)
            capacity = max(2 * self._keys.shape[1], end)
            self._keys, self._values = (self._grown(old, capacity) for old in (self.keys, self.values))
        self._keys[:, self.length : end] = k
        self._values[:, self.length : end] = v
        self.length = end
        return self.keys, self.values

    def truncate(self, length: int) -> None:
        """Forget every position from `length` on (the buffers keep their room; nothing is copied)."""
        if length <= 0:
            self._keys = self._values = None
            self.length = 0
        else:
            self.length = min(self.length, length)

    @staticmethod
    def _grown(filled: Tensor, capacity: int) -> Tensor:
        buffer = filled.new_empty((filled.shape[0], capacity, *filled.shape[2:]))
        buffer[:, : filled.shape[1]] = filled
        return buffer


@dataclass
class KVCache:
    """A KVCacheEntry per layer; `length` is the number of positions already processed. `mask` [batch, length]
    marks which cached positions are real tokens once a padded batch has been through (None: all of them)."""

    entries: list[KVCacheEntry] = field(default_factory=list)
    mask: torch.Tensor | None = None

    @classmethod
    def empty(cls, n_layers: int, capacity: int = 0) -> "KVCache":
        """A cache with no positions yet; each layer's first buffers hold `capacity` positions (more when the first
        step brings more)."""
        return cls([KVCacheEntry(capacity=capacity) for _ in range(n_layers)])

    @property
    def length(self) -> int:
        return self.entries[0].length if self.entries else 0

    def check(self, n_layers: int, batch: int) -> int:
        """The cached length, after checking that the cache fits a model of n_layers and this batch."""
        if len(self.entries) != n_layers:
            raise ValueError(
                f"the KV cache has {len(self.entries)} layer{'s' * (len(self.entries) != 1)}, the model "
                f"{n_layers} layers: make it with KVCache.empty({n_layers})"
            )
        lengths = [entry.length for entry in self.entries]
        if len(set(lengths)) > 1:
            raise ValueError(f"the KV cache is inconsistent: its layers hold {lengths} positions")
        keys = self.entries[0].keys if self.entries else None
        if keys is not None and keys.shape[0] != batch:
            raise ValueError(
                f"the KV cache holds a batch of {keys.shape[0]} sequences; these tokens are a batch of {batch}"
            )
        return lengths[0] if lengths else 0

    def truncate(self, length: int) -> None:
        """Forget every position from `length` on, in every layer: what a step that fails part-way undoes, so
        that the cache never holds keys for some layers and not others."""
        for entry in self.entries:
            entry.truncate(length)
        if self.mask is not None:
            self.mask = self.mask[:, : max(length, 0)] if length > 0 else None


class TransformerLensCache:
    """TransformerLens's own KV cache (`transformer_lens.cache.TransformerLensKeyValueCache`, what its forward takes
    as past_kv_cache) seen as a KVCache, so that code written for TransformerLens can hand it to Forma's model: the
    keys, values and attention mask go into that object, as TransformerLens's forward puts them, and a frozen cache
    is read but not extended. (Forma stores keys after rotary, TransformerLens before: a cache filled by one model
    is for that model.)"""

    def __init__(self, cache: object):
        self.cache = cache
        self.entries = [_TransformerLensEntry(entry) for entry in cache.entries]  # type: ignore[attr-defined]

    @property
    def length(self) -> int:
        return self.entries[0].length if self.entries else 0

    @property
    def mask(self) -> torch.Tensor | None:
        previous = self.cache.previous_attention_mask  # type: ignore[attr-defined]
        return previous.bool() if previous.shape[-1] else None

    @mask.setter
    def mask(self, keys: torch.Tensor) -> None:
        if not self.cache.frozen:  # type: ignore[attr-defined]
            previous = self.cache.previous_attention_mask  # type: ignore[attr-defined]
            self.cache.previous_attention_mask = keys.to(  # type: ignore[attr-defined]
                device=previous.device, dtype=previous.dtype
            )

    def check(self, n_layers: int, batch: int) -> int:
        if len(self.entries) != n_layers:
            raise ValueError(f"the KV cache has {len(self.entries)} layers, the model {n_layers}")
        if {entry.entry.past_keys.shape[0] for entry in self.entries} != {batch}:
            raise ValueError(f"the KV cache holds another batch than these tokens' {batch}")
        return self.length

    def truncate(self, length: int) -> None:
        for entry in self.entries:
            entry.truncate(length)


class _TransformerLensEntry:
    def __init__(self, entry: object):
        self.entry = entry

    @property
    def length(self) -> int:
        return self.entry.past_keys.shape[1]  # type: ignore[attr-defined]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.entry.append(k, v)  # type: ignore[attr-defined]

    def truncate(self, length: int) -> None:
        if not self.entry.frozen:  # type: ignore[attr-defined]
            self.entry.past_keys = self.entry.past_keys[:, :length]  # type: ignore[attr-defined]
            self.entry.past_values = self.entry.past_values[:, :length]  # type: ignore[attr-defined]
