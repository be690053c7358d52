"""What the checks compute with: float64, seeded generators and attention layers, and hooks that record what a
HookPoint carries."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor
from transformer_lens.hook_points import HookPoint

from lab.model.attention import Attention
from lab.model.config import ModelConfig

F64 = torch.float64


def seeded_generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@contextmanager
def capturing(*points: HookPoint) -> Iterator[list[Tensor]]:
    """Record what each HookPoint carries during the block (one slot per point); hooks removed in finally."""
    seen: list[Tensor] = [torch.empty(0)] * len(points)

    def recorder(slot: int) -> Callable[[Tensor, HookPoint], None]:
        def record(activation: Tensor, hook: HookPoint) -> None:
            seen[slot] = activation.detach().clone()

        return record

    try:
        for slot, point in enumerate(points):
            point.add_hook(recorder(slot))
        yield seen
    finally:
        for point in points:
            point.remove_hooks("fwd")


def seeded_attention(cfg: ModelConfig, seed: int, cls: type[Attention] = Attention) -> Attention:
    """An Attention whose initial weights come from `seed`: modules draw from torch's global generator, whose
    seed is random per process, so an unseeded one would change every run. The caller's generator is kept."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return cls(cfg)


def attention_config(d_model: int, n_heads: int, n_ctx: int) -> ModelConfig:
    # init_std = 1/√d_model gives q and k components of order one, so patterns are far from uniform.
    return ModelConfig(
        d_vocab=2, d_model=d_model, n_layers=1, n_heads=n_heads, n_ctx=n_ctx, bias=False, init_std=d_model**-0.5
    )
