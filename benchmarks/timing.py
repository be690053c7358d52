"""What every benchmark shares: interleaved timing (every contender runs once per round, so drift in machine
load hits all alike), device syncs, peak memory, the forward pass's FLOPs, a forward's own matrix products replayed
alone (its floor), and the atomic write of benchmarks/results/<name>.json."""

import ctypes
import json
import math
import os
import platform
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def interleaved(
    contenders: dict[str, Callable[[], object]], rounds: int = 11, warmup: int = 2, memory: str | None = None
) -> dict[str, dict]:
    """Median (and spread) of each contender's wall time over `rounds` interleaved rounds, in seconds. Round r
    starts with the contender r places on (a, b, c; b, c, a; c, a, b; ...).

    memory: a device ("cpu", "cuda"): one more call of each contender, after the warm-up and before the timed
    rounds, reads its peak memory (`peak_memory`, reported as peak_memory_bytes). It is not timed: returning the
    heap to the system first (so reused pages count) makes that call fault its memory in afresh."""
    for _ in range(warmup):
        for fn in contenders.values():
            fn()
    peaks = {name: peak_memory(fn, memory) for name, fn in contenders.items()} if memory is not None else {}
    times: dict[str, list[float]] = {name: [] for name in contenders}
    order = list(contenders.items())
    for round_ in range(rounds):
        # Each round starts one contender further on, so none always runs first (after a warm cache, a freed heap).
        for name, fn in order[round_ % len(order) :] + order[: round_ % len(order)]:
            call = Clocked(fn)
            call()
            times[name].append(call.seconds)
    return {
        name: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t), "rounds": rounds}
        | ({"peak_memory_bytes": peaks[name]} if memory is not None else {})
        for name, t in times.items()
    }


class Clocked:
    """fn, which keeps the wall time of its last call in `seconds`."""

    def __init__(self, fn: Callable[[], object]):
        self.fn, self.seconds = fn, float("nan")

    def __call__(self) -> object:
        start = time.perf_counter()
        out = self.fn()
        self.seconds = time.perf_counter() - start
        return out


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str) -> Callable[[], Any]:
    """fn, then a device sync: on a GPU the time of a call is the time until its kernels finish."""

    def run():
        out = fn()
        sync(device)
        return out

    return run


def training_steps(ours: Any, hf: Any, tokens: torch.Tensor, lr: float = 1e-4) -> dict[str, Callable[[], None]]:
    """One AdamW step of next-token training each, Forma's (`model.loss`) and Hugging Face's (`labels=`), on the
    same tokens: {"forma_step", "hf_step"}, the contenders of a training benchmark (both models in train mode)."""
    ours, hf = ours.train(), hf.train()
    opt_ours = torch.optim.AdamW(ours.parameters(), lr=lr)
    opt_hf = torch.optim.AdamW(hf.parameters(), lr=lr)

    def step_ours() -> None:
        opt_ours.zero_grad(set_to_none=True)
        ours.loss(tokens).backward()
        opt_ours.step()

    def step_hf() -> None:
        opt_hf.zero_grad(set_to_none=True)
        hf(tokens, labels=tokens).loss.backward()
        opt_hf.step()

    return {"forma_step": step_ours, "hf_step": step_hf}


def machine() -> dict:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "load_average_1_5_15": list(os.getloadavg()),
        "utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def cache_bytes(cache: Any) -> int:
    """Bytes of the tensors an activation cache holds (a TransformerLens ActivationCache or a dict)."""
    values = cache.cache_dict.values() if hasattr(cache, "cache_dict") else cache.values()
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def forward_flops(cfg: Any, batch: int, tokens: int) -> float:
    """Matmul FLOPs of one forward pass of a decoder with config `cfg` (a Forma ModelConfig) on batch × tokens.

    Per token and layer: 2·d·(h·d_head) for W_Q and as much for W_O, 2·2·d·(kv·d_head) for W_K and W_V,
    2·d·d_mlp per MLP matrix (two, or three when gated), and 2·2·T·h·d_head for the scores and A v (causal:
    half of T·T on average, counted in full, as sdpa computes it); then 2·d·|V| for the unembedding. For
    GPT-2 (h·d_head = d, d_mlp = 4d) the blocks are 2·12·d² per token and layer."""
    d, h, kv, dh = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    matrices = 3 if cfg.mlp == "swiglu" else 2
    per_layer = 2 * d * h * dh * 2 + 2 * 2 * d * kv * dh + 2 * d * cfg.d_mlp * matrices + 2 * 2 * tokens * h * dh
    return batch * tokens * (cfg.n_layers * per_layer + 2 * d * cfg.d_vocab)


@dataclass(frozen=True)
class Operand:
    """A tensor argument of a recorded call, by its layout: what a replay allocates in its place."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device

    def make(self, generator: torch.Generator) -> torch.Tensor:
        """Random normal values laid out as the recorded tensor was (a transposed or expanded view included)."""
        span = 1 + sum((n - 1) * s for n, s in zip(self.shape, self.stride)) if all(self.shape) else 0
        values = torch.randn(span, generator=generator, dtype=torch.float32).to(self.dtype)
        return values.to(self.device).as_strided(self.shape, self.stride)


# The aten matrix products a forward dispatches: linear and matmul as such under inference mode (a dispatch mode
# sees them before they decompose), mm, addmm, bmm and baddbmm otherwise and on the explicit attention path.
PRODUCTS = ("linear", "matmul", "mm", "addmm", "bmm", "baddbmm")


class MatrixProducts:
    """Every matrix product (an aten op named in PRODUCTS) that one call of `fn` dispatches, in order, with its
    operands' layouts and its other arguments; calling it runs those products alone, on random operands laid out
    alike (made once), each allocating its output as it did in fn. Its time is the part of fn's that the
    matrix products take at the speed this machine runs them: a floor under fn that no arrangement of the rest
    can go below. `flops`: 2·m·k·n per [m, k] × [k, n] product (× the batch for bmm), as torch's FlopCounterMode
    counts them. Attention fused into one kernel (scaled_dot_product_attention) is not among them."""

    def __init__(self, fn: Callable[[], Any], seed: int = 0):
        from torch.utils._python_dispatch import TorchDispatchMode

        calls: list[tuple[Any, tuple, tuple]] = []

        def spec(value: Any) -> Any:
            return (
                Operand(tuple(value.shape), tuple(value.stride()), value.dtype, value.device)
                if isinstance(value, torch.Tensor)
                else value
            )

        class Record(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func.overloadpacket.__name__ in PRODUCTS:
                    named = tuple(sorted((k, spec(v)) for k, v in kwargs.items()))
                    calls.append((func, tuple(spec(a) for a in args), named))
                return func(*args, **kwargs)

        with Record():
            fn()
        self.calls = calls
        generator = torch.Generator().manual_seed(seed)

        def make(value: Any) -> Any:
            return value.make(generator) if isinstance(value, Operand) else value

        self._runs = [
            (func, tuple(make(a) for a in args), {k: make(v) for k, v in kwargs}) for func, args, kwargs in calls
        ]
        self.flops = sum(self._flops(func, args) for func, args, _ in calls)

    @staticmethod
    def _flops(func: Any, args: tuple) -> int:
        """2·m·k·n per [m, k] × [k, n] product, times the batch: what FlopCounterMode counts for each op."""
        name = func.overloadpacket.__name__
        if name == "linear":  # x [..., k] · Wᵀ, W [n, k]
            x, W = args[:2]
            return 2 * math.prod(x.shape) * W.shape[0]
        a, b = args[1:3] if name in ("addmm", "baddbmm") else args[:2]
        batch = math.prod(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])) if len(b.shape) > 1 else 1
        m = a.shape[-2] if len(a.shape) > 1 else 1
        return 2 * batch * m * a.shape[-1] * (b.shape[-1] if len(b.shape) > 1 else 1)

    def __call__(self) -> None:
        for func, args, kwargs in self._runs:
            func(*args, **kwargs)


PEAK_METHODS = {
    "cuda": "torch.cuda.max_memory_allocated above memory_allocated before the call: bytes of tensors held",
    "cpu": "VmHWM (the peak resident set, the same high-water mark as ru_maxrss) reset through /proc/self/clear_refs "
    "before the call, above VmRSS before it, after malloc_trim returned the allocator's free pages: the "
    "call's own peak of resident memory, in this process",
}


def _proc_status(key: str) -> int:
    match = re.search(rf"^{key}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    if match is None:
        raise OSError(f"/proc/self/status has no {key}")
    return int(match.group(1)) * 1024


def peak_memory(fn: Callable[[], Any], device: str) -> int | None:
    """Bytes by which one call of fn raises memory above what was in use just before it (PEAK_METHODS says
    how, per device); None where the platform cannot say (no /proc, no glibc)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed heap pages back to the system, so they count when reused
        Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak RSS to the current RSS (Linux ≥ 4.0)
        before = _proc_status("VmRSS")
    except OSError:
        fn()
        return None
    fn()
    return _proc_status("VmHWM") - before


def result_name(name: str, device: str) -> str:
    """The results file's stem for a benchmark run on `device`: <name> on the CPU, <name>_<kind> elsewhere
    ("cuda:1" writes <name>_cuda), so a GPU run never overwrites the CPU's figures."""
    return name if device == "cpu" else f"{name}_{device.split(':')[0]}"


def write(name: str, payload: dict) -> Path:
    """Atomically write benchmarks/results/<name>.json."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2))
    os.replace(tmp, path)
    return path
