"""What `run_with_cache` caches: the selection it resolves from a names_filter (every hook point by default), and
`Cache`, TransformerLens's ActivationCache whose KeyError says why an entry is missing."""

from collections.abc import Callable
from typing import Any

from torch import Tensor
from transformer_lens import ActivationCache, HookedRootModule


class Cache(ActivationCache):
    """TransformerLens's ActivationCache, whose KeyError says why an entry is missing: an unknown hook name (with
    the closest ones), a hook point whose switch is off, or one the names_filter left out."""

    def __getitem__(self, key: Any) -> Tensor:
        try:
            return super().__getitem__(key)
        except KeyError as err:  # TransformerLens raises it with the full name the key resolved to
            name = err.args[0] if err.args and isinstance(err.args[0], str) else key
        self.model.check_hook_names([name])  # an unknown or switched-off name: the model's error for it
        raise KeyError(f"{name!r} is a hook of the model but was not cached: left out by the names_filter")


def resolve_names_filter(model: HookedRootModule, names_filter: Any) -> Callable[[str], bool] | list[str]:
    """A run_with_cache selection as a list of checked names or a predicate: None caches every hook point."""
    if names_filter is None:
        return lambda name: True
    if isinstance(names_filter, str):
        names_filter = [names_filter]
    if isinstance(names_filter, (list, tuple)):
        odd = [name for name in names_filter if not isinstance(name, str)]
        if odd:  # TransformerLens would match no hook against them and cache nothing
            raise ValueError(
                f"names_filter holds {odd[0]!r} ({type(odd[0]).__name__}): hook names are strings "
                "(or pass one predicate on names)"
            )
        model.check_hook_names(names_filter)
        return list(names_filter)
    return names_filter
