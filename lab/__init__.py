"""Forma: look inside language models and measure where likelihood and truth part ways."""

import importlib

from lab.freed_memory import keep_freed_memory
from lab.thread_invariant import ask_for_strict_mode

keep_freed_memory()  # repeated run_with_cache calls reuse freed memory (see lab.freed_memory)
ask_for_strict_mode()  # matrix products give the same bits at any thread count (see lab.thread_invariant)

# The short public API, each name loaded from its home (docs/model-and-hooks.md, "The top-level names")
HOMES = {
    "HookedTransformer": "lab.model.transformer",
    "ModelConfig": "lab.model.config",
    "KVCache": "lab.model.kv_cache",
    "Cache": "lab.model.activation_cache",
    "next_token_loss": "lab.model.transformer",
}
__all__ = list(HOMES)
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """`lab.HookedTransformer` and the other top-level names load lab.model (and torch) on first use, so
    that `forma --help` and `import lab.folders` answer without loading torch."""
    if name in __all__:
        return getattr(importlib.import_module(HOMES[name]), name)
    raise AttributeError(f"module 'lab' has no attribute {name!r}")
