"""What a kl run shows, computed from the rest of its results: the issue's acceptance numbers
(`acceptance`) and one sentence per claim, supported or not and why (`headlines`)."""

import math
from typing import Any

from lab.metrics.statistics import sign
from lab.runs import headline

from experiments.kl.config import FAMILY_Z
from experiments.kl.measure import _lengths


def acceptance(results: dict[str, Any]) -> dict[str, Any]:
    """The issue's acceptance numbers, computed from the results: the Markov quantities over complete
    contexts (where the entropy rate is E[H_t]), the hidden-Markov ones over every position."""
    rate = results["source"]["entropy_rate_nats"]
    final_kl = results["checkpoints"][-1]["complete"]["kl_nats"]
    scaling, T = results["scaling"], results["temperature_min"]["T"]
    low, high = scaling["E_ci95"]
    scaling_rate = scaling["true_entropy_nats"]  # the sweep's own chain
    rows = [r[region] for r in results["checkpoints"] for region in ("complete", "first")] + \
        [r["all"] for r in results["hmm"]]
    return {
        "final_kl_over_entropy_rate": final_kl / rate, "final_kl_below_5pct": final_kl < 0.05 * rate,
        "min_T": T, "min_T_in_0.8_1.25": 0.8 <= T <= 1.25,
        "E_nats": scaling["E_nats"], "E_ci95": scaling["E_ci95"], "E_ci95_open": scaling.get("E_ci95_open"),
        "true_entropy_nats": scaling_rate,
        "true_entropy_in_E_ci95": bool(low <= scaling_rate <= high), "E_minus_true_nats": scaling["E_nats"] - scaling_rate,
        "entropy_rate_within_3se": results["entropy_rate_check"]["within_3se"],
        "sampled_within_3se": all(abs(r["sampled_minus_exact_in_se"]) <= 3 for r in rows),
        "max_abs_sampled_minus_exact_in_se": max(abs(r["sampled_minus_exact_in_se"]) for r in rows),
        "sampled_ce_within_3se": all(abs(r["sampled_ce_minus_exact_in_se"]) <= 3 for r in rows),
        "max_abs_sampled_ce_minus_exact_in_se": max(abs(r["sampled_ce_minus_exact_in_se"]) for r in rows),
        "kl_last_below_first": final_kl < results["checkpoints"][0]["complete"]["kl_nats"],
        "hmm_kl_last_below_first": results["hmm"][-1]["all"]["kl_nats"] < results["hmm"][0]["all"]["kl_nats"],
    }


def headlines(results: dict[str, Any]) -> list[dict[str, Any]]:
    """What the run shows, one sentence each, computed from the rest of results: {name, sentence, value,
    interval, direction (must agree between the quick and default profiles), supported, why_not}. A headline
    the run cannot support is kept, unsupported, with the reason in words."""
    rate = results["source"]["entropy_rate_nats"]
    first, last = results["checkpoints"][0]["complete"], results["checkpoints"][-1]["complete"]
    early = results["checkpoints"][-1].get("first")
    check = results["entropy_rate_check"]
    scaling, best = results["scaling"], results["temperature_min"]
    lens = results["lens"]
    hmm_first, hmm_last = results["hmm"][0]["all"], results["hmm"][-1]["all"]
    rows = [r[region] for r in results["checkpoints"] for region in ("complete", "first") if region in r] + \
        [r["all"] for r in results["hmm"]]
    worst_kl = max(abs(r["sampled_minus_exact_in_se"]) for r in rows)
    worst_ce = max(abs(r["sampled_ce_minus_exact_in_se"]) for r in rows)
    se = last["sampled_kl_se"]
    out = [
        headline("kl_falls", f"Training shrinks KL(p ‖ P_θ) over complete contexts from {first['kl_nats']:.3f} to "
                              f"{last['kl_nats']:.3f} nats/token ({last['kl_nats'] / rate:.1%} of the entropy rate "
                              f"{rate:.4f}), while CE {last['cross_entropy_nats']:.4f} stays above H "
                              f"{last['entropy_nats']:.4f}.",
                  last["kl_nats"], [last["sampled_kl_nats"] - 1.96 * se, last["sampled_kl_nats"] + 1.96 * se],
                  sign(last["kl_nats"] - first["kl_nats"])),
        headline("sampled_matches_exact",
                  f"The sampled paths agree with the exact ones at every checkpoint and region: the model's own "
                  f"−log P_θ at the sampled tokens against H + KL from the exact distributions (worst "
                  f"|z| = {worst_ce:.2f}), and KL̂ against KL (worst |z| = {worst_kl:.2f}); over these "
                  f"{2 * len(rows)} comparisons the limit is |z| ≤ {FAMILY_Z}.",
                  max(worst_ce, worst_kl), None, bool(worst_ce <= FAMILY_Z and worst_kl <= FAMILY_Z)),
        headline("entropy_rate_check",
                  f"The closed-form entropy rate {rate:.4f} nats matches the mean H over complete-context held-out "
                  f"prefixes, {check['mean_complete_context_entropy_nats']:.4f} ± {check['se']:.4f} (z = "
                  f"{check['z']:.2f}).", check["mean_complete_context_entropy_nats"],
                  [check["mean_complete_context_entropy_nats"] - 1.96 * check["se"],
                   check["mean_complete_context_entropy_nats"] + 1.96 * check["se"]], check["within_3se"]),
        headline("lens", f"Through the ground-truth lens, KL to p falls from {lens[0]['kl_nats']:.3f} nats at "
                          f"{lens[0]['label']} to {lens[-1]['kl_nats']:.3f} after the last layer (complete contexts).",
                  lens[-1]["kl_nats"], None, sign(lens[-1]["kl_nats"] - lens[0]["kl_nats"])),
        headline("temperature", f"KL to the truth is smallest at T = {best['T']:.3f} ({best['kl_nats']:.4f} nats; "
                                 f"{best['kl_at_T1_nats']:.4f} at T = 1).", best["T"], None,
                  bool(0.8 <= best["T"] <= 1.25), not best["at_bracket_edge"],
                  "the minimising temperature is at the edge of the searched bracket"),
        headline("hmm_kl_falls", f"On the hidden-Markov source KL over every position falls from "
                                  f"{hmm_first['kl_nats']:.3f} to {hmm_last['kl_nats']:.3f} nats/token.",
                  hmm_last["kl_nats"], None, sign(hmm_last["kl_nats"] - hmm_first["kl_nats"])),
    ]
    if early is not None:
        out.insert(1, headline(
            "first_positions", f"The first positions ({_lengths(*early['prefix_lengths'])}, shorter than the "
                               f"chain's order) are reported apart: "
                               f"H {early['entropy_nats']:.4f}, KL {early['kl_nats']:.3f} nats/token.",
            early["kl_nats"], None, sign(early["entropy_nats"] - rate)))
    low, high = scaling["E_ci95"]
    closed = math.isfinite(low) and scaling.get("E_ci95_open") is None and scaling["dof"] >= 2
    why = (f"the fit has {len(scaling['points'])} widths ({scaling['dof']} degree(s) of freedom) and its 95% "
           f"interval [{low:.2f}, {high:.2f}] is {'open ' + scaling['E_ci95_open'] if scaling.get('E_ci95_open') else 'too loose'}: "
           f"it cannot place E") if not closed else None
    true_rate = scaling["true_entropy_nats"]
    out.append(headline(
        "scaling_E", f"The scaling fit's irreducible term E = {scaling['E_nats']:.4f} [{low:.4f}, {high:.4f}] "
                     f"{'contains' if low <= true_rate <= high else 'misses'} the true entropy rate {true_rate:.4f} "
                     f"of its chain (α = {scaling['alpha']:.3f}, {len(scaling['points'])} widths).",
        scaling["E_nats"], [low, high], bool(low <= true_rate <= high), closed, why))
    held = scaling["heldout_entropy_nats"]
    out.append(headline(
        "scaling_E_vs_heldout_entropy",
        f"E is {scaling['E_minus_heldout_entropy_nats']:+.4f} nats from the held-out entropy {held:.4f}: "
        + ("its whole interval lies below it, so the fit extrapolates to a loss no model can reach."
           if scaling["E_ci95_below_heldout_entropy"] else "the interval does not lie below it."),
        scaling["E_minus_heldout_entropy_nats"], [low - held, high - held], scaling["E_ci95_below_heldout_entropy"],
        closed, why))
    return out

