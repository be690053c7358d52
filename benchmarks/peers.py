"""Forma against its peers on identical weights: forward, caching, generation, training, utilisation.

Every figure is a median of interleaved rounds, and every ratio is to a peer measured in the same
process on the same weights and inputs. Writes benchmarks/results/peers.json and
benchmarks/results/summary.md.

    forward          ours vs HF GPT-2 (sdpa, eager) at 4×256 and 8×512, batch 8 × 256 tokens
    run_with_cache   all hooks, and one layer's resid_post, vs TransformerBridge (compatibility mode);
                     bytes held by each cache
    generation       tokens/s, our KV cache vs HF generate (greedy; sampling with top_k=0), 256 new tokens
    training         one optimizer step vs HF GPT-2 on the same config and batch
    utilisation      the share of the forward that its own matrix products take, run alone in the same rounds
                     (`benchmarks.timing.MatrixProducts`: the same ops on operands of the same layouts)

Targets: forward ≤ 1.0× HF sdpa; run_with_cache(all) ≤ 0.7× the bridge; generation ≥ 1.0× HF;
training step ≤ 1.0× HF; forward utilisation ≥ 0.40 at 8×512 (at most 60% of the forward outside its products).
"""

import argparse
import copy
import tempfile
import time
from functools import partial
from typing import Any

import torch

from benchmarks.summary import write_summary
from benchmarks.timing import (
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

VOCAB = 8192
SIZES = {"4x256": (4, 256), "8x512": (8, 512)}


def gpt2(layers: int, d_model: int, n_ctx: int, attn: str, device: str):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        n_layer=layers,
        n_embd=d_model,
        n_head=d_model // 64,
        vocab_size=VOCAB,
        n_positions=n_ctx,
        bos_token_id=None,
        eos_token_id=None,
        attn_implementation=attn,
    )
    return GPT2LMHeadModel(cfg).eval().to(device)


def bench_forward(device: str, rounds: int, batch: int, tokens: int) -> dict:
    out = {}
    for name, (layers, d) in SIZES.items():
        hf_sdpa = gpt2(layers, d, 1024, "sdpa", device)
        hf_eager = gpt2(layers, d, 1024, "eager", device)
        hf_eager.load_state_dict(hf_sdpa.state_dict())
        ours = from_hf(hf_sdpa).to(device)
        x = torch.randint(0, VOCAB, (batch, tokens), device=device)
        with torch.inference_mode():
            diff = (ours(x) - hf_sdpa(x).logits).abs().max().item()
            products = MatrixProducts(partial(ours, x))  # the forward's own matrix products, run alone
            t = interleaved(
                {
                    "forma": timed(partial(ours, x), device),
                    "hf_sdpa": timed(partial(hf_sdpa, x), device),
                    "hf_eager": timed(partial(hf_eager, x), device),
                    "forma_products": timed(products, device),
                },
                rounds=rounds,
            )
        flops, alone = forward_flops(ours.cfg, batch, tokens), t["forma_products"]["median_s"]
        out[name] = {
            "timing": t,
            "max_abs_logit_diff": diff,
            "ratio_vs_hf_sdpa": t["forma"]["median_s"] / t["hf_sdpa"]["median_s"],
            "ratio_vs_hf_eager": t["forma"]["median_s"] / t["hf_eager"]["median_s"],
            "forward_flops": flops,
            "forma_flops_per_s": flops / t["forma"]["median_s"],
            "products": len(products.calls),
            "products_flops": products.flops,
            "products_flops_per_s": products.flops / alone,
            "utilisation": alone / t["forma"]["median_s"],
        }
    return out


def bench_cache(device: str, rounds: int, batch: int, tokens: int) -> dict:
    from transformer_lens.model_bridge import TransformerBridge

    layers, d = SIZES["4x256"]
    hf = gpt2(layers, d, 1024, "sdpa", "cpu")
    ours = from_hf(hf).to(device)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = to_hf_tokenizer(word_level([f"w{i}" for i in range(VOCAB - 4)]), tmp)
        bridge = TransformerBridge.boot_transformers(
            "gpt2", hf_model=copy.deepcopy(hf).to(device), tokenizer=tokenizer, device=device
        )
    bridge.enable_compatibility_mode()
    x = torch.randint(0, VOCAB, (batch, tokens), device=device)
    one = f"blocks.{layers - 1}.hook_resid_post"
    with torch.inference_mode():
        t = interleaved(
            {
                "forma_forward": timed(lambda: ours(x), device),
                "forma_cache_all": timed(lambda: ours.run_with_cache(x), device),
                "bridge_cache_all": timed(lambda: bridge.run_with_cache(x), device),
                "forma_cache_one": timed(lambda: ours.run_with_cache(x, names_filter=[one]), device),
                "bridge_cache_one": timed(lambda: bridge.run_with_cache(x, names_filter=[one]), device),
            },
            rounds=rounds,
        )
        _, ours_all = ours.run_with_cache(x)
        _, theirs_all = bridge.run_with_cache(x)
        bytes_ours, bytes_theirs = cache_bytes(ours_all), cache_bytes(theirs_all)
        del ours_all, theirs_all
    med = {k: v["median_s"] for k, v in t.items()}
    return {
        "timing": t,
        "cache_all_vs_bridge": med["forma_cache_all"] / med["bridge_cache_all"],
        "cache_one_vs_bridge": med["forma_cache_one"] / med["bridge_cache_one"],
        "cache_all_vs_own_forward": med["forma_cache_all"] / med["forma_forward"],
        "cache_all_bytes": {"forma": bytes_ours, "bridge": bytes_theirs},
    }


def bench_generation(device: str, rounds: int, new_tokens: int) -> dict:
    layers, d = SIZES["4x256"]
    hf = gpt2(layers, d, 1024, "sdpa", device)
    ours = from_hf(hf).to(device)
    prompt = torch.randint(0, VOCAB, (1, 16), device=device)
    mask = torch.ones_like(prompt)
    common = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, attention_mask=mask, pad_token_id=0)
    with torch.inference_mode():
        t = interleaved(
            {
                "forma_greedy": timed(lambda: generate(ours, prompt, new_tokens, temperature=0), device),
                "hf_greedy": timed(lambda: hf.generate(prompt, do_sample=False, **common), device),
                "forma_sample": timed(lambda: generate(ours, prompt, new_tokens, temperature=1.0, seed=0), device),
                "hf_sample": timed(lambda: hf.generate(prompt, do_sample=True, top_k=0, **common), device),
            },
            rounds=rounds,
            warmup=1,
        )
    tps = {k: new_tokens / v["median_s"] for k, v in t.items()}
    return {
        "new_tokens": new_tokens,
        "timing": t,
        "tokens_per_s": tps,
        "greedy_speed_vs_hf": tps["forma_greedy"] / tps["hf_greedy"],
        "sample_speed_vs_hf": tps["forma_sample"] / tps["hf_sample"],
    }


def bench_training(device: str, rounds: int, batch: int, tokens: int) -> dict:
    layers, d = SIZES["4x256"]
    hf = gpt2(layers, d, 1024, "sdpa", device)
    ours = from_hf(hf).to(device)
    x = torch.randint(0, VOCAB, (batch, tokens), device=device)
    t = interleaved({name: timed(fn, device) for name, fn in training_steps(ours, hf, x).items()}, rounds=rounds)
    return {"timing": t, "step_vs_hf": t["forma_step"]["median_s"] / t["hf_step"]["median_s"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--only", nargs="*", choices=["forward", "cache", "generation", "training"])
    args = parser.parse_args(argv)
    sections = set(args.only or ["forward", "cache", "generation", "training"])
    results: dict[str, Any] = {
        "device": args.device,
        "machine": machine(),
        "shape": {"batch": args.batch, "tokens": args.tokens, "rounds": args.rounds, "vocab": VOCAB},
    }
    start = time.perf_counter()
    if "forward" in sections:
        results["forward"] = bench_forward(args.device, args.rounds, args.batch, args.tokens)
    if "cache" in sections:
        results["run_with_cache"] = bench_cache(args.device, args.rounds, args.batch, args.tokens)
    if "generation" in sections:
        results["generation"] = bench_generation(args.device, max(5, args.rounds // 2), args.new_tokens)
    if "training" in sections:
        results["training"] = bench_training(args.device, args.rounds, args.batch, args.tokens)
    results["wall_s"] = time.perf_counter() - start
    path = write(result_name("peers", args.device), results)
    print(f"wrote {path}")
    if sections == {"forward", "cache", "generation", "training"}:
        print(write_summary(args.device.split(":")[0]).read_text())


if __name__ == "__main__":
    main()
