"""Forward pass on identical weights: Forma vs Hugging Face GPT-2 (sdpa), and run_with_cache vs TransformerBridge.

CPU, 4 layers, d_model 256, batch 8 × 128 tokens, medians of interleaved rounds. Writes
benchmarks/results/forward.json. Targets: plain forward ≤ 1.0× HF; cache-all ≤ 0.7× the bridge;
cache-all ≤ 1.15× our own plain forward.
"""

import argparse
import tempfile

import torch

from benchmarks.summary import write_summary
from benchmarks.timing import interleaved, machine, write
from lab.data.tokenizers import to_hf_tokenizer, word_level
from lab.hf.convert import from_hf


def op_profile(fn, calls: int = 5, top: int = 8) -> dict[str, float]:
    """Where a call's time goes: the `top` aten ops by self CPU time, in ms per call (torch.profiler),
    and the total; what the ratios above are made of."""
    fn()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    table = {e.key: e.self_cpu_time_total / 1e3 / calls for e in events[:top]}
    return table | {"total": sum(e.self_cpu_time_total for e in events) / 1e3 / calls}


def _three_models(args: argparse.Namespace, vocab: int) -> tuple:
    """One random GPT-2 of the run's shape (sdpa attention), read three ways: by Hugging Face itself, by Forma
    (from_hf), and by TransformerLens's bridge in compatibility mode (on a copy of the same weights)."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import GPT2Config, GPT2LMHeadModel

    hf_cfg = GPT2Config(
        n_layer=args.layers,
        n_embd=args.d_model,
        n_head=args.d_model // 64,
        vocab_size=vocab,
        n_positions=max(256, args.tokens),
        bos_token_id=None,
        eos_token_id=None,
        attn_implementation="sdpa",
    )
    hf = GPT2LMHeadModel(hf_cfg).eval()
    ours = from_hf(hf)
    bridge_hf = GPT2LMHeadModel(hf_cfg).eval()
    bridge_hf.load_state_dict(hf.state_dict())
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = to_hf_tokenizer(word_level([f"w{i}" for i in range(vocab - 4)]), tmp)
        bridge = TransformerBridge.boot_transformers("gpt2", hf_model=bridge_hf, tokenizer=tokenizer, device="cpu")
    bridge.enable_compatibility_mode()
    return hf, ours, bridge


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()

    torch.manual_seed(0)
    vocab = 4096
    hf, ours, bridge = _three_models(args, vocab)
    tokens = torch.randint(0, vocab, (args.batch, args.tokens), generator=torch.Generator().manual_seed(1))

    with torch.inference_mode():
        max_diff = (ours(tokens) - hf(tokens).logits).abs().max().item()
        contenders = {
            "forma_forward": lambda: ours(tokens),
            "hf_sdpa_forward": lambda: hf(tokens),
            "forma_run_with_cache_all": lambda: ours.run_with_cache(tokens),
            "bridge_run_with_cache_all": lambda: bridge.run_with_cache(tokens),
        }
        timing = interleaved(contenders, rounds=args.rounds)
        profile = {
            name: op_profile(contenders[name])
            for name in ("forma_forward", "forma_run_with_cache_all", "hf_sdpa_forward", "bridge_run_with_cache_all")
        }
    med = {name: t["median_s"] for name, t in timing.items()}
    ratios = {
        "forward_vs_hf_sdpa": med["forma_forward"] / med["hf_sdpa_forward"],
        "cache_all_vs_bridge": med["forma_run_with_cache_all"] / med["bridge_run_with_cache_all"],
        "cache_all_vs_own_forward": med["forma_run_with_cache_all"] / med["forma_forward"],
    }
    targets = {"forward_vs_hf_sdpa": 1.0, "cache_all_vs_bridge": 0.7, "cache_all_vs_own_forward": 1.15}
    payload = {
        "benchmark": "forward",
        "shape": {
            "layers": args.layers,
            "d_model": args.d_model,
            "batch": args.batch,
            "tokens": args.tokens,
            "vocab": vocab,
        },
        "max_abs_logit_diff_vs_hf": max_diff,
        "timing": timing,
        "profile_ms_per_call": profile,
        "ratios": ratios,
        "targets": targets,
        "meets_target": {k: ratios[k] <= targets[k] for k in targets},
        "machine": machine(),
    }
    path = write("forward", payload)
    for name, value in ratios.items():
        print(f"{name:28s} {value:6.3f}× (target ≤ {targets[name]})")
    print(f"wrote {path} and {write_summary()}")


if __name__ == "__main__":
    main()
