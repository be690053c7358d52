"""Readouts judged honestly — chosen on a validation split, reported on a test split, beside controls — and
P(IK): which readouts of the residual stream predict a right answer, layer by layer."""

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from experiments.calibration.config import N_OPTIONS, Config
from experiments.calibration.setting import Setting, continuation_logprobs, right_padded, statement_prefix
from lab.analysis.activations.collect import collect_activations
from lab.analysis.lens import logit_lens
from lab.analysis.probes.fitting import feature_rank
from lab.analysis.probes.probe import fit_probe
from lab.analysis.probes.readouts import judge_readouts, random_model, shuffled_control
from lab.analysis.probes.splits import group_partition
from lab.metrics.calibration import softmax
from lab.metrics.discrimination import Metric, auroc, auroc_ci, bootstrap_ci
from lab.model.transformer import HookedTransformer


# --------------------------------------------------------------------------------------------
# Readouts judged honestly: chosen on a validation split, reported on a test split, beside controls
# --------------------------------------------------------------------------------------------
@dataclass
class Parts:
    """Entity-disjoint rows: `train` fits the probes, `validation` chooses among readouts, `test` reports."""

    groups: np.ndarray  # the entity of each row (a person, an MMLU item)
    train: np.ndarray
    validation: np.ndarray
    test: np.ndarray
    shuffle: np.ndarray  # one permutation of the rows: the shuffled-label control of every readout


def make_parts(groups: np.ndarray, cfg: Config, probes: bool = True) -> Parts:
    """Train / validation / test by entity (validation and test only, half each, when nothing is fitted)."""
    fractions = (
        (
            1 - cfg.probe_validation_fraction - cfg.probe_test_fraction,
            cfg.probe_validation_fraction,
            cfg.probe_test_fraction,
        )
        if probes
        else (0.5, 0.5)
    )
    split = group_partition(groups, fractions, seed=cfg.seed)
    train, validation, test = split if probes else (np.array([], dtype=int), *split)
    return Parts(
        np.asarray(groups), train, validation, test, np.random.default_rng(cfg.seed + 12345).permutation(len(groups))
    )


def _validation_fields(scores: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """The validation AUROC and its class counts: used to choose, so it needs no interval."""
    y = np.asarray(y).astype(bool)
    return {
        "validation_auroc": auroc(scores, y),
        "validation_auroc_n_pos": int(y.sum()),
        "validation_auroc_n_neg": int((~y).sum()),
    }


def class_counts(y: np.ndarray, parts: Parts) -> dict[str, dict[str, int]]:
    y = np.asarray(y).astype(bool)
    return {
        name: {"n_pos": int(y[rows].sum()), "n_neg": int((~y[rows]).sum())}
        for name, rows in (("train", parts.train), ("validation", parts.validation), ("test", parts.test))
    }


def _unscored(y: np.ndarray, parts: Parts, why: str) -> dict[str, Any]:
    """The fields of a readout flagged and not scored: NaN AUROCs beside the splits' class counts, and why."""
    y = np.asarray(y).astype(bool)
    test = y[parts.test]
    blank = Metric(float("nan"), float("nan"), float("nan"), int(test.sum()), int((~test).sum()), why)
    return {
        **_validation_fields(np.zeros(len(parts.validation)), y[parts.validation]),
        "validation_auroc": float("nan"),
        **blank.fields("auroc"),
        **blank.fields("control_shuffled_auroc"),
        **blank.fields("control_untrained_auroc"),
    }


def fixed_readout_row(
    scores: np.ndarray, untrained: np.ndarray | None, y: np.ndarray, parts: Parts, n_boot: int, seed: int
) -> dict[str, Any]:
    """A readout that fits nothing (a logit-lens readout): constant when its scores do not vary (feature_rank 0);
    else its validation AUROC, its test AUROC with a stratified entity interval, the same score against shuffled
    labels, and the untrained model's same readout."""
    y = np.asarray(y).astype(int)
    test, groups = parts.test, parts.groups[parts.test]
    if feature_rank(scores[:, None]) == 0:
        return {"constant": True, **_unscored(y, parts, "constant scores (the same for every row): not scored")}
    row: dict[str, Any] = {"constant": False, **_validation_fields(scores[parts.validation], y[parts.validation])}
    row |= auroc_ci(scores[test], y[test], groups, n_boot=n_boot, seed=seed).fields("auroc")
    row |= auroc_ci(scores[test], y[parts.shuffle][test], groups, n_boot=n_boot, seed=seed).fields(
        "control_shuffled_auroc"
    )
    row |= (
        auroc_ci(untrained[test], y[test], groups, n_boot=n_boot, seed=seed).fields("control_untrained_auroc")
        if untrained is not None
        else {"control_untrained_auroc": None}
    )
    return row


def probe_rows(X: Any, X_untrained: Any | None, y: np.ndarray, parts: Parts, cfg: Config) -> list[dict[str, Any]]:
    """A logistic and a small MLP probe fitted on the training persons, chosen on validation, reported on test,
    each beside the same probe on shuffled labels and on the untrained model's activations."""
    rows = []
    options = dict(
        groups=parts.groups,
        split=(parts.train, parts.test),
        n_bootstrap=cfg.n_boot,
        seed=cfg.seed,
        n_folds=cfg.probe_folds,
    )
    for kind in ("logistic", "mlp"):
        extra = dict(mlp_steps=cfg.mlp_steps, grid=cfg.mlp_decays) if kind == "mlp" else {}
        fitted = fit_probe(X, y, kind, **options, **extra)
        row: dict[str, Any] = {
            "readout": f"{kind} probe",
            "constant": fitted.constant,
            "feature_rank": fitted.feature_rank,
            "n_features": fitted.n_features,
            "regularization": None if fitted.constant else fitted.regularization,
        }
        if fitted.constant:
            rows.append(row | _unscored(y, parts, fitted.metrics["auroc"].why_no_interval))
            continue
        row |= _validation_fields(fitted.predict_scores(X[parts.validation]).numpy(), y[parts.validation])
        row |= fitted.metrics["auroc"].fields("auroc")
        shuffled = shuffled_control(X, y, kind, **options, **extra)
        row |= shuffled.metrics["auroc"].fields("control_shuffled_auroc")
        if X_untrained is None:
            row["control_untrained_auroc"] = None
        else:
            untrained_probe = fit_probe(X_untrained, y, kind, **options, **extra)
            row |= untrained_probe.metrics["auroc"].fields("control_untrained_auroc")
        row["test_scores"] = fitted.test_scores.numpy()
        rows.append(row)
    return rows


FAMILIES = {"logistic probes": ("logistic probe",), "mlp probes": ("mlp probe",)}


def judge(
    rows: list[dict[str, Any]],
    what: str,
    baseline: Metric,
    y: np.ndarray,
    parts: Parts,
    baseline_scores: np.ndarray,
    n_boot: int,
    seed: int,
) -> dict[str, Any]:
    """`judge_readouts` over every candidate, and the paired test-split difference between the baseline and the
    chosen readout (both score the same test rows, so the difference is resampled by entity, stratified)."""
    verdict = judge_readouts(rows, what, baseline)
    chosen = verdict["chosen"]
    if chosen is not None:
        row = next(r for r in rows if all(r.get(k) == chosen.get(k) for k in ("readout", "position", "layer")))
        test = parts.test
        labels = np.asarray(y).astype(int)[test]
        gap = bootstrap_ci(
            lambda b, c, l: auroc(b, l) - auroc(c, l),
            baseline_scores[test],
            row["test_scores"],
            labels,
            groups=parts.groups[test],
            strata=labels,
            n_boot=n_boot,
            seed=seed,
        )
        chosen |= {"baseline_minus_chosen_auroc": gap.value, "baseline_minus_chosen_auroc_ci95": gap.interval}
    return verdict


def judge_families(
    rows: list[dict[str, Any]],
    name: str,
    baseline: Metric,
    y: np.ndarray,
    parts: Parts,
    baseline_scores: np.ndarray,
    cfg: Config,
) -> dict[str, dict[str, Any]]:
    """The verdict over all candidates, then one per family of readouts (each chosen on validation within it)."""
    families = {
        "all readouts": None,
        **FAMILIES,
        "lens readouts": tuple(sorted({r["readout"] for r in rows if r["readout"].startswith("lens")})),
    }
    out = {}
    for family, kinds in families.items():
        subset = [r for r in rows if kinds is None or r["readout"] in kinds]
        if subset:
            what = name if kinds is None else f"{name}, {family}"
            out[family] = judge(subset, what, baseline, y, parts, baseline_scores, cfg.n_boot, cfg.seed)
    return out


def public_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows without their per-item test scores (kept only to pair the chosen readout with the baseline)."""
    return [{k: v for k, v in r.items() if k != "test_scores"} for r in rows]


# --------------------------------------------------------------------------------------------
# P(IK): which readouts of the residual stream predict a right answer, layer by layer
# --------------------------------------------------------------------------------------------
def residual_hooks(n_layers: int) -> list[str]:
    """The residual stream entering each layer, and after the last: layer l = 0..n_layers."""
    return [f"blocks.{layer}.hook_resid_pre" for layer in range(n_layers)] + [f"blocks.{n_layers - 1}.hook_resid_post"]


@torch.inference_mode()
def lens_readouts(
    model: HookedTransformer, setting: Setting, items: list[dict[str, Any]], slot: int
) -> dict[str, np.ndarray]:
    """Per layer and item ([layer, n]): the cloze confidence recomputed from that layer's logit lens, and the lens's
    top-token probability and negative entropy at the value slot."""
    world, pad_id = setting.world, setting.token("<pad>")
    prefixes = [setting.ids(statement_prefix(world, item["person"], item["attribute"])) for item in items]
    log_p = continuation_logprobs(
        model,
        [p for p in prefixes for _ in range(N_OPTIONS)],
        [setting.ids(o) for item in items for o in item["options"]],
        pad_id,
        lens=True,
    )
    cloze = softmax(log_p.reshape(log_p.shape[0], len(items), N_OPTIONS)).max(axis=-1)
    lens = logit_lens(model, right_padded(prefixes, pad_id))[:, :, slot].double()  # [layer, n, d_vocab]
    entropy = -(lens.exp() * lens).sum(-1)
    return {
        "lens cloze confidence": cloze,
        "lens top probability": lens.exp().amax(-1).numpy(),
        "lens negative entropy": (-entropy).numpy(),
    }


def lens_rows(
    readout: str,
    position: str,
    trained: np.ndarray | list[np.ndarray],
    untrained: np.ndarray | list[np.ndarray],
    hooks: list[str],
    y: np.ndarray,
    parts: Parts,
    cfg: Config,
) -> list[dict[str, Any]]:
    """One lens readout's rows, a layer each, from its scores ([layer, n]) on the trained model and on the untrained
    control: a candidate at every layer before the last, whose lens is the model's own output (shown, never
    chosen)."""
    return [
        {
            "layer": layer,
            "hook": hook,
            "readout": readout,
            "position": position,
            "candidate": layer < len(hooks) - 1,
            "regularization": None,
            **fixed_readout_row(trained[layer], untrained[layer], y, parts, cfg.n_boot, cfg.seed),
            "test_scores": trained[layer][parts.test],
        }
        for layer, hook in enumerate(hooks)
    ]


def p_ik(
    model: HookedTransformer, setting: Setting, items: list[dict[str, Any]], frame: pd.DataFrame, cfg: Config
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """P(IK) rows and their verdicts. Label: the cloze answer is right. Candidates: logistic and
    MLP probes on the residual stream at the last name token and at the value slot, and the logit-lens readouts of
    the layers before the last at the value slot. The last layer's lens readouts are the model's own output —
    its lens cloze confidence *is* the baseline — so they are shown beside it and never chosen."""
    world = setting.world
    persons = frame["person"].to_numpy()
    y = frame["correct"].to_numpy().astype(int)
    prefixes = [setting.ids(statement_prefix(world, int(p), setting.attribute)) for p in persons]
    if len({len(p) for p in prefixes}) != 1:
        raise ValueError("every cloze prompt must have the same length (fixed probe positions)")
    tokens = torch.tensor(prefixes)
    name_pos = len(setting.ids("<bos> " + world.persons[int(persons[0])].name)) - 1
    slot = tokens.shape[1] - 1
    parts = make_parts(persons, cfg)
    hooks = residual_hooks(model.cfg.n_layers)
    untrained = random_model(model, seed=cfg.seed + 1)
    acts = {
        name: collect_activations(m, tokens, hooks, positions=[name_pos, slot], progress=False)
        for name, m in (("trained", model), ("untrained", untrained))
    }
    rows: list[dict[str, Any]] = []
    for layer, hook in enumerate(hooks):
        for position, index in (("last name token", name_pos), ("value slot", slot)):
            X = {name: a[hook][a.pos == index] for name, a in acts.items()}
            for row in probe_rows(X["trained"], X["untrained"], y, parts, cfg):
                rows.append({"layer": layer, "hook": hook, "position": position, "candidate": True, **row})
    readouts = {
        name: lens_readouts(m, setting, items, slot) for name, m in (("trained", model), ("untrained", untrained))
    }
    for readout, scores in readouts["trained"].items():
        rows += lens_rows(readout, "value slot", scores, readouts["untrained"][readout], hooks, y, parts, cfg)
    confidence = frame["confidence"].to_numpy()
    baseline = auroc_ci(confidence[parts.test], y[parts.test], persons[parts.test], n_boot=cfg.n_boot, seed=cfg.seed)
    verdicts = judge_families(rows, "P(IK)", baseline, y, parts, confidence, cfg)
    info = {
        **baseline.fields("p_ik_baseline_auroc"),
        "n_rows": len(y),
        "class_counts": class_counts(y, parts),
        "share_correct": float(y.mean()),
        "positions": {"last name token": name_pos, "value slot": slot},
        "verdicts": verdicts,
    }
    return public_rows(rows), info


def p_ik_summary(verdicts: dict[str, dict[str, Any]]) -> list[str]:
    """The verdicts' sentences: over every candidate first, then per family of readouts."""
    return [v["sentence"] for v in verdicts.values()]
