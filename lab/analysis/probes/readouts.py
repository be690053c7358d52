"""Controls and verdicts: the same probe on shuffled labels, a randomly initialised model of the same shape,
and the choice of a readout on the validation split judged on the test split against both controls
(`judge_readouts`, docs/definitions.md §5), with the model's own confidence beside it as the baseline."""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from torch import Tensor

from lab.analysis.probes.fitting import Kind
from lab.analysis.probes.probe import ProbeResult, fit_probe
from lab.metrics.discrimination import MIN_PER_CLASS, Metric
from lab.model.transformer import HookedTransformer


def shuffled_control(X: Any, y: Any, kind: Kind = "logistic", *, seed: int = 0, **options: Any) -> ProbeResult:
    """The same probe fitted and scored on labels permuted across rows: what chance looks like here."""
    y = np.asarray(y.detach().cpu() if isinstance(y, Tensor) else y)
    permuted = y[np.random.default_rng(seed + 12345).permutation(len(y))]
    return fit_probe(X, permuted, kind, seed=seed, **options)


def random_model(model: Any, seed: int = 1) -> Any:
    """A randomly initialised model of the same shape (same config and tokenizer, fresh weights), eval mode."""
    if not isinstance(model, HookedTransformer):
        raise TypeError(f"random_model needs a HookedTransformer, got {type(model).__name__}")
    device = model.W_E.device
    return HookedTransformer(model.cfg, seed=seed, tokenizer=model.tokenizer).to(device).eval()


# --------------------------------------------------------------------------------------------
# Choosing a readout on validation, judging it on test
# --------------------------------------------------------------------------------------------
VERDICTS = ("carries the signal", "no signal beyond its controls", "not enough data", "nothing to score", "no verdict")


def metric_of(row: Mapping[str, Any], key: str) -> Metric | None:
    """The Metric a row carries under `key` (Metric.fields' layout), or None when the row has none."""
    if row.get(key) is None:
        return None
    interval = row.get(f"{key}_ci95")
    low, high = interval if interval else (float("nan"), float("nan"))
    return Metric(
        float(row[key]),
        float(low),
        float(high),
        row.get(f"{key}_n_pos"),
        row.get(f"{key}_n_neg"),
        row.get(f"{key}_why_no_interval"),
    )


def _name(row: Mapping[str, Any]) -> str:
    return f"{row['readout']} at the {row['position']}, layer {row['layer']}"


def judge_readouts(
    rows: Sequence[Mapping[str, Any]], what: str, baseline: Metric | None = None, min_per_class: int = MIN_PER_CLASS
) -> dict[str, Any]:
    """Choose the readout with the highest validation AUROC among the candidates and judge it on the test split.

    Each row: readout, position, layer, candidate (False for the baseline's own family, which is reported
    beside, never chosen), constant (flagged, not scored), validation_auroc (+ _n_pos, _n_neg), auroc on
    the test split (+ _ci95, _n_pos, _n_neg, _why_no_interval), and the same for control_shuffled_auroc and
    control_untrained_auroc (None when no untrained model could be built). Verdicts (VERDICTS):
    "carries the signal" when the chosen readout's test interval lies wholly above both controls'
    intervals; "no signal beyond its controls" otherwise; "not enough data" when the validation split
    holds fewer than `min_per_class` of either class, or the chosen readout or a control has no interval
    (too few of a class in the test split); "nothing to score" when every candidate is constant; "no
    verdict" when the untrained-model control is missing. The sentence says which, and why, in words.
    """
    out: dict[str, Any] = {
        "what": what,
        "min_per_class": min_per_class,
        "chosen": None,
        "baseline": None if baseline is None else baseline.fields("auroc"),
    }
    base = "" if baseline is None else f" Baseline (the model's own confidence, not a candidate): {baseline}"

    def verdict(name: str, sentence: str, carries: bool | None) -> dict[str, Any]:
        compare = ""
        if baseline is not None and out["chosen"] is not None and np.isfinite(baseline.value):
            side = "above" if baseline.value > out["chosen"]["auroc"] else "not above"
            compare = f" — its estimate is {side} the chosen readout's"
        tail = f"{base}{compare}." if base else ""
        return out | {"verdict": name, "carries_signal": carries, "sentence": f"{what}: {sentence}.{tail}"}

    scored = [r for r in rows if r.get("candidate", True) and not r.get("constant", False)]
    flagged = sum(1 for r in rows if r.get("candidate", True) and r.get("constant", False))
    out["n_candidates"], out["n_constant"] = len(scored), flagged
    too_few = _too_few(rows, min_per_class)
    if too_few is not None:
        return verdict("not enough data", too_few, None)
    if not scored:
        return verdict(
            "nothing to score", f"nothing to score — every candidate readout ({flagged}) has constant features", None
        )
    chosen = max(scored, key=lambda r: np.nan_to_num(r["validation_auroc"], nan=-1.0))
    test = metric_of(chosen, "auroc")
    shuffled = metric_of(chosen, "control_shuffled_auroc")
    untrained = metric_of(chosen, "control_untrained_auroc")
    out["chosen"] = _chosen_fields(chosen, test, shuffled, untrained)
    return verdict(*_judgement(chosen, test, shuffled, untrained, out["chosen"]))


def _too_few(rows: Sequence[Mapping[str, Any]], min_per_class: int) -> str | None:
    """The sentence for a validation split with fewer than min_per_class of either class; None when it has enough
    (or says nothing of its counts)."""
    if not rows:
        return None
    n_pos, n_neg = rows[0].get("validation_auroc_n_pos"), rows[0].get("validation_auroc_n_neg")
    if n_pos is None or min(n_pos, n_neg) >= min_per_class:
        return None
    return (
        f"not enough data — the validation split holds {n_pos} right and "
        f"{n_neg} wrong answers; choosing a readout and judging it needs at least {min_per_class} "
        f"of each in the validation and in the test split"
    )


def _chosen_fields(
    chosen: Mapping[str, Any], test: Metric, shuffled: Metric | None, untrained: Metric | None
) -> dict[str, Any]:
    """The chosen readout as the report gives it: where it reads, its validation AUROC, its test and control
    AUROCs."""
    return {k: chosen[k] for k in ("readout", "position", "layer") if k in chosen} | {
        **{k: chosen.get(k) for k in ("validation_auroc", "validation_auroc_n_pos", "validation_auroc_n_neg")},
        **test.fields("auroc"),
        **(shuffled.fields("control_shuffled_auroc") if shuffled else {}),
        **(untrained.fields("control_untrained_auroc") if untrained else {"control_untrained_auroc": None}),
    }


def _judgement(
    chosen: Mapping[str, Any],
    test: Metric,
    shuffled: Metric | None,
    untrained: Metric | None,
    fields: dict[str, Any],
) -> tuple[str, str, bool | None]:
    """(verdict, sentence, carries the signal) of the chosen readout against its controls; the margin over them
    goes into its `fields` when there is one."""
    said = (
        f"{_name(chosen)} (chosen on the validation split, AUROC {chosen['validation_auroc']:.3f}) scores "
        f"{test} on the test split; shuffled labels {shuffled}; untrained model "
        f"{untrained if untrained else 'not run'}"
    )
    refused = [m.why_no_interval for m in (test, shuffled, untrained) if m is not None and m.why_no_interval]
    if refused:
        return "not enough data", f"not enough data — {refused[0]}; {said}", None
    if untrained is None:
        return "no verdict", f"no verdict — there is no untrained-model control; {said}", None
    margin = test.low - max(shuffled.high, untrained.high)
    fields["margin_over_controls"] = margin
    if margin > 0:
        return (
            "carries the signal",
            f"carries the signal — {said}: its interval lies above both controls' by {margin:.3f}",
            True,
        )
    return (
        "no signal beyond its controls",
        f"no signal beyond its controls — {said}: its interval does not clear both controls' intervals",
        False,
    )
