"""Forma on the zoo's real language model (smollm2: SmolLM2-135M-Instruct) against transformers and TransformerLens's
TransformerBridge on the same weights, all in one process.

The peers read the built folder themselves: transformers' `LlamaForCausalLM.from_pretrained` (local files only, no
remote code), once with sdpa attention and once with eager; the bridge boots over a third such model
(`TransformerBridge.boot_transformers`, compatibility mode without weight processing, as tests/real/test_smollm2.py
compares it). Forma's model is `lab.load.load_model` of the same folder. Every figure is a median of interleaved
rounds (`benchmarks.timing.interleaved`: a load that drifts hits all contenders alike), with the peak resident
memory of one call of each (`benchmarks.timing.PEAK_METHODS`):

    load             load_model(folder) vs from_pretrained (model alone, and model with its tokenizer, as Forma's
                     load includes the tokenizer)
    forward          1 × 128 and 8 × 256 tokens: Forma vs transformers sdpa and eager
    run_with_cache   every hook, 1 × 128 tokens: Forma vs the bridge; Forma's plain forward in the same rounds
    generate         64 new tokens, greedy, with the KV cache, from a text prompt: Forma's generate vs HF generate

Goals: forward ≤ 0.95× transformers sdpa; run_with_cache ≤ 0.8× the bridge; generate ≤ 1.0×
transformers' time; load ≤ 3 s. For each goal missed, "profile" says where the time goes (torch.profiler's top
ops, or cProfile's top functions for the load). Writes benchmarks/results/real_model.json after each section,
"complete": true at the end; the load average is recorded at the start and at the end (the machine is shared:
the ratios, measured in one process in the same rounds, are what count).

    python -m benchmarks.real_model [--model smollm2] [--rounds 3] [--warmup 1] [--quick]
"""

import argparse
import cProfile
import os
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.forward import op_profile
from benchmarks.summary import write_summary
from benchmarks.timing import PEAK_METHODS, cache_bytes, interleaved, machine, write

# Each goal an upper bound: on a time ratio (Forma's over the peer's), or on Forma's load in seconds (load_s). The
# forward's goal holds at each shape (the ratios forward_<batch>x<tokens>_vs_hf_sdpa).
GOALS = {"forward_vs_hf_sdpa": 0.95, "cache_all_vs_bridge": 0.8, "generate_vs_hf": 1.0, "load_s": 3.0}
FORWARD_SHAPES = ((1, 128), (8, 256))
CACHE_TOKENS = 128
NEW_TOKENS = 64
PROMPT = "The capital of France is Paris. The capital of Italy is"
# --quick: the same measurements at toy sizes (a tiny folder in the tests), to check the plumbing in seconds.
QUICK = {"forward_shapes": ((1, 8), (2, 16)), "cache_tokens": 8, "new_tokens": 4}


def hf_of(folder: Path, attention: str) -> Any:
    """transformers' own reading of the folder, with `attention` ("sdpa", "eager"), in eval mode."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        folder, local_files_only=True, trust_remote_code=False, attn_implementation=attention
    ).eval()


def hf_tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)


def bridge_of(folder: Path) -> Any:
    """TransformerBridge over its own transformers model of the folder (booting rewraps the modules it is given),
    in compatibility mode without weight processing: the same numbers at every hook as the model's own."""
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(
        "LlamaForCausalLM", hf_model=hf_of(folder, "sdpa"), tokenizer=hf_tokenizer(folder), device="cpu"
    )
    bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    return bridge.eval()


def ratio(timing: dict, ours: str, theirs: str) -> float:
    return timing[ours]["median_s"] / timing[theirs]["median_s"]


def peaks(timing: dict) -> dict[str, int | None]:
    return {name: row["peak_memory_bytes"] for name, row in timing.items()}


def bench_load(folder: Path, rounds: int, warmup: int) -> dict:
    """load_model against from_pretrained, each call a fresh model from the folder (the file in the page cache
    after the warm-up, as a second load finds it)."""
    from lab.load import load_model

    calls = {
        "forma_load_model": lambda: load_model(folder),
        "hf_from_pretrained": lambda: hf_of(folder, "sdpa"),
        "hf_from_pretrained_and_tokenizer": lambda: (hf_of(folder, "sdpa"), hf_tokenizer(folder)),
    }
    t = interleaved(calls, rounds=rounds, warmup=warmup, memory="cpu")
    return {
        "timing": t,
        "load_s": t["forma_load_model"]["median_s"],
        "ratio_vs_hf": ratio(t, "forma_load_model", "hf_from_pretrained"),
        "ratio_vs_hf_and_tokenizer": ratio(t, "forma_load_model", "hf_from_pretrained_and_tokenizer"),
        "peak_memory_bytes": peaks(t),
    }


def bench_forward(ours: Any, sdpa: Any, eager: Any, x: torch.Tensor, rounds: int, warmup: int) -> dict:
    with torch.inference_mode():
        diff = (ours(x) - sdpa(x).logits).abs().max().item()
        t = interleaved(
            {"forma": lambda: ours(x), "hf_sdpa": lambda: sdpa(x), "hf_eager": lambda: eager(x)},
            rounds=rounds,
            warmup=warmup,
            memory="cpu",
        )
    return {
        "batch": x.shape[0],
        "tokens": x.shape[1],
        "timing": t,
        "max_abs_logit_diff_vs_hf_sdpa": diff,
        "ratio_vs_hf_sdpa": ratio(t, "forma", "hf_sdpa"),
        "ratio_vs_hf_eager": ratio(t, "forma", "hf_eager"),
        "peak_memory_bytes": peaks(t),
    }


def bench_cache(ours: Any, bridge: Any, x: torch.Tensor, rounds: int, warmup: int) -> dict:
    held: dict[str, dict[str, int]] = {}  # what each full cache holds, read from the timed calls themselves

    def keep(name: str, cache: Any) -> None:
        held[name] = {"hooks": len(cache), "bytes": cache_bytes(cache)}

    calls = {
        "forma_cache_all": lambda: keep("forma", ours.run_with_cache(x)[1]),
        "bridge_cache_all": lambda: keep("bridge", bridge.run_with_cache(x)[1]),
        "forma_forward": lambda: ours(x),  # the floor: no cache can take less than the forward it is read from
    }
    with torch.inference_mode():
        t = interleaved(calls, rounds=rounds, warmup=warmup, memory="cpu")
    return {
        "batch": x.shape[0],
        "tokens": x.shape[1],
        "timing": t,
        "cache_all_vs_bridge": ratio(t, "forma_cache_all", "bridge_cache_all"),
        "forward_vs_bridge_cache_all": ratio(t, "forma_forward", "bridge_cache_all"),
        "cache_all_vs_own_forward": ratio(t, "forma_cache_all", "forma_forward"),
        "cache_all": held,
        "peak_memory_bytes": peaks(t),
    }


def generate_calls(ours: Any, hf: Any, prompt: torch.Tensor, n: int) -> dict[str, Callable[[], torch.Tensor]]:
    """Greedy decoding of exactly n new tokens with the KV cache, Forma's and transformers'."""
    from lab.model.decoding import generate

    common = dict(
        max_new_tokens=n,
        eos_token_id=None,  # no stop, and no EOS suppressed (min_new_tokens would change the argmax): n tokens each
        attention_mask=torch.ones_like(prompt),
        do_sample=False,
        use_cache=True,
        pad_token_id=0,
    )
    return {
        "forma_generate": lambda: generate(ours, prompt, n, temperature=0, use_kv_cache=True),
        "hf_generate": lambda: hf.generate(prompt, **common),
    }


def bench_generate(ours: Any, hf: Any, prompt: torch.Tensor, n: int, rounds: int, warmup: int) -> dict:
    calls = generate_calls(ours, hf, prompt, n)
    with torch.inference_mode():
        same = bool(torch.equal(calls["forma_generate"](), calls["hf_generate"]()))
        t = interleaved(calls, rounds=rounds, warmup=warmup, memory="cpu")
    return {
        "prompt_tokens": prompt.shape[1],
        "new_tokens": n,
        "timing": t,
        "tokens_per_s": {name: n / row["median_s"] for name, row in t.items()},
        "ratio_vs_hf": ratio(t, "forma_generate", "hf_generate"),
        "same_tokens_as_hf": same,
        "peak_memory_bytes": peaks(t),
    }


def python_profile(fn: Callable[[], object], top: int = 10) -> dict[str, Any]:
    """Where one call's time goes by Python function (cProfile): the `top` functions by cumulative seconds (what
    they and their callees take) and by their own seconds, and the call's total."""
    profiler = cProfile.Profile()
    profiler.runcall(fn)
    stats = pstats.Stats(profiler).stats  # {(file, line, name): (calls, primitive calls, own s, cumulative s, ...)}

    def named(column: int) -> dict[str, float]:
        rows = sorted(stats.items(), key=lambda kv: kv[1][column], reverse=True)[:top]
        return {f"{Path(file).name}:{line}({name})": round(v[column], 4) for (file, line, name), v in rows}

    return {"cumulative_s": named(3), "own_s": named(2), "total_s": max(v[3] for v in stats.values())}


def goal_of(name: str) -> str | None:
    """The goal a ratio is held to (a key of GOALS), if any."""
    if name.startswith("forward_") and name.endswith("_vs_hf_sdpa"):
        return "forward_vs_hf_sdpa"
    return name if name in GOALS else None


def ratios_of(out: dict[str, Any]) -> dict[str, float]:
    """Every ratio of the sections measured so far (a stopped run has some of them)."""
    ratios = {
        f"forward_{key}_vs_hf_{attention}": row[f"ratio_vs_hf_{attention}"]
        for key, row in out.get("forward", {}).items()
        for attention in ("sdpa", "eager")
    }
    if "run_with_cache" in out:
        ratios["cache_all_vs_bridge"] = out["run_with_cache"]["cache_all_vs_bridge"]
    if "generate" in out:
        ratios["generate_vs_hf"] = out["generate"]["ratio_vs_hf"]
    if "load" in out:
        ratios |= {"load_vs_hf": out["load"]["ratio_vs_hf"], "load_s": out["load"]["load_s"]}
    return ratios


def judge(out: dict[str, Any], calls: dict[str, dict[str, Callable[[], object]]]) -> None:
    """The ratios so far, each goal met or not, and a profile of each goal newly missed (`calls`: its contenders)."""
    out["ratios"] = ratios_of(out)
    out["meets_target"] = {name: out["ratios"][name] <= GOALS[goal_of(name)] for name in out["ratios"] if goal_of(name)}
    missed = [name for name, met in out["meets_target"].items() if not met and name not in out["profile"]]
    if missed:
        print(f"  profile of {', '.join(missed)}", flush=True)
        out["profile"] |= profiles(missed, calls)


def profiles(missed: list[str], calls: dict[str, dict[str, Callable[[], object]]]) -> dict[str, Any]:
    """For each missed goal, where the time goes: torch.profiler's top ops by own CPU time (ms per call) for Forma
    and its peer, or for the load, cProfile's top functions (Python: loading is mostly not torch ops)."""
    out: dict[str, Any] = {}
    for name in missed:
        if name == "load_s":
            out[name] = {"forma_load_model": python_profile(calls[name]["forma_load_model"])}
            continue
        with torch.inference_mode():
            out[name] = {
                "method": "torch.profiler, self CPU time of the top ops, ms per call",
                **{contender: op_profile(fn, calls=1) for contender, fn in calls[name].items()},
            }
        if name == "generate_vs_hf":
            with torch.inference_mode():
                out[name]["forma_generate_python"] = python_profile(calls[name]["forma_generate"])
    return out


def weight_layout(d_in: int, d_out: int, tokens: int, rounds: int = 50) -> dict[str, Any]:
    """The same product x·W [tokens, d_in] × [d_in, d_out] with W stored as TransformerLens lays it out ([d_in, d_out],
    Forma's W_in, W_Q, W_U) and as torch.nn.Linear does ([d_out, d_in], transposed in the product: transformers'):
    median ms of each, in this process. The forward's gap to transformers is this layout's, not extra work."""
    x, w = torch.randn(tokens, d_in), torch.randn(d_in, d_out)
    w_linear = w.T.contiguous()
    calls = {"in_out": lambda: x @ w, "out_in": lambda: torch.nn.functional.linear(x, w_linear)}
    with torch.inference_mode():
        t = interleaved(calls, rounds=rounds, warmup=5, memory=None)
    return {
        "shape": [tokens, d_in, d_out],
        "median_ms": {name: row["median_s"] * 1e3 for name, row in t.items()},
        "in_out_over_out_in": t["in_out"]["median_s"] / t["out_in"]["median_s"],
    }


def measure(folder: Path, sizes: dict[str, Any], rounds: int, warmup: int, out: dict[str, Any], save) -> None:
    """Every section into `out`, the longest last, each judged (and profiled where it misses its goal) and saved as
    soon as it is measured: a stopped run keeps what it measured."""
    from lab.load import load_model

    def done(section: str, calls: dict[str, dict[str, Callable[[], object]]]) -> None:
        judge(out, calls)
        save()
        print(f"  {section} done", flush=True)

    out["load"] = bench_load(folder, rounds, warmup)
    done("load", {"load_s": {"forma_load_model": lambda: load_model(folder)}})
    ours, sdpa, eager = load_model(folder), hf_of(folder, "sdpa"), hf_of(folder, "eager")
    ids = torch.Generator().manual_seed(1)
    inputs = {f"{b}x{t}": torch.randint(0, ours.cfg.d_vocab, (b, t), generator=ids) for b, t in sizes["forward_shapes"]}
    out["forward"] = {}

    def forward(key: str, x: torch.Tensor) -> None:
        out["forward"][key] = bench_forward(ours, sdpa, eager, x, rounds, warmup)
        done(f"forward {key}", {f"forward_{key}_vs_hf_sdpa": {"forma": lambda: ours(x), "hf_sdpa": lambda: sdpa(x)}})

    first, *rest = inputs.items()
    forward(*first)
    if "forward_1x128_vs_hf_sdpa" in out["profile"]:  # where the forward's time goes: the MLP's and W_U's products
        cfg, tokens = ours.cfg, first[1].shape[1]
        out["profile"]["weight_layout"] = {
            "mlp_in": weight_layout(cfg.d_model, cfg.d_mlp, tokens),
            "mlp_out": weight_layout(cfg.d_mlp, cfg.d_model, tokens),
        }
    bridge = bridge_of(folder)
    x = torch.randint(0, ours.cfg.d_vocab, (1, sizes["cache_tokens"]), generator=ids)
    out["run_with_cache"] = bench_cache(ours, bridge, x, rounds, warmup)
    cache_calls = {"forma": lambda: ours.run_with_cache(x), "bridge": lambda: bridge.run_with_cache(x)}
    done("run_with_cache", {"cache_all_vs_bridge": cache_calls})
    prompt = torch.tensor([hf_tokenizer(folder)(PROMPT, add_special_tokens=False).input_ids])
    out["generate"] = bench_generate(ours, sdpa, prompt, sizes["new_tokens"], rounds, warmup)
    done("generate", {"generate_vs_hf": generate_calls(ours, sdpa, prompt, sizes["new_tokens"])})
    for key, x_large in rest:  # the larger forward shapes last: the longest measurement
        forward(key, x_large)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="a zoo name or a Hugging Face LLaMA folder")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="toy sizes: checks the plumbing, measures nothing real")
    args = parser.parse_args(argv)
    from lab.folders import model_folder

    try:
        folder = model_folder(args.model)
    except (ValueError, FileNotFoundError) as err:
        print(f"benchmarks.real_model: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    sizes = (
        QUICK
        if args.quick
        else {"forward_shapes": FORWARD_SHAPES, "cache_tokens": CACHE_TOKENS, "new_tokens": NEW_TOKENS}
    )
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # its "Loading weights" bar on every from_pretrained, not ours
    start = time.perf_counter()
    torch.manual_seed(0)
    out: dict[str, Any] = {
        "benchmark": "real_model",
        "model": args.model,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "quick": args.quick,
        "complete": False,
        "goals": GOALS,
        "peak_memory_method": PEAK_METHODS["cpu"],
        "machine": machine(),
        "profile": {},
    }

    def save() -> Path:
        out["wall_s"] = time.perf_counter() - start
        out["load_average_at_end"] = list(os.getloadavg())
        return write("real_model", out)

    measure(folder, sizes, args.rounds, args.warmup, out, save)
    out["complete"] = True
    path = save()
    for name, value in out["ratios"].items():
        goal = goal_of(name)
        print(f"{name:32s} {value:7.3f}" + (f" (goal ≤ {GOALS[goal]})" if goal else ""))
    print(f"wrote {path} and {write_summary()}")


if __name__ == "__main__":
    main()
