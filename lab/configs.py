"""What every small config dataclass shares: strict loading from a mapping, and a scoped thread count."""

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")


def from_dict_strict(cls: type[T], data: Any) -> T:
    """cls(**data), after rejecting a non-mapping, unknown keys and missing required keys by name."""
    name = cls.__name__
    if not isinstance(data, dict):
        raise ValueError(f"{name}: expected a mapping, got {type(data).__name__}")
    fields = dataclasses.fields(cls)
    known = {f.name for f in fields}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{name}: unknown keys {unknown}; known keys are {sorted(known)}")
    missing = sorted(f.name for f in fields if f.name not in data and f.default is dataclasses.MISSING
                     and f.default_factory is dataclasses.MISSING)
    if missing:
        raise ValueError(f"{name}: missing required keys {missing}")
    return cls(**data)


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run a block with torch using n threads, restoring the caller's setting after (small models on a
    shared machine run far faster on one thread than on two that wait for each other)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
