"""The scoreboard's lenses and head detectors on a real pretrained model (smollm2), whose next-token law is unknown.

Without the world's law the lenses are graded against the model itself, on windows of the real corpus's held-out
documents (`lab.zoo.transcoders.corpus_windows(corpus, n, length, split="val")`), each window a prompt:

    kl_model     KL(P_θ ‖ P^(l)) per layer, each window's mean over its positions, with a bootstrap 95% interval
                 over windows; beside it (a "beaten" control) the KL of a prompt-blind law, the training split's
                 unigram distribution (add-one): a lens reads something of the prompt where its interval lies wholly
                 below the unigram's
    prompt_gain  KL(P_θ ‖ P^(l)_other) − KL(P_θ ‖ P^(l)), the other reading another window's stream at the same
                 position (the windows of each pass rolled by one): chance 0. The check a wrong lens fails: a lens
                 blind to the prompt gains exactly 0, one emitting random logits gains nothing (its interval holds
                 0); a lens that reads the model's stream gains (its interval above 0).

The lenses (lab.analysis): the logit lens; the tuned lens (Belrose et al. 2023) fitted on windows of the training
split (`fit_tuned_lens` on the sizes' layers only: on a vocabulary of 49,152 every layer's term costs an
unembedding of every position); the Jacobian lens (Gurnee et al. 2026, the reference's estimator, summed over later
positions), whose exact fit replicates each window d_model = 576 times (one backward pass per output dimension), so
it is fitted on a handful of short training windows, and left out of the quick sizes (`jacobian_windows = 0`).
The output row (the model itself) reads KL 0 for every lens.

Head detectors (lab.analysis.heads) on repeated random tokens, <|endoftext|> x_1 … x_L x_1 … x_L (Olsson et al.
2022, §2), against single-head ablation: with 30 × 9 heads, Shapley values over sets of heads (as the toy track's
`grade_head_detectors` computes them) would take 2^270 runs, so each head is mean-ablated alone (its z replaced by
its mean over the sequences and positions, from its layer on) and its effect is the increase of the loss on the
second copy, where induction predicts every token. One path serves both kinds: an induction head writes the copy;
a previous-token head works through later heads' keys, so its effect is the same loss increase through every
later layer (its total effect). Grades per kind:

    spearman_<kind>  Spearman ρ across heads between the detector's score and the ablation effect, bootstrap over
                     sequences; control: the same ρ for random head scores (seeded), chance 0
    auroc_<kind>     P(a flagged head's effect > an unflagged one's), flagged = score ≥ FLAGGED (none: the top
                     head); control: as many heads flagged at random, chance ½

`lens_rows` and `head_rows` return rows of the scoreboard's table (experiments.scoreboard.per_world.row) with the
world `WORLD`; their sizes are experiments.scoreboard.config's RealSizes (REAL_LENSES_QUICK and
REAL_LENSES_DEFAULT, the real track's two profiles').
"""

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from experiments.scoreboard.config import RealSizes
from experiments.scoreboard.per_world import row
from lab.analysis.grading import FLAGGED
from lab.analysis.heads import HEAD_KINDS, pattern_scores, repeated_tokens
from lab.analysis.jacobian_lens import fit_jacobian_lens
from lab.analysis.lens import read_out, residual_stack
from lab.analysis.tuned_lens import fit_tuned_lens
from lab.data.real_corpus import read_split
from lab.metrics.discrimination import bootstrap_ci
from lab.metrics.grades import Grade, mean_over_prompts
from lab.metrics.statistics import spearman
from lab.model.transformer import HookedTransformer
from lab.zoo.transcoders import corpus_windows

WORLD = "smollm2 (real corpus, held-out documents)"  # the table's world of every row here
UNIGRAM = "the training split's unigram law (add-one), blind to the prompt"
RANDOM_SCORES = "random head scores (seeded)"
RANDOM_FLAGS = "as many heads flagged at random"
SEPARATOR = 0  # <|endoftext|>, smollm2's document separator, before each repeated random sequence
FIRST_ORDINARY = 100  # random tokens are drawn from ids ≥ this (below it: special tokens and single bytes)


def layer_label(layer: int, n_layers: int) -> str:
    """The table's readout of a lens's row: "resid_pre l", or "output" for the model's own."""
    return "output" if layer == n_layers else f"resid_pre {layer}"


def unigram_log_probs(corpus: str | Path, d_vocab: int) -> Tensor:
    """log u: the training split's token frequencies with one added to every count (no token has probability 0)."""
    counts = np.bincount(np.asarray(read_split(corpus, "train")), minlength=d_vocab)[:d_vocab].astype(np.float64) + 1
    return torch.from_numpy(np.log(counts / counts.sum())).float()


Move = Callable[[Tensor], Tensor]  # a lens's map of the residual stack [layer + 1, …, d_model] before the readout


@torch.inference_mode()
def lens_readings(
    model: HookedTransformer,
    windows: Tensor,
    moves: dict[str, Move],
    layers: Sequence[int],
    log_unigram: Tensor,
    windows_per_pass: int = 4,
) -> dict[str, Any]:
    """Per window (its mean over positions): {lens: {layer: {"kl_model", "kl_other"}}} with KL(P_θ ‖ P^(l)) and
    KL(P_θ ‖ another window's P^(l)) (the windows of each pass rolled by one), and "unigram": KL(P_θ ‖ u). Each
    layer is read alone, so no [layer, …, vocab] tensor is ever held."""
    rows = [*layers, model.cfg.n_layers]
    out: dict[str, Any] = {name: {layer: {"kl_model": [], "kl_other": []} for layer in rows} for name in moves}
    out["unigram"] = []
    for start in range(0, len(windows), windows_per_pass):
        chunk = windows[start : start + windows_per_pass]
        stack = residual_stack(model, chunk)
        final = read_out(model, stack[-1]).log_softmax(-1)
        p = final.exp()

        def kl(log_q: Tensor, p: Tensor = p, final: Tensor = final) -> list[float]:
            return (p * (final - log_q)).sum(-1).mean(-1).tolist()

        out["unigram"] += kl(log_unigram)
        for name, move in moves.items():
            moved = move(stack)
            for layer in rows:
                log_q = read_out(model, moved[layer]).log_softmax(-1)
                out[name][layer]["kl_model"] += kl(log_q)
                out[name][layer]["kl_other"] += kl(log_q.roll(1, dims=0))
    return out


def lens_grades_real(readings: dict[str, Any], n_boot: int, seed: int) -> dict[str, dict[int, dict[str, Grade]]]:
    """{lens: {layer: {"kl_model", "prompt_gain"}}} from `lens_readings`: kl_model against the unigram law (a
    "beaten" control), prompt_gain against chance 0 (the module's docstring)."""
    boot = {"n_boot": n_boot, "seed": seed}
    unigram = mean_over_prompts(readings["unigram"], **boot)
    out: dict[str, dict[int, dict[str, Grade]]] = {}
    for name, by_layer in readings.items():
        if name == "unigram":
            continue
        out[name] = {}
        for layer, values in by_layer.items():
            own, other = np.asarray(values["kl_model"]), np.asarray(values["kl_other"])
            out[name][layer] = {
                "kl_model": Grade(
                    "kl_model",
                    mean_over_prompts(own, **boot),
                    unigram,
                    unigram.value,
                    "lower",
                    len(own),
                    control_kind="beaten",
                    control_means=UNIGRAM,
                ),
                "prompt_gain": Grade(
                    "prompt_gain", mean_over_prompts(other - own, **boot), None, 0.0, "higher", len(own)
                ),
            }
    return out


def fitted_lenses(model: HookedTransformer, corpus: str | Path, sizes: RealSizes) -> tuple[dict[str, Move], dict]:
    """The lenses' moves (logit: none; tuned: fitted on training windows; Jacobian: where the sizes fit it) and a
    record of their fits (windows, evaluations, training KL, seconds)."""
    moves: dict[str, Move] = {"logit": lambda stack: stack}
    record: dict[str, Any] = {}
    clock = time.perf_counter()
    fit = corpus_windows(corpus, sizes.fit_windows, sizes.length, "train", seed=sizes.seed)
    tuned = fit_tuned_lens(model, fit, max_iter=sizes.tuned_iterations, layers=sizes.layers)
    moves["tuned"] = tuned.translate
    record["tuned"] = {
        "fit_windows": sizes.fit_windows,
        "evaluations": tuned.evaluations,
        "train_kl_nats": {str(layer): tuned.train_kl_nats[layer] for layer in sizes.layers},
        "seconds": time.perf_counter() - clock,
    }
    if sizes.jacobian_windows:
        clock = time.perf_counter()
        fit = corpus_windows(corpus, sizes.jacobian_windows, sizes.jacobian_length, "train", seed=sizes.seed + 1)
        jacobian = fit_jacobian_lens(model, fit, prompts_per_pass=1)
        moves["jacobian"] = jacobian.transport
        record["jacobian"] = {"fit_windows": sizes.jacobian_windows, "seconds": time.perf_counter() - clock}
    return moves, record


def lens_rows(model: HookedTransformer, corpus: str | Path, profile: RealSizes) -> list[dict[str, Any]]:
    """The scoreboard's rows of the logit, tuned and Jacobian lenses on `model` (smollm2) over the real `corpus`
    (`forma corpus real`'s folder): fitted on its training split, graded on its held-out documents, every layer of
    `profile.layers` and the output (the module's docstring)."""
    rows, _ = lens_part(model, corpus, profile)
    return rows


def lens_part(
    model: HookedTransformer, corpus: str | Path, sizes: RealSizes
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """`lens_rows`'s rows and a record: the fits, the per-layer values, the seconds."""
    moves, record = fitted_lenses(model, corpus, sizes)
    clock = time.perf_counter()
    held_out = corpus_windows(corpus, sizes.eval_windows, sizes.length, "val", seed=sizes.seed)
    log_unigram = unigram_log_probs(corpus, model.cfg.d_vocab)
    readings = lens_readings(model, held_out, moves, sizes.layers, log_unigram, sizes.windows_per_pass)
    graded = lens_grades_real(readings, sizes.n_boot, sizes.seed)
    record["grading_seconds"] = time.perf_counter() - clock
    rows = [
        row(f"{name} lens", WORLD, layer_label(layer, model.cfg.n_layers), grade)
        for name, by_layer in graded.items()
        for layer, grades in by_layer.items()
        for grade in grades.values()
    ]
    record["kl_model_nats"] = {
        name: {layer_label(layer, model.cfg.n_layers): g["kl_model"].value.value for layer, g in by_layer.items()}
        for name, by_layer in graded.items()
    }
    return rows, record


def repeated_sequences(model: HookedTransformer, sizes: RealSizes) -> tuple[Tensor, Tensor]:
    """Tokens [sequence, 1 + 2L]: <|endoftext|> then L random ordinary tokens twice (`repeated_tokens`), and the
    positions scored [sequence, 1 + 2L]: L + 1 … 2L − 1, whose next token is the second copy's, read by induction."""
    span = sizes.head_span
    body = repeated_tokens(model.cfg.d_vocab, span, sizes.head_sequences, sizes.seed, FIRST_ORDINARY)
    tokens = torch.cat([torch.full((len(body), 1), SEPARATOR, dtype=body.dtype), body], dim=1)
    scored = torch.zeros_like(tokens, dtype=torch.bool)
    scored[:, span + 1 : 2 * span] = True
    return tokens, scored


@torch.inference_mode()
def detector_scores(model: HookedTransformer, tokens: Tensor, kinds: Sequence[str]) -> dict[str, np.ndarray]:
    """{kind: [sequence, layer, head]}: each sequence's `pattern_scores` of every head."""
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(model.cfg.n_layers)]
    _, cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
    out = {}
    for kind in kinds:
        detection = HEAD_KINDS[kind](tokens.cpu())
        out[kind] = np.stack(
            [
                torch.stack(
                    [pattern_scores(cache[n][b : b + 1].float().cpu(), detection[b : b + 1]) for n in names]
                ).numpy()
                for b in range(len(tokens))
            ]
        )
    return out


@torch.inference_mode()
def ablation_effects(
    model: HookedTransformer, tokens: Tensor, scored: Tensor, heads: Sequence[tuple[int, int]] | None = None
) -> np.ndarray:
    """[sequence, layer, head]: the increase of each sequence's mean loss (nats) over its `scored` positions (one
    range, the same for every sequence) when one head's z is replaced by its mean over the sequences and positions,
    the model run from that head's layer on (the heads of one layer side by side in one pass). `heads` (layer,
    head) pairs limit the heads ablated (the others NaN); default every head."""
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    heads = [(l, h) for l in range(n_layers) for h in range(n_heads)] if heads is None else list(heads)
    columns = torch.nonzero(scored[0, :-1]).flatten()
    targets = tokens[:, columns + 1]
    z_names = [f"blocks.{layer}.attn.hook_z" for layer in range(n_layers)]
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in z_names or n.endswith("hook_resid_pre"))
    last = model(tokens, stop_at_layer=n_layers)

    def loss(final: Tensor) -> Tensor:  # [rows] mean −log p(target) over the scored positions
        log_probs = read_out(model, final[:, columns]).log_softmax(-1)
        picked = log_probs.gather(-1, targets.repeat(len(final) // len(tokens), 1)[..., None])[..., 0]
        return -picked.mean(-1)

    clean = loss(last)
    out = np.full((len(tokens), n_layers, n_heads), np.nan)
    for layer in sorted({l for l, _ in heads}):
        chosen = [h for l, h in heads if l == layer]
        mean = cache[z_names[layer]].mean(dim=(0, 1))

        def ablate(z: Tensor, hook: Any, chosen: list[int] = chosen, mean: Tensor = mean) -> Tensor:
            z = z.clone()
            for j, head in enumerate(chosen):
                z[j * len(tokens) : (j + 1) * len(tokens), :, head] = mean[head]
            return z

        start = cache[f"blocks.{layer}.hook_resid_pre"].repeat(len(chosen), 1, 1)
        final = model.run_with_hooks(
            start, start_at_layer=layer, stop_at_layer=n_layers, fwd_hooks=[(z_names[layer], ablate)]
        )
        out[:, layer, chosen] = (loss(final).view(len(chosen), len(tokens)) - clean).T.double().numpy()
    return out


def _auroc(flagged: np.ndarray, effects: np.ndarray) -> float:
    """P(a flagged head's effect > an unflagged head's), ties ½; NaN when every head or none is flagged."""
    a, b = effects[flagged], effects[~flagged]
    if not len(a) or not len(b):
        return float("nan")
    return float(((a[:, None] > b[None]).sum() + 0.5 * (a[:, None] == b[None]).sum()) / (len(a) * len(b)))


def _flags(scores: np.ndarray) -> np.ndarray:
    flagged = scores >= FLAGGED
    return flagged if flagged.any() else np.arange(len(scores)) == np.nanargmax(scores)


def head_grades(scores: dict[str, np.ndarray], effects: np.ndarray, n_boot: int, seed: int) -> dict[str, Grade]:
    """spearman_<kind> and auroc_<kind> (the module's docstring) from scores {kind: [sequence, heads]} and effects
    [sequence, heads], bootstrap over sequences; the controls draw fresh random scores (fresh random flags) at
    every resample."""
    index = np.arange(len(effects))
    boot = {"n_boot": n_boot, "seed": seed}
    grades = {}
    for kind, by_sequence in scores.items():
        rng = np.random.default_rng(seed + 7)

        def rho(rows: np.ndarray, by_sequence: np.ndarray = by_sequence) -> float:
            return spearman(np.nanmean(by_sequence[rows], 0).tolist(), effects[rows].mean(0).tolist())

        def rho_random(rows: np.ndarray, rng: np.random.Generator = rng) -> float:
            return spearman(rng.random(effects.shape[1]).tolist(), effects[rows].mean(0).tolist())

        def auroc(rows: np.ndarray, by_sequence: np.ndarray = by_sequence) -> float:
            return _auroc(_flags(np.nanmean(by_sequence[rows], 0)), effects[rows].mean(0))

        def auroc_random(rows: np.ndarray, by_sequence: np.ndarray = by_sequence, rng=rng) -> float:
            return _auroc(rng.permutation(_flags(np.nanmean(by_sequence[rows], 0))), effects[rows].mean(0))

        for name, metric, control, chance, means in (
            (f"spearman_{kind}", rho, rho_random, 0.0, RANDOM_SCORES),
            (f"auroc_{kind}", auroc, auroc_random, 0.5, RANDOM_FLAGS),
        ):
            grades[name] = Grade(
                name,
                bootstrap_ci(metric, index, **boot),
                bootstrap_ci(control, index, **boot),
                chance,
                "higher",
                len(index),
                control_means=means,
            )
    return grades


def head_rows(model: HookedTransformer, profile: RealSizes) -> list[dict[str, Any]]:
    """The scoreboard's rows of the induction and previous-token detectors on `model` (smollm2) against every
    head's single-head ablation effect on repeated random tokens (the module's docstring)."""
    rows, _ = head_part(model, profile)
    return rows


def head_part(model: HookedTransformer, sizes: RealSizes) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """`head_rows`'s rows and a record: every head's mean score and effect, the seconds."""
    clock = time.perf_counter()
    tokens, scored = repeated_sequences(model, sizes)
    kinds = ("induction", "previous_token")
    scores = {kind: s.reshape(len(tokens), -1) for kind, s in detector_scores(model, tokens, kinds).items()}
    effects = ablation_effects(model, tokens, scored).reshape(len(tokens), -1)
    grades = head_grades(scores, effects, sizes.n_boot, sizes.seed)
    rows = [row("head detectors", WORLD, "every head", grade) for grade in grades.values()]
    shape = (model.cfg.n_layers, model.cfg.n_heads)
    record = {
        "sequences": len(tokens),
        "span": sizes.head_span,
        "scores": {kind: np.nanmean(s, 0).reshape(shape).tolist() for kind, s in scores.items()},
        "effects_nats": effects.mean(0).reshape(shape).tolist(),
        "seconds": time.perf_counter() - clock,
    }
    return rows, record
