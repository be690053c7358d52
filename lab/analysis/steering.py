"""Steering: add a vector to an activation while the model runs or generates.

    x_t ← x_t + α·v        at hook `name`, for every position t ≥ from_position

(activation addition, Turner et al. 2023, "Steering Language Models With Activation Engineering";
a probe direction from `lab.analysis.probes.probe.steering_vector` is one source of v.)

With the KV cache, each decoding step runs the model on the newest token only, so the hook sees
[batch, 1, ...] and cannot tell from the tensor which position that is. `steer` therefore also
watches the model's forward calls and reads the cache's length (the number of positions already
processed) before each one: a hook call covers absolute positions offset … offset + pos − 1. Adding
at every position it sees then means the same thing with and without the cache — every prompt and
every generated position (from_position = 0), or only positions from `from_position` on (e.g. the
prompt's length: steer the continuation but not the prompt) — and cached decoding gives the same
tokens as recomputing (tested).
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lab.model.decoding import generate

__all__ = ["generate_steered", "steer"]

# Hooks whose dim 1 is not the position: steering them would add along heads, not positions.
NOT_POSITIONAL = ("hook_attn_scores", "hook_pattern")


@contextmanager
def steer(
    model: Any, name: str, vector: Float[Tensor, "*shape"], scale: float = 1.0, from_position: int = 0
) -> Iterator[Any]:
    """Within the block, every forward pass adds scale·vector to activation `name` at positions ≥ from_position.

    vector has the activation's per-position shape ([d_model] for the residual stream, [head, d_head]
    for hook_z). Nest `steer` blocks to steer at several hooks. All hooks are removed on exit, even
    when the block raises.
    """
    if not isinstance(name, str):
        raise TypeError(f"steer takes one hook name; nest `with steer(...)` blocks for several, got {name!r}")
    if name.rsplit(".", 1)[-1] in NOT_POSITIONAL:
        raise ValueError(
            f"{name} is indexed [batch, head, query, key]; steer a per-position activation "
            "(the residual stream, attn_out, mlp_out, z, ...)"
        )
    if hasattr(model, "check_hook_names"):
        model.check_hook_names([name])
    if not isinstance(from_position, int) or from_position < 0:
        raise ValueError(f"from_position must be a non-negative integer, got {from_position!r}")
    vector = torch.as_tensor(vector)
    if not vector.dtype.is_floating_point:
        raise ValueError(f"a steering vector must be floating point, got {vector.dtype}")
    offset = [0]  # absolute position of the first token of the current forward pass

    def track(module: Any, args: tuple, kwargs: dict) -> None:
        cache = kwargs.get("kv_cache")  # keyword-only in forward
        offset[0] = 0 if cache is None else cache.length

    def add(activation: Tensor, hook: Any) -> Tensor:
        if tuple(vector.shape) != tuple(activation.shape[2:]):
            raise ValueError(
                f"steering vector of shape {tuple(vector.shape)} does not match {name}'s "
                f"per-position shape {tuple(activation.shape[2:])}"
            )
        start = max(0, from_position - offset[0])
        delta = (scale * vector).to(device=activation.device, dtype=activation.dtype)
        if start == 0:
            return activation + delta
        if start >= activation.shape[1]:
            return activation
        steered = activation.clone()
        steered[:, start:] += delta
        return steered

    handle = model.register_forward_pre_hook(track, with_kwargs=True)
    try:
        with model.hooks(fwd_hooks=[(name, add)]):
            yield model
    finally:
        handle.remove()


def generate_steered(
    model: Any,
    tokens: Int[Tensor, "batch pos"],
    name: str,
    vector: Float[Tensor, "*shape"],
    scale: float = 1.0,
    max_new_tokens: int = 20,
    *,
    from_position: int = 0,
    **generate_options: Any,
) -> Int[Tensor, "batch pos"]:
    """`lab.model.decoding.generate` with scale·vector added at `name` (prompt followed by the new tokens).

    generate_options: temperature, top_k, top_p, seed, use_kv_cache, eos_token_id.
    """
    with steer(model, name, vector, scale, from_position):
        return generate(model, tokens, max_new_tokens, **generate_options)
