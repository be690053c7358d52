"""What every check is: the Check record, the rules one measured entry passes by, and a check read entry by
entry."""

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Check:
    """One claim, computed: the equation, what we measured, what the equation predicts, and the verdict."""

    name: str
    item: int  # the claim's number in the list of checks (docs/experiments.md)
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
