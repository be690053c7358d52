"""Streaming one layer's activations over 10,000 sequences of 128 tokens from the pydoc model, in bounded memory.

Target: peak memory below 1.5× one batch's cache. Each measurement runs in a fresh
subprocess, so every peak is the process's own high-water mark (`ru_maxrss`) above its resident set
just before the measured call (psutil); torch's allocations are invisible to tracemalloc.

    cache    `model.run_with_cache(batch, names_filter=[hook])` on one batch — what caching one batch
             of this layer costs through the ordinary API (the forward pass, its logits, the cache)
    stream   `save_activations` of the same hook at every position of every sequence, float16, to
             safetensors shards in a temporary folder (deleted afterwards)

Reported: both peaks and their ratio (the target), the bytes of one batch's cache tensor itself,
the rows and bytes written, sequences per second, and RSS samples over the run (flat = bounded).
Uses models/pydoc if it is trained, else an untrained model of the same config (memory and speed do
not depend on the weights); the token ids are uniform random either way. Writes
benchmarks/results/activations.json.

    python -m benchmarks.activations [--sequences 10000] [--batch 64] [--layer 2] [--positions all]
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import torch

from benchmarks.timing import machine, write

HOOK = "blocks.{layer}.hook_resid_post"


def load_model() -> tuple[torch.nn.Module, str]:
    from lab import HookedTransformer, ModelConfig
    from lab.folders import is_trained
    from lab.zoo.recipes import load_recipe

    if is_trained("pydoc"):
        return HookedTransformer.from_pretrained("pydoc"), "models/pydoc (trained)"
    recipe = load_recipe("pydoc")
    cfg = ModelConfig.from_dict(recipe["model"] | {"d_vocab": recipe["world"]["vocab_size"], "tokenizer": "pydoc"})
    return HookedTransformer(cfg, seed=0).eval(), "untrained model with models/pydoc's config (pydoc is not trained)"


def rss() -> int:
    return psutil.Process().memory_info().rss


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def phase_cache(args: argparse.Namespace) -> dict:
    model, source = load_model()
    batch = torch.randint(0, model.cfg.d_vocab, (args.batch, args.seq_len), generator=torch.Generator().manual_seed(0))
    hook = HOOK.format(layer=args.layer)
    before = rss()
    start = time.perf_counter()
    with torch.inference_mode():
        _, cache = model.run_with_cache(batch, names_filter=[hook])
    seconds = time.perf_counter() - start
    return {
        "model": source,
        "peak_rss_bytes": peak_rss() - before,
        "seconds": seconds,
        "cache_tensor_bytes": cache[hook].numel() * cache[hook].element_size(),
        "cache_tensor_shape": list(cache[hook].shape),
    }


def phase_stream(args: argparse.Namespace) -> dict:
    from lab.analysis.activations.store import save_activations

    model, source = load_model()
    data = torch.randint(
        0, model.cfg.d_vocab, (args.sequences, args.seq_len), generator=torch.Generator().manual_seed(1)
    )
    out = Path(tempfile.mkdtemp(prefix="forma-bench-activations-"))
    samples: list[tuple[float, int]] = []
    stop = threading.Event()

    def sample() -> None:  # RSS over time: a flat trace is the evidence that memory does not grow with data
        t0 = time.perf_counter()
        while not stop.is_set():
            samples.append((time.perf_counter() - t0, rss()))
            stop.wait(0.25)

    before = rss()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    try:
        store = save_activations(
            model,
            data,
            HOOK.format(layer=args.layer),
            out,
            positions=args.positions,
            batch_size=args.batch,
            dtype=getattr(torch, args.dtype),
            progress=args.progress,
        )
        seconds = time.perf_counter() - start
        stop.set()
        sampler.join()
        written = sum(f.stat().st_size for f in out.iterdir())
        result = {
            "model": source,
            "peak_rss_bytes": peak_rss() - before,
            "seconds": seconds,
            "sequences_per_s": args.sequences / seconds,
            "rows": len(store),
            "shards": len(store.index["shards"]),
            "bytes_written": written,
            "row_shape": store.index["hooks"][HOOK.format(layer=args.layer)]["shape"],
            "rss_trace_mb": [
                (round(t, 1), round((r - before) / 2**20, 1)) for t, r in samples[:: max(1, len(samples) // 20)]
            ],
        }
    finally:
        stop.set()
        shutil.rmtree(out, ignore_errors=True)
    return result


def run_phase(name: str, argv: list[str]) -> dict:
    """One measurement in a fresh interpreter, so its peak is not an earlier phase's."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.activations", "--phase", name, *argv],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=int, default=10_000)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--layer", type=int, default=2)
    parser.add_argument("--positions", default="all", choices=["all", "last"])
    parser.add_argument("--dtype", default="float16", choices=["float16", "float32"])
    parser.add_argument("--progress", action="store_true")
    parser.add_argument("--phase", choices=["cache", "stream"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase == "cache":
        print(json.dumps(phase_cache(args)))
        return
    if args.phase == "stream":
        print(json.dumps(phase_stream(args)))
        return

    argv = _phase_argv(args)
    cache = run_phase("cache", argv)
    stream = run_phase("stream", argv)
    ratio = stream["peak_rss_bytes"] / cache["peak_rss_bytes"]
    mb = 2**20
    payload = {
        "benchmark": "activations",
        "machine": machine(),
        "model": stream["model"],
        "hook": HOOK.format(layer=args.layer),
        "sequences": args.sequences,
        "seq_len": args.seq_len,
        "batch": args.batch,
        "positions": args.positions,
        "dtype": args.dtype,
        "one_batch_run_with_cache_peak_rss_mb": cache["peak_rss_bytes"] / mb,
        "one_batch_cache_tensor_mb": cache["cache_tensor_bytes"] / mb,
        "stream_peak_rss_mb": stream["peak_rss_bytes"] / mb,
        "stream_vs_one_batch_cache": ratio,
        "stream_vs_cache_tensor_alone": stream["peak_rss_bytes"] / cache["cache_tensor_bytes"],
        "target_stream_vs_one_batch_cache": 1.5,
        "passed": ratio < 1.5,
        "stream_seconds": stream["seconds"],
        "sequences_per_s": stream["sequences_per_s"],
        "rows_written": stream["rows"],
        "shards": stream["shards"],
        "gb_written": stream["bytes_written"] / 2**30,
        "rss_trace_mb": stream["rss_trace_mb"],
        "note": "peaks are ru_maxrss above the RSS just before the call, each in a fresh process; the machine's "
        "cores may be shared with other work, so the times are indicative",
    }
    path = write("activations", payload)
    _print_summary(payload)
    print(f"wrote {path}")


def _phase_argv(args: argparse.Namespace) -> list[str]:
    """The options each phase's fresh interpreter is run with: this run's own."""
    argv = [
        f"--sequences={args.sequences}",
        f"--seq-len={args.seq_len}",
        f"--batch={args.batch}",
        f"--layer={args.layer}",
        f"--positions={args.positions}",
        f"--dtype={args.dtype}",
    ]
    return argv + (["--progress"] if args.progress else [])


def _print_summary(payload: dict) -> None:
    """The run's figures as lines a reader reads, from what it wrote."""
    print(
        f"model: {payload['model']}; hook {payload['hook']}, {payload['sequences']} × {payload['seq_len']} tokens, "
        f"batch {payload['batch']}, positions {payload['positions']}, {payload['dtype']}"
    )
    print(
        f"one batch, run_with_cache(names_filter=[hook]): peak +{payload['one_batch_run_with_cache_peak_rss_mb']:.1f} "
        "MB "
        f"(the cache tensor itself: {payload['one_batch_cache_tensor_mb']:.1f} MB)"
    )
    print(
        f"streamed {payload['rows_written']:,} rows into {payload['shards']} shards "
        f"({payload['gb_written']:.2f} GB) in {payload['stream_seconds']:.1f} s "
        f"({payload['sequences_per_s']:.0f} sequences/s): peak "
        f"+{payload['stream_peak_rss_mb']:.1f} MB"
    )
    print(
        f"stream / one batch's cache = {payload['stream_vs_one_batch_cache']:.2f} "
        f"(target < 1.5: {'PASS' if payload['passed'] else 'FAIL'}); "
        f"stream / cache tensor alone = {payload['stream_vs_cache_tensor_alone']:.2f}"
    )
    print(f"RSS above start over the run (s, MB): {payload['rss_trace_mb']}")


if __name__ == "__main__":
    main()
