"""What every small config dataclass shares: its fields checked against their annotations, strict loading
from a mapping, one way to write and read it (`Record`), and a scoped thread count."""

import dataclasses
import functools
import json
import math
import numbers
import types
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal, TypeVar, Union

from lab.outside_files import parse_json

T = TypeVar("T")


def need(config: Any, ok: bool, message: str, field: str | None = None) -> None:
    """A config's condition on its values, checked in `__post_init__` after its types: when `ok` is false, a
    ValueError that names the class ("FactWorldConfig: n_persons must be a positive integer, got 0"), or, given
    the `field` the condition is about, the class, the field and its value ("TrainConfig.lr: must be positive,
    got 0.0")."""
    if ok:
        return
    if field is None:
        raise ValueError(f"{type(config).__name__}: {message}")
    raise ValueError(f"{type(config).__name__}.{field}: {message}, got {getattr(config, field)!r}")


def check_fields(config: Any) -> None:
    """Check every field of a dataclass instance against its annotation, the first thing each config's
    `__post_init__` does; a mismatch is a ValueError naming the class, the field, the type and the value
    ("ModelConfig.bias must be a bool (true or false), got 'false' (str)").

    bool is a bool (never the string "false", never 0 or 1); int an integer and not a bool; float a finite
    number, an int allowed and stored as a float (so 1 and 1.0 save alike); str a string; Literal[...] one of
    its values; tuple[X, ...] and tuple[X, Y] a tuple — or a list, as JSON and TOML write it, stored as a
    tuple — whose elements are each checked; X | None either; Any anything.
    """
    cls = type(config)
    for name, annotation in _field_types(cls).items():
        value = getattr(config, name)
        try:
            conformed = _conform(value, annotation)
        except _Mismatch as err:
            where = f" at element {err.where}" if err.where else ""
            raise ValueError(
                f"{cls.__name__}.{name} must be {err.expected}{where}, got {value!r} ({type(value).__name__})"
            ) from None
        if conformed is not value:
            object.__setattr__(config, name, conformed)  # also through a frozen dataclass


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


class _Mismatch(Exception):
    def __init__(self, expected: str, where: str = ""):
        super().__init__(expected)
        self.expected, self.where = expected, where


def _conform(value: Any, annotation: Any) -> Any:
    """`value` as the annotation wants it (the same object unless normalised), or _Mismatch."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return value
    if annotation in _SCALARS:
        return _SCALARS[annotation](value)
    if origin is Literal:
        if any(type(value) is type(a) and value == a for a in args):
            return value
        raise _Mismatch("one of " + ", ".join(repr(a) for a in args))
    if origin in (Union, types.UnionType):
        return _conform_union(value, args)
    if origin is tuple:
        return _conform_tuple(value, annotation, args)
    raise TypeError(f"check_fields cannot check the annotation {annotation!r}: add it to lab.configs._conform")


def _conform_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise _Mismatch("a bool (true or false)")


def _conform_int(value: Any) -> int:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return value if type(value) is int else int(value)
    raise _Mismatch("an int")


def _conform_float(value: Any) -> float:
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if math.isfinite(number):
            return value if type(value) is float else number
    raise _Mismatch("a finite float")


def _conform_str(value: Any) -> str:
    if isinstance(value, str):
        return value
    raise _Mismatch("a str")


_SCALARS = {bool: _conform_bool, int: _conform_int, float: _conform_float, str: _conform_str}


def _conform_union(value: Any, args: tuple) -> Any:
    """The first option of `X | Y | None` that `value` conforms to."""
    if value is None and type(None) in args:
        return None
    for option in (a for a in args if a is not type(None)):
        try:
            return _conform(value, option)
        except _Mismatch:
            pass
    raise _Mismatch(" or ".join(_describe(a) for a in args))


def _conform_tuple(value: Any, annotation: Any, args: tuple) -> tuple:
    """A tuple (or list) whose every element conforms, as a tuple; an element's mismatch names its index."""
    if not isinstance(value, (tuple, list)):
        raise _Mismatch(_describe(annotation))
    variadic = len(args) == 2 and args[1] is Ellipsis
    if not variadic and len(value) != len(args):
        raise _Mismatch(f"{_describe(annotation)} with {len(args)} elements")
    elements = []
    for i, element in enumerate(value):
        try:
            elements.append(_conform(element, args[0] if variadic else args[i]))
        except _Mismatch as err:
            raise _Mismatch(err.expected, str(i)) from None
    same = isinstance(value, tuple) and all(a is b for a, b in zip(elements, value))
    return value if same else tuple(elements)


def _describe(annotation: Any) -> str:
    if annotation is type(None):
        return "None"
    if typing.get_origin(annotation) is tuple:
        return f"a tuple {annotation!r}".replace("typing.", "")
    return {bool: "bool", int: "int", float: "finite float", str: "str"}.get(annotation, repr(annotation))


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
    missing = sorted(
        f.name
        for f in fields
        if f.name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )
    if missing:
        raise ValueError(f"{name}: missing required keys {missing}")
    return cls(**data)


class Record:
    """to_dict / from_dict / to_json / from_json / replace for a config dataclass, the same for every one:
    `dataclasses.asdict`, strict loading (unknown and missing keys named: from_dict_strict), JSON with sorted
    keys, a malformed file a ValueError that names the class."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: Any) -> Any:
        return from_dict_strict(cls, data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Any:
        return cls.from_dict(parse_json(text, cls.__name__))  # bounded nesting; a malformed text named

    def replace(self, **changes: Any) -> Any:
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


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
