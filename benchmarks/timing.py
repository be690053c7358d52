"""Interleaved timing: every contender runs once per round, so drift in machine load hits all alike."""

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def interleaved(contenders: dict[str, Callable[[], object]], rounds: int = 11, warmup: int = 2) -> dict[str, dict]:
    """Median (and spread) of each contender's wall time over `rounds` interleaved rounds, in seconds."""
    for _ in range(warmup):
        for fn in contenders.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t), "rounds": rounds}
            for name, t in times.items()}


def machine() -> dict:
    return {"python": platform.python_version(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}


def write(name: str, payload: dict) -> Path:
    """Atomically write benchmarks/results/<name>.json."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2))
    os.replace(tmp, path)
    return path
