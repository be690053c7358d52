"""The hooked transformers: config, components, the decoder-only model, its KV cache, and the encoder–decoder."""

from lab.model.config import ModelConfig
from lab.model.encoder_decoder import EncoderDecoder, EncoderDecoderConfig
from lab.model.kv_cache import KVCache, KVCacheEntry
from lab.model.transformer import HookedTransformer, next_token_loss

__all__ = [
    "EncoderDecoder",
    "EncoderDecoderConfig",
    "HookedTransformer",
    "KVCache",
    "KVCacheEntry",
    "ModelConfig",
    "next_token_loss",
]
