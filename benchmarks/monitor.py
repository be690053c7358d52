"""Tokens per second of generation with the monitor on against plain generation, in the same process.

Target: monitored generation ≥ 0.8× the tokens/s of plain KV-cached generation. Two workloads, each timed
interleaved (benchmarks.timing: plain and monitored alternate, so drift in the machine's load hits both alike):

    facts    the monitor experiment's own shape: its default model config (d_model 128, 4 layers) on 512 prompts
             "<bos> First Last birthday" of 4 tokens, 2 new tokens each — the trained model of the newest monitor
             run when there is one (speed does not depend on the weights)
    pydoc    models/pydoc's config, 8 prompts of 16 tokens, 96 new tokens each: the per-token cost on a longer
             generation

Monitored = every token signal (max_prob, entropy, margin, lens_kl, subject_attention over the upper half, a probe
on the middle layer) and P(IK), the readouts random (their cost does not depend on their weights). Greedy decoding,
one thread. Writes benchmarks/results/monitor.json.

    python -m benchmarks.monitor [--rounds 11]
"""

import argparse

import torch

from benchmarks.timing import interleaved, machine, write
from lab import HookedTransformer, ModelConfig
from lab.analysis.monitor import LinearReadout, Monitor
from lab.model.decoding import decode


def facts_model() -> tuple[HookedTransformer, str]:
    from experiments.monitor import Config
    from lab.runs import latest_run

    folder = latest_run("monitor")
    if folder is not None and (folder / "model").is_dir():
        return HookedTransformer.load(folder / "model"), f"the model of {folder}"
    cfg = Config()
    model_cfg = ModelConfig(d_vocab=400, d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads, n_ctx=8)
    return HookedTransformer(model_cfg, seed=0).eval(), "untrained model of the monitor experiment's default config"


def pydoc_model() -> tuple[HookedTransformer, str]:
    from lab.zoo.recipes import load_recipe

    recipe = load_recipe("pydoc")
    cfg = ModelConfig.from_dict(recipe["model"] | {"d_vocab": recipe["world"]["vocab_size"], "tokenizer": "pydoc"})
    return HookedTransformer(cfg, seed=0).eval(), "untrained model with models/pydoc's config"


def readouts(model: HookedTransformer) -> tuple[LinearReadout, LinearReadout]:
    g = torch.Generator().manual_seed(0)
    d, last = model.cfg.d_model, model.cfg.n_layers - 1
    middle = max(0, model.cfg.n_layers // 2 - 1)
    return (
        LinearReadout(f"blocks.{middle}.hook_resid_post", torch.randn(d, generator=g) / d, 0.0),
        LinearReadout(f"blocks.{last}.hook_resid_post", torch.randn(d, generator=g) / d, 0.0, position=2),
    )


def workload(model: HookedTransformer, batch: int, prompt_len: int, new: int, rounds: int) -> dict:
    prompts = torch.randint(0, model.cfg.d_vocab, (batch, prompt_len), generator=torch.Generator().manual_seed(1))
    probe, p_ik = readouts(model)
    monitor = Monitor(model, probe=probe, p_ik=p_ik)
    subject = [1, 2]
    plain_tokens = decode(model, prompts, new, temperature=0).tokens
    assert torch.equal(plain_tokens, monitor.generate(prompts, new, subject=subject).tokens), (
        "the monitor changed tokens"
    )
    timing = interleaved(
        {
            "plain": lambda: decode(model, prompts, new, temperature=0),
            "monitored": lambda: monitor.generate(prompts, new, subject=subject),
        },
        rounds=rounds,
    )
    tokens = batch * new
    plain, monitored = (tokens / timing[k]["median_s"] for k in ("plain", "monitored"))
    return {
        "batch": batch,
        "prompt_tokens": prompt_len,
        "new_tokens": new,
        "signals": list(monitor.token_signals) + ["p_ik"],
        "plain_tokens_per_s": plain,
        "monitored_tokens_per_s": monitored,
        "monitored_over_plain": monitored / plain,
        "target_ratio": 0.8,
        "meets_target": monitored / plain >= 0.8,
        "timing": timing,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = {"machine": machine()}
    with torch.inference_mode():
        for name, (load, shape) in {"facts": (facts_model, (512, 4, 2)), "pydoc": (pydoc_model, (8, 16, 96))}.items():
            model, source = load()
            results[name] = {"model": source, **workload(model, *shape, rounds=args.rounds)}
            print(
                f"{name}: plain {results[name]['plain_tokens_per_s']:.0f} tokens/s, monitored "
                f"{results[name]['monitored_tokens_per_s']:.0f} tokens/s, ratio "
                f"{results[name]['monitored_over_plain']:.2f}"
            )
    print(f"wrote {write('monitor', results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
