"""Freed activation memory stays in the process: repeated run_with_cache calls do not page-fault afresh."""

import json
import os
import subprocess
import sys

import pytest

from lab.freed_memory import keep_freed_memory

# Four run_with_cache calls on a model whose full cache (≈ 110 MB) is larger than glibc's adaptive
# trim threshold (64 MB at most); the script prints whether the allocator was tuned, the minor page
# faults of the four calls, and the 4 KB pages one cache holds.
SCRIPT = """
import json, resource, torch
import lab
from lab import HookedTransformer, ModelConfig
model = HookedTransformer(ModelConfig(d_vocab=512, d_model=256, n_layers=4, n_heads=4, n_ctx=256), seed=0).eval()
tokens = torch.randint(0, 512, (8, 128), generator=torch.Generator().manual_seed(0))
with torch.inference_mode():
    for _ in range(2):
        _, cache = model.run_with_cache(tokens)
    pages = sum(t.numel() * t.element_size() for t in cache.values()) // 4096
    del cache
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        model.run_with_cache(tokens)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"tuned": lab.freed_memory.keep_freed_memory(), "faults": faults, "pages": pages}))
"""


def _faults(keep: str) -> dict:
    env = {**os.environ, "FORMA_KEEP_FREED_MEMORY": keep, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.processes  # measures page faults in a fresh Python of its own
@pytest.mark.skipif(not keep_freed_memory(), reason="the C library is not glibc: there is no allocator to tune")
def test_repeated_caching_reuses_freed_memory():
    kept = _faults("1")
    assert kept["tuned"] and kept["pages"] > 20_000
    # Each call touches every page of its cache again; tuned, they come from the heap it kept, so four
    # calls fault in less than 2% of one cache's pages. (Untuned, glibc hands most of them back to the OS
    # and faults them in again, but how much depends on its adaptive thresholds' history.)
    assert kept["faults"] < 0.02 * kept["pages"], kept


def test_the_tuning_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("FORMA_KEEP_FREED_MEMORY", "0")
    assert keep_freed_memory() is False  # before any call to the allocator: `import lab` leaves it as it is
