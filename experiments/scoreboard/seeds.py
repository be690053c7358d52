"""Training seeds: every world's model is trained and graded once per seed, and the table's rows of the seeds are
combined into one row per method × world × readout × grade, whatever part wrote them (`row` in parts).

The combined row's value is the mean of the seeds' values; its interval is the envelope of the seeds' intervals
and values — from the lowest seed's low to the highest seed's high — so it covers the spread between the trained
models as well as each model's spread over prompts (a two-level bootstrap would need every grade's per-prompt
values, which the rows do not keep; the envelope is wider, never narrower). The control's value and interval are
combined the same way and its verdicts are taken again from the combined intervals (Grade.control_at_chance's and
Grade.beats_control's rules).
`seeds` counts the seeds behind the row and `seed_min` / `seed_max` are the lowest and highest seed's value: the
seed spread on its own. Each seed's own rows stay in the per-seed table, with a `seed` column."""

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["SEED_FIELDS", "combine_seeds", "per_seed_rows", "training_seeds"]

SEED_FIELDS = ("seeds", "seed_min", "seed_max")
KEY = ("method", "world", "readout", "grade")


def training_seeds(seed: int, count: int) -> list[int]:
    """The run's training seeds: `seed`, `seed` + 1, … (`count` of them); the first one's models are the run's."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"the number of training seeds must be a positive integer, got {count!r}")
    return [seed + k for k in range(count)]


def _finite(values: Sequence[Any]) -> list[float]:
    return [float(v) for v in values if v is not None and not isinstance(v, bool) and math.isfinite(float(v))]


def _mean(values: Sequence[Any]) -> float | None:
    kept = _finite(values)
    return sum(kept) / len(kept) if kept else None


def _envelope(rows: list[dict[str, Any]], value: str, low: str, high: str) -> tuple[Any, Any, Any]:
    """(mean, low, high) over the seeds: the mean of the values, the envelope of the intervals and values; no
    interval (None) where a seed has none."""
    values, lows, highs = [r[value] for r in rows], _finite([r[low] for r in rows]), _finite([r[high] for r in rows])
    mean = _mean(values)
    if mean is None or len(lows) < len(rows) or len(highs) < len(rows):
        return mean, None, None
    kept = _finite(values)
    return mean, min(lows + kept), max(highs + kept)


def _control_at_chance(row: dict[str, Any], verdicts: list[Any]) -> bool | None:
    """Grade.control_at_chance's rule on the combined control interval: None where a seed has no verdict."""
    if any(v is None for v in verdicts) or row["chance"] is None or row["control_low"] is None:
        return None
    if row["better"] == "higher":
        return bool(row["control_low"] <= row["chance"])
    return bool(row["control_high"] >= row["chance"])


def _beats_control(row: dict[str, Any], verdicts: list[Any]) -> bool | None:
    """Grade.beats_control's rule on the combined intervals (the value's wholly on the good side of the
    control's): None where a seed has no verdict."""
    if any(v is None for v in verdicts) or row["low"] is None or row.get("control_low") is None:
        return None
    if row["better"] == "higher":
        return bool(row["low"] > row["control_high"])
    return bool(row["high"] < row["control_low"])


def _combined(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from the seeds' rows of one key (see the module's docstring)."""
    out = dict(rows[0])
    out["value"], out["low"], out["high"] = _envelope(rows, "value", "low", "high")
    if out["low"] is None:
        reasons = [r.get("why_no_interval") for r in rows if r.get("why_no_interval")]
        out["why_no_interval"] = reasons[0] if reasons else "a seed's grade has no interval"
    if "control" in out and out["control"] is not None:
        out["control"], out["control_low"], out["control_high"] = _envelope(
            rows, "control", "control_low", "control_high"
        )
    if "chance" in out:
        out["chance"] = _mean([r["chance"] for r in rows]) if out["chance"] is not None else None
    if "control_at_chance" in out:
        out["control_at_chance"] = _control_at_chance(out, [r["control_at_chance"] for r in rows])
    if "beats_control" in out:
        out["beats_control"] = _beats_control(out, [r["beats_control"] for r in rows])
    kept = _finite([r["value"] for r in rows])
    out["seeds"] = len(rows)
    out["seed_min"], out["seed_max"] = (min(kept), max(kept)) if kept else (None, None)
    return out


def combine_seeds(tables: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per key (method, world, readout, grade) from each seed's table {seed: rows}, in the first seed's
    order (keys only some seeds have come after, in the order they first appear)."""
    grouped: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for rows in tables.values():
        for r in rows:
            grouped.setdefault(tuple(r[k] for k in KEY), []).append(r)
    return [_combined(rows) for rows in grouped.values()]


def per_seed_rows(tables: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Every seed's rows, each with its `seed`."""
    return [{"seed": seed, **r} for seed, rows in tables.items() for r in rows]
