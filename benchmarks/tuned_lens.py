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

--model smollm2: the same two fits on the zoo's smollm2 (SmolLM2-135M-Instruct, 30 layers, a vocabulary of 49,152),
whose next-token law is unknown, so both are judged against the model itself, as the scoreboard's real lenses are
(experiments.scoreboard.real_lenses): fitted on windows of the real corpus's training split (`forma corpus real`;
`lab.zoo.transcoders.corpus_windows`), judged on windows of its held-out documents by KL(P_θ ‖ lens) per layer, each
window's mean over its positions, with bootstrap 95% intervals over windows (`lens_readings`, `lens_grades_real`),
the logit lens and the training split's unigram law beside them. Forma fits each layer alone (`fit_tuned_lens(layers=
[l])`: every layer's term holds [tokens, 49,152] logits and their gradient, too much for all 30 at once), on all
but the last `forma_validation_windows` of the fit windows, and stops early on those (`fit_tuned_lens(validation=)`:
each layer keeps its iterate of lowest KL on them); the package trains every layer together by its recipe
(`train_package_lens`) on every fit window. The sizes are SMOLLM2 (SMOLLM2_QUICK for
--quick); each side is fitted once, on one intra-op thread, and timed. Writes
benchmarks/results/tuned_lens_smollm2.json.

    python -m benchmarks.tuned_lens [--quick] [--rounds 3] [--fit 256] [--held-out 256]
    python -m benchmarks.tuned_lens --model smollm2 [--corpus corpora/real] [--quick]
"""

import argparse
import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from benchmarks.summary import write_summary
from benchmarks.timing import interleaved, machine, write
from experiments.scoreboard.real_lenses import Move, layer_label, lens_grades_real, lens_readings, unigram_log_probs
from lab.analysis.lens import logit_lens
from lab.analysis.tuned_lens import TunedLens, fit_tuned_lens
from lab.configs import torch_threads
from lab.data.sources import MarkovSource
from lab.hf.convert import to_hf
from lab.load import load_model
from lab.metrics.discrimination import Metric
from lab.metrics.grades import Grade, lens_grades
from lab.model.config import ModelConfig
from lab.model.transformer import HookedTransformer
from lab.train.batches import SequenceBatches
from lab.train.config import TrainConfig
from lab.train.loop import train
from lab.zoo.transcoders import corpus_windows

WORLD = {"vocab_size": 8, "order": 2, "concentration": 0.3, "seed": 0}  # experiments/scoreboard's Markov chain
LENGTH = 16
REPO = Path(__file__).resolve().parents[1]


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


@dataclasses.dataclass(frozen=True)
class RealLensSizes:
    """What the smollm2 mode fits and judges on (tuned_lens_smollm2.json records the sizes it ran at)."""

    layers: tuple[int, ...]  # the layers fitted and read (blocks.l.hook_resid_pre); the output row is always read
    fit_windows: int  # training windows both lenses are fitted on
    held_out_windows: int  # held-out windows they are judged on
    length: int  # tokens a window
    forma_iterations: int  # L-BFGS iterations of each layer's fit (fit_tuned_lens's max_iter)
    package_steps: int  # steps of the package's recipe
    package_batch: int  # windows a step, cycling through the fit windows
    n_boot: int
    # of the fit windows, the last this many Forma does not fit on but stops early by (fit_tuned_lens's validation:
    # each layer keeps its iterate of lowest KL on them); 0: Forma fits on every fit window for forma_iterations
    forma_validation_windows: int = 0
    windows_per_pass: int = 4  # held-out windows read at once (each reading holds [windows, length, 49,152] floats)
    seed: int = 0


# Every 3rd layer and the last, not all 30: each layer's fit costs an unembedding of every fitting token per L-BFGS
# evaluation (the package's, per step), and the run is kept to tens of minutes on 2 shared cores. The package passes
# over the fitting windows as often as at the test's sizes (16 times); Forma's L-BFGS, still improving on its
# validation windows at 15 iterations, runs to 40, each layer kept at its best iterate on them.
SMOLLM2 = RealLensSizes(
    layers=(*range(0, 30, 3), 29),
    fit_windows=32,
    held_out_windows=32,
    length=16,
    forma_iterations=40,
    package_steps=128,
    package_batch=4,
    n_boot=1000,
    forma_validation_windows=8,
)
SMOLLM2_LAYERS = "every 3rd layer (0, 3, …, 27) and the last (29), to keep the run to tens of minutes"
# tests/real/test_scoreboard_real_lenses.py's comparison, on its slice of the corpus; --quick writes nothing
SMOLLM2_QUICK = RealLensSizes(
    layers=(20, 28),
    fit_windows=4,
    held_out_windows=4,
    length=16,
    forma_iterations=15,
    package_steps=24,
    package_batch=2,
    n_boot=300,
)


def package_move(lens: Any) -> Move:
    """The package's lens as a move of the residual stack [layer + 1, …, d_model] (experiments.scoreboard.real_lenses):
    row l < n_layers to x + translator_l(x), the output row as it is; read through the model's final norm and
    unembedding, it is the package's reading (tests/ecosystem/test_tuned_lens.py)."""

    def move(stack: Tensor) -> Tensor:
        n = len(stack) - 1
        return torch.stack([stack[l] + lens.layer_translators[l](stack[l]) for l in range(n)] + [stack[-1]])

    return move


def fit_each_layer(
    model: HookedTransformer, fit: Tensor, layers: Sequence[int], max_iter: int, validation: Tensor | None = None
) -> tuple[TunedLens, list[int]]:
    """Forma's tuned lens fitted one layer at a time (`fit_tuned_lens(layers=[l])`: the layers share no parameter,
    so each is its own term's minimiser, and one layer's logits at a time fit in memory), stopped early by
    `validation` where given, the translators put together, and each layer's L-BFGS evaluations."""
    n, d = model.cfg.n_layers, model.cfg.d_model
    A, b, train_kl, evaluations = torch.zeros(n, d, d), torch.zeros(n, d), [float("nan")] * n, []
    stopped = None if validation is None else [-1] * n
    for layer in layers:
        lens = fit_tuned_lens(model, fit, max_iter=max_iter, layers=[layer], validation=validation)
        A[layer], b[layer], train_kl[layer] = lens.A[layer], lens.b[layer], lens.train_kl_nats[layer]
        if stopped is not None:
            stopped[layer] = lens.stopped_at[layer]
        evaluations.append(lens.evaluations)
    return TunedLens(A, b, train_kl, sum(evaluations), stopped_at=stopped), evaluations


def compare_on_real(
    model: HookedTransformer, corpus: str | Path, sizes: RealLensSizes
) -> tuple[dict[str, dict[int, dict[str, Grade]]], dict[str, Any]]:
    """Forma's tuned lens and the package's fitted on the same training windows of the real `corpus`, graded on its
    held-out windows with the logit lens beside them: `lens_grades_real`'s {"forma" | "package" | "logit": {layer:
    grades}} (the layers of `sizes` and the output), and a record of the fits (seconds, Forma's evaluations)."""
    fit = corpus_windows(corpus, sizes.fit_windows, sizes.length, "train", seed=sizes.seed)
    held_out = corpus_windows(corpus, sizes.held_out_windows, sizes.length, "val", seed=sizes.seed)
    hf = to_hf(model)
    fitted: dict[str, Any] = {}

    mine = len(fit) - sizes.forma_validation_windows
    validation = fit[mine:] if sizes.forma_validation_windows else None

    def forma() -> None:
        fitted["forma"] = fit_each_layer(model, fit[:mine], sizes.layers, sizes.forma_iterations, validation)

    def package() -> None:
        fitted["package"] = train_package_lens(hf, fit, sizes.package_steps, sizes.package_batch, sizes.layers)

    timing = interleaved({"forma": forma, "package": package}, rounds=1, warmup=0)
    ours, evaluations = fitted["forma"]
    moves = {"forma": ours.translate, "package": package_move(fitted["package"]), "logit": lambda stack: stack}
    log_unigram = unigram_log_probs(corpus, model.cfg.d_vocab)
    readings = lens_readings(model, held_out, moves, sizes.layers, log_unigram, sizes.windows_per_pass)
    record = {
        "fit_seconds": {name: t["median_s"] for name, t in timing.items()},
        "forma_evaluations": dict(zip(sizes.layers, evaluations)),
        "forma_train_kl_nats": {layer: ours.train_kl_nats[layer] for layer in sizes.layers},
        "forma_stopped_at": {
            layer: None if ours.stopped_at is None else ours.stopped_at[layer] for layer in sizes.layers
        },
    }
    return lens_grades_real(readings, sizes.n_boot, sizes.seed), record


def _interval(metric: Metric) -> list[float]:
    return [metric.value, metric.low, metric.high]


def real_layers(graded: dict[str, dict[int, dict[str, Grade]]], fits: dict[str, Any], n_layers: int) -> list[dict]:
    """One row a layer read: [KL(P_θ ‖ lens), low, high] of Forma's, the package's and the logit lens, whether
    Forma's lies at or below the top of the package's interval, and Forma's fit of that layer."""
    rows = []
    for layer in graded["forma"]:
        kl = {name: _interval(graded[key][layer]["kl_model"].value) for name, key in LENSES}
        rows.append(
            {
                "layer": layer,
                "readout": layer_label(layer, n_layers),
                "kl_model_nats": kl,
                "forma_at_or_below_package_high": kl["forma"][0] <= kl["package"][2],
            }
            | (
                {}
                if layer == n_layers
                else {
                    "forma_evaluations": fits["forma_evaluations"][layer],
                    "forma_train_kl_nats": fits["forma_train_kl_nats"][layer],
                    "forma_stopped_at": fits["forma_stopped_at"][layer],
                }
            )
        )
    return rows


LENSES = (("forma", "forma"), ("package", "package"), ("logit_lens", "logit"))  # the file's name, the move's


def smollm2(corpus: Path, quick: bool) -> dict[str, Any]:
    """The smollm2 mode (the module's docstring): its record, written unless `quick`."""
    sizes = SMOLLM2_QUICK if quick else SMOLLM2
    start, load = time.perf_counter(), machine()["load_average_1_5_15"]
    with torch_threads(1):
        model = load_model("smollm2")
        graded, fits = compare_on_real(model, corpus, sizes)
    n_layers = model.cfg.n_layers
    rows = real_layers(graded, fits, n_layers)
    fitted = [row for row in rows if row["layer"] < n_layers]
    results = {
        "machine_at_start": {"load_average_1_5_15": load},
        "model": "smollm2 (SmolLM2-135M-Instruct): 30 layers, d_model 576, a vocabulary of 49,152",
        "corpus": f"{corpus.name}: training windows fitted on, held-out documents' windows judged on",
        "sizes": dataclasses.asdict(sizes),
        "layers_chosen": SMOLLM2_LAYERS if sizes == SMOLLM2 else "the quick sizes: the test's",
        "tokens": {"fit": sizes.fit_windows * sizes.length, "held_out": sizes.held_out_windows * sizes.length},
        "package_recipe": {
            "steps": sizes.package_steps,
            "batch_windows": sizes.package_batch,
            "optimizer": "SGD nesterov, lr 0.1, momentum 0.9, weight decay 1e-3, linear decay, clip 1.0",
        },
        "threads": 1,
        "layers": rows,
        "unigram_kl_model_nats": _interval(graded["forma"][n_layers]["kl_model"].control),
        "fit_seconds": fits["fit_seconds"],
        "forma_at_or_below_package_high_at_every_layer": all(r["forma_at_or_below_package_high"] for r in fitted),
        "seconds": time.perf_counter() - start,
        "machine": machine(),
    }
    where = "(--quick: not written)" if quick else f"→ {write('tuned_lens_smollm2', results)}, {write_summary()}"
    print(
        f"smollm2, {len(fitted)} layers: forma {fits['fit_seconds']['forma']:.0f} s, package "
        f"{fits['fit_seconds']['package']:.0f} s; Forma at or below the top of the package's interval at every "
        f"layer: {results['forma_at_or_below_package_high_at_every_layer']} {where}"
    )
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("markov", "smollm2"), default="markov", help="the toy model or smollm2")
    parser.add_argument("--corpus", type=Path, default=REPO / "corpora" / "real", help="smollm2's real corpus")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="markov: 2 layers, 300 training steps, 64 sequences, 1 round; smollm2: SMOLLM2_QUICK (writes nothing)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fit", type=int, default=256)
    parser.add_argument("--held-out", type=int, default=256)
    args = parser.parse_args(argv)
    if args.model == "smollm2":
        if not (args.corpus / "manifest.json").is_file():
            parser.error(f"{args.corpus} holds no real corpus (manifest.json): run `forma corpus real --out DIR`")
        smollm2(args.corpus, args.quick)
        return
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
