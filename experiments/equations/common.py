"""What every check shares: the Check record, float64, seeded generators and attention layers, and hooks that
record what a HookPoint carries."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from transformer_lens.hook_points import HookPoint

from lab.model import ModelConfig
from lab.model.attention import Attention

F64 = torch.float64


@dataclass
class Check:
    """One claim, computed: the equation, what we measured, what the equation predicts, and the verdict."""

    name: str
    item: int  # the claim's number in issue 9
    equation: str  # LaTeX, for st.latex
    measured: float | list[float]
    expected: float | list[float]
    tolerance: float | list[float]
    passed: bool
    note: str
    what: list[str] = field(default_factory=list)  # each measured entry, in words
    rules: list[str] = field(default_factory=list)  # how each entry passes (RULES); none given: "within" each
    seconds: float = 0.0
    timing: dict[str, list[float]] = field(default_factory=dict)  # wall times beside the check, never gated


# How one measured entry x passes, against its expected value e and tolerance t: "within" |x − e| ≤ t, "more
# than" x > e, "at least" x ≥ e; "shown": the entry is part of a rule the note states (a slope, an ordering).
RULES = ("within", "more than", "at least", "shown")


def _g(value: float) -> str:
    return f"{value:.4g}"


def comparison(measured: float, expected: float, tolerance: float, rule: str) -> tuple[str, str]:
    """One entry's pass rule (words, symbols with the measured value in place): ("more than 0.05",
    "0.6222 > 0.05"), ("at most 1e-10 from 0", "|1.499e-15| ≤ 1e-10"), ("within 0.04 of 1",
    "|0.98 − 1| ≤ 0.04")."""
    x, e, t = _g(measured), _g(expected), _g(tolerance)
    if rule == "more than":
        return f"more than {e}", f"{x} > {e}"
    if rule == "at least":
        return f"at least {e}", f"{x} ≥ {e}"
    if rule == "shown":
        return "shown for the rule in the note", ""
    if tolerance == 0:
        return f"exactly {e}", f"{x} = {e}"
    if expected == 0:
        return f"at most {t} from 0", f"|{x}| ≤ {t}"
    return f"within {t} of {e}", f"|{x} − {e}| ≤ {t}"


def holds(measured: float, expected: float, tolerance: float, rule: str) -> bool | None:
    """Whether one entry meets its rule (None for "shown": the note's rule decides)."""
    if rule == "more than":
        return measured > expected
    if rule == "at least":
        return measured >= expected
    if rule == "shown":
        return None
    return abs(measured - expected) <= tolerance


def entries(check: dict[str, Any]) -> list[dict[str, Any]]:
    """A check (as results.json holds it) entry by entry: what it is, the measured value, its rule in words and
    in symbols, and whether it holds."""

    def listed(value: Any) -> list[Any]:
        return list(value) if isinstance(value, (list, tuple)) else [value]

    measured, expected, tolerance = (listed(check[k]) for k in ("measured", "expected", "tolerance"))
    what = listed(check.get("what") or []) or [f"entry {i + 1}" for i in range(len(measured))]
    rules = listed(check.get("rules") or []) or ["within"] * len(measured)
    out = []
    for w, m, e, t, rule in zip(what, measured, expected, tolerance, rules, strict=True):
        words, symbols = comparison(m, e, t, rule)
        out.append(
            {"what": w, "measured": m, "passes when": words, "in symbols": symbols, "holds": holds(m, e, t, rule)}
        )
    return out


def all_close(measured: list[float], expected: list[float], tolerance: list[float]) -> bool:
    return all(abs(m - e) <= t for m, e, t in zip(measured, expected, tolerance, strict=True))


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
