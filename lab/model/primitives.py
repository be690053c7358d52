"""What every component is made of: the checked hook point that wraps each activation, the switch that adds or
removes hook points, the constructors and initialisers of the components' parameters, `Derived`, a value
kept from weights until they change, and `linear`, the product x W + b every component's weights enter by."""

from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint


class CheckedHookPoint(HookPoint):
    """TransformerLens's HookPoint, whose hooks may return only a stand-in for the activation: a tensor of
    its shape, dtype and device, or None (keep it); a backward hook may also return it as a 1-tuple (grad,).
    Anything else is a ValueError naming the hook.

    Every way of attaching a hook — run_with_hooks, `with model.hooks(...)`, run_with_cache, add_hook —
    ends in `HookPoint.add_hook`, so the check lives here once. It wraps the hook function; a hook point
    with no hook attached runs exactly as before (the identity, no check).
    """

    def add_hook(self, hook: Callable[..., Any], dir: Literal["fwd", "bwd"] = "fwd", *args: Any, **kwargs: Any) -> Any:
        if not callable(hook):
            raise ValueError(
                f"a hook on {self.name} must be a function (activation, hook) -> tensor or None, "
                f"got {type(hook).__name__}"
            )
        user_hook, what = hook, "activation" if dir == "fwd" else "gradient"

        def checked(tensor: Tensor, *, hook: Any) -> Any:  # TransformerLens passes the hook point as `hook=`
            result = user_hook(tensor, hook=hook)
            if dir == "bwd" and isinstance(result, tuple) and len(result) == 1:  # (grad,), as torch's own hooks return
                check_replacement(result[0], tensor, hook.name, what)
            elif result is not None:
                check_replacement(result, tensor, hook.name, what)
            return result

        checked.__name__ = checked.__qualname__ = getattr(hook, "__name__", type(hook).__name__)
        handle = super().add_hook(checked, dir, *args, **kwargs)
        if handle is None:  # TransformerLens 3 returns nothing: its handle is the one just listed, first or last
            listed = self.fwd_hooks if dir == "fwd" else self.bwd_hooks
            handle = listed[0] if kwargs.get("prepend") or (len(args) > 2 and args[2]) else listed[-1]
        handle.user_hook = user_hook  # what list_hooks() shows: the caller's function, not the wrapper
        return handle


def check_replacement(result: Any, tensor: Any, name: str | None, what: str = "activation") -> None:
    """A hook's return value must stand in for the tensor it was given: same shape, dtype and device."""
    if not isinstance(result, Tensor):
        raise ValueError(
            f"the hook on {name} returned a value of type {type(result).__name__}, not a tensor: a hook "
            f"returns None (keep the {what}) or a tensor of the {what}'s shape {tuple(tensor.shape)}"
        )
    if result.shape != tensor.shape:
        raise ValueError(
            f"the hook on {name} returned shape {tuple(result.shape)} for the {what} of shape "
            f"{tuple(tensor.shape)}: a replacement must have the same shape (no broadcasting)"
        )
    if result.dtype != tensor.dtype or result.device != tensor.device:
        raise ValueError(
            f"the hook on {name} returned a {result.dtype} tensor on {result.device} for the "
            f"{tensor.dtype} {what} on {tensor.device}: a replacement must keep the dtype and device"
        )


class Reads:
    """Whether the hooks on an explicit path only read its activations: each hook point returns the very tensor it
    was given, unwritten. Then the path's fused kernel gives the result, so that a hook (or a cache) that only
    reads leaves every number exactly as it is without one. (An inference tensor counts no writes: its hook
    point is given a copy, compared with the original after.)

        read = Reads()
        pattern = read(hook_pattern, read(hook_attn_scores, scores).softmax(-1))
        z = fused(...) if read.unchanged else pattern @ v"""

    def __init__(self) -> None:
        self.unchanged = True

    def __call__(self, hook_point: nn.Module, tensor: Tensor) -> Tensor:
        if tensor.is_inference():  # its writes are not counted: the hook gets a copy, compared after
            given = tensor.clone()
            output = hook_point(given)
            self.unchanged = self.unchanged and output is given and torch.equal(given, tensor)
            return output
        version = tensor._version
        output = hook_point(tensor)
        self.unchanged = self.unchanged and output is tensor and output._version == version
        return output


def empty_parameter(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape))


def zero_parameter(shape: tuple[int, ...]) -> nn.Parameter:
    return nn.Parameter(torch.zeros(shape))


def init_normal_(weight: Tensor, std: float) -> None:
    """weight ← N(0, std²) in place. Drawn as a unit normal scaled by std: bit for bit what
    `torch.randn(shape) * std` draws, so every seed builds the weights it always built."""
    with torch.no_grad():
        weight.normal_(0.0, 1.0).mul_(std)


def reset_biases(*biases: Tensor | None) -> None:
    with torch.no_grad():
        for bias in biases:
            if bias is not None:
                bias.zero_()


def set_hook_points(module: nn.Module, names: tuple[str, ...], present: bool) -> None:
    """Add (or remove) the named hook points of `module`: a switch makes its hook points exist only while the
    activation they carry does. The model's `setup()` must run afterwards to name them."""
    for name in names:
        if present and name not in module._modules:
            module.add_module(name, CheckedHookPoint().train(module.training))
        elif not present and name in module._modules:
            delattr(module, name)


class Derived:
    """A value computed from some tensors (a weight laid out anew, whether a bias is zero), kept until one of them
    changes: a new tensor (another address, shape, device or dtype) or an in-place write (its version counter moves
    on an optimizer step, load_state_dict, reset_parameters, `with torch.no_grad(): w += …`). A tensor whose
    writes cannot be tracked (an inference tensor) is computed from afresh on every call. A kept tensor is for use
    outside autograd: under autograd it must be formed in the graph, for gradients to reach the tensors."""

    def __init__(self, compute: Callable[..., Any]):
        self.compute = compute
        self._key: tuple | None = None
        self._value: Any = None

    def __call__(self, *tensors: Tensor | None) -> Any:
        if any(t is not None and t.is_inference() for t in tensors):
            return self.compute(*tensors)
        key = tuple(None if t is None else (t.data_ptr(), t._version, t.shape, t.device, t.dtype) for t in tensors)
        if key != self._key:
            self._value, self._key = self.compute(*tensors), key
        return self._value


# A product with at most this many rows of x (a decoding step: one token per sequence) runs as BLOCKS products over
# contiguous blocks of the weight, batched (`torch.bmm`), outside autograd and on the CPU. There one matrix-vector
# product reads the weights at about a single thread's memory bandwidth, and a product of 2 to 8 rows is slower
# still; the batched blocks read them faster. `benchmarks.real_sizes` measures what it gives a decoding step
# (generation against HF generate).
FEW_ROWS = 8
BLOCKS = 8


def linear(x: Tensor, W: Tensor, b: Tensor | None = None) -> Tensor:
    """x W + b for W [d_in, d_out], TransformerLens's layout (W itself, or the transpose of a [d_out, d_in] weight).

    For a few rows outside autograd on the CPU, W is cut along its outer dimension in memory into BLOCKS
    contiguous blocks and the blocks' products run as one batched product: blocks of d_in (W stored
    [d_in, d_out]) give partial sums, added up; blocks of d_out (W stored [d_out, d_in], as a tied unembedding's
    W_Eᵀ) give slices of the output, laid side by side. The same product to float round-off (tested)."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if rows == 0 or rows > FEW_ROWS or torch.is_grad_enabled() or x.device.type != "cpu" or min(W.shape) < BLOCKS:
        return F.linear(x, W.T, b)
    x2 = x.reshape(rows, x.shape[-1])
    if W.is_contiguous():
        out = _blocks_of_inputs(x2, W)
    elif W.T.is_contiguous():
        out = _blocks_of_outputs(x2, W.T)
    else:
        return F.linear(x, W.T, b)
    if b is not None:
        out += b
    return out.view(*x.shape[:-1], W.shape[1])


def _blocks_of_inputs(x: Tensor, W: Tensor) -> Tensor:
    """x W as Σ_k x[:, block k] W[block k, :], W [d_in, d_out] contiguous; the last rows left over by BLOCKS
    equal blocks, as one more product."""
    rows, d_in = x.shape
    size = d_in // BLOCKS
    whole = BLOCKS * size
    xs = x[:, :whole].reshape(rows, BLOCKS, size).transpose(0, 1)  # [block, rows, size]
    out = torch.bmm(xs, W[:whole].view(BLOCKS, size, W.shape[1])).sum(dim=0)
    return out if whole == d_in else out.addmm_(x[:, whole:], W[whole:])


def _blocks_of_outputs(x: Tensor, W_t: Tensor) -> Tensor:
    """x W_tᵀ as its output's slices x W_t[block k, :]ᵀ side by side, W_t [d_out, d_in] contiguous; the last rows
    left over by BLOCKS equal blocks, as one more product."""
    rows, d_in = x.shape
    size = W_t.shape[0] // BLOCKS
    whole = BLOCKS * size
    parts = torch.bmm(x.expand(BLOCKS, rows, d_in), W_t[:whole].view(BLOCKS, size, d_in).transpose(1, 2))
    out = parts.transpose(0, 1).reshape(rows, whole)  # [rows, block·size], blocks in order
    return out if whole == W_t.shape[0] else torch.cat((out, F.linear(x, W_t[whole:])), dim=1)
