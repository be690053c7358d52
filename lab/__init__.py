"""Forma: look inside language models and measure where likelihood and truth part ways."""

from lab.model import HookedTransformer, KVCache, ModelConfig, next_token_loss

__all__ = ["HookedTransformer", "KVCache", "ModelConfig", "next_token_loss"]
__version__ = "0.1.0"
