"""The headlines: what a run supports, in words, with the direction a smaller profile must agree on."""

import math
from typing import Any

from lab.runs import headline

from experiments.monitor.config import ERROR_KINDS


# --------------------------------------------------------------------------------------------
# Headlines
# --------------------------------------------------------------------------------------------
def _auroc_headline(name: str, what: str, block: dict[str, Any], sign: int) -> dict[str, Any]:
    """Whether a signal separates false claims from right ones: supported when its familywise interval (every
    separation claim of the run at once, `familywise_level`) excludes ½. The direction is which way the signal's
    raw value points to a false claim (sign · (AUROC > ½))."""
    value, interval = block.get("auroc"), block.get("auroc_ci95")
    joint, level = block.get("auroc_familywise_ci"), block.get("auroc_familywise_level")
    counts = f"{block.get('auroc_n_pos')} false and {block.get('auroc_n_neg')} right claims"
    claim = f"{what} separates false claims from right ones."  # shown only when supported
    if value is None or not math.isfinite(value):
        return headline(name, claim, None, None, 0, False, f"{what}: no AUROC ({counts} on the test split)")
    if interval is None or joint is None or any(not math.isfinite(x) for x in (*interval, *joint)):
        why = block.get("auroc_why_no_interval") or "no familywise interval (the run was made before Forma computed one)"
        return headline(name, claim, value, None, 0, False, f"{what}: {why}")
    text = (f"AUROC {value:.3f}, 95% [{interval[0]:.3f}, {interval[1]:.3f}], {level:.1%} familywise "
            f"[{joint[0]:.3f}, {joint[1]:.3f}], {counts} on the test split")
    if joint[0] <= 0.5 <= joint[1]:
        return headline(name, claim, value, joint, 0, False,
                         f"{what}: the familywise interval straddles ½ ({text}), so no direction is shown")
    points = sign if value > 0.5 else -sign
    return headline(name, f"{what} {'rises' if points > 0 else 'falls'} with the risk of a false claim ({text}).",
                     value, joint, points)


def headlines(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's headlines, a pure function of the rest of results.json: {name, sentence, value, interval, direction,
    supported, why_not}; `direction` is what the quick profile must share with the default one."""
    out = []
    signals = {row["signal"]: row for row in results["signals"]}
    for name, row in signals.items():
        out.append(_auroc_headline(f"{name}_separates", f"The signal {name}", row, row["sign"]))
    own = signals.get("max_prob")
    if own:
        for kind, block in own["by_kind"].items():
            out.append(_auroc_headline(f"max_prob_separates_{kind}", f"max_prob, against the {ERROR_KINDS[kind]}",
                                       block, own["sign"]))
    for entry in results["abstention"]:
        if entry["signal"] != results["abstention_signal"]:
            continue
        alpha, ltt, again = entry["alpha"], entry["ltt"], entry["resplits"]
        mean, band = again["crc_joint_risk"], again["crc_joint_risk_ci95"]
        out.append(headline(
            f"crc_keeps_joint_risk_alpha_{alpha:g}",
            f"Conformal risk control at α = {alpha:g} on {entry['signal']}, over {again['n_resplits']} draws of the "
            f"calibration subjects: answered and false {mean:.3f} [{band[0]:.3f}, {band[1]:.3f}] of the test prompts "
            f"({'within' if band[0] <= alpha else 'above'} α) at coverage {again['crc_coverage']:.0%}; the error "
            f"rate among those answers is {again['crc_selective_risk'] or 0:.3f} (CRC promises nothing about it).",
            mean, band, bool(band[0] <= alpha)))
        if not again["ltt_n_answering"]:
            out.append(headline(f"ltt_keeps_selective_risk_alpha_{alpha:g}",
                                 f"Learn then Test keeps the error rate among answers at α = {alpha:g}.", None, None,
                                 0, False,
                                 f"Learn then Test certified no threshold at α = {alpha:g} (δ = {ltt['delta']:g}) in "
                                 f"any of {again['n_resplits']} draws of the calibration subjects: even the most "
                                 f"confident answers are false more often than α, so nothing is answered"))
            continue
        share, delta, n = again["ltt_share_above_alpha"], ltt["delta"], again["n_resplits"]
        slack = 3 * math.sqrt(delta * (1 - delta) / n)  # three binomial standard errors of a share of n draws
        out.append(headline(
            f"ltt_keeps_selective_risk_alpha_{alpha:g}",
            f"Learn then Test at α = {alpha:g}, δ = {delta:g} answers in {again['ltt_n_answering']} of {n} draws of "
            f"the calibration subjects (mean coverage {again['ltt_coverage']:.0%}); the error rate among its test "
            f"answers exceeds α in {share:.0%} of the draws ({'within' if share <= delta + slack else 'beyond'} "
            f"δ + {slack:.2f}).", share, None, bool(share <= delta + slack)))
    for entry in results.get("abstention_unavailable", []):  # too few calibration prompts for that α
        out.append(headline(f"abstention_alpha_{entry['alpha']:g}",
                             f"Abstention keeps its promise at α = {entry['alpha']:g}.", None, None, 0, False,
                             f"No abstention rule is scored at α = {entry['alpha']:g}: {entry['why_not']}"))
    return out
