"""What training the same bits at any thread count costs: one training step (forward, loss, backward, gradient
clip, AdamW) of each decoder-only zoo recipe at its own sizes, with the kernels Forma trains with against the
ones they replaced, interleaved in the same process (benchmarks.timing) at torch's default thread count.

    invariant  the token embedding as F.embedding (its CPU backward sums each row's gradients in token order) and
               LayerNorm's gain and bias applied outside the fused kernel when they take gradients (their
               gradients summed over rows by one reduction): the same bits at any thread count
    former     W_E[tokens] (its CPU backward adds rows atomically from several threads, in an order that varies
               run to run) and F.layer_norm with the gain and bias inside (its backward sums their gradients in
               one partial sum per thread: bits that depend on the thread count)

Models: each recipe's [model] table (markov, facts, pydoc) with its default build's vocabulary, at its [train]
batch_size × seq_len (random weights, random tokens: a step's time does not depend on them). Then how far apart
each form's weights land: the markov recipe's model trained 50 steps twice at the default thread count and once
at one thread (`divergence`). Writes benchmarks/results/determinism.json.

    python -m benchmarks.determinism [--rounds 11]
"""

import argparse
import json
import types

import torch
import torch.nn.functional as F

from benchmarks.timing import interleaved, machine, write
from lab import HookedTransformer, ModelConfig
from lab.model.norms import LayerNorm
from lab.train.config import TrainConfig
from lab.train.loop import make_optimizer, summed_loss

RECIPES = ("markov", "facts", "pydoc")


def recipe_model(name: str) -> tuple[ModelConfig, TrainConfig]:
    """The recipe's model, with the vocabulary its default build had (docs/measured/cards/NAME.json), and its
    training config."""
    from lab.measured import REPO
    from lab.zoo.recipes import load_recipe

    recipe = load_recipe(name)
    vocab = json.loads((REPO / "docs" / "measured" / "cards" / f"{name}.json").read_text())["d_vocab"]
    cfg = ModelConfig.from_dict(recipe["model"] | {"d_vocab": vocab})
    return cfg, TrainConfig.from_dict({"seq_len": cfg.n_ctx} | recipe["train"])


def former_kernels(model: HookedTransformer) -> HookedTransformer:
    """`model` with the token embedding and every LayerNorm running the kernels Forma trained with before."""
    embed = model.embed
    embed.forward = lambda tokens: embed.W_E[tokens]
    for module in model.modules():
        if isinstance(module, LayerNorm):
            module.forward = types.MethodType(
                lambda self, x: F.layer_norm(x, (x.shape[-1],), self.w, self.b, self.eps), module
            )
    return model


def step(model: HookedTransformer, train_cfg: TrainConfig, tokens: torch.Tensor):
    optimizer = make_optimizer(model.train(), train_cfg)

    def run() -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = summed_loss(model(tokens), tokens[:, 1:]) / tokens[:, 1:].numel()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train_cfg.grad_clip)
        optimizer.step()
        return loss.item()

    return run


def recipe_step(name: str, rounds: int) -> dict:
    cfg, train_cfg = recipe_model(name)
    tokens = torch.randint(
        0, cfg.d_vocab, (train_cfg.batch_size, train_cfg.seq_len), generator=torch.Generator().manual_seed(0)
    )
    invariant = HookedTransformer(cfg, seed=0)
    former = former_kernels(HookedTransformer(cfg, seed=0))
    with torch.no_grad():  # the same function: the first losses agree to float round-off
        first = (model(tokens).float().log_softmax(-1) for model in (invariant, former))
        assert torch.allclose(*first, atol=1e-5), f"{name}: the two forms compute different functions"
    timing = interleaved(
        {"invariant": step(invariant, train_cfg, tokens), "former": step(former, train_cfg, tokens)}, rounds=rounds
    )
    return {
        "d_model": cfg.d_model,
        "n_layers": cfg.n_layers,
        "d_vocab": cfg.d_vocab,
        "norm": cfg.norm,
        "batch": train_cfg.batch_size,
        "seq_len": train_cfg.seq_len,
        "step_s": {k: v["median_s"] for k, v in timing.items()},
        "invariant_over_former": timing["invariant"]["median_s"] / timing["former"]["median_s"],
        "timing": timing,
    }


def divergence(steps: int = 50) -> dict:
    """How far apart training's bits land with each form: the markov recipe's model trained `steps` steps on its
    own Markov chain, twice at the default thread count and once at one thread; the largest |Δ| of any weight
    between the two default-count runs, and between one thread and the default."""
    from lab.configs import torch_threads
    from lab.data.sources import MarkovSource
    from lab.train.batches import SequenceBatches
    from lab.train.loop import train

    cfg, train_cfg = recipe_model("markov")
    train_cfg = train_cfg.replace(steps=steps, warmup_steps=steps // 5, eval_interval=steps, eval_batches=1)
    source = MarkovSource(cfg.d_vocab, order=2, concentration=0.5, seed=0)
    data = SequenceBatches(
        torch.from_numpy(source.sample(steps * train_cfg.batch_size, train_cfg.seq_len, seed=1)),
        torch.from_numpy(source.sample(train_cfg.batch_size, train_cfg.seq_len, seed=2)),
    )
    default = torch.get_num_threads()

    def weights(form, threads: int) -> dict[str, torch.Tensor]:
        model = form(HookedTransformer(cfg, seed=0))
        with torch_threads(threads):
            train(model, train_cfg, data, progress=False)
        return {k: v.detach().clone() for k, v in model.state_dict().items()}

    def largest(a: dict, b: dict) -> float:
        return max((a[k] - b[k]).abs().max().item() for k in a)

    out = {"steps": steps, "default_threads": default}
    for name, form in (("invariant", lambda model: model), ("former", former_kernels)):
        first, again, one = weights(form, default), weights(form, default), weights(form, 1)
        out[name] = {"max_abs_diff_same_threads": largest(first, again), "max_abs_diff_one_thread": largest(first, one)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args(argv)
    results = {"machine": machine(), "recipes": {name: recipe_step(name, args.rounds) for name in RECIPES}}
    results["worst_invariant_over_former"] = max(r["invariant_over_former"] for r in results["recipes"].values())
    results["divergence"] = divergence()
    path = write("determinism", results)
    for name, r in results["recipes"].items():
        print(
            f"{name}: step {r['step_s']['invariant'] * 1e3:.1f} ms against {r['step_s']['former'] * 1e3:.1f} ms "
            f"({r['invariant_over_former']:.3f}×)"
        )
    d = results["divergence"]
    print(
        f"after {d['steps']} steps, largest |Δ| between two runs at {d['default_threads']} threads / against one "
        f"thread: invariant {d['invariant']['max_abs_diff_same_threads']:.2e} / "
        f"{d['invariant']['max_abs_diff_one_thread']:.2e}, former {d['former']['max_abs_diff_same_threads']:.2e} / "
        f"{d['former']['max_abs_diff_one_thread']:.2e}"
    )
    print(f"wrote {path}")
    from benchmarks.summary import write_summary

    write_summary()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
