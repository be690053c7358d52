"""Grade an interpretability method on a Forma model against a world whose law and mechanism are known.

Each function takes a model, held-out prompts drawn from the world, and the world's truth, and returns `Grade`s
(lab.metrics.grades): the method's value with a bootstrap 95% interval over prompts, a control that knows
nothing, and what chance gives that control.

    grade_lens               a lens's reading at every layer against the true law p and against the model
                             (KL(p ‖ P^(l)), KL(P_θ ‖ P^(l)), and what it gains over another prompt's reading;
                             `logit_lens`, a `TunedLens`, a `JacobianLens`, …)
    grade_input_attribution  input-attribution scores for the last prediction against the positions the true law
                             reads (AUROC, share of the mass) and against the model's exhaustive causal effects,
                             beside the trivial baselines (recency, last token, uniform, random), each against the
                             same method on models without the mechanism (an untrained model of the same shape, a
                             model trained on another world); given transcoders, the attribution graph's too
                             (`graph_position_scores`), against untrained transcoders, with both replacement scores
    grade_belief_probes      linear probes from the residual stream to a hidden-Markov belief state (R²), with
                             shuffled targets, an untrained model of the same shape, Hewitt & Liang's control
                             task and the lookup of the last k tokens (a finite memory) beside them
    grade_value_probes       linear probes to a categorical value, e.g. a fact's (accuracy), with the same controls
    grade_head_detectors     head-detector scores against each head's Shapley value over every set of heads
                             ablated together (`head_shapley`), along the path each kind of head works on
    grade_attribution_patching  attribution patching's estimates against the exhaustive patching sweep

A world supplies its truth through `relevant_positions(tokens)` (the positions each prediction reads),
`conditionals(tokens)` (the law) and, for a hidden-Markov world, `beliefs(tokens)` (lab.data.sources,
lab.data.mechanisms); a fact world's prompts through `lab.data.facts.FactWorld.cloze`.
"""

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from lab.analysis.attribution import attribution_patch
from lab.analysis.graphs.attribute import attribute
from lab.analysis.graphs.influence import graph_scores, position_influence
from lab.analysis.heads import HEAD_KINDS, pattern_scores
from lab.analysis.input_attribution import METHODS, input_attributions, resample_effects
from lab.analysis.lens import logit_lens, residual_stack
from lab.analysis.patching import patch_heads, patch_positions
from lab.analysis.probes.fitting import accuracy
from lab.analysis.probes.probe import fit_probe
from lab.analysis.probes.readouts import random_model
from lab.analysis.probes.splits import group_split
from lab.analysis.transcoders.model import Transcoders
from lab.metrics.discrimination import bootstrap_ci
from lab.metrics.grades import (
    BASELINES,
    Grade,
    attribution_grades,
    baseline_scores,
    lens_grades,
    mean_over_prompts,
)
from lab.metrics.memory import last_tokens_lookup
from lab.metrics.statistics import spearman
from lab.model.transformer import HookedTransformer

__all__ = [
    "FLAGGED",
    "HEAD_PATHS",
    "MEMORY",
    "UNTRAINED_MODEL",
    "UNTRAINED_TRANSCODERS",
    "VALUE_PROBE_LAMBDAS",
    "AttributionGrades",
    "flagged_margin",
    "grade_attribution_patching",
    "grade_belief_probes",
    "grade_head_detectors",
    "grade_input_attribution",
    "grade_lens",
    "grade_value_probes",
    "graph_position_scores",
    "graph_readings",
    "head_ablation_effects",
    "head_shapley",
    "last_position_truth",
    "readouts",
    "shapley_values",
]

Lens = Callable[[HookedTransformer, Tensor], Tensor]  # (model, tokens) → log-probabilities [layer, batch, pos, vocab]


def grade_lens(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    p: Any,
    lens: Lens = logit_lens,
    *,
    valid: Any = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> list[dict[str, Grade]]:
    """KL(p ‖ P^(l)), KL(P_θ ‖ P^(l)) and the gain over another prompt's reading (`lab.metrics.grades.lens_grades`)
    for every layer of `lens` (rows: resid_pre 0 … n − 1, then the output), on held-out `tokens` whose true law is
    `p` [batch, pos, vocab] (a source's `conditionals(tokens)`), averaged over the `valid` positions of each prompt
    (default all)."""
    with torch.inference_mode():
        log_probs = lens(model, tokens).double().cpu().numpy()
    return lens_grades(log_probs, np.asarray(p, dtype=np.float64), valid, n_boot=n_boot, seed=seed)


def last_position_truth(relevant_positions: Any) -> Bool[Tensor, "batch pos"]:
    """The last row of a world's `relevant_positions(tokens)` [batch, pos, pos]: the positions the prediction after
    each prompt's last token reads."""
    relevant = torch.as_tensor(np.asarray(relevant_positions), dtype=torch.bool)
    if relevant.ndim != 3 or relevant.shape[1] != relevant.shape[2]:
        raise ValueError(f"relevant positions must be [batch, pos, pos], got {tuple(relevant.shape)}")
    return relevant[:, -1]


UNTRAINED_MODEL = "an untrained model of the same shape"  # the default control of grade_input_attribution
UNTRAINED_TRANSCODERS = "untrained transcoders of the same shape"  # the attribution graph's control


@dataclass
class AttributionGrades:
    """Every method's and baseline's scores [batch, pos], the model's exhaustive effects, each one's grades (its
    control the hardest of the `controls` to beat), each one's grades on every control model by name, and the
    attribution graph's replacement scores (trained and untrained transcoders) when it is graded."""

    scores: dict[str, Float[Tensor, "batch pos"]]
    effects: Float[Tensor, "batch pos"]
    grades: dict[str, dict[str, Grade]]  # method or baseline → auroc | relevant_mass | rank_correlation
    controls: dict[str, dict[str, dict[str, Grade]]]  # method → control → grade (each graded alone)
    baselines: tuple[str, ...] = ()
    replacement: dict[str, Grade] = dataclasses.field(default_factory=dict)  # "replacement_score" beside untrained


def graph_readings(
    model: HookedTransformer,
    transcoders: Transcoders,
    tokens: Int[Tensor, "batch pos"],
    max_feature_nodes: int | None = None,
) -> tuple[Float[Tensor, "batch pos"], Float[Tensor, " batch"]]:
    """Each prompt's attribution graph (at most `max_feature_nodes` features, the rest folded into the error nodes;
    None keeps every active one) read twice: the share of the tokens' path influence at each position
    (`graph_position_scores`) and the graph's replacement score (`graph_scores`: the tokens' share of the influence
    that tokens and error nodes carry, 1 when the transcoders replace the MLPs exactly)."""
    graphs = [attribute(model, transcoders, prompt, max_feature_nodes=max_feature_nodes) for prompt in tokens]
    positions = torch.stack([position_influence(graph) for graph in graphs])
    return positions, torch.tensor([graph_scores(graph)["replacement"] for graph in graphs])


def graph_position_scores(
    model: HookedTransformer, transcoders: Transcoders, tokens: Int[Tensor, "batch pos"]
) -> Float[Tensor, "batch pos"]:
    """Each prompt's attribution graph (lab.analysis.graphs: its own local replacement, the logits of its last
    position) read as input attribution: the share of the tokens' path influence on the logits at each position
    (`position_influence`; its share at the relevant positions is `position_share`)."""
    return torch.stack([position_influence(attribute(model, transcoders, prompt)) for prompt in tokens])


def untrained_transcoders(transcoders: Transcoders) -> Transcoders:
    """Transcoders of the same shape and kind, randomly initialised (another seed) and never trained."""
    return Transcoders(dataclasses.replace(transcoders.cfg, seed=transcoders.cfg.seed + 1)).eval()


def grade_input_attribution(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    relevant: Bool[Tensor, "batch pos"],
    methods: Sequence[str] = METHODS,
    *,
    target: Any = None,
    valid: Any = None,
    n_boot: int = 1000,
    seed: int = 0,
    ig_steps: int = 32,
    transcoders: Transcoders | None = None,
    controls: Mapping[str, HookedTransformer] | None = None,
    baselines: Sequence[str] = BASELINES,
    effect_values: Any = None,
    graph_features: int | None = None,
) -> AttributionGrades:
    """Each method's attribution of the prediction after each prompt's last token, graded against the truly
    relevant positions `relevant` [batch, pos] (a set per prompt: lab.metrics.grades says how each grade treats
    it) and against the model's own exhaustive causal effects (`resample_effects`), over the `valid` positions
    (default all).

    Controls that can fail: the same method on each model of `controls` ({what: model of the same shape without
    the world's mechanism}; default an untrained one, `UNTRAINED_MODEL`; {} for none), graded against this world's
    truth and this model's effects; each grade's control is the hardest of them to beat. The trivial `baselines`
    (lab.metrics.grades.BASELINES: recency, last token, uniform, random) are graded beside the methods, their
    controls their own scores (they read no model). With `transcoders` (trained on the model), the attribution
    graph is one more method, "attribution_graph" (`graph_readings`; it explains the top logits, so it takes no
    `target`), its control the same graph over `untrained_transcoders`, and its replacement score beside theirs;
    `graph_features` caps each graph's feature nodes (attribute's max_feature_nodes; None: every active feature).
    `effect_values` (token ids) are the replacements the causal effects average over (resample_effects' `values`;
    default every token: exhaustive, |V| forward passes per position, too many on a real vocabulary)."""
    if controls is None:
        controls = {UNTRAINED_MODEL: random_model(model, seed=seed + 1)}
    truth = np.asarray(torch.as_tensor(relevant).cpu(), dtype=bool)
    mask = np.ones_like(truth) if valid is None else np.broadcast_to(np.asarray(valid, dtype=bool), truth.shape)
    scores = input_attributions(model, tokens, target, methods, ig_steps=ig_steps)
    against = {
        what: input_attributions(other, tokens, target, methods, ig_steps=ig_steps) for what, other in controls.items()
    }
    replacement: dict[str, Grade] = {}
    if transcoders is not None:
        scores["attribution_graph"], untrained_scores, replacement["replacement_score"] = _graph_method(
            model, transcoders, tokens, n_boot, seed, graph_features
        )
        against = {what: dict(s) for what, s in against.items()} | {
            UNTRAINED_TRANSCODERS: {"attribution_graph": untrained_scores}
        }
    for name in baselines:
        scores[name] = torch.from_numpy(baseline_scores(name, mask, seed=seed)).float()
        for by_method in against.values():
            by_method[name] = scores[name]  # a baseline reads no model: the same scores on every one
    effects = resample_effects(model, tokens, target, values=effect_values)
    grade = partial(attribution_grades, relevant=truth, effects=effects.numpy(), valid=mask, n_boot=n_boot, seed=seed)
    grades, graded_controls = {}, {}
    for method, value in scores.items():
        theirs = {what: by_method[method].cpu().numpy() for what, by_method in against.items() if method in by_method}
        grades[method] = grade(value.cpu().numpy(), controls=theirs)
        graded_controls[method] = {what: grade(c) for what, c in theirs.items()}
    return AttributionGrades(scores, effects, grades, graded_controls, tuple(baselines), replacement)


def _graph_method(
    model: HookedTransformer,
    transcoders: Transcoders,
    tokens: Int[Tensor, "batch pos"],
    n_boot: int,
    seed: int,
    max_feature_nodes: int | None = None,
) -> tuple[Tensor, Tensor, Grade]:
    """The attribution graph as a method of input attribution: its scores over the trained `transcoders`, its
    control's over `untrained_transcoders`, and the replacement score of the trained set beside the untrained's."""
    scores, trained = graph_readings(model, transcoders, tokens, max_feature_nodes)
    untrained_scores, untrained = graph_readings(model, untrained_transcoders(transcoders), tokens, max_feature_nodes)
    boot = {"n_boot": n_boot, "seed": seed}
    replacement = Grade(
        "replacement_score",
        mean_over_prompts(trained.numpy(), **boot),
        mean_over_prompts(untrained.numpy(), **boot),
        None,
        "higher",
        len(trained),
        control_kind="beaten",
        control_means=UNTRAINED_TRANSCODERS,
    )
    return scores, untrained_scores, replacement


# --- probes -------------------------------------------------------------------------------------------------


def readouts(model: HookedTransformer, tokens: Int[Tensor, "batch pos"]) -> dict[str, Float[Tensor, "batch pos d"]]:
    """The residual stream entering each block ("resid_pre l"), after the last ("final") and all of them side by
    side ("all layers"): the readouts a probe is fitted on."""
    with torch.inference_mode():
        stack = residual_stack(model, model.check_tokens(tokens)).float()
    names = [f"resid_pre {layer}" for layer in range(stack.shape[0] - 1)] + ["final"]
    out = {name: stack[i].clone() for i, name in enumerate(names)}
    out["all layers"] = torch.cat(list(stack), dim=-1).clone()
    return out


def _r2(y: np.ndarray, predicted: np.ndarray) -> float:
    """R² pooled over every output: 1 − Σ(y − ŷ)² / Σ(y − ȳ)² with ȳ each output's mean."""
    total = ((y - y.mean(axis=0)) ** 2).sum()
    return float(1.0 - ((y - predicted) ** 2).sum() / total) if total > 0 else float("nan")


def _ridge_predictions(
    X: Tensor, Y: np.ndarray, split: tuple[np.ndarray, np.ndarray], groups: np.ndarray, seed: int
) -> np.ndarray:
    """Test-row predictions of one ridge probe per column of Y, each with its α cross-validated on grouped folds
    of the training rows."""
    columns = [
        fit_probe(X, Y[:, k], "ridge", groups=groups, split=split, seed=seed, n_bootstrap=1).test_scores.numpy()
        for k in range(Y.shape[1])
    ]
    return np.stack(columns, axis=1)


MEMORY = (1, 2, 3, 4, 5, 6)  # the lengths k of the finite-memory lookups a belief probe is set beside


def grade_belief_probes(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    beliefs: Any,
    *,
    untrained: HookedTransformer | None = None,
    test_fraction: float = 0.3,
    n_boot: int = 1000,
    seed: int = 0,
    memory: Sequence[int] = MEMORY,
) -> dict[str, dict[str, Any]]:
    """Ridge probes from each readout (`readouts`) to the belief state [batch, pos, S] at every position, fitted on
    some prompts and scored on the others (prompts are the groups), R² pooled over the S outputs:

        r2             the probe's test R², beside the same probe on targets shuffled across rows (control, chance 0)
        r2_untrained   the same probe on an untrained model of the same shape (`untrained`, default a fresh one)
        r2_control_task  Hewitt & Liang's control task: each token type gets a belief drawn at random from the data,
                       and the probe is fitted to that instead (what the probe can memorise from the token alone)
        selectivity    r2 − r2_control_task (paired bootstrap)
        r2_beyond_token  the probe's R² for what the belief holds beyond the current token, η_t − E[η | x_t] (the
                       means by token type from the training rows), beside the same on shuffled targets (control):
                       the part of the belief a readout of the token alone cannot give
        r2_beyond_token_untrained  the same on the untrained model
        r2_last_k      {k: R²} of the lookup of the last k tokens for each k in `memory`
                       (`lab.metrics.memory.last_tokens_lookup`, fitted on the probe's training prompts and judged on
                       its test prompts): the belief a finite memory gives; the same for every readout

    Returns {readout: {name: Grade or Metric}}; beside them "test_predictions" and "test_rows" (the probe's
    predictions on the test rows, and which rows of batch · pos those are)."""
    tokens = model.check_tokens(tokens)
    beliefs = np.asarray(beliefs, dtype=np.float64)
    batch, length = tokens.shape
    if beliefs.shape[:2] != (batch, length):
        raise ValueError(f"beliefs {beliefs.shape} must be [batch, pos, states] for tokens {tuple(tokens.shape)}")
    Y = beliefs.reshape(batch * length, -1)
    groups = np.repeat(np.arange(batch), length)
    split = group_split(groups, test_fraction, seed)
    targets = _belief_targets(Y, tokens.reshape(-1).cpu().numpy(), split[0], model.cfg.d_vocab, seed)
    untrained = random_model(model, seed=seed + 1) if untrained is None else untrained
    ours, theirs = readouts(model, tokens), readouts(untrained, tokens)
    boot = {"groups": groups[split[1]], "n_boot": n_boot, "seed": seed}
    flat_tokens = tokens.cpu().numpy()
    lookups = {
        k: bootstrap_ci(_r2, Y[split[1]], last_tokens_lookup(flat_tokens, Y, split[0], k)[split[1]], **boot)
        for k in memory
    }
    out = {}
    for name, X in ours.items():
        X, X_untrained = X.reshape(batch * length, -1), theirs[name].reshape(batch * length, -1)
        out[name] = _belief_grades(X, X_untrained, targets, split, groups, n_boot, seed) | {"r2_last_k": lookups}
    return out


class _BeliefTargets(NamedTuple):
    """What a belief probe is fitted to, every row: the belief, it shuffled across rows, Hewitt & Liang's control
    task, and the belief beyond the current token (and that shuffled)."""

    Y: np.ndarray
    shuffled: np.ndarray
    control_task: np.ndarray
    beyond: np.ndarray
    beyond_shuffled: np.ndarray


def _belief_targets(
    Y: np.ndarray, flat_tokens: np.ndarray, train: np.ndarray, d_vocab: int, seed: int
) -> _BeliefTargets:
    """The targets of grade_belief_probes from the beliefs Y [rows, S], each row's token and the training rows."""
    rng = np.random.default_rng(seed + 7)
    shuffled = Y[rng.permutation(len(Y))]
    by_type = Y[rng.integers(0, len(Y), size=d_vocab)]  # one random belief per token type
    by_token = np.stack(
        [
            Y[train][flat_tokens[train] == v].mean(axis=0) if (flat_tokens[train] == v).any() else Y[train].mean(axis=0)
            for v in range(d_vocab)
        ]
    )
    beyond = Y - by_token[flat_tokens]
    return _BeliefTargets(Y, shuffled, by_type[flat_tokens], beyond, beyond[rng.permutation(len(beyond))])


def _belief_grades(
    X: np.ndarray,
    X_untrained: np.ndarray,
    t: _BeliefTargets,
    split: tuple[np.ndarray, np.ndarray],
    groups: np.ndarray,
    n_boot: int,
    seed: int,
) -> dict[str, Any]:
    """One readout's grades (grade_belief_probes' docstring names them), from its features X and the untrained
    model's."""
    boot = {"groups": groups[split[1]], "n_boot": n_boot, "seed": seed}
    y_test, c_test, b_test = t.Y[split[1]], t.control_task[split[1]], t.beyond[split[1]]
    predicted = _ridge_predictions(X, t.Y, split, groups, seed)
    predicted_shuffled = _ridge_predictions(X, t.shuffled, split, groups, seed)
    predicted_control = _ridge_predictions(X, t.control_task, split, groups, seed)
    predicted_untrained = _ridge_predictions(X_untrained, t.Y, split, groups, seed)
    r2 = bootstrap_ci(_r2, y_test, predicted, **boot)
    control = bootstrap_ci(_r2, t.shuffled[split[1]], predicted_shuffled, **boot)
    beyond_r2 = bootstrap_ci(_r2, b_test, _ridge_predictions(X, t.beyond, split, groups, seed), **boot)
    beyond_control = bootstrap_ci(
        _r2, t.beyond_shuffled[split[1]], _ridge_predictions(X, t.beyond_shuffled, split, groups, seed), **boot
    )
    n_test = len(np.unique(groups[split[1]]))
    return {
        "r2": Grade("r2", r2, control, 0.0, "higher", n_test),
        "r2_beyond_token": Grade("r2_beyond_token", beyond_r2, beyond_control, 0.0, "higher", n_test),
        "r2_beyond_token_untrained": bootstrap_ci(
            _r2, b_test, _ridge_predictions(X_untrained, t.beyond, split, groups, seed), **boot
        ),
        "r2_untrained": bootstrap_ci(_r2, y_test, predicted_untrained, **boot),
        "r2_control_task": bootstrap_ci(_r2, c_test, predicted_control, **boot),
        "selectivity": bootstrap_ci(
            lambda y, p, c, q: _r2(y, p) - _r2(c, q), y_test, predicted, c_test, predicted_control, **boot
        ),
        "test_predictions": predicted,
        "test_rows": split[1],
    }


VALUE_PROBE_LAMBDAS = (1e-3, 1e-2, 1e-1)  # a multi-class logistic fit is a Newton solve in (features × classes)²


def grade_value_probes(
    model: HookedTransformer,
    tokens: Tensor | Sequence[Tensor],
    labels: Any,
    groups: Any,
    *,
    untrained: HookedTransformer | None = None,
    test_fraction: float = 0.3,
    n_boot: int = 1000,
    seed: int = 0,
    grid: Sequence[float] = VALUE_PROBE_LAMBDAS,
    n_folds: int = 3,
    labels_are_tokens: bool = False,
) -> dict[str, dict[str, Any]]:
    """Logistic probes from each readout at each prompt's last position to a categorical label per prompt (a
    fact's value), split by `groups` (the entity each prompt is about: no entity on both sides), scored by test
    accuracy. `tokens` is one batch of prompts [batch, pos], or a list of batches of different lengths (the
    labels and groups follow their order).

        accuracy           beside the same probe on shuffled labels (control; chance: the largest class's share)
        accuracy_untrained the same probe on an untrained model of the same shape
        accuracy_control_task  Hewitt & Liang's control task: each group gets a label drawn at random, and the
                           probe is fitted to that (unlearnable across held-out groups: what chance looks like)
        selectivity        accuracy − accuracy_control_task (paired bootstrap over groups)

    With `labels_are_tokens` (each label a token id, e.g. the value's word), the model's own reading is the
    baseline beside each probe, on the same test prompts: the logit lens at that readout, its top token among
    the labels (the model's output for "final" and "all layers"):

        accuracy_logit_lens    the logit lens's accuracy: how much of the answer the model has written there
        accuracy_beyond_lens   accuracy − accuracy_logit_lens (paired bootstrap): what the probe reads that the
                               model has not yet written (a probe of the final stream reads the model's answer)

    Each probe's λ is chosen from `grid` by `n_folds`-fold grouped cross-validation on its training rows (a short
    grid: every readout is fitted four times). Returns {readout: {name: Grade or Metric}}."""
    batches = [model.check_tokens(tokens)] if isinstance(tokens, Tensor) else [model.check_tokens(t) for t in tokens]
    n = sum(len(b) for b in batches)
    labels = np.asarray(labels)
    groups = np.asarray(groups)
    if labels.shape != (n,) or groups.shape != labels.shape:
        raise ValueError(f"labels {labels.shape} and groups {groups.shape} need one entry per prompt ({n})")
    split = group_split(groups, test_fraction, seed)
    test_groups = groups[split[1]]
    shuffled, control_task = _value_targets(labels, groups, seed)
    untrained = random_model(model, seed=seed + 1) if untrained is None else untrained
    ours, theirs = _last_positions(model, batches), _last_positions(untrained, batches)
    _, counts = np.unique(labels[split[1]], return_counts=True)
    chance = float(counts.max() / counts.sum())
    boot = {"groups": test_groups, "n_boot": n_boot, "seed": seed}
    predictions = partial(_value_predictions, groups=groups, split=split, seed=seed, grid=grid, n_folds=n_folds)
    y_test, c_test = labels[split[1]], control_task[split[1]]
    own = _own_readings(model, batches, np.unique(labels)) if labels_are_tokens else None
    out = {}
    for name, X in ours.items():
        predicted = predictions(X, labels)
        predicted_control = predictions(X, control_task)
        value = bootstrap_ci(accuracy, y_test, predicted, **boot)
        control = bootstrap_ci(accuracy, shuffled[split[1]], predictions(X, shuffled), **boot)
        out[name] = {
            "accuracy": Grade("accuracy", value, control, chance, "higher", len(np.unique(test_groups))),
            "accuracy_untrained": bootstrap_ci(accuracy, y_test, predictions(theirs[name], labels), **boot),
            "accuracy_control_task": bootstrap_ci(accuracy, c_test, predicted_control, **boot),
            "selectivity": bootstrap_ci(
                lambda y, p, c, q: accuracy(y, p) - accuracy(c, q), y_test, predicted, c_test, predicted_control, **boot
            ),
        }
        if own is not None:
            read = own[name][split[1]]
            out[name]["accuracy_logit_lens"] = bootstrap_ci(accuracy, y_test, read, **boot)
            out[name]["accuracy_beyond_lens"] = bootstrap_ci(
                lambda y, p, q: accuracy(y, p) - accuracy(y, q), y_test, predicted, read, **boot
            )
    return out


def _own_readings(model: HookedTransformer, batches: list[Tensor], classes: np.ndarray) -> dict[str, np.ndarray]:
    """At each readout of `readouts`, the class (a token id among `classes`) the logit lens ranks first at every
    prompt's last position: the answer as the model has written it so far."""
    with torch.inference_mode():
        lens = torch.cat([logit_lens(model, b)[:, :, -1] for b in batches], dim=1)  # [layer, prompt, vocab]
    top = classes[lens[:, :, torch.as_tensor(classes)].argmax(-1).numpy()]  # [layer, prompt]
    out = {f"resid_pre {layer}": top[layer] for layer in range(model.cfg.n_layers)}
    return out | {"final": top[-1], "all layers": top[-1]}


def _value_targets(labels: np.ndarray, groups: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The labels shuffled across prompts (the control), and Hewitt & Liang's control task: each group's label
    drawn at random from the labels."""
    rng = np.random.default_rng(seed + 7)
    shuffled = labels[rng.permutation(len(labels))]
    group_ids = np.unique(groups, return_inverse=True)[1]
    return shuffled, labels[rng.integers(0, len(labels), size=group_ids.max() + 1)][group_ids]


def _last_positions(model: HookedTransformer, batches: list[Tensor]) -> dict[str, Tensor]:
    """Each readout at every prompt's last position, the batches' prompts in order."""
    read = [readouts(model, b) for b in batches]
    return {name: torch.cat([r[name][:, -1] for r in read]) for name in read[0]}


def _value_predictions(
    X: Tensor,
    y: np.ndarray,
    *,
    groups: np.ndarray,
    split: tuple[np.ndarray, np.ndarray],
    seed: int,
    grid: Sequence[float],
    n_folds: int,
) -> np.ndarray:
    """The classes a logistic probe from X to y, λ chosen by grouped cross-validation, predicts on the test rows."""
    result = fit_probe(
        X, y, "logistic", groups=groups, split=split, seed=seed, n_bootstrap=1, grid=grid, n_folds=n_folds
    )
    scores = result.test_scores.numpy()
    index = (scores > 0.5).astype(int) if scores.ndim == 1 else scores.argmax(axis=1)
    return result.classes[index]


# --- heads and patching -----------------------------------------------------------------------------------


@torch.inference_mode()
def head_ablation_effects(
    model: HookedTransformer, tokens: Int[Tensor, "batch pos"], scored: Bool[Tensor, "batch pos"]
) -> Float[Tensor, "batch layer head"]:
    """Each head's exhaustive ablation effect on each prompt: the drop in the mean log-probability of the true next
    token over the `scored` positions (e.g. an induction world's copy positions) when that head's output z is
    replaced by its mean over the batch and positions (mean ablation), one head at a time."""
    tokens = model.check_tokens(tokens)
    scored = torch.as_tensor(scored, dtype=torch.bool)[:, :-1]
    targets = tokens[:, 1:]

    def copied(logits: Tensor) -> Tensor:
        picked = logits[:, :-1].log_softmax(-1).gather(-1, targets[..., None])[..., 0]
        return (picked * scored).sum(dim=1) / scored.sum(dim=1).clamp_min(1)

    names = [f"blocks.{layer}.attn.hook_z" for layer in range(model.cfg.n_layers)]
    logits, cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
    clean = copied(logits)
    out = torch.zeros(tokens.shape[0], model.cfg.n_layers, model.cfg.n_heads)
    for layer, name in enumerate(names):
        mean = cache[name].mean(dim=(0, 1))  # [head, d_head]
        for head in range(model.cfg.n_heads):

            def ablate(z: Tensor, hook: Any, head: int = head, mean: Tensor = mean) -> Tensor:
                z = z.clone()
                z[:, :, head] = mean[head]
                return z

            out[:, layer, head] = (
                (clean - copied(model.run_with_hooks(tokens, fwd_hooks=[(name, ablate)]))).float().cpu()
            )
    return out


HEAD_PATHS = {"induction": "direct", "previous_token": "keys"}  # where each kind of head does its work
MAX_SHAPLEY_HEADS = 12  # exact Shapley values take 2^n ablated runs


def shapley_values(values: np.ndarray, n: int) -> np.ndarray:
    """Exact Shapley values [batch, n] from v(S) for every subset S of n players, values [2^n, batch] indexed by
    the bitmask of S (v(∅) = 0): φ_i = Σ_{S ∌ i} |S|! (n − |S| − 1)! / n! · (v(S ∪ {i}) − v(S))."""
    sizes = np.array([bin(mask).count("1") for mask in range(2**n)])
    weight = np.array([math.factorial(k) * math.factorial(n - k - 1) / math.factorial(n) for k in range(n)])
    out = np.zeros((values.shape[1], n))
    for i in range(n):
        without = np.array([mask for mask in range(2**n) if not mask >> i & 1])
        out[:, i] = (weight[sizes[without]][:, None] * (values[without | 1 << i] - values[without])).sum(axis=0)
    return out


@torch.inference_mode()
def head_shapley(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    scored: Bool[Tensor, "batch pos"],
    path: str = "total",
) -> Float[Tensor, "batch layer head"]:
    """Each head's necessity measured in every set of heads it works with: the exact Shapley value, per prompt,
    of v(S) = the drop in the mean log-probability of the true next token over the `scored` positions when the
    heads of S are mean-ablated together (their z replaced by its mean over the batch and positions), over every
    subset S of the heads that can act along `path`:

        total    the heads' outputs removed everywhere (every head)
        direct   removed only from the residual stream the unembedding reads, every later block seeing them
                 intact: what a head writes to the prediction itself (every head; a copying head's path)
        keys     removed only from the residual stream the later blocks' attention keys read (the heads below
                 the last layer; those of the last have no such path and get 0): what a previous-token head is
                 for, as path patching to the keys measures it

    The values of the heads sum to v(all of them) on every prompt (Shapley's efficiency)."""
    if path not in ("total", "direct", "keys"):
        raise ValueError(f"path must be total, direct or keys, got {path!r}")
    tokens = model.check_tokens(tokens)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    players = [(l, h) for l in range(L - 1 if path == "keys" else L) for h in range(H)]
    if len(players) > MAX_SHAPLEY_HEADS:
        raise ValueError(
            f"exact Shapley values over {len(players)} heads take 2^{len(players)} runs: at most "
            f"{MAX_SHAPLEY_HEADS} heads"
        )
    copied = _copy_log_prob(tokens, scored)
    names = [f"blocks.{layer}.attn.hook_z" for layer in range(L)]
    final = f"blocks.{L - 1}.hook_resid_post"
    logits, cache = model.run_with_cache(tokens, names_filter=lambda name: name in names or name == final)
    means = [cache[name].mean(dim=(0, 1)) for name in names]
    values = np.zeros((2 ** len(players), tokens.shape[0]))
    clean = copied(logits)
    for mask in range(1, 2 ** len(players)):
        chosen = [players[i] for i in range(len(players)) if mask >> i & 1]
        if path == "total":
            ablated = model.run_with_hooks(tokens, fwd_hooks=_mean_ablations(chosen, names, means))
        else:
            change = _ablation_change(model, chosen, cache, names, means)  # [batch, pos, d_model] per layer
            if path == "direct":
                ablated = model.unembed(model.ln_final(cache[final] + sum(change.values())))
            else:
                ablated = _with_keys_changed(model, tokens, change)
        values[mask] = (clean - copied(ablated)).double().cpu().numpy()
    shapley = torch.from_numpy(shapley_values(values, len(players))).float()
    out = torch.zeros(tokens.shape[0], L, H)
    for i, (layer, head) in enumerate(players):
        out[:, layer, head] = shapley[:, i]
    return out


def _copy_log_prob(tokens: Tensor, scored: Any) -> Callable[[Tensor], Tensor]:
    """logits → each prompt's mean log-probability of its true next token over its `scored` positions."""
    scored = torch.as_tensor(scored, dtype=torch.bool)[:, :-1]
    targets = tokens[:, 1:]

    def copied(logits: Tensor) -> Tensor:
        picked = logits[:, :-1].log_softmax(-1).gather(-1, targets[..., None])[..., 0]
        return (picked * scored).sum(dim=1) / scored.sum(dim=1).clamp_min(1)

    return copied


def _mean_ablations(chosen: list[tuple[int, int]], names: list[str], means: list[Tensor]) -> list[tuple[str, Any]]:
    """Hooks that replace the chosen heads' z by its mean, every layer that has one."""
    hooks = []
    for layer, name in enumerate(names):
        heads = [h for l, h in chosen if l == layer]
        if heads:

            def ablate(z: Tensor, hook: Any, heads: list[int] = heads, mean: Tensor = means[layer]) -> Tensor:
                z = z.clone()
                z[:, :, heads] = mean[heads]
                return z

            hooks.append((name, ablate))
    return hooks


def _ablation_change(
    model: HookedTransformer, chosen: list[tuple[int, int]], cache: Any, names: list[str], means: list[Tensor]
) -> dict[int, Tensor]:
    """{layer: what mean-ablating its chosen heads adds to the residual stream, (mean z − z) W_O summed over them}."""
    change = {}
    for layer, name in enumerate(names):
        heads = [h for l, h in chosen if l == layer]
        if heads:
            z = cache[name][:, :, heads]
            change[layer] = torch.einsum("bphd,hdm->bpm", means[layer][heads] - z, model.W_O[layer, heads])
    return change


def _with_keys_changed(model: HookedTransformer, tokens: Tensor, change: dict[int, Tensor]) -> Tensor:
    """The logits when each later block's attention keys read the residual stream plus `change` of the layers
    below it (queries, values and everything else as in the clean run)."""

    def keys(k_input: Tensor, hook: Any, layer: int = 0) -> Tensor:
        below = [c for l, c in change.items() if l < layer]
        return k_input + sum(below)[:, :, None] if below else k_input

    hooks = [(f"blocks.{layer}.hook_k_input", partial(keys, layer=layer)) for layer in range(1, model.cfg.n_layers)]
    before = model.cfg.use_split_qkv_input
    model.set_use_split_qkv_input(True)
    try:
        return model.run_with_hooks(tokens, fwd_hooks=hooks)
    finally:
        model.set_use_split_qkv_input(before)


@torch.inference_mode()
def _detector_scores(model: HookedTransformer, tokens: Tensor, kind: str) -> Tensor:
    """[batch, layer, head]: each prompt's `pattern_scores` (NaN where the prompt has no query to score)."""
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(model.cfg.n_layers)]
    _, cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
    detection = HEAD_KINDS[kind](tokens.cpu())
    out = torch.full((tokens.shape[0], model.cfg.n_layers, model.cfg.n_heads), float("nan"))
    for b in range(tokens.shape[0]):
        if detection[b].any():
            out[b] = torch.stack(
                [pattern_scores(cache[name][b : b + 1].float().cpu(), detection[b : b + 1]) for name in names]
            )
    return out


FLAGGED = 0.5  # a detector flags a head that puts at least half its attention where its pattern says


def flagged_margin(scores: np.ndarray, values: np.ndarray, level: float = FLAGGED) -> float:
    """How clearly the heads a detector flags are the heads doing the work: the smallest value among the flagged
    heads (score ≥ `level`; none flagged: the head it scores highest) minus the largest among the others. With one
    head flagged it is that head's lead over the next; negative when a head the detector passes over does more
    than one it flags; NaN when it flags every head."""
    flagged = scores >= level
    if not flagged.any():
        flagged = np.arange(len(scores)) == np.nanargmax(scores)
    if flagged.all():
        return float("nan")
    return float(values[flagged].min() - values[~flagged].max())


def grade_head_detectors(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    scored: Bool[Tensor, "batch pos"],
    *,
    kinds: Sequence[str] = ("induction", "previous_token"),
    scores: dict[str, Any] | None = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Head detectors against each head's necessity in the set of heads it works with (`head_shapley`, exact
    Shapley values over every subset of heads, mean ablation), on the world's own held-out prompts, averaged over
    the prompts of each bootstrap resample. Each kind is graded along its own path (HEAD_PATHS): an induction
    head's work is what it writes to the prediction (direct), a previous-token head's what the later keys read:

        spearman_<kind>   Spearman ρ across heads between the detector's score and the heads' values on its path
        margin_<kind>     the smallest value among the heads the detector flags minus the largest among the
                          others (`flagged_margin`; one head flagged: its lead over the next): above 0 when the
                          heads the detector flags are the ones doing that work

    Control for each: the heads' values in a fresh random order at every resample (the permutation null: chance
    0). `scores` {kind: [batch, layer, head]} replaces the detectors' own (to grade another detector, e.g. a
    random one). Returns {"grades": {name: Grade}, "values": {kind: [layer, head]}, "scores": {kind: [layer,
    head]}} (the last two over every prompt)."""
    tokens = model.check_tokens(tokens)
    values = {kind: head_shapley(model, tokens, scored, HEAD_PATHS[kind]).flatten(1).numpy() for kind in kinds}
    given = scores or {}
    detected = {
        kind: np.asarray(given[kind], dtype=np.float64).reshape(len(tokens), -1)
        if kind in given
        else _detector_scores(model, tokens, kind).flatten(1).numpy()
        for kind in kinds
    }
    index = np.arange(tokens.shape[0])

    def across_heads(kind: str, measure: Callable[..., float], permute: bool) -> Callable[[np.ndarray], float]:
        order = _shuffler(permute, seed + 3)

        def metric(rows: np.ndarray) -> float:
            return measure(np.nanmean(detected[kind][rows], axis=0), order(values[kind][rows].mean(axis=0)))

        return metric

    def rho(a: np.ndarray, b: np.ndarray) -> float:
        return spearman(a.tolist(), b.tolist())

    grades = {}
    for kind in kinds:
        for name, measure in ((f"spearman_{kind}", rho), (f"margin_{kind}", flagged_margin)):
            grades[name] = _against_null(name, partial(across_heads, kind, measure), index, 0.0, n_boot, seed)
    shape = (model.cfg.n_layers, model.cfg.n_heads)
    return {
        "grades": grades,
        "values": {kind: values[kind].mean(axis=0).reshape(shape) for kind in kinds},
        "scores": {kind: np.nanmean(detected[kind], axis=0).reshape(shape) for kind in kinds},
    }


def _shuffler(permute: bool, seed: int) -> Callable[[np.ndarray], np.ndarray]:
    """Values in a fresh random order at every call (from `seed`) when permute, else as they are."""
    rng = np.random.default_rng(seed)
    return (lambda values: values[rng.permutation(len(values))]) if permute else (lambda values: values)


def _against_null(
    name: str,
    metric: Callable[[bool], Callable[[np.ndarray], float]],
    index: np.ndarray,
    chance: float,
    n_boot: int,
    seed: int,
) -> Grade:
    """A metric of the prompts' rows over bootstrap resamples (`metric(False)`), graded against its permutation
    null (`metric(True)`: the heads' effects in a fresh random order at every resample)."""
    boot = {"n_boot": n_boot, "seed": seed}
    return Grade(
        name,
        bootstrap_ci(metric(False), index, **boot),
        bootstrap_ci(metric(True), index, **boot),
        chance,
        "higher",
        len(index),
    )


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x - x.mean(), y - y.mean()
    denominator = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / denominator) if denominator > 0 else float("nan")


def grade_attribution_patching(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    answer: Any,
    wrong: Any,
    *,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Attribution patching (`lab.analysis.attribution.attribution_patch`, denoising) against the exhaustive sweep
    (`patch_heads`, `patch_positions` on resid_pre) for the logit difference answer − wrong at the last position,
    prompt by prompt: Pearson r across the cells of each sweep (heads [layer, head]; resid_pre [layer, position]),
    averaged over prompts; control: each prompt's exhaustive values in a random order of cells (chance 0)."""
    clean, corrupted = model.check_tokens(clean), model.check_tokens(corrupted)
    answer = torch.as_tensor(answer).expand(clean.shape[0])
    wrong = torch.as_tensor(wrong).expand(clean.shape[0])
    per_prompt: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {"heads": [], "resid_pre": []}
    for b in range(clean.shape[0]):
        rows = slice(b, b + 1)
        options = {"answer": answer[rows], "wrong": wrong[rows]}
        estimate = attribution_patch(model, clean[rows], corrupted[rows], **options)
        exhaustive = {
            "heads": patch_heads(model, clean[rows], corrupted[rows], **options),
            "resid_pre": patch_positions(model, clean[rows], corrupted[rows], "resid_pre", **options),
        }
        for sweep, pairs in per_prompt.items():
            pairs.append((estimate[sweep].values.flatten().numpy(), exhaustive[sweep].values.flatten().numpy()))
    boot = {"n_boot": n_boot, "seed": seed}
    grades = {}
    rng = np.random.default_rng(seed + 5)
    for sweep, pairs in per_prompt.items():
        real = [_pearson(a, e) for a, e in pairs]
        control = [_pearson(a, e[rng.permutation(len(e))]) for a, e in pairs]  # a fresh order of cells per prompt
        grades[f"pearson_{sweep}"] = Grade(
            f"pearson_{sweep}",
            mean_over_prompts(real, **boot),
            mean_over_prompts(control, **boot),
            0.0,
            "higher",
            len(pairs),
        )
    return {"grades": grades, "pairs": per_prompt}
