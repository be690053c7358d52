"""What a kl run shows, computed from the rest of its results: the issue's acceptance numbers
(`acceptance`) and one sentence per claim, supported or not and why (`headlines`)."""

import math
from typing import Any

from experiments.kl.config import FAMILY_Z
from experiments.kl.measure import lengths_in_words
from lab.metrics.statistics import sign
from lab.runs import headline


def acceptance(results: dict[str, Any]) -> dict[str, Any]:
    """The issue's acceptance numbers, computed from the results: the Markov quantities over complete
    contexts (where the entropy rate is E[H_t]), the hidden-Markov ones over every position."""
    rate = results["source"]["entropy_rate_nats"]
    final_kl = results["checkpoints"][-1]["complete"]["kl_nats"]
    scaling, T = results["scaling"], results["temperature_min"]["T"]
    low, high = scaling["E_ci95"]
    scaling_rate = scaling["true_entropy_nats"]  # the sweep's own chain
    rows = [r[region] for r in results["checkpoints"] for region in ("complete", "first")] + [
        r["all"] for r in results["hmm"]
    ]
    return {
        "final_kl_over_entropy_rate": final_kl / rate,
        "final_kl_below_5pct": final_kl < 0.05 * rate,
        "min_T": T,
        "min_T_in_0.8_1.25": 0.8 <= T <= 1.25,
        "E_nats": scaling["E_nats"],
        "E_ci95": scaling["E_ci95"],
        "E_ci95_open": scaling.get("E_ci95_open"),
        "true_entropy_nats": scaling_rate,
        "true_entropy_in_E_ci95": bool(low <= scaling_rate <= high),
        "E_minus_true_nats": scaling["E_nats"] - scaling_rate,
        "entropy_rate_within_3se": results["entropy_rate_check"]["within_3se"],
        "sampled_within_3se": all(abs(r["sampled_minus_exact_in_se"]) <= 3 for r in rows),
        "max_abs_sampled_minus_exact_in_se": max(abs(r["sampled_minus_exact_in_se"]) for r in rows),
        "sampled_ce_within_3se": all(abs(r["sampled_ce_minus_exact_in_se"]) <= 3 for r in rows),
        "max_abs_sampled_ce_minus_exact_in_se": max(abs(r["sampled_ce_minus_exact_in_se"]) for r in rows),
        "kl_last_below_first": final_kl < results["checkpoints"][0]["complete"]["kl_nats"],
        "hmm_kl_last_below_first": results["hmm"][-1]["all"]["kl_nats"] < results["hmm"][0]["all"]["kl_nats"],
    }


def _fall(
    name: str, what: str, before: tuple[float, float], after: tuple[float, float], where: str, detail: str = ""
) -> dict[str, Any]:
    """A change between two measurements, each a mean with its standard error over held-out sequences: shown with
    its direction when the 95% interval of the difference, ± 1.96·√(se₁² + se₂²), excludes 0 (two means of the
    same sequences are positively correlated, so this is the wider interval); not shown otherwise."""
    (a, se_a), (b, se_b) = before, after
    half = 1.96 * math.sqrt(se_a**2 + se_b**2)
    text = (
        f"{what} {'falls' if b < a else 'rises'} {where}, from {a:.3f} to {b:.3f} nats/token (change "
        f"{b - a:+.3f}, 95% [{b - a - half:+.3f}, {b - a + half:+.3f}]){detail}."
    )
    if abs(b - a) <= half:
        return headline(
            name,
            text,
            b,
            [b - a - half, b - a + half],
            0,
            False,
            f"{text[:-1]}: the interval includes 0, so this run cannot tell the direction",
        )
    return headline(name, text, b, [b - a - half, b - a + half], sign(b - a))


def headlines(results: dict[str, Any]) -> list[dict[str, Any]]:
    """What the run shows, one sentence each, computed from the rest of results: {name, sentence, value,
    interval, direction (must agree between the quick and default profiles), supported, why_not}. A headline
    the run cannot support — a change within its noise, a check that fails — is kept, unsupported, with the reason
    in words."""
    rate = results["source"]["entropy_rate_nats"]
    first, last = results["checkpoints"][0]["complete"], results["checkpoints"][-1]["complete"]
    early = results["checkpoints"][-1].get("first")
    lens = results["lens"]
    hmm_first, hmm_last = results["hmm"][0]["all"], results["hmm"][-1]["all"]
    return [
        _fall(
            "kl_falls",
            "KL(p ‖ P_θ) over complete contexts",
            (first["kl_nats"], first["kl_se"]),
            (last["kl_nats"], last["kl_se"]),
            "over training",
            f"; {last['kl_nats'] / rate:.1%} of the entropy rate {rate:.4f} at the end, CE "
            f"{last['cross_entropy_nats']:.4f} against H {last['entropy_nats']:.4f}",
        ),
        *([] if early is None else [_first_positions(early, rate)]),
        _sampled_matches_exact(results),
        _entropy_rate_check(results["entropy_rate_check"], rate),
        _fall(
            "lens",
            "Through the ground-truth lens, KL to p",
            (lens[0]["kl_nats"], lens[0]["kl_se"]),
            (lens[-1]["kl_nats"], lens[-1]["kl_se"]),
            f"between the first layer's input ({lens[0]['label']}) and the last layer's output (complete contexts)",
        ),
        _temperature(results["temperature_min"]),
        _fall(
            "hmm_kl_falls",
            "On the hidden-Markov source KL over every position",
            (hmm_first["kl_nats"], hmm_first["kl_se"]),
            (hmm_last["kl_nats"], hmm_last["kl_se"]),
            "over training",
        ),
        *_scaling_headlines(results["scaling"]),
    ]


def _sampled_matches_exact(results: dict[str, Any]) -> dict[str, Any]:
    """The check of the sampled paths against the exact ones, over every checkpoint and region, at the familywise
    limit: the model's own −log P_θ against H + KL, and KL̂ against KL."""
    rows = [r[region] for r in results["checkpoints"] for region in ("complete", "first") if region in r] + [
        r["all"] for r in results["hmm"]
    ]
    worst_kl = max(abs(r["sampled_minus_exact_in_se"]) for r in rows)
    worst_ce = max(abs(r["sampled_ce_minus_exact_in_se"]) for r in rows)
    agree = worst_ce <= FAMILY_Z and worst_kl <= FAMILY_Z
    sampled = (
        f"The sampled paths {'agree' if agree else 'disagree'} with the exact ones over every checkpoint and "
        f"region: the model's own −log P_θ at the sampled tokens against H + KL from the exact distributions "
        f"(worst |z| = {worst_ce:.2f}), and KL̂ against KL (worst |z| = {worst_kl:.2f}); over these "
        f"{2 * len(rows)} comparisons the limit is |z| ≤ {FAMILY_Z}."
    )
    return headline("sampled_matches_exact", sampled, max(worst_ce, worst_kl), None, bool(agree), agree, sampled)


def _entropy_rate_check(check: dict[str, Any], rate: float) -> dict[str, Any]:
    """The closed-form entropy rate against the mean entropy over complete-context held-out prefixes."""
    matches, mean = check["within_3se"], check["mean_complete_context_entropy_nats"]
    entropy_rate = (
        f"The closed-form entropy rate {rate:.4f} nats {'matches' if matches else 'misses'} the mean H over "
        f"complete-context held-out prefixes, {mean:.4f} ± {check['se']:.4f} (z = {check['z']:.2f}; the limit is "
        "|z| ≤ 3)."
    )
    interval = [mean - 1.96 * check["se"], mean + 1.96 * check["se"]]
    return headline("entropy_rate_check", entropy_rate, mean, interval, bool(matches), matches, entropy_rate)


def _temperature(best: dict[str, Any]) -> dict[str, Any]:
    """Where KL to the truth is smallest over the temperature scan: near 1 for a model trained to the truth."""
    interior, near_one = not best["at_bracket_edge"], 0.8 <= best["T"] <= 1.25
    temperature = (
        f"KL to the truth is smallest at T = {best['T']:.3f} ({best['kl_nats']:.4f} nats; "
        f"{best['kl_at_T1_nats']:.4f} at T = 1), {'within' if near_one else 'outside'} [0.8, 1.25]."
    )
    why = "the minimising temperature is at the edge of the searched bracket" if not interior else temperature
    return headline("temperature", temperature, best["T"], None, bool(near_one), interior and near_one, why)


def _first_positions(early: dict[str, Any], rate: float) -> dict[str, Any]:
    """The positions shorter than the chain's order, reported apart: their entropy against the entropy rate."""
    gap, half = early["entropy_nats"] - rate, 1.96 * early["entropy_se"]
    text = (
        f"The first positions ({lengths_in_words(*early['prefix_lengths'])}, shorter than the chain's order) are "
        f"reported apart: H {early['entropy_nats']:.4f}, {gap:+.4f} nats from the entropy rate (95% "
        f"[{gap - half:+.4f}, {gap + half:+.4f}]), KL {early['kl_nats']:.3f} nats/token."
    )
    why = (
        None
        if abs(gap) > half
        else f"{text[:-1]}: the entropy's interval includes the rate, so this run cannot tell the "
        "first positions' entropy from it"
    )
    return headline(
        "first_positions", text, early["kl_nats"], [gap - half, gap + half], sign(gap), abs(gap) > half, why
    )


def _scaling_headlines(scaling: dict[str, Any]) -> list[dict[str, Any]]:
    """The scaling fit's E against the true entropy rate of its chain and against the held-out entropy; neither is
    supported when the fit's interval cannot place E."""
    low, high = scaling["E_ci95"]
    closed = math.isfinite(low) and scaling.get("E_ci95_open") is None and scaling["dof"] >= 2
    why = (
        (
            f"the fit has {len(scaling['points'])} widths ({scaling['dof']} degree(s) of freedom) and its 95% "
            f"interval [{low:.2f}, {high:.2f}] is "
            f"{'open ' + scaling['E_ci95_open'] if scaling.get('E_ci95_open') else 'too loose'}: "
            f"it cannot place E"
        )
        if not closed
        else None
    )
    true_rate, held = scaling["true_entropy_nats"], scaling["heldout_entropy_nats"]
    return [
        headline(
            "scaling_E",
            f"The scaling fit's irreducible term E = {scaling['E_nats']:.4f} [{low:.4f}, {high:.4f}] "
            f"{'contains' if low <= true_rate <= high else 'misses'} the true entropy rate {true_rate:.4f} "
            f"of its chain (α = {scaling['alpha']:.3f}, {len(scaling['points'])} widths).",
            scaling["E_nats"],
            [low, high],
            bool(low <= true_rate <= high),
            closed,
            why,
        ),
        headline(
            "scaling_E_vs_heldout_entropy",
            f"E is {scaling['E_minus_heldout_entropy_nats']:+.4f} nats from the held-out entropy {held:.4f}: "
            + (
                "its whole interval lies below it, so the fit extrapolates to a loss no model can reach."
                if scaling["E_ci95_below_heldout_entropy"]
                else "the interval does not lie below it."
            ),
            scaling["E_minus_heldout_entropy_nats"],
            [low - held, high - held],
            scaling["E_ci95_below_heldout_entropy"],
            closed,
            why,
        ),
    ]
