"""Patching sweeps and attribution patching at GPT-2-small shapes, against TransformerLens on the same weights.

    sweeps        Forma's sweeps (lab.analysis.patching: patch_positions for resid_pre, attn_out, mlp_out;
                  patch_heads) against TransformerLens 4's get_act_patch_resid_pre, get_act_patch_attn_out,
                  get_act_patch_mlp_out and get_act_patch_attn_head_out_all_pos, each run twice: on a
                  TransformerBridge over the same weights (compatibility mode, no weight processing: the same
                  numbers at every hook) and on Forma's own model. With --heads-by-position also
                  patch_heads_by_position against get_act_patch_attn_head_out_by_pos (layers × positions × heads
                  passes for TransformerLens).
    values        the largest |Forma − TransformerLens| of every sweep, on each.
    attribution   attribution_patch (every sweep at once, lab.analysis.attribution) against the patching
                  sweeps it estimates (resid_pre, attn_out, mlp_out, resid_post, heads; heads by position with
                  --heads-by-position), and its agreement with each: Pearson r of the effects (value − corrupted)
                  over the cells, and the overlap of the k cells of largest |effect|.
    zoo           the same agreement on every trained decoder-only zoo model (models/NAME, or $FORMA_ZOO_DIR),
                  on one random prompt from its vocabulary corrupted at a quarter of its length.

GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257), random weights (seed 0), converted with
lab.hf.convert.from_hf; one prompt of 32 random tokens, the corrupted prompt differing at position 8; the metric is
the logit difference, at the last position, between the clean and the corrupted run's top tokens. Every
figure is a median of interleaved rounds (one by default: a sweep is itself hundreds of forward passes for
TransformerLens, 1,296 of GPT-2 small in one round; the run's wall time and the load at its start are in
the file it writes, `wall_s` and `machine`). Targets: every sweep ≤ 0.2× TransformerLens's on the bridge and on Forma;
values equal to
≤ 1e-5. Writes benchmarks/results/patching.json (patching_<device>.json off the CPU: --device cuda puts
both models, the prompts and the zoo models on the GPU, and every timed call ends with a device sync).

    python -m benchmarks.patching [--quick] [--rounds 1] [--layers 12] [--tokens 32] [--heads-by-position] \
        [--device cpu]
    python -m benchmarks.patching --zoo-only     # the zoo's agreement again (after building the zoo), into that file

--quick: 4 layers and 12 tokens (GPT-2-small widths and vocabulary kept): a smoke run.
"""

import argparse
import copy
import json
import tempfile
import time
from functools import partial
from typing import Any

import torch

from benchmarks.timing import RESULTS, interleaved, machine, result_name, timed, write
from lab.analysis.attribution import attribution_patch
from lab.analysis.patching import logit_diff, patch_heads, patch_heads_by_position, patch_positions
from lab.data.tokenizers import to_hf_tokenizer, word_level
from lab.folders import CARD_FILE, zoo_dir
from lab.hf.convert import from_hf

VOCAB = 50257
TOP_K = 10


def models(layers: int, device: str = "cpu") -> tuple[Any, Any]:
    """Forma's model and the TransformerBridge on one set of random GPT-2-small-shaped weights, on `device`."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        n_layer=layers, n_embd=768, n_head=12, vocab_size=VOCAB, n_positions=1024, bos_token_id=None, eos_token_id=None
    )
    hf = GPT2LMHeadModel(cfg).eval()
    ours = from_hf(hf).eval().to(device)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = to_hf_tokenizer(word_level([f"w{i}" for i in range(VOCAB - 4)]), tmp)
        bridge = TransformerBridge.boot_transformers(
            "gpt2", hf_model=copy.deepcopy(hf).to(device), tokenizer=tokenizer, device=device
        )
    bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    return ours, bridge.eval()


def prompts(vocab: int, tokens: int, corrupt_at: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(0, vocab, (1, tokens), generator=g)
    corrupted = clean.clone()
    corrupted[0, corrupt_at] = (clean[0, corrupt_at] + 1 + torch.randint(0, vocab - 1, (1,), generator=g)) % vocab
    return clean, corrupted


def top_tokens_metric(model: Any, clean: torch.Tensor, corrupted: torch.Tensor):
    """logit(clean run's top token) − logit(corrupted run's top token, or the clean run's second) at the end."""
    with torch.inference_mode():
        a = model(clean)[0, -1].topk(2).indices
        b = int(model(corrupted)[0, -1].argmax())
    wrong = b if b != int(a[0]) else int(a[1])
    return logit_diff(int(a[0]), wrong)


def agreement(estimate: torch.Tensor, truth: torch.Tensor, corrupted: float, k: int = TOP_K) -> dict:
    """Pearson r of the effects (value − corrupted) over the cells, and the share of the truth's k cells of
    largest |effect| that are among the estimate's k."""
    a, b = (estimate - corrupted).flatten().double(), (truth - corrupted).flatten().double()
    k = min(k, a.numel())
    top = lambda x: set(x.abs().topk(k).indices.tolist())  # noqa: E731
    return {
        "pearson_r": float(torch.corrcoef(torch.stack([a, b]))[0, 1]),
        "top_k": k,
        "top_k_overlap": len(top(a) & top(b)) / k,
        "cells": a.numel(),
    }


# Each sweep: Forma's, and TransformerLens's function for it (its output laid out as Forma's).
FORMA_SWEEPS = {
    "resid_pre": lambda m, clean, corrupted, metric: patch_positions(m, clean, corrupted, "resid_pre", metric).values,
    "attn_out": lambda m, clean, corrupted, metric: patch_positions(m, clean, corrupted, "attn_out", metric).values,
    "mlp_out": lambda m, clean, corrupted, metric: patch_positions(m, clean, corrupted, "mlp_out", metric).values,
    "heads": lambda m, clean, corrupted, metric: patch_heads(m, clean, corrupted, metric).values,
    "heads_by_position": lambda m, clean, corrupted, metric: (
        patch_heads_by_position(m, clean, corrupted, metric).values
    ),
}
TL_SWEEPS = {
    "resid_pre": ("get_act_patch_resid_pre", False),
    "attn_out": ("get_act_patch_attn_out", False),
    "mlp_out": ("get_act_patch_mlp_out", False),
    "heads": ("get_act_patch_attn_head_out_all_pos", False),
    # TransformerLens's is [layer, pos, head]; Forma's [layer, head, pos]
    "heads_by_position": ("get_act_patch_attn_head_out_by_pos", True),
}


def bench_sweeps(
    ours: Any,
    bridge: Any,
    clean: torch.Tensor,
    corrupted: torch.Tensor,
    metric,
    rounds: int,
    heads_by_position: bool,
    device: str = "cpu",
) -> dict:
    """Each sweep of Forma's against TransformerLens's function for it, run on the bridge (tl_bridge) and on
    Forma's own model (tl_forma), all three interleaved; the values compared with each."""
    import transformer_lens.patching as tl

    peers = {"tl_bridge": bridge, "tl_forma": ours}
    with torch.inference_mode():
        caches = {peer: model.run_with_cache(clean)[1] for peer, model in peers.items()}
    names = [name for name in FORMA_SWEEPS if heads_by_position or name != "heads_by_position"]
    out = {}
    for name in names:
        values: dict[str, torch.Tensor] = {}
        function, transposed = TL_SWEEPS[name]

        def theirs(peer: str, values: dict = values, function: str = function, transposed: bool = transposed) -> None:
            result = getattr(tl, function)(peers[peer], corrupted, caches[peer], metric)
            values[peer] = result.transpose(1, 2) if transposed else result

        def forma(values: dict = values, name: str = name) -> None:
            values["forma"] = FORMA_SWEEPS[name](ours, clean, corrupted, metric)

        calls = {"forma": forma, **{peer: partial(theirs, peer) for peer in peers}}
        t = interleaved({key: timed(fn, device) for key, fn in calls.items()}, rounds=rounds, warmup=0)
        diff = {peer: float((values["forma"].cpu() - values[peer].cpu()).abs().max()) for peer in peers}
        out[name] = {
            "timing": t,
            "ratio_vs_tl_bridge": t["forma"]["median_s"] / t["tl_bridge"]["median_s"],
            "ratio_vs_tl_forma": t["forma"]["median_s"] / t["tl_forma"]["median_s"],
            "max_abs_diff": diff["tl_bridge"],
            "max_abs_diff_vs_tl_forma": diff["tl_forma"],
            "cells": values["forma"].numel(),
        }
        print(
            f"{name}: {out[name]['ratio_vs_tl_bridge']:.3f}× TransformerLens on the bridge, "
            f"{out[name]['ratio_vs_tl_forma']:.3f}× TransformerLens on Forma, max |diff| "
            f"{max(diff.values()):.1e}",
            flush=True,
        )
    return out


def bench_attribution(
    ours: Any,
    clean: torch.Tensor,
    corrupted: torch.Tensor,
    metric,
    rounds: int,
    heads_by_position: bool,
    device: str = "cpu",
) -> dict:
    truth: dict[str, Any] = {}

    def sweeps() -> None:
        for component in ("resid_pre", "attn_out", "mlp_out", "resid_post"):
            truth[component] = patch_positions(ours, clean, corrupted, component, metric)
        truth["heads"] = patch_heads(ours, clean, corrupted, metric)
        if heads_by_position:
            truth["heads_by_position"] = patch_heads_by_position(ours, clean, corrupted, metric)

    estimate: dict[str, Any] = {}
    t = interleaved(
        {
            "attribution": timed(lambda: estimate.update(attribution_patch(ours, clean, corrupted, metric)), device),
            "sweeps": timed(sweeps, device),
        },
        rounds=rounds,
        warmup=0,
    )
    return {
        "timing": t,
        "ratio_vs_sweeps": t["attribution"]["median_s"] / t["sweeps"]["median_s"],
        "swept": sorted(truth),
        "agreement": {
            name: agreement(estimate[name].values, truth[name].values, truth[name].corrupted) for name in truth
        },
    }


def zoo_agreement(tokens: int, device: str = "cpu") -> dict:
    """Attribution against the exhaustive sweeps on every trained zoo model, one prompt from its vocabulary."""
    from lab import HookedTransformer
    from lab.folders import is_trained, zoo_names
    from lab.zoo.recipes import load_recipe

    out = {}
    for name in zoo_names():
        # an encoder-decoder (dates) has no decoder-only sweep
        if not is_trained(name) or load_recipe(name)["model"].get("kind", "decoder_only") != "decoder_only":
            continue
        model = HookedTransformer.from_pretrained(name).eval().to(device)
        n = min(tokens, model.cfg.n_ctx)
        clean, corrupted = (p.to(device) for p in prompts(model.cfg.d_vocab, n, n // 4))
        metric = top_tokens_metric(model, clean, corrupted)
        estimate = attribution_patch(model, clean, corrupted, metric)
        truth = {
            c: patch_positions(model, clean, corrupted, c, metric)
            for c in ("resid_pre", "attn_out", "mlp_out", "resid_post")
        }
        truth["heads"] = patch_heads(model, clean, corrupted, metric)
        truth["heads_by_position"] = patch_heads_by_position(model, clean, corrupted, metric)
        card = zoo_dir() / name / CARD_FILE
        quick = json.loads(card.read_text()).get("quick") if card.is_file() else None  # the recipe's small profile?
        out[name] = {
            "tokens": n,
            "quick_build": quick,
            "agreement": {s: agreement(estimate[s].values, truth[s].values, truth[s].corrupted) for s in truth},
        }
    return out


def _add_zoo_agreement(parser: argparse.ArgumentParser, device: str) -> None:
    """--zoo-only: measure the zoo agreement into the results file a full run wrote, its other figures kept."""
    path = RESULTS / f"{result_name('patching', device)}.json"
    if not path.is_file():
        parser.error(f"--zoo-only adds to the results of a full run, and there is none at {path}")
    results = json.loads(path.read_text())
    results["zoo"] = zoo_agreement(results["shape"]["tokens"], device)
    results["zoo_measured_utc"] = machine()["utc"]
    print(
        f"zoo: {', '.join(results['zoo']) or 'no trained decoder-only zoo model'}; wrote "
        f"{write(result_name('patching', device), results)}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="where both models run (default cpu; e.g. cuda)")
    parser.add_argument("--quick", action="store_true", help="4 layers, 12 tokens")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--tokens", type=int, default=None)
    parser.add_argument("--heads-by-position", action="store_true")
    parser.add_argument(
        "--zoo-only",
        action="store_true",
        help="measure the zoo agreement only, into the results file a full run wrote (its other "
        "figures are kept); the zoo is models/ or $FORMA_ZOO_DIR",
    )
    args = parser.parse_args(argv)
    if args.zoo_only:
        _add_zoo_agreement(parser, args.device)
        return
    layers = args.layers or (4 if args.quick else 12)
    tokens = args.tokens or (12 if args.quick else 32)
    rounds = args.rounds
    corrupt_at = min(8, tokens // 4)
    start = time.perf_counter()
    ours, bridge = models(layers, args.device)
    clean, corrupted = (p.to(args.device) for p in prompts(VOCAB, tokens, corrupt_at))
    metric = top_tokens_metric(ours, clean, corrupted)
    results: dict[str, Any] = {
        "device": args.device,
        "machine": machine(),
        "shape": {
            "layers": layers,
            "d_model": 768,
            "n_heads": 12,
            "vocab": VOCAB,
            "tokens": tokens,
            "corrupted_position": corrupt_at,
            "rounds": rounds,
            "quick": args.quick,
        },
        "targets": {"ratio_vs_tl_bridge": 0.2, "ratio_vs_tl_forma": 0.2, "max_abs_diff": 1e-5},
        "sweeps": bench_sweeps(ours, bridge, clean, corrupted, metric, rounds, args.heads_by_position, args.device),
    }
    del bridge
    results["attribution"] = bench_attribution(
        ours, clean, corrupted, metric, rounds, args.heads_by_position, args.device
    )
    print(
        f"attribution: {results['attribution']['ratio_vs_sweeps']:.4f}× the sweeps; r = "
        + ", ".join(f"{k} {v['pearson_r']:.3f}" for k, v in results["attribution"]["agreement"].items()),
        flush=True,
    )
    results["zoo"] = zoo_agreement(tokens, args.device)
    results["wall_s"] = time.perf_counter() - start
    print(f"wrote {write(result_name('patching', args.device), results)}")


if __name__ == "__main__":
    main()
