"""The headlines: what a run supports, in words, with the direction a smaller profile must agree on."""

import math
from typing import Any

from experiments.monitor.config import ERROR_KINDS
from lab.names import name as display
from lab.runs import headline


# --------------------------------------------------------------------------------------------
# Headlines
# --------------------------------------------------------------------------------------------
def auroc_headline(name: str, what: str, block: dict[str, Any], sign: int) -> dict[str, Any]:
    """Whether a signal separates false claims from right ones: supported when its familywise interval (every
    separation claim of the run at once, `familywise_level`; DeLong's, which needs no resamples at that level)
    excludes ½. The direction is which way the signal's
    raw value points to a false claim (sign · (AUROC > ½))."""
    value, interval = block.get("auroc"), block.get("auroc_ci95")
    joint, level = block.get("auroc_familywise_ci"), block.get("auroc_familywise_level")
    counts = f"{block.get('auroc_n_pos')} false and {block.get('auroc_n_neg')} right claims"
    claim = f"{what} separates false claims from right ones."  # shown only when supported
    if value is None or not math.isfinite(value):
        return headline(name, claim, None, None, 0, False, f"{what}: no AUROC ({counts} on the test split)")
    if interval is None or joint is None or any(not math.isfinite(x) for x in (*interval, *joint)):
        why = (
            block.get("auroc_why_no_interval") or "no familywise interval (the run was made before Forma computed one)"
        )
        return headline(name, claim, value, None, 0, False, f"{what}: {why}")
    text = (
        f"AUROC {value:.3f}, 95% [{interval[0]:.3f}, {interval[1]:.3f}] (stratified bootstrap), {level:.1%} "
        f"familywise [{joint[0]:.3f}, {joint[1]:.3f}] (DeLong), {counts} on the test split"
    )
    if joint[0] <= 0.5 <= joint[1]:
        return headline(
            name,
            claim,
            value,
            joint,
            0,
            False,
            f"{what}: the familywise interval straddles ½ ({text}), so no direction is shown",
        )
    points = sign if value > 0.5 else -sign
    return headline(
        name,
        f"{what} {'rises' if points > 0 else 'falls'} with the risk of a false claim ({text}).",
        value,
        joint,
        points,
    )


def share(x: float) -> str:
    """A share as measured, to two significant figures: 0.23%, 4.5%, 42% (0 only when it is 0)."""
    return "0%" if x == 0 else f"{100 * x:.2g}%" if x < 0.995 else f"{100 * x:.3g}%"


def _range(values: list[float] | None) -> str:
    return f"; the draws' 90% range [{values[0]:.3f}, {values[1]:.3f}]" if values else ""


def _crc_headline(entry: dict[str, Any]) -> dict[str, Any]:
    """CRC promises E[answered and false] ≤ α over the calibration draw: the mean over re-draws of the calibration
    subjects, ± 1.96 standard errors, must not lie above α (a test that fails when the mean exceeds α by more than
    its noise)."""
    alpha, again = entry["alpha"], entry["resplits"]
    mean, band = again["crc_joint_risk"], again["crc_joint_risk_ci95"]
    selective = again["crc_selective_risk"]
    kept = band[0] <= alpha
    sentence = (
        f"Conformal risk control at α = {alpha:g} on {display(entry['signal'])}, over {again['n_resplits']} draws of "
        f"the calibration subjects: answered and false {mean:.3f} of the test prompts (mean, 95% "
        f"[{band[0]:.3f}, {band[1]:.3f}]{_range(again.get('crc_joint_risk_range90'))}; "
        f"{'within' if kept else 'above'} α) at coverage {share(again['crc_coverage'])}; "
        + (
            f"the error rate among those answers is {selective:.3f} (CRC promises nothing about it)."
            if selective is not None
            else "no draw answered anything."
        )
    )
    return headline(
        f"crc_keeps_joint_risk_alpha_{alpha:g}",
        sentence,
        mean,
        band,
        kept,
        kept,
        None if kept else f"the joint rate's mean lies above α: {sentence}",
    )


def _ltt_headline(entry: dict[str, Any]) -> dict[str, Any]:
    """LTT promises P(error rate among answers > α) ≤ δ, a draw that certifies nothing counting as kept. Its check —
    the share of re-draws whose test answers are false more often than α, within δ + 3 binomial standard errors —
    can fail only when more draws answer than δ + that slack: a rule that answers in fewer draws keeps the promise
    by abstaining, whatever its answers are, and is not shown. What the answering draws do is said beside it."""
    alpha, ltt, again = entry["alpha"], entry["ltt"], entry["resplits"]
    name, delta, n = f"ltt_keeps_selective_risk_alpha_{alpha:g}", ltt["delta"], again["n_resplits"]
    claim = f"Learn then Test keeps the error rate among answers at α = {alpha:g} (δ = {delta:g})."
    answering, above, share_above = again["ltt_n_answering"], again["ltt_n_above_alpha"], again["ltt_share_above_alpha"]
    if not again["ltt_n_certifying"]:
        return headline(
            name,
            claim,
            None,
            None,
            0,
            False,
            f"Learn then Test certified no threshold at α = {alpha:g} (δ = {delta:g}) in any of {n} draws "
            f"of the calibration subjects: the smallest p-value over the grid was "
            f"{again['ltt_smallest_p_value']:.3g} (median over the draws "
            f"{again['ltt_smallest_p_value_median']:.3g}), above δ, so it answers nothing",
        )
    slack = 3 * math.sqrt(delta * (1 - delta) / n)  # three binomial standard errors of a share of n draws
    answers = (
        f"it certifies a threshold in {again['ltt_n_certifying']} and answers in {answering} of {n} draws of "
        f"the calibration subjects, covering {share(again['ltt_coverage'])} of the test prompts on average "
        f"over all draws"
    )
    if answering:
        answers += (
            f" and {share(again['ltt_coverage_answering'])} over the draws that answer; among their answers "
            f"the error rate is {again['ltt_selective_risk']:.3f} (mean over those draws; "
            f"{again['ltt_pooled_selective_risk']:.3f} pooled), above α in {above} of {answering} draws"
        )
    if answering / n <= delta + slack:
        return headline(
            name,
            claim,
            share_above,
            None,
            0,
            False,
            f"Learn then Test at α = {alpha:g}, δ = {delta:g}: {answers}. Its promise counts a draw that "
            f"answers nothing as kept, so with answers in at most δ + {slack:.2f} of the draws the check "
            f"(share of draws above α ≤ δ + {slack:.2f}) cannot fail: the promise is kept by abstaining",
        )
    kept = share_above <= delta + slack
    sentence = (
        f"Learn then Test at α = {alpha:g}, δ = {delta:g}: {answers}; the share of all draws whose test "
        f"answers exceed α is {share(share_above)} ({'within' if kept else 'beyond'} δ + {slack:.2f}, a draw "
        f"that answers nothing counting as kept)."
    )
    return headline(name, sentence, share_above, None, kept, kept, None if kept else sentence)


def headlines(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's headlines, a pure function of the rest of results.json: {name, sentence, value, interval, direction,
    supported, why_not}; `direction` is what the quick profile must share with the default one."""
    out = []
    signals = {row["signal"]: row for row in results["signals"]}
    for name, row in signals.items():
        out.append(auroc_headline(f"{name}_separates", f"The signal {display(name)}", row, row["sign"]))
    own = signals.get("max_prob")
    if own:
        for kind, block in own["by_kind"].items():
            out.append(
                auroc_headline(
                    f"max_prob_separates_{kind}",
                    f"{display('max_prob')[:1].upper()}{display('max_prob')[1:]}, against the {ERROR_KINDS[kind]},",
                    block,
                    own["sign"],
                )
            )
    for entry in results["abstention"]:
        if entry["signal"] != results["abstention_signal"]:
            continue
        out.append(_crc_headline(entry))
        out.append(_ltt_headline(entry))
    for entry in results.get("abstention_unavailable", []):  # too few calibration prompts for that α
        out.append(
            headline(
                f"abstention_alpha_{entry['alpha']:g}",
                f"Abstention keeps its promise at α = {entry['alpha']:g}.",
                None,
                None,
                0,
                False,
                f"No abstention rule is scored at α = {entry['alpha']:g}: {entry['why_not']}",
            )
        )
    return out
