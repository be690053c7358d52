"""Harvesting one hook's activations for probe and SAE datasets: Forma's `save_activations` against the
TransformerBridge's `run_with_cache(names_filter=[hook])` on the same weights.

    ratio    GPT-2-small shapes (12 layers, d_model 768, 12 heads, vocab 50,257; random weights from a
             transformers GPT2Config, converted with lab.hf.convert.from_hf, the same weights in the bridge in
             compatibility mode): tokens/s of Forma's harvest of an early and a middle hook (every
             position, float32, to safetensors shards on disk) against the bridge's run_with_cache with
             names_filter for the same hook on the same batches (kept in memory: nothing written, so the
             bridge's side is a lower bound on what a harvest through it costs). Interleaved rounds,
             medians; the first rows of both are compared.
    memory   peak RSS of a Forma harvest of many batches against one batch's run_with_cache(names_filter=
             [hook]) — each in a fresh process, the resident high-water mark (VmHWM, reset once the model
             is built) above the resident set with the model loaded (tracemalloc does not see torch), so
             the target reads
             harvest peak ≤ 1.5 × one batch's peak, both above the model.
    corpus   one harvest of ≥ 1M tokens (a random-token corpus) by Forma, at a size small enough for the time
             this takes on a CPU (the sizes are written beside the figures), with its tokens/s, its peak
             and an RSS trace (flat = bounded), against one batch's run_with_cache at that size.

Target: harvest ≥ 2× the bridge's throughput; peak ≤ 1.5× one batch's. Writes
benchmarks/results/harvest.json (harvest_<device>.json off the CPU). --device cuda runs both models on the
GPU (Forma's harvest still lands on the CPU and on disk, the bridge's cache stays on the GPU), every timed
call ends with a device sync, and the memory phases read the GPU's peak (torch.cuda.max_memory_allocated
above what was allocated before) beside the resident set; the ratio is then the GPU's.

    python -m benchmarks.harvest [--rounds 3] [--corpus-tokens 1048576] [--quick] [--device cpu]
"""

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from benchmarks.activations import rss
from benchmarks.timing import interleaved, machine, result_name, sync, timed, write

# (layers, d_model, heads, vocab): GPT-2 small, the smaller model the ≥1M-token harvest runs at on a CPU, and
# the tiny one tests/sae's agreement of Forma's harvest with SAELens' store runs at.
SIZES = {"gpt2-small": (12, 768, 12, 50257), "small": (4, 128, 4, 8192), "tiny": (3, 64, 4, 257)}
HOOKS = {"early": "blocks.2.hook_resid_post", "middle": "blocks.5.hook_resid_post"}
CORPUS_HOOK = "blocks.1.hook_resid_post"
SEQ_LEN = 128


def hf_model(size: str, device: str = "cpu"):
    from transformers import GPT2Config, GPT2LMHeadModel

    layers, d, heads, vocab = SIZES[size]
    torch.manual_seed(0)
    cfg = GPT2Config(
        n_layer=layers, n_embd=d, n_head=heads, vocab_size=vocab, n_positions=1024, bos_token_id=None, eos_token_id=None
    )
    return GPT2LMHeadModel(cfg).eval().to(device)


def forma_model(size: str, device: str = "cpu"):
    from lab.hf.convert import from_hf

    return from_hf(hf_model(size, device)).eval().to(device)


def corpus(n_sequences: int, vocab: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, (n_sequences, SEQ_LEN), generator=torch.Generator().manual_seed(seed))


def _forma_and_bridge(device: str) -> tuple:
    """One GPT-2-small Hugging Face model of random weights, read by Forma (from_hf) and by TransformerLens's
    bridge in compatibility mode (a word-level tokenizer of its vocabulary's size)."""
    from transformer_lens.model_bridge import TransformerBridge

    from lab.data.tokenizers import to_hf_tokenizer, word_level
    from lab.hf.convert import from_hf

    hf = hf_model("gpt2-small", device)
    ours = from_hf(hf).eval().to(device)
    vocab = SIZES["gpt2-small"][3]
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = to_hf_tokenizer(word_level([f"w{i}" for i in range(vocab - 4)]), tmp)
        bridge = TransformerBridge.boot_transformers(
            "gpt2", hf_model=copy.deepcopy(hf), tokenizer=tokenizer, device=device
        )
    bridge.enable_compatibility_mode()
    return ours, bridge


def _agreement(bridge, batch: torch.Tensor, out: Path, rows: int) -> dict[str, float]:
    """Per hook, the largest |difference| between the first `rows` rows Forma harvested under `out` and the
    bridge's run_with_cache of the first batch."""
    from lab.analysis.activations.store import ActivationStore

    agreement = {}
    for where, hook in HOOKS.items():
        stored = next(ActivationStore(out / hook).shards()).acts[hook][:rows]
        with torch.inference_mode():
            _, cache = bridge.run_with_cache(batch, names_filter=[hook])
        theirs = cache[hook].reshape(-1, cache[hook].shape[-1]).cpu()
        # Compatibility mode centres the writing weights, so the bridge's residual stream is Forma's minus
        # each row's mean over d_model: compare the rows centred.
        centred = lambda t: t - t.mean(dim=-1, keepdim=True)  # noqa: E731
        agreement[where] = float((centred(stored) - centred(theirs)).abs().max())
    return agreement


def bench_ratio(args: argparse.Namespace) -> dict:
    from lab.analysis.activations.store import save_activations

    device = args.device
    ours, bridge = _forma_and_bridge(device)
    vocab = SIZES["gpt2-small"][3]
    data = corpus(args.batches * args.batch, vocab, seed=1)  # on the CPU: the harvest moves each batch itself
    batches = [batch.to(device) for batch in data.split(args.batch)]
    tokens = data.numel()
    out = Path(tempfile.mkdtemp(prefix="forma-bench-harvest-"))

    def harvest(hook: str):
        return lambda: save_activations(
            ours, data, hook, out / hook, positions="all", batch_size=args.batch, progress=False, overwrite=True
        )

    def bridge_cache(hook: str):
        def run():
            with torch.inference_mode():
                for batch in batches:
                    _, cache = bridge.run_with_cache(batch, names_filter=[hook])
                    rows = cache[hook].reshape(-1, cache[hook].shape[-1])
            return rows

        return run

    contenders = {}
    for where, hook in HOOKS.items():
        contenders[f"forma_harvest_{where}"] = timed(harvest(hook), device)
        contenders[f"bridge_run_with_cache_{where}"] = timed(bridge_cache(hook), device)
    try:
        timing = interleaved(contenders, rounds=args.rounds, warmup=1)
        agreement = _agreement(bridge, batches[0], out, SEQ_LEN * args.batch)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return _ratio_record(args, tokens, timing, agreement)


def _ratio_record(args: argparse.Namespace, tokens: int, timing: dict, agreement: dict[str, float]) -> dict:
    """What the ratio run records: its setting, each contender's timing, the agreement with the bridge, and per hook
    each side's tokens per second and Forma's throughput against the bridge's."""
    result = {
        "device": args.device,
        "size": "gpt2-small",
        "shape": dict(zip(("n_layers", "d_model", "n_heads", "d_vocab"), SIZES["gpt2-small"])),
        "hooks": HOOKS,
        "batch": args.batch,
        "seq_len": SEQ_LEN,
        "tokens_per_round": tokens,
        "max_abs_diff_note": "rows centred over d_model: the bridge's compatibility mode centres the writing weights",
        "rounds": args.rounds,
        "timing": timing,
        "max_abs_diff_vs_bridge": agreement,
    }
    for where in HOOKS:
        ours_s = timing[f"forma_harvest_{where}"]["median_s"]
        theirs_s = timing[f"bridge_run_with_cache_{where}"]["median_s"]
        result[f"forma_tokens_per_s_{where}"] = tokens / ours_s
        result[f"bridge_tokens_per_s_{where}"] = tokens / theirs_s
        result[f"throughput_vs_bridge_{where}"] = theirs_s / ours_s
    return result


# --- memory phases: each in a fresh interpreter, so its peak is its own ---------------------------------
def reset_peak() -> None:
    """Hand freed memory back to the OS, then reset the process's resident high-water mark to its current RSS
    (Linux ≥ 4.0, /proc/PID/clear_refs). Building the model (a Hugging Face model, then its conversion) peaks
    above anything measured after it, so ru_maxrss alone would report that construction peak; and the memory
    it freed, kept by malloc for reuse (`lab.freed_memory`), would absorb the measured call's allocations unseen."""
    from lab.freed_memory import release_freed_memory

    release_freed_memory()
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss() -> int:
    """VmHWM: the resident high-water mark since the last reset_peak, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmHWM line")


def gpu_mark(device: str) -> int | None:
    """On a GPU: reset torch's peak statistics and return the bytes allocated now; None on the CPU."""
    if not device.startswith("cuda"):
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def gpu_peak(mark: int | None) -> int | None:
    """Bytes of tensors the GPU held at its peak since gpu_mark, above what it held then."""
    if mark is None:
        return None
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - mark


def phase_cache(size: str, hook: str, batch: int, device: str = "cpu") -> dict:
    model = forma_model(size, device)
    x = corpus(batch, SIZES[size][3], seed=0).to(device)
    reset_peak()
    before, mark = rss(), gpu_mark(device)
    with torch.inference_mode():
        _, cache = model.run_with_cache(x, names_filter=[hook])
    sync(device)
    return {
        "peak_rss_bytes": peak_rss() - before,
        "peak_gpu_bytes": gpu_peak(mark),
        "cache_tensor_bytes": cache[hook].numel() * cache[hook].element_size(),
        "model_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
    }


def phase_harvest(size: str, hook: str, batch: int, n_sequences: int, dtype: str, device: str = "cpu") -> dict:
    from lab.analysis.activations.store import save_activations

    model = forma_model(size, device)
    data = corpus(n_sequences, SIZES[size][3], seed=2)
    out = Path(tempfile.mkdtemp(prefix="forma-bench-harvest-"))
    samples: list[tuple[float, int]] = []
    stop = threading.Event()

    def sample() -> None:
        t0 = time.perf_counter()
        while not stop.is_set():
            samples.append((time.perf_counter() - t0, rss()))
            stop.wait(0.5)

    reset_peak()
    before, mark = rss(), gpu_mark(device)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    try:
        store = save_activations(
            model, data, hook, out, positions="all", batch_size=batch, dtype=getattr(torch, dtype), progress=False
        )
        seconds = time.perf_counter() - start
        stop.set()
        sampler.join()
        written = sum(f.stat().st_size for f in out.iterdir())
        return {
            "peak_rss_bytes": peak_rss() - before,
            "peak_gpu_bytes": gpu_peak(mark),
            "seconds": seconds,
            "tokens": data.numel(),
            "tokens_per_s": data.numel() / seconds,
            "rows": len(store),
            "shards": len(store.index["shards"]),
            "bytes_written": written,
            "rss_trace_mb": [
                (round(t, 1), round((r - before) / 2**20, 1)) for t, r in samples[:: max(1, len(samples) // 20)]
            ],
        }
    finally:
        stop.set()
        shutil.rmtree(out, ignore_errors=True)


def run_phase(device: str, *argv: str) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.harvest", "--device", device, "--phase", *argv],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_memory(size: str, hook: str, batch: int, n_sequences: int, dtype: str, device: str = "cpu") -> dict:
    """The harvest's peak against one batch's run_with_cache, each in a fresh process: the resident set's on
    the CPU, the GPU's tensors' on a GPU (where the resident set is reported beside it)."""
    cache = run_phase(device, "cache", size, hook, str(batch))
    harvest = run_phase(device, "harvest", size, hook, str(batch), str(n_sequences), dtype)
    mb = 2**20
    measure = "peak_gpu_bytes" if device.startswith("cuda") else "peak_rss_bytes"
    ratio = harvest[measure] / cache[measure]
    gpu = (
        {}
        if measure == "peak_rss_bytes"
        else {
            "one_batch_run_with_cache_peak_gpu_mb": cache["peak_gpu_bytes"] / mb,
            "harvest_peak_gpu_mb": harvest["peak_gpu_bytes"] / mb,
        }
    )
    return {
        "device": device,
        "peak_measure": measure.removesuffix("_bytes"),
        **gpu,
        "size": size,
        "shape": dict(zip(("n_layers", "d_model", "n_heads", "d_vocab"), SIZES[size])),
        "hook": hook,
        "batch": batch,
        "seq_len": SEQ_LEN,
        "sequences": n_sequences,
        "tokens": harvest["tokens"],
        "dtype": dtype,
        "model_mb": cache["model_bytes"] / mb,
        "one_batch_run_with_cache_peak_rss_mb": cache["peak_rss_bytes"] / mb,
        "one_batch_cache_tensor_mb": cache["cache_tensor_bytes"] / mb,
        "harvest_peak_rss_mb": harvest["peak_rss_bytes"] / mb,
        "harvest_vs_one_batch": ratio,
        "target_harvest_vs_one_batch": 1.5,
        "passed": ratio <= 1.5,
        "harvest_seconds": harvest["seconds"],
        "tokens_per_s": harvest["tokens_per_s"],
        "rows": harvest["rows"],
        "shards": harvest["shards"],
        "gb_written": harvest["bytes_written"] / 2**30,
        "rss_trace_mb": harvest["rss_trace_mb"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="where the models run (default cpu; e.g. cuda)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2, help="sequences per batch at GPT-2-small shapes")
    parser.add_argument("--batches", type=int, default=1, help="batches per timed round at GPT-2-small shapes")
    parser.add_argument("--memory-sequences", type=int, default=8, help="sequences harvested for the GPT-2-small peak")
    parser.add_argument("--corpus-tokens", type=int, default=2**20)
    parser.add_argument("--corpus-batch", type=int, default=32)
    parser.add_argument("--quick", action="store_true", help="a smoke run: small counts, not a measurement")
    parser.add_argument("--phase", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.phase:
        kind, size, hook, batch, *rest = args.phase
        result = (
            phase_cache(size, hook, int(batch), args.device)
            if kind == "cache"
            else phase_harvest(size, hook, int(batch), int(rest[0]), rest[1], args.device)
        )
        print(json.dumps(result))
        return
    if args.quick:
        args.rounds, args.batch, args.batches, args.memory_sequences, args.corpus_tokens = 1, 1, 1, 4, 2**14

    torch.manual_seed(0)
    start = time.perf_counter()
    ratio = bench_ratio(args)
    memory = bench_memory("gpt2-small", HOOKS["middle"], args.batch, args.memory_sequences, "float32", args.device)
    n_corpus = -(-args.corpus_tokens // SEQ_LEN)
    corpus_run = bench_memory("small", CORPUS_HOOK, args.corpus_batch, n_corpus, "float16", args.device)
    payload = {
        "benchmark": "harvest",
        "device": args.device,
        "machine": machine(),
        "quick": args.quick,
        "ratio": ratio,
        "memory_gpt2_small": memory,
        "corpus": corpus_run,
        "target_throughput_vs_bridge": 2.0,
        "wall_s": time.perf_counter() - start,
        "note": "random weights and uniform random tokens (speed and memory do not depend on them); the "
        "machine's cores may be shared with other work, so times are indicative and ratios, "
        "measured interleaved in one process, are the figures to read",
    }
    path = None if args.quick else write(result_name("harvest", args.device), payload)
    _print_summary(ratio, memory, corpus_run, args.device)
    print(f"wrote {path}" if path else "quick run: nothing written")


def _print_summary(ratio: dict, memory: dict, corpus_run: dict, device: str) -> None:
    """The run's figures, one line per hook's throughput and one per memory phase."""
    for where, hook in HOOKS.items():
        print(
            f"GPT-2 small, {hook}: Forma harvest {ratio[f'forma_tokens_per_s_{where}']:.0f} tokens/s, bridge "
            f"run_with_cache {ratio[f'bridge_tokens_per_s_{where}']:.0f} tokens/s: "
            f"{ratio[f'throughput_vs_bridge_{where}']:.2f}× (target ≥ 2×); max |diff| "
            f"{ratio['max_abs_diff_vs_bridge'][where]:.1e} (rows centred)"
        )
    where = "gpu" if device.startswith("cuda") else "rss"
    for name, m in (("GPT-2 small", memory), ("corpus", corpus_run)):
        print(
            f"{name}: {m['tokens']:,} tokens of {m['hook']} at {m['tokens_per_s']:.0f} tokens/s, peak ({where}) "
            f"+{m[f'harvest_peak_{where}_mb']:.0f} MB against one batch's run_with_cache +"
            f"{m[f'one_batch_run_with_cache_peak_{where}_mb']:.0f} MB: {m['harvest_vs_one_batch']:.2f}× (target ≤ "
            "1.5×; "
            f"model {m['model_mb']:.0f} MB); RSS trace {m['rss_trace_mb']}"
        )


if __name__ == "__main__":
    main()
