"""Reading the weights of a model that accelerate has spread over devices, outside a forward pass.

A model dispatched by accelerate (`accelerate.dispatch_model`, or Hugging Face's `device_map=`) keeps each
offloaded module's weights on the meta device — shapes without values — and an `AlignDevicesHook` on the
module (`module._hf_hook`) loads them from its weights map just before the module's forward and drops them
after. Code that reads a weight outside a forward (`model.W_Q`, a conversion) would see the meta tensor;
`read_weight` reads the values from that hook's weights map instead; `onloaded(model)` loads every
offloaded weight for the length of a `with` block, for code that reads modules' weights directly (as
TransformerLens's `ActivationCache.stack_head_results` reads `blocks[l].attn.W_O`). Nothing here imports
accelerate: the hook is recognised by the attributes accelerate gives it.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import Tensor, nn


def read_weight(model: nn.Module, name: str) -> Tensor:
    """The tensor `name` ("blocks.3.attn.W_Q") of `model`, with its values even when accelerate has offloaded
    it: then from the offloading hook's weights map, on that hook's execution device (where the forward pass
    would see it). A tensor on the meta device that no hook offloads (a model built there for its shapes)
    comes back as it is."""
    tensor = _walk(model, name)
    if not isinstance(tensor, Tensor) or tensor.device.type != "meta":
        return tensor
    module, parts = model, name.split(".")
    for depth, part in enumerate(parts):
        for hook in _hooks(module):
            if getattr(hook, "offload", False) and getattr(hook, "weights_map", None) is not None:
                value = hook.weights_map[".".join(parts[depth:])]
                device = getattr(hook, "execution_device", None)
                return value if device is None else value.to(device)
        module = getattr(module, part)
    return tensor


@contextmanager
def onloaded(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block, every offloaded module of `model` holds its weights on its execution device, as it does
    during its own forward pass; on exit they go back to their offload store. The whole model is in memory
    meanwhile: this is for weight-reading analysis on a model that fits, not for running one that does not."""
    loaded: list[tuple[Any, nn.Module]] = []
    try:
        for module in model.modules():
            for hook in _hooks(module):
                if getattr(hook, "offload", False) and getattr(hook, "weights_map", None) is not None:
                    hook.pre_forward(module)  # what accelerate does before the module's forward
                    loaded.append((hook, module))
        yield model
    finally:
        for hook, module in reversed(loaded):
            hook.post_forward(module, None)


def _walk(model: nn.Module, name: str) -> Any:
    value: Any = model
    for part in name.split("."):
        value = getattr(value, part)
    return value


def _hooks(module: Any) -> tuple[Any, ...]:
    """The accelerate hooks on one module: one hook, or the parts of a SequentialHook."""
    hook = getattr(module, "_hf_hook", None)
    if hook is None:
        return ()
    return tuple(getattr(hook, "hooks", (hook,)))
