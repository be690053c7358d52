"""Forma's tuned lens against the tuned-lens package's, on the same model and the same tokens: held-out KL and time.

The model is trained on a world with known truth (the scoreboard's order-2 Markov chain over 8 symbols; 4 layers,
d_model 64, 1,500 steps; seeded), exported with `lab.hf.convert.to_hf`. Both lenses are fitted on the same draw of
`--fit` sequences of 16 tokens and judged on an independent draw of `--held-out` sequences:

    forma     lab.analysis.tuned_lens.fit_tuned_lens: the residual streams cached once, each layer's translator by
              full-batch L-BFGS on KL(P_θ ‖ lens) + ½λ‖A‖²
    package   tuned-lens 0.2's TunedLens trained by its train loop's recipe (`train_package_lens`: SGD with Nesterov
              momentum, lr 1.0 × (1 − β), weight decay 1e-3, linear decay, gradient clipping, a fresh forward pass
              of the model each step; 250 steps of 32 sequences, the package's default step count)

For each layer, KL(P_θ ‖ lens) and KL(p ‖ lens) (p the chain's true law) on the held-out tokens with bootstrap 95%
intervals over sequences (lab.metrics.grades.lens_grades), and whether Forma's estimate lies at or below the upper
end of the package's interval. Times are medians of `--rounds` interleaved fits (benchmarks/timing.interleaved),
on one intra-op thread, each fit from scratch. Writes benchmarks/results/tuned_lens.json (--quick writes nothing).

    python -m benchmarks.tuned_lens [--quick] [--rounds 3] [--fit 256] [--held-out 256]
"""

import argparse
from typing import Any

import numpy as np
import torch

from benchmarks.summary import write_summary
from benchmarks.timing import interleaved, machine, write
from lab.analysis.lens import logit_lens
from lab.analysis.tuned_lens import fit_tuned_lens
from lab.configs import torch_threads
from lab.data.sources import MarkovSource
from lab.hf.convert import to_hf
from lab.metrics.grades import lens_grades
from lab.model.config import ModelConfig
from lab.model.transformer import HookedTransformer
from lab.train.batches import SequenceBatches
from lab.train.config import TrainConfig
from lab.train.loop import train

WORLD = {"vocab_size": 8, "order": 2, "concentration": 0.3, "seed": 0}  # experiments/scoreboard's Markov chain
LENGTH = 16


def train_package_lens(hf: Any, fit: torch.Tensor, steps: int, batch: int, layers: Any = None) -> Any:
    """tuned-lens's TunedLens trained as its train loop (tuned_lens/scripts/train_loop.py with ingredients.Optimizer's
    defaults) trains it: SGD with Nesterov momentum β = 0.9, lr 1.0 × (1 − β), weight decay 1e-3, linear decay to 0
    with no warm-up, gradients clipped at norm 1, the loss KL(final ‖ lens) of each layer, a fresh forward pass of
    the model each step. (ingredients.py itself does not import beside torchdata 0.11, which has no dataloader2, so
    the recipe is written out here; on the CPU, without its bfloat16 autocast.) `layers` trains only those layers'
    translators (the others stay at the package's zero initialisation), as `fit_tuned_lens(layers=)` fits them."""
    from transformers import get_linear_schedule_with_warmup
    from tuned_lens import model_surgery
    from tuned_lens.nn import TunedLens

    model_surgery._transformer_lens_available = False  # tuned-lens 0.2 beside TransformerLens 4 (docs/ecosystem.md)
    lens = TunedLens.from_model(hf, bias=True)
    optimizer = torch.optim.SGD(lens.parameters(), lr=1.0 * (1 - 0.9), momentum=0.9, nesterov=True, weight_decay=1e-3)
    scheduler = get_linear_schedule_with_warmup(optimizer, 0, steps)
    for step in range(steps):
        rows = torch.arange(step * batch, (step + 1) * batch) % len(fit)
        with torch.no_grad():
            out = hf(fit[rows], output_hidden_states=True)
            target = out.logits.log_softmax(-1)
        for layer, h in enumerate(out.hidden_states[:-1]):
            if layers is not None and layer not in layers:
                continue
            loss = (target.exp() * (target - lens(h, layer).log_softmax(-1))).sum(-1).mean()
            loss.backward()
        torch.nn.utils.clip_grad_norm_(lens.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    return lens


def trained_model(layers: int, steps: int) -> tuple[HookedTransformer, MarkovSource]:
    source = MarkovSource(**WORLD)
    cfg = ModelConfig(d_vocab=8, d_model=64, n_layers=layers, n_heads=4, n_ctx=LENGTH, mlp="gelu")
    model = HookedTransformer(cfg, seed=0)
    model.b_U.requires_grad_(False)  # no Hugging Face head has an unembedding bias
    data = SequenceBatches(
        torch.from_numpy(source.sample(steps * 32, LENGTH, seed=1)), torch.from_numpy(source.sample(64, LENGTH, seed=2))
    )
    train(
        model,
        TrainConfig(
            steps=steps,
            batch_size=32,
            seq_len=LENGTH,
            lr=3e-3,
            min_lr=3e-4,
            warmup_steps=100,
            eval_interval=steps,
            eval_batches=2,
            checkpoint_every_s=0.0,
        ),
        data,
        progress=False,
    )
    return model.eval(), source


def _kl(log_probs: np.ndarray, p: np.ndarray, valid: np.ndarray) -> list[list[float]]:
    """[KL(p ‖ lens), low, high] per layer, averaged over each sequence's valid positions."""
    return [
        [g.value.value, g.value.low, g.value.high]
        for g in (layer["kl_true"] for layer in lens_grades(log_probs, p, valid))
    ]


def measure(layers: int, steps: int, n_fit: int, n_held_out: int, rounds: int, package_steps: int) -> dict[str, Any]:
    model, source = trained_model(layers, steps)
    hf = to_hf(model)
    fit = torch.from_numpy(source.sample(n_fit, LENGTH, seed=3))
    held_out_np = source.sample(n_held_out, LENGTH, seed=4)
    held_out = torch.from_numpy(held_out_np)
    fitted: dict[str, Any] = {}

    def forma() -> None:
        fitted["forma"] = fit_tuned_lens(model, fit)

    def package() -> None:
        fitted["package"] = train_package_lens(hf, fit, package_steps, 32)

    timing = interleaved({"forma": forma, "package": package}, rounds=rounds, warmup=0)
    valid = np.arange(LENGTH) < LENGTH - 1
    p = source.conditionals(held_out_np)
    model_p = logit_lens(model, held_out)[-1].exp().double().numpy()
    with torch.no_grad():
        hidden = hf(held_out, output_hidden_states=True).hidden_states
        theirs = (
            torch.stack(
                [fitted["package"](hidden[l], l).log_softmax(-1) for l in range(layers)]
                + [logit_lens(model, held_out)[-1]]
            )
            .double()
            .numpy()
        )
    ours = fitted["forma"].log_probs(model, held_out).double().numpy()
    logit = logit_lens(model, held_out).double().numpy()
    out: dict[str, Any] = {}
    for name, log_probs in (("forma", ours), ("package", theirs), ("logit_lens", logit)):
        out[name] = {"kl_model": _kl(log_probs, model_p, valid), "kl_true": _kl(log_probs, p, valid)}
    within = [out["forma"]["kl_model"][l][0] <= out["package"]["kl_model"][l][2] for l in range(layers)]
    return {
        "model": {"world": {"kind": "markov", **WORLD}, "n_layers": layers, "d_model": 64, "train_steps": steps},
        "tokens": {"fit_sequences": n_fit, "held_out_sequences": n_held_out, "length": LENGTH},
        "package_recipe": {
            "steps": package_steps,
            "batch_sequences": 32,
            "optimizer": "SGD nesterov, lr 0.1, momentum 0.9, weight decay 1e-3, linear decay, clip 1.0",
        },
        "layers": [f"resid_pre {l}" for l in range(layers)] + ["output"],
        "kl": out,
        "timing": timing,
        "forma_faster_by": timing["package"]["median_s"] / timing["forma"]["median_s"],
        "forma_within_package_interval": within,
        "forma_within_every_interval": all(within),
        "forma_lbfgs_evaluations": fitted["forma"].evaluations,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 layers, 300 training steps, 64 sequences, 1 round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fit", type=int, default=256)
    parser.add_argument("--held-out", type=int, default=256)
    args = parser.parse_args(argv)
    layers, steps = (2, 300) if args.quick else (4, 1500)
    n_fit, n_held_out = (64, 64) if args.quick else (args.fit, args.held_out)
    rounds = 1 if args.quick else args.rounds
    with torch_threads(1):
        results = measure(layers, steps, n_fit, n_held_out, rounds, 250)
    results["machine"] = machine()
    where = "(--quick: not written)" if args.quick else f"→ {write('tuned_lens', results)}, {write_summary()}"
    print(
        f"forma {results['timing']['forma']['median_s']:.2f} s, package "
        f"{results['timing']['package']['median_s']:.2f} s "
        f"({results['forma_faster_by']:.1f}×); within the package's interval at every layer: "
        f"{results['forma_within_every_interval']} {where}"
    )


if __name__ == "__main__":
    main()
