"""Forma: look inside language models and measure where likelihood and truth part ways."""

import importlib

from lab.freed_memory import keep_freed_memory

keep_freed_memory()  # repeated run_with_cache calls reuse freed memory (see lab.freed_memory)

__all__ = ["HookedTransformer", "KVCache", "ModelConfig", "next_token_loss"]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """`lab.HookedTransformer` and the other top-level names load lab.model (and torch) on first use, so
    that `forma --help` and `import lab.folders` answer without loading torch."""
    if name in __all__:
        return getattr(importlib.import_module("lab.model"), name)
    raise AttributeError(f"module 'lab' has no attribute {name!r}")
