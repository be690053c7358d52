"""The hooked decoder-only transformer: config, components, the model, and its KV cache."""

from lab.model.config import ModelConfig
from lab.model.kv_cache import KVCache, KVCacheEntry
from lab.model.transformer import HookedTransformer, next_token_loss

__all__ = ["HookedTransformer", "KVCache", "KVCacheEntry", "ModelConfig", "next_token_loss"]
