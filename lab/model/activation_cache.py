"""What `run_with_cache` caches: the selection it resolves from a names_filter (every hook but the per-head result
by default), and `Cache`, TransformerLens's ActivationCache whose KeyError says why an entry is missing."""

from collections.abc import Callable
from typing import Any

from torch import Tensor
from transformer_lens import ActivationCache, HookedRootModule


class Cache(ActivationCache):
    """TransformerLens's ActivationCache, whose KeyError says why an entry is missing: an unknown hook
    name (with the closest ones), or a hook the names_filter — or the default, for attn.hook_result —
    left out."""

    def __getitem__(self, key: Any) -> Tensor:
        try:
            return super().__getitem__(key)
        except KeyError as err:  # TransformerLens raises it with the full name the key resolved to
            name = err.args[0] if err.args and isinstance(err.args[0], str) else key
        self.model.check_hook_names([name])  # an unknown name: the model's KeyError, naming the closest ones
        why = ("left out by default (n_heads × attn_out; name it in names_filter, or use cache.stack_head_results())"
               if not default_names_filter(self.model)(name) else "left out by the names_filter")
        raise KeyError(f"{name!r} is a hook of the model but was not cached: {why}")


def cached_by_default(name: str) -> bool:
    """run_with_cache's selection when none is given: every hook except the per-head result (cached too once
    use_attn_result is on: see `default_names_filter`)."""
    return not name.endswith("attn.hook_result")


def default_names_filter(model: HookedRootModule) -> Callable[[str], bool]:
    """What run_with_cache caches when asked for nothing in particular."""
    if getattr(model.cfg, "use_attn_result", False):
        return lambda name: True
    return cached_by_default


def resolve_names_filter(model: HookedRootModule, names_filter: Any) -> Callable[[str], bool] | list[str]:
    """A run_with_cache selection as a list of checked names or a predicate (see `run_with_cache`)."""
    if names_filter is None:
        return default_names_filter(model)
    if isinstance(names_filter, str):
        names_filter = [names_filter]
    if isinstance(names_filter, (list, tuple)):
        odd = [name for name in names_filter if not isinstance(name, str)]
        if odd:  # TransformerLens would match no hook against them and cache nothing
            raise ValueError(f"names_filter holds {odd[0]!r} ({type(odd[0]).__name__}): hook names are strings "
                             "(or pass one predicate on names)")
        model.check_hook_names(names_filter)
        return list(names_filter)
    return names_filter

