"""Forma: look inside language models and measure where likelihood and truth part ways."""

from lab.memory import keep_freed_memory
from lab.model import HookedTransformer, KVCache, ModelConfig, next_token_loss

keep_freed_memory()  # repeated run_with_cache calls reuse freed memory (see lab.memory)

__all__ = ["HookedTransformer", "KVCache", "ModelConfig", "next_token_loss"]
__version__ = "0.1.0"
