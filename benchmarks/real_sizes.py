"""Forma at the sizes people use, against Hugging Face and the TransformerBridge on identical weights.

Two shapes, random weights from a transformers config, converted with `lab.hf.convert.from_hf`:

    gpt2_small   GPT2Config: 12 layers, d_model 768, 12 heads, vocab 50,257, n_ctx 1024; batch 2 × 512
    llama_like   LlamaConfig: d_model 2048, 32 query heads / 8 key-value heads (GQA), SwiGLU (d_mlp 5632),
                 RMSNorm, rotary, vocab 32,000, 2 layers (fewer than a real one, so it fits the time); batch 2 × 512

Measured at each shape, every figure a median of interleaved rounds against its peer in the same process:

    forward          Forma vs HF (sdpa)
    run_with_cache   every hook, and one (the last block's resid_post), vs TransformerBridge (compatibility mode,
                     as benchmarks/peers.py builds it); bytes held by each cache; and Forma's plain forward in the
                     same rounds, the floor below which no cache can go
    generation       KV-cached greedy decoding, tokens/s, vs HF generate (same prompt, same number of new tokens)
    training         one AdamW step (forward, backward, step) vs HF, dropout off in both
    utilisation      the limit: Forma's forward's own matrix products (`benchmarks.timing.MatrixProducts`: the same
                     ops on operands of the same layouts), run alone in the same rounds; their time against Forma's
                     forward (the share of it they take) and against HF's; the forward's FLOP/s
    peak memory      of one call of each of the above, per contender (`benchmarks.timing.PEAK_METHODS`)

Targets: forward ≤ 0.9× HF sdpa; run_with_cache(all) ≤ 0.7× the bridge; generation ≥ 1.2× HF.
Writes benchmarks/results/real_sizes.json (real_sizes_<device>.json off the CPU) after each measurement,
"complete": true once every shape is done.

    python -m benchmarks.real_sizes [--quick] [--rounds 3] [--warmup 1] [--shapes gpt2_small llama_like] [--device cpu]
"""

import argparse
import copy
import dataclasses
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.timing import (
    PEAK_METHODS,
    MatrixProducts,
    cache_bytes,
    forward_flops,
    interleaved,
    machine,
    result_name,
    timed,
    training_steps,
    write,
)
from lab.data.tokenizers import to_hf_tokenizer, word_level
from lab.hf.convert import from_hf
from lab.model.decoding import generate

TARGETS = {"forward_vs_hf_sdpa": ("≤", 0.9), "cache_all_vs_bridge": ("≤", 0.7), "generation_speed_vs_hf": ("≥", 1.2)}


@dataclass(frozen=True)
class Shape:
    """One model shape and the batch it is measured on."""

    family: str  # "gpt2" or "llama"
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_mlp: int
    d_vocab: int
    n_ctx: int
    batch: int
    tokens: int
    prompt: int = 32  # generation: a batch of one prompt of this many tokens
    new_tokens: int = 32

    def __post_init__(self):
        if self.family not in ("gpt2", "llama"):
            raise ValueError(f"family must be 'gpt2' or 'llama', got {self.family!r}")
        if self.d_model % self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"d_model {self.d_model} must split into n_heads {self.n_heads}, and n_heads into "
                f"n_kv_heads {self.n_kv_heads}"
            )
        if max(self.tokens, self.prompt + self.new_tokens) > self.n_ctx:
            raise ValueError(f"tokens {self.tokens} (or prompt + new_tokens) exceed n_ctx {self.n_ctx}")


SHAPES = {
    "gpt2_small": Shape("gpt2", 12, 768, 12, 12, 3072, 50257, 1024, 2, 512),
    "llama_like": Shape("llama", 2, 2048, 32, 8, 5632, 32000, 2048, 2, 512),
}
# --quick: the same two families at toy sizes, to check that everything runs (seconds, not minutes).
QUICK = {
    "gpt2_small": Shape("gpt2", 2, 128, 4, 4, 512, 1000, 128, 2, 64, prompt=8, new_tokens=8),
    "llama_like": Shape("llama", 2, 128, 8, 2, 352, 1000, 128, 2, 64, prompt=8, new_tokens=8),
}


def hf_model(shape: Shape, device: str) -> Any:
    """The HF causal LM of `shape` with random weights (seed 0), sdpa attention, dropout off, eval mode."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if shape.family == "gpt2":
        cfg = GPT2Config(
            n_layer=shape.n_layers,
            n_embd=shape.d_model,
            n_head=shape.n_heads,
            n_inner=shape.d_mlp,
            vocab_size=shape.d_vocab,
            n_positions=shape.n_ctx,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=None,
            eos_token_id=None,
            attn_implementation="sdpa",
        )
        return GPT2LMHeadModel(cfg).eval().to(device)
    cfg = LlamaConfig(
        num_hidden_layers=shape.n_layers,
        hidden_size=shape.d_model,
        num_attention_heads=shape.n_heads,
        num_key_value_heads=shape.n_kv_heads,
        intermediate_size=shape.d_mlp,
        vocab_size=shape.d_vocab,
        max_position_embeddings=shape.n_ctx,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(cfg).eval().to(device)


def bridge_of(hf: Any, shape: Shape, device: str) -> Any:
    """TransformerBridge in compatibility mode over a copy of `hf` (booting rewraps the HF modules in place)."""
    from transformer_lens.model_bridge import TransformerBridge

    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = to_hf_tokenizer(word_level([f"w{i}" for i in range(shape.d_vocab - 4)]), tmp)
        bridge = TransformerBridge.boot_transformers(
            type(hf).__name__, hf_model=copy.deepcopy(hf), tokenizer=tokenizer, device=device
        )
    bridge.enable_compatibility_mode()
    return bridge


def ratio(timing: dict, ours: str, theirs: str) -> float:
    return timing[ours]["median_s"] / timing[theirs]["median_s"]


def peaks(timing: dict) -> dict[str, int | None]:
    return {name: row["peak_memory_bytes"] for name, row in timing.items()}


def bench_forward(ours: Any, hf: Any, x: torch.Tensor, device: str, rounds: int, warmup: int) -> dict:
    with torch.inference_mode():
        diff = (ours(x) - hf(x).logits).abs().max().item()
        products = MatrixProducts(lambda: ours(x))  # the floor: Forma's forward's own matrix products, run alone
        t = interleaved(
            {
                "forma": timed(lambda: ours(x), device),
                "hf_sdpa": timed(lambda: hf(x), device),
                "forma_products": timed(products, device),
            },
            rounds=rounds,
            warmup=warmup,
            memory=device,
        )
    flops, alone = forward_flops(ours.cfg, *x.shape), t["forma_products"]["median_s"]
    return {
        "timing": t,
        "max_abs_logit_diff": diff,
        "ratio_vs_hf_sdpa": ratio(t, "forma", "hf_sdpa"),
        "peak_memory_bytes": peaks(t),
        "forward_flops": flops,
        "forma_flops_per_s": flops / t["forma"]["median_s"],
        "hf_flops_per_s": flops / t["hf_sdpa"]["median_s"],
        "products": len(products.calls),
        "products_flops": products.flops,
        "products_flops_per_s": products.flops / alone,
        "products_vs_hf_sdpa": ratio(t, "forma_products", "hf_sdpa"),
        "utilisation": alone / t["forma"]["median_s"],
        "hf_utilisation": alone / t["hf_sdpa"]["median_s"],
    }


def bench_cache(ours: Any, bridge: Any, x: torch.Tensor, device: str, rounds: int, warmup: int) -> dict:
    one = f"blocks.{ours.cfg.n_layers - 1}.hook_resid_post"
    held: dict[str, int] = {}  # bytes of each full cache, read from the timed calls themselves (no extra run)
    calls = {
        "forma_cache_all": lambda: held.__setitem__("forma", cache_bytes(ours.run_with_cache(x)[1])),
        "bridge_cache_all": lambda: held.__setitem__("bridge", cache_bytes(bridge.run_with_cache(x)[1])),
        "forma_cache_one": lambda: ours.run_with_cache(x, names_filter=[one]),
        "bridge_cache_one": lambda: bridge.run_with_cache(x, names_filter=[one]),
        "forma_forward": lambda: ours(x),  # the floor: no cache can take less than the forward it is read from
    }
    with torch.inference_mode():
        t = interleaved(
            {name: timed(fn, device) for name, fn in calls.items()}, rounds=rounds, warmup=warmup, memory=device
        )
    return {
        "timing": t,
        "hook": one,
        "cache_all_vs_bridge": ratio(t, "forma_cache_all", "bridge_cache_all"),
        "cache_one_vs_bridge": ratio(t, "forma_cache_one", "bridge_cache_one"),
        "peak_memory_bytes": peaks(t),
        "forward_vs_bridge_cache_all": ratio(t, "forma_forward", "bridge_cache_all"),
        "cache_all_bytes": held,
    }


def bench_generation(ours: Any, hf: Any, shape: Shape, device: str, rounds: int, warmup: int) -> dict:
    prompt = torch.randint(0, shape.d_vocab, (1, shape.prompt), generator=torch.Generator().manual_seed(2)).to(device)
    n = shape.new_tokens
    common = dict(
        max_new_tokens=n, min_new_tokens=n, attention_mask=torch.ones_like(prompt), pad_token_id=0, do_sample=False
    )
    calls = {
        "forma_greedy": lambda: generate(ours, prompt, n, temperature=0),
        "hf_greedy": lambda: hf.generate(prompt, **common),
    }
    with torch.inference_mode():
        same = bool(torch.equal(calls["forma_greedy"]().cpu(), calls["hf_greedy"]().cpu()))
        t = interleaved(
            {name: timed(fn, device) for name, fn in calls.items()}, rounds=rounds, warmup=warmup, memory=device
        )
    tps = {name: n / row["median_s"] for name, row in t.items()}
    return {
        "prompt_tokens": shape.prompt,
        "new_tokens": n,
        "timing": t,
        "tokens_per_s": tps,
        "speed_vs_hf": tps["forma_greedy"] / tps["hf_greedy"],
        "same_tokens_as_hf": same,
        "peak_memory_bytes": peaks(t),
    }


def bench_training(ours: Any, hf: Any, x: torch.Tensor, device: str, rounds: int, warmup: int) -> dict:
    calls = training_steps(ours, hf, x)
    # the first step allocates AdamW's moments (2 × the weights): always one warm-up step before the clock
    t = interleaved(
        {name: timed(fn, device) for name, fn in calls.items()}, rounds=rounds, warmup=max(warmup, 1), memory=device
    )
    ours.eval()
    hf.eval()
    return {"timing": t, "step_vs_hf": ratio(t, "forma_step", "hf_step"), "peak_memory_bytes": peaks(t)}


def bench_shape(
    shape: Shape, device: str, rounds: int, warmup: int, out: dict[str, Any], save: Callable[[], object]
) -> None:
    """Every measurement at `shape`, into `out`, calling `save` after each (a stopped run keeps what it measured)."""
    start = time.perf_counter()
    hf = hf_model(shape, device)
    ours = from_hf(hf).to(device)  # before the bridge: booting rewraps the HF module tree it is given
    x = torch.randint(0, shape.d_vocab, (shape.batch, shape.tokens), generator=torch.Generator().manual_seed(1)).to(
        device
    )
    out |= {"shape": dataclasses.asdict(shape), "n_params": sum(p.numel() for p in ours.parameters())}
    sections = (
        ("forward", lambda: bench_forward(ours, hf, x, device, rounds, warmup)),
        ("run_with_cache", lambda: bench_cache(ours, bridge_of(hf, shape, device), x, device, rounds, warmup)),
        ("generation", lambda: bench_generation(ours, hf, shape, device, rounds, warmup)),
        ("training", lambda: bench_training(ours, hf, x, device, rounds, warmup)),
    )
    for section, measure in sections:
        print(f"  {section}", flush=True)
        out[section] = measure()
        out["wall_s"] = time.perf_counter() - start
        save()
    out["ratios"] = {
        "forward_vs_hf_sdpa": out["forward"]["ratio_vs_hf_sdpa"],
        "cache_all_vs_bridge": out["run_with_cache"]["cache_all_vs_bridge"],
        "cache_one_vs_bridge": out["run_with_cache"]["cache_one_vs_bridge"],
        "generation_speed_vs_hf": out["generation"]["speed_vs_hf"],
        "training_step_vs_hf": out["training"]["step_vs_hf"],
        "forward_utilisation": out["forward"]["utilisation"],
    }
    out["meets_target"] = {
        k: (out["ratios"][k] <= v) if op == "≤" else (out["ratios"][k] >= v) for k, (op, v) in TARGETS.items()
    }
    save()


# (measure, section, Forma's timing key, the peer's, the peer, the section's ratio, the target's key)
ROWS = (
    ("forward", "forward", "forma", "hf_sdpa", "HF sdpa", "ratio_vs_hf_sdpa", "forward_vs_hf_sdpa"),
    (
        "forward's floor: its matrix products alone",
        "forward",
        "forma_products",
        "hf_sdpa",
        "HF sdpa",
        "products_vs_hf_sdpa",
        None,
    ),
    (
        "run_with_cache(all)",
        "run_with_cache",
        "forma_cache_all",
        "bridge_cache_all",
        "bridge",
        "cache_all_vs_bridge",
        "cache_all_vs_bridge",
    ),
    (
        "run_with_cache(all)'s floor: Forma's forward, nothing cached",
        "run_with_cache",
        "forma_forward",
        "bridge_cache_all",
        "bridge cache(all)",
        "forward_vs_bridge_cache_all",
        None,
    ),
    (
        "run_with_cache(one)",
        "run_with_cache",
        "forma_cache_one",
        "bridge_cache_one",
        "bridge",
        "cache_one_vs_bridge",
        None,
    ),
    (
        "generation (tokens/s)",
        "generation",
        "forma_greedy",
        "hf_greedy",
        "HF generate",
        "speed_vs_hf",
        "generation_speed_vs_hf",
    ),
    ("training step", "training", "forma_step", "hf_step", "HF", "step_vs_hf", None),
)


def summary_lines(results: dict[str, Any]) -> list[str]:
    """The summary's "real sizes" section from real_sizes.json: per shape and measure, Forma's figure, the peer's,
    their ratio and the target, and the peak memory of each; the forward's floor, its matrix products alone. A
    run stopped part-way shows what it measured, and says so."""
    m = results["machine"]
    lines = [
        "## Real sizes (benchmarks/real_sizes.py)",
        "",
        f"{m['utc']} · torch {m['torch']} · {m['threads']} threads · load average "
        f"{m['load_average_1_5_15'][0]:.2f} at the start, {results['load_average_at_end'][0]:.2f} at the end · "
        f"medians of {results['rounds']} interleaved rounds after {results['warmup']} warm-up"
        + ("" if results["complete"] else " · stopped part-way: what it measured"),
        "",
        "| shape | measure | Forma | peer | ratio | target | peak MB Forma / peer |",
        "|---|---|---|---|---|---|---|",
    ]
    if results.get("runs"):  # shapes measured in runs of their own, merged: each with its own start and load
        lines[2:2] = [
            results["runs"]
            + ": "
            + "; ".join(
                f"{name} {shape['machine']['utc']}, load {shape['machine']['load_average_1_5_15'][0]:.2f} at its start"
                for name, shape in results["shapes"].items()
                if "machine" in shape
            ),
            "",
        ]
    for name, shape in results["shapes"].items():
        lines += _table_rows(name, shape)
    for name, shape in results["shapes"].items():
        lines += _floor_notes(name, shape)
    lines += ["", f"Peak memory: {results['peak_memory_method']}."]
    return lines


def _table_rows(name: str, shape: dict[str, Any]) -> list[str]:
    """One shape's rows of the table: each measure it has (Forma, the peer, ratio, target, peak memory), then the
    share of its forward spent in the matrix products."""
    lines = []
    for measure, section, ours, theirs, peer, ratio_key, target_key in ROWS:
        if section not in shape:
            continue
        part = shape[section]
        if section == "generation":
            a, b = (f"{part['tokens_per_s'][k]:.1f}" for k in (ours, theirs))
        else:
            a, b = (f"{part['timing'][k]['median_s']:.3f} s" for k in (ours, theirs))
        target = " ".join((TARGETS[target_key][0], f"{TARGETS[target_key][1]}×")) if target_key else "—"
        memory = part["peak_memory_bytes"]
        mb = " / ".join("—" if memory[k] is None else f"{memory[k] / 2**20:.0f}" for k in (ours, theirs))
        lines.append(f"| {name} | {measure} | {a} | {b} ({peer}) | {part[ratio_key]:.3f}× | {target} | {mb} |")
    if "forward" in shape:
        f = shape["forward"]
        measure = "share of the forward in its matrix products"
        if max(f["utilisation"], f["hf_utilisation"]) > 1:  # the products alone read while the machine was slower
            lines.append(
                f"| {name} | {measure} | not shown: the products alone were measured slower than the "
                f"whole forward (a noisy reading) | — | — | — | — |"
            )
        else:
            lines.append(
                f"| {name} | {measure} | {f['utilisation']:.2f} of Forma's | {f['hf_utilisation']:.2f} "
                f"of HF sdpa's | — | — | — |"
            )
    return lines


def _floor_notes(name: str, shape: dict[str, Any]) -> list[str]:
    """What one shape's floors say under the table: the forward's matrix products alone against HF's forward, and
    a run_with_cache(all) target that Forma's bare forward already misses."""
    lines = []
    if "forward" in shape:
        f, (op, target) = shape["forward"], TARGETS["forward_vs_hf_sdpa"]
        lines += [
            "",
            f"{name}: the forward's {f['products']} matrix products, run alone on operands laid out as "
            f"the forward's own, take {f['timing']['forma_products']['median_s']:.3f} s "
            f"({f['products_flops_per_s'] / 1e9:.1f} GFLOP/s): {f['products_vs_hf_sdpa']:.3f}× HF's "
            f"forward, the lowest ratio a forward made of them can reach"
            + (
                f"; above the forward target ({op} {target}×): no forward made of these products meets "
                f"it in these rounds."
                if f["products_vs_hf_sdpa"] > target
                else "."
            ),
        ]
    floor = shape.get("run_with_cache", {}).get("forward_vs_bridge_cache_all")
    op, target = TARGETS["cache_all_vs_bridge"]
    if floor is not None and floor > target:
        lines += [
            "",
            f"{name}: the run_with_cache(all) target ({op} {target}×) cannot be met on this machine: "
            f"Forma's forward alone, caching nothing, takes {floor:.3f}× the bridge's "
            f"run_with_cache(all) in the same rounds, and a cache is read from a forward.",
        ]
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=3, help="timed interleaved rounds (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default 1)")
    parser.add_argument("--shapes", nargs="*", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--quick", action="store_true", help="toy sizes of both families: a check that it runs")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.warmup < 0:
        parser.error(f"--rounds must be at least 1 and --warmup at least 0, got {args.rounds} and {args.warmup}")
    table = QUICK if args.quick else SHAPES
    results: dict[str, Any] = {
        "benchmark": "real_sizes",
        "device": args.device,
        "machine": machine(),
        "quick": args.quick,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "targets": TARGETS,
        "peak_memory_method": PEAK_METHODS["cuda" if args.device.startswith("cuda") else "cpu"],
        "complete": False,
        "shapes": {},
    }
    name = result_name("real_sizes", args.device)
    start = time.perf_counter()

    def save() -> Path:
        results["wall_s"], results["load_average_at_end"] = time.perf_counter() - start, list(os.getloadavg())
        return write(name, results)

    for shape in args.shapes:
        print(f"[{shape}]", flush=True)
        bench_shape(table[shape], args.device, args.rounds, args.warmup, results["shapes"].setdefault(shape, {}), save)
    results["complete"] = True
    path = save()
    print("\n".join(summary_lines(results)))
    print(f"wrote {path} in {results['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
