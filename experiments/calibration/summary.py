"""Issue 7's acceptance, checked on the results themselves, and the headlines: what a run supports, in words,
with the direction a smaller profile must agree on."""

import math
from typing import Any

from experiments.calibration.config import N_OPTIONS
from lab.metrics.discrimination import MIN_PER_CLASS


# --------------------------------------------------------------------------------------------
# Acceptance, checked on the results themselves
# --------------------------------------------------------------------------------------------
def eces_without_interval(results: Any, where: str = "results") -> list[str]:
    """Every ECE in the results that lacks its `_ci95` interval, its `noise_floor_` or its `_debiased` estimate."""
    missing = []
    if isinstance(results, dict):
        for key, value in results.items():
            if (
                key.startswith("ece")
                and isinstance(value, float)
                and not key.endswith(("_p95", "_debiased"))
                and not all(k in results for k in (f"{key}_ci95", f"noise_floor_{key}", f"{key}_debiased"))
            ):
                missing.append(f"{where}.{key}")
            missing += eces_without_interval(value, f"{where}.{key}")
    elif isinstance(results, list):
        for index, value in enumerate(results):
            missing += eces_without_interval(value, f"{where}[{index}]")
    return missing


def aurocs_without_counts(results: Any, where: str = "results") -> list[str]:
    """Every AUROC in the results without its class counts (`_n_pos`, `_n_neg`) beside it."""
    missing = []
    if isinstance(results, dict):
        for key, value in results.items():
            if (
                "auroc" in key
                and isinstance(value, float)
                and math.isfinite(value)
                and "minus" not in key
                and not (f"{key}_n_pos" in results and f"{key}_n_neg" in results)
            ):
                missing.append(f"{where}.{key}")
            missing += aurocs_without_counts(value, f"{where}.{key}")
    elif isinstance(results, list):
        for index, value in enumerate(results):
            missing += aurocs_without_counts(value, f"{where}[{index}]")
    return missing


def acceptance(results: dict[str, Any]) -> dict[str, Any]:
    """Issue 7's acceptance, measured at the partial checkpoint and at the end of training."""
    checks: dict[str, Any] = {}
    for name, blocks in (("partial", results), ("end", results["at_end"])):
        rows = blocks["mc"]["by_exposure"]
        accuracy = [r["accuracy"] for r in rows]
        unseen = next((r for r in rows if r["exposure"] == "0"), None)
        band = None if unseen is None else 2 * math.sqrt(0.25 * 0.75 / unseen["n"])  # ≈95% binomial band at chance
        checks[name] = {
            "cloze_accuracy_by_exposure": dict(zip([r["exposure"] for r in rows], accuracy)),
            "cloze_accuracy_rises_with_exposure": all(b >= a for a, b in zip(accuracy, accuracy[1:])),
            "exposure_0_near_chance": unseen is not None and abs(unseen["accuracy"] - 1 / N_OPTIONS) <= band,
            "exposure_0_chance_band": band,
            "temperature_does_not_raise_test_nll": blocks["temperature"]["nll_after"]
            <= blocks["temperature"]["nll_before"] + 1e-12,
            "p_ik_verdict": blocks["p_ik_verdict"]["verdict"],
            "p_ik_chosen": blocks["p_ik_verdict"]["chosen"],
            "p_true_verdict": blocks["p_true"]["layers"]["verdict"]["verdict"],
        }
    checks["eces_without_interval_or_floor"] = eces_without_interval(results)
    checks["every_ece_has_interval_and_floor"] = not checks["eces_without_interval_or_floor"]
    checks["aurocs_without_counts"] = aurocs_without_counts(results)
    checks["every_auroc_has_counts"] = not checks["aurocs_without_counts"]
    return checks


# --------------------------------------------------------------------------------------------
# Headlines: what a run supports, in words, with the direction a smaller profile must agree on
# --------------------------------------------------------------------------------------------
def _headline(
    name: str,
    sentence: str,
    value: float | None,
    interval: list[float] | None,
    direction: bool | int | None,
    why_not: str | None = None,
) -> dict[str, Any]:
    supported = why_not is None
    return {
        "name": name,
        "sentence": sentence,
        "value": value,
        "interval": interval,
        "direction": direction if supported else None,
        "supported": supported,
        "why_not": why_not,
    }


def signed_headline(
    name: str, value: float, interval: list[float] | None, null: float, up: str, down: str, what: str
) -> dict[str, Any]:
    """A headline whose direction is the side of `null` its 95% interval lies on; none when it straddles."""
    if interval is None or not all(map(math.isfinite, interval)):
        return _headline(name, up, value, None, None, f"{what}: no interval, so no direction")
    if interval[0] <= null <= interval[1]:
        return _headline(
            name,
            up,
            value,
            interval,
            None,
            f"{what}: its 95% interval [{interval[0]:.3f}, "
            f"{interval[1]:.3f}] includes {null:g}, so this run cannot tell the direction",
        )
    up_side = interval[0] > null
    return _headline(name, up if up_side else down, value, interval, 1 if up_side else -1)


def _wald(p: float, n: int) -> float:
    return 1.96 * math.sqrt(max(p * (1 - p), 0.0) / n)


def _wilson(p: float, n: int) -> list[float]:
    """Wilson's 95% interval for a proportion (Wilson 1927): sound near 0 and 1, where Wald's collapses."""
    z = 1.96
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [centre - half, centre + half]


# "At chance" is said only when the never-seen persons' 95% interval lies within chance ± this: an interval that
# merely contains chance is what any small sample gives, and would let the claim stand whatever the model does.
CHANCE_MARGIN = 0.1


def _exposure_gap_headline(rows: dict[str, Any], name: str, described: str) -> dict[str, Any]:
    """Cloze accuracy of persons seen at least twice against never-seen persons (Wald 95% on the difference)."""
    unseen = rows.get("0")
    seen = [rows[k] for k in ("2-5", "6+") if k in rows]
    n_seen = sum(r["n"] for r in seen)
    if unseen is None or unseen["n"] < MIN_PER_CLASS or n_seen < MIN_PER_CLASS:
        return _headline(
            name,
            "Cloze accuracy by exposure",
            None,
            None,
            None,
            f"fewer than {MIN_PER_CLASS} never-seen or often-seen evaluation persons",
        )
    a0, a1 = unseen["accuracy"], sum(r["accuracy"] * r["n"] for r in seen) / n_seen
    half = math.sqrt(_wald(a0, unseen["n"]) ** 2 + _wald(a1, n_seen) ** 2)
    text = (
        f"persons seen at least twice are answered right {a1:.0%} of the time, never-seen persons {a0:.0%} "
        f"(difference {a1 - a0:+.2f}, Wald 95% [{a1 - a0 - half:+.2f}, {a1 - a0 + half:+.2f}], {described})"
    )
    return signed_headline(
        name,
        a1 - a0,
        [a1 - a0 - half, a1 - a0 + half],
        0.0,
        f"Cloze accuracy rises with exposure: {text}.",
        f"Cloze accuracy falls with exposure: {text}.",
        "the accuracy gap between often-seen and never-seen persons",
    )


def _never_seen_at_chance_headline(unseen: dict[str, Any]) -> dict[str, Any]:
    """Are never-seen persons answered at chance? Supported either way only when the Wilson interval says so
    (outside chance, or within chance ± CHANCE_MARGIN)."""
    low, high = _wilson(unseen["accuracy"], unseen["n"])
    chance = 1 / N_OPTIONS
    text = f"{unseen['accuracy']:.0%} right of {unseen['n']} (Wilson 95% [{low:.0%}, {high:.0%}]), chance {chance:.0%}"
    if not low <= chance <= high:
        return _headline(
            "never_seen_at_chance",
            f"Never-seen persons are not answered at chance: {text}.",
            unseen["accuracy"],
            [low, high],
            False,
        )
    if chance - CHANCE_MARGIN <= low and high <= chance + CHANCE_MARGIN:
        return _headline(
            "never_seen_at_chance",
            f"Never-seen persons are answered at chance: {text}, within chance ± {CHANCE_MARGIN:g}.",
            unseen["accuracy"],
            [low, high],
            True,
        )
    return _headline(
        "never_seen_at_chance",
        f"Never-seen persons: {text}.",
        unseen["accuracy"],
        [low, high],
        None,
        f"the interval contains chance but reaches beyond chance ± "
        f"{CHANCE_MARGIN:g}: too few never-seen persons to call it chance",
    )


def _never_seen_overconfident_headline(unseen: dict[str, Any]) -> dict[str, Any]:
    """Confidence against accuracy on never-seen persons."""
    # the per-item gap confidence − correctness: its mean and standard error carry both sides' noise
    gap, half = unseen["overconfidence"], 1.96 * unseen["overconfidence_se"]
    text = (
        f"mean confidence {unseen['mean_confidence']:.2f} against accuracy {unseen['accuracy']:.2f} "
        f"(gap {gap:+.2f}, 95% [{gap - half:+.2f}, {gap + half:+.2f}] over {unseen['n']} persons)"
    )
    return signed_headline(
        "never_seen_overconfident",
        gap,
        [gap - half, gap + half],
        0.0,
        f"Never-seen persons get confident inventions: {text}.",
        f"On never-seen persons the model is underconfident: {text}.",
        "the confidence gap on never-seen persons",
    )


def _exposure_headlines(block: dict[str, Any], where: str, described: str) -> list[dict[str, Any]]:
    """Accuracy by exposure at one checkpoint (`where`: "end" or "partial", described in the sentence as
    `described`), and at the end the never-seen persons' accuracy and confidence."""
    rows = {r["exposure"]: r for r in block["by_exposure"]}
    out = [_exposure_gap_headline(rows, f"accuracy_rises_with_exposure_{where}", described)]
    unseen = rows.get("0")
    if where == "end" and unseen is not None and unseen["n"] >= MIN_PER_CLASS:
        out += [_never_seen_at_chance_headline(unseen), _never_seen_overconfident_headline(unseen)]
    return out


def _ece_headline(name: str, what: str, block: dict[str, Any], key: str) -> dict[str, Any]:
    """Miscalibration beyond noise (the ECE's interval above a calibrated model's 95th-percentile ECE), or
    calibration within noise (the interval below it); otherwise no direction."""
    value, interval = block[key], block.get(f"{key}_ci95")
    floor, p95 = block[f"noise_floor_{key}"], block[f"noise_floor_{key}_p95"]
    text = (
        f"ECE {value:.3f}"
        + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "")
        + f", debiased {block[f'{key}_debiased']:.3f}, against a calibrated model's {floor:.3f} "
        f"(95th percentile {p95:.3f}) at n = {block.get('n', block.get('n_tokens'))}"
    )
    if not interval:
        return _headline(name, f"{what}: {text}.", value, None, None, "no interval for the ECE")
    if interval[0] > p95:
        return _headline(name, f"{what} is miscalibrated beyond noise: {text}.", value, interval, 1)
    if interval[1] < p95:
        return _headline(name, f"{what} is calibrated within noise: {text}.", value, interval, -1)
    return _headline(
        name,
        f"{what}: {text}.",
        value,
        interval,
        None,
        f"the ECE's interval [{interval[0]:.3f}, {interval[1]:.3f}] straddles the noise floor's 95th "
        f"percentile {p95:.3f}: this run cannot tell miscalibration from noise",
    )


def _temperature_headlines(block: dict[str, Any]) -> list[dict[str, Any]]:
    T, interval = block["T"], block.get("T_ci95")
    eces = "; ".join(
        f"{label} ECE {block[f'{key}_before']:.3f} → {block[f'{key}_after']:.3f}"
        for key, label in (("ece_15_equal_width", "15-bin equal-width"), ("ece_10_equal_mass", "10-bin equal-mass"))
    )
    return [
        signed_headline(
            "temperature_above_1",
            T,
            interval,
            1.0,
            f"The model is overconfident: the NLL-fitted temperature is T = {T:.2f}"
            + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "")
            + " > 1.",
            f"The model is underconfident: the NLL-fitted temperature is T = {T:.2f} < 1.",
            "the fitted temperature",
        ),
        signed_headline(
            "temperature_lowers_test_nll",
            block["nll_decrease"],
            block.get("nll_decrease_ci95"),
            0.0,
            f"Temperature scaling lowers the test NLL from {block['nll_before']:.3f} to {block['nll_after']:.3f} "
            f"nats ({eces}; accuracy unchanged).",
            f"Temperature scaling raises the test NLL from {block['nll_before']:.3f} to {block['nll_after']:.3f} "
            f"nats ({eces}).",
            "the test NLL's change under temperature scaling",
        ),
    ]


def verdict_headline(name: str, verdict: dict[str, Any] | None, where: str = "") -> dict[str, Any]:
    """A verdict as a headline; its direction: whether the chosen readout carries the signal. True needs the
    verdict's own rule (the test interval clear of both controls' intervals). False needs the interval to reach
    a control's estimate — consistent with no signal; an interval above both estimates yet not clear of their
    intervals is too wide to tell either way, and is not shown. "not enough data", "nothing to score" and "no
    verdict" are not shown, with the verdict's own sentence as the reason."""
    if verdict is None:
        return _headline(name, "", None, None, None, "not measured in this run")
    chosen = verdict.get("chosen") or {}
    value, interval = chosen.get("auroc"), chosen.get("auroc_ci95")
    sentence = verdict["sentence"] + where
    if verdict["carries_signal"] is None:
        return _headline(name, sentence, value, interval, None, sentence)
    if verdict["carries_signal"]:
        return _headline(name, sentence, value, interval, True)
    controls = max(chosen["control_shuffled_auroc"], chosen["control_untrained_auroc"])
    if interval[0] > controls:
        return _headline(
            name,
            sentence,
            value,
            interval,
            None,
            f"{verdict['what']}: the chosen readout's interval [{interval[0]:.3f}, {interval[1]:.3f}] lies "
            f"above both controls' estimates (up to {controls:.3f}) but not clear of their intervals — "
            "too few items to tell signal from its absence",
        )
    return _headline(name, sentence, value, interval, False)


def _baseline_headline(name: str, blocks: dict[str, Any], what: str) -> dict[str, Any]:
    value, interval = blocks.get("p_ik_baseline_auroc"), blocks.get("p_ik_baseline_auroc_ci95")
    if value is None:
        return _headline(name, "", None, None, None, "not measured in this run")
    counts = (
        f"{blocks.get('p_ik_baseline_auroc_n_pos')} right and {blocks.get('p_ik_baseline_auroc_n_neg')} wrong "
        "answers on the test split"
    )
    if interval is None:
        return _headline(name, "", value, None, None, f"{what}: {blocks.get('p_ik_baseline_auroc_why_no_interval')}")
    text = f"AUROC {value:.3f} [{interval[0]:.3f}, {interval[1]:.3f}] ({counts})"
    return signed_headline(
        name,
        value,
        interval,
        0.5,
        f"{what} separates right from wrong answers: {text}.",
        f"{what} ranks wrong answers above right ones: {text}.",
        "the baseline's AUROC",
    )


def _lettered_transfer_headline(end: dict[str, Any]) -> dict[str, Any]:
    """Cloze against lettered accuracy on the evaluation persons: does the lettered format, trained on other
    persons, transfer to them?"""
    cloze, lettered = end["mc"], end["lettered"]
    gap = cloze["accuracy"] - lettered["accuracy"]
    half = math.sqrt(_wald(cloze["accuracy"], cloze["n"]) ** 2 + _wald(lettered["accuracy"], lettered["n"]) ** 2)
    text = (
        f"on the evaluation persons cloze multiple choice is answered {cloze['accuracy']:.0%} right, the lettered "
        f"quiz — a format trained on other persons — {lettered['accuracy']:.0%} (chance 25%) at mean confidence "
        f"{lettered['mean_confidence']:.2f}"
    )
    return signed_headline(
        "lettered_does_not_transfer",
        gap,
        [gap - half, gap + half],
        0.0,
        f"Lettered multiple choice does not transfer: {text}.",
        f"Lettered multiple choice beats cloze: {text}.",
        "the cloze − lettered accuracy gap",
    )


def _linear_probe_headlines(linear: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The logistic probes' verdict, and the model's own confidence against the best of them when it was chosen."""
    out = [verdict_headline("linear_probe_verdict", linear)]
    chosen = (linear or {}).get("chosen") or {}
    if chosen.get("baseline_minus_chosen_auroc") is not None:
        value, interval = chosen["baseline_minus_chosen_auroc"], chosen.get("baseline_minus_chosen_auroc_ci95")
        where = f"{chosen['readout']} at the {chosen['position']}, layer {chosen['layer']}"
        out.append(
            signed_headline(
                "own_confidence_beats_linear_probes",
                value,
                interval,
                0.0,
                f"The model's own confidence beats the best linear probe ({where}, chosen on validation) "
                f"by {value:.3f} AUROC on the test persons"
                + (f" [{interval[0]:.3f}, {interval[1]:.3f}]." if interval else "."),
                f"The best linear probe ({where}) beats the model's own confidence by {-value:.3f} AUROC.",
                "the AUROC gap between the model's own confidence and the best linear probe",
            )
        )
    return out


def headlines(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's headlines, a pure function of the rest of results.json. Each is {name, sentence, value, interval,
    direction, supported, why_not}: a supported one is shown with its sentence; an unsupported one is not shown —
    its why_not says in words what this run cannot support (too few items, an interval that straddles the null,
    a verdict of "not enough data"). `direction` (a bool or ±1) is what a smaller profile must agree on."""
    if "at_end" not in results:  # --model PATH --mmlu FILE: lettered multiple choice of a local model
        return [
            _ece_headline(
                "lettered_ece_beyond_noise", "Lettered multiple choice", results["lettered"], "ece_15_equal_width"
            ),
            *_temperature_headlines(results["temperature"]),
            _baseline_headline("own_confidence_separates", results, "The model's own lettered confidence"),
            verdict_headline("p_ik_verdict", results.get("p_ik_verdict")),
        ]
    end = results["at_end"]
    training = results.get("training") or {}
    partial = (
        f"at the partial checkpoint, step {training.get('partial_step')}, chosen on the recall of the format "
        f"persons, who are not evaluated"
    )
    out = _exposure_headlines(end["mc"], "end", "at the end of training") + _exposure_headlines(
        results["mc"], "partial", partial
    )
    out.append(
        _ece_headline(
            "cloze_ece_beyond_noise", "Cloze multiple choice at the end of training", end["mc"], "ece_15_equal_width"
        )
    )
    out.append(_lettered_transfer_headline(end))
    out += _temperature_headlines(end["temperature"])
    out.append(_baseline_headline("own_confidence_separates", end, "The model's own cloze confidence"))
    verdicts = end.get("p_ik_verdicts", {})
    out.append(verdict_headline("p_ik_verdict", verdicts.get("all readouts")))
    out.append(
        verdict_headline(
            "p_ik_verdict_partial", results.get("p_ik_verdicts", {}).get("all readouts"), f" (P(IK) {partial}.)"
        )
    )
    out += _linear_probe_headlines(verdicts.get("logistic probes"))
    out.append(verdict_headline("p_true_verdict", end["p_true"]["layers"]["verdict"]))
    token = results.get("token_level")
    if token:
        out.append(
            _ece_headline(
                "token_level_ece_beyond_noise",
                "Next-token prediction of held-out English by the pydoc model",
                token,
                "ece",
            )
        )
    return out
