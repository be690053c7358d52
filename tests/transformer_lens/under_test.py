"""What a ported TransformerLens test file imports in place of `transformer_lens.HookedTransformer`: the model
under test of the implementation the file is being run for (tests/transformer_lens/conftest.py imports each
ported file twice, once per implementation, with `implementation(...)` set around the import)."""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.transformer_lens.models import IMPLEMENTATIONS

_current: list[str] = []


@contextmanager
def implementation(name: str) -> Iterator[None]:
    """Make `name` ("reference" or "forma") what `from tests.transformer_lens.under_test import ...` gives."""
    _current.append(name)
    try:
        yield
    finally:
        _current.pop()


def __getattr__(name: str) -> Any:  # PEP 562: resolved at each ported file's import
    if name == "HookedTransformer":
        if not _current:
            raise ImportError("a ported TransformerLens test file is imported by tests/transformer_lens/conftest.py, "
                              "once per implementation")
        return IMPLEMENTATIONS[_current[-1]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
