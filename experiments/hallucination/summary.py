"""Issue 5's acceptance, checked on the results themselves, and the headlines: what a run supports, in words,
with the direction a smaller profile must agree on."""

import math
from typing import Any

import numpy as np

from lab.metrics.statistics import sign, spearman
from lab.runs import headline

from experiments.hallucination.config import DELTAS, FAMILY_Z, MAX_FACT_PROBABILITY_FLAG, Config, _key


# --------------------------------------------------------------------------------------------
# Summaries, tables, figures
# --------------------------------------------------------------------------------------------
def relative_change(reduction: float) -> str:
    """A reduction 1 − new/old in words: "14.0% lower", or "3.2% higher" when it is negative."""
    return f"{abs(reduction):.1%} {'lower' if reduction >= 0 else 'higher'}"


def acceptance(sweep: list[dict[str, Any]], upweighting: list[dict[str, Any]], cfg: Config) -> dict[str, Any]:
    """Issue 5's acceptance checks, computed from the results (never asserted here)."""
    mf = [s["monofact_rate"] for s in sweep]
    by_epoch = {}
    for epoch in cfg.epochs:
        rates = [next(c["hallucination_rate"] for c in s["checkpoints"] if c["checkpoint"] == f"epoch {epoch}")
                 for s in sweep]
        by_epoch[str(epoch)] = spearman(mf, rates)
    sides = [(c[f"bound_rhs_delta_{_key(d)}"], c[f"bound_margin_delta_{_key(d)}"])
             for s in sweep for c in s["checkpoints"] for d in DELTAS]
    informative = [margin for rhs, margin in sides if rhs > 0]  # where the right side is negative it says nothing
    out: dict[str, Any] = {
        "spearman_monofact_vs_hallucination": by_epoch,
        "spearman_at_least_0_9": all(v >= 0.9 for v in by_epoch.values()),
        "min_bound_margin": min(margin for _, margin in sides),
        "min_bound_margin_where_right_side_positive": min(informative) if informative else None,
        "bound_holds_where_right_side_positive": all(m >= 0 for m in informative) if informative else None,
        "bound_checks_with_positive_right_side": len(informative), "bound_checks": len(sides),
        "largest_right_side": max(rhs for rhs, _ in sides),
    }
    if upweighting:
        control = upweighting[0]
        mixed = [u for u in upweighting[1: 1 + len(cfg.upweight_shares)]]
        out["upweighting"] = [{
            "condition": u["condition"],
            "hallucination_reduction": 1 - u["hallucination_rate"] / control["hallucination_rate"],
            "hallucination_reduction_draws": [1 - r / control["hallucination_rate"] for r in u["hallucination_rate_draws"]],
            "miscalibration_change": u["miscalibration_tv_eps"] - control["miscalibration_tv_eps"],
            "recall_change": u["recall_seen"] - control["recall_seen"]} for u in upweighting[1:]]
        out["mixed_upweighting_passes"] = all(
            1 - u["hallucination_rate"] / control["hallucination_rate"] >= 0.15
            and u["miscalibration_tv_eps"] > control["miscalibration_tv_eps"]
            and abs(u["recall_seen"] - control["recall_seen"]) <= 0.05 for u in mixed)
    return out


def headlines(results: dict[str, Any]) -> list[dict[str, Any]]:
    """What the run shows, one sentence each, computed from the rest of results: {name, sentence, value,
    interval, direction (must agree between the quick and default profiles), supported, why_not}. A headline
    the run cannot support is kept, unsupported, with the reason in words."""
    sweep = sorted(results["sweep"], key=lambda s: s["gamma"])
    out = []

    # Hallucination against the monofact rate across γ, at each γ's held-out optimum.
    mf = [s["monofact_rate"] for s in sweep]
    optimum = [next(c for c in s["checkpoints"] if c["checkpoint"] == "optimum") for s in sweep]
    rates = [c["hallucination_rate"] for c in optimum]
    rho = spearman(mf, rates)
    by_epoch = results["acceptance"]["spearman_monofact_vs_hallucination"]
    rising = all(b > a for a, b in zip(mf, mf[1:]))
    flagged = [s for s in sweep if s["max_fact_probability"] >= MAX_FACT_PROBABILITY_FLAG]
    note = ("" if not flagged else " (one fact holds " + ", ".join(
        f"{s['max_fact_probability']:.0%} of p at γ = {s['gamma']:g}" for s in flagged)
        + f": beyond the theorem's bounded largest fact, flagged at ≥ {MAX_FACT_PROBABILITY_FLAG:.0%})")
    why = None
    if len(sweep) < 3:
        why = f"only {len(sweep)} γ values: a rank correlation of {len(sweep)} points can only be ±1"
    elif not rising:
        why = ("the monofact rate does not rise with γ across " + ", ".join(f"γ = {s['gamma']:g} (MF {m:.3f})"
               for s, m in zip(sweep, mf)) + ": the sweep is outside the regime where γ moves MF up")
    out.append(headline(
        "hallucination_rises_with_monofact_rate",
        f"Across {len(sweep)} popularity shapes (MF {min(mf):.3f} … {max(mf):.3f}), g(H) at each γ's held-out optimum "
        f"has Spearman ρ = {rho:+.2f} with the monofact rate (at fixed epochs: "
        + ", ".join(f"{e}: {v:+.2f}" for e, v in by_epoch.items()) + ")" + note + ".",
        rho, None, sign(rho) if math.isfinite(rho) else 0, why is None, why))

    # Both sides of the bound, at every checkpoint and δ.
    checks = [(c[f"bound_rhs_delta_{_key(d)}"], c[f"bound_margin_delta_{_key(d)}"])
              for s in sweep for c in s["checkpoints"] for d in DELTAS]
    positive = [(rhs, margin) for rhs, margin in checks if rhs > 0]
    if positive:
        worst = min(margin for _, margin in positive)
        out.append(headline(
            "bound_holds", f"Where its right side is positive ({len(positive)} of {len(checks)} checks), the bound "
                           f"g(H) ≥ MF − Mis − slack holds with smallest margin {worst:+.3f}.",
            worst, None, bool(worst >= 0)))
    else:
        best = max(rhs for rhs, _ in checks)
        out.append(headline(
            "bound_holds", "The Kalai–Vempala bound's right side is negative at every check.", best, None, 0,
            False, f"bound vacuous: right side < 0 at every check ({len(checks)} of {len(checks)}; the largest is "
                   f"{best:+.3f}), so g(H) ≥ right side holds whatever the model does and says nothing"))

    # The enumeration against sampled documents, and the grammar's mass.
    z = max(abs(c["sampled_hallucination_rate"] - c["hallucination_rate"]) / c["sampled_se"]
            for s in sweep for c in s["checkpoints"] if c["sampled_se"] > 0)
    n_checkpoints = sum(len(s["checkpoints"]) for s in sweep)
    out.append(headline(
        "enumeration_matches_sampling",
        f"The exact g(H) by enumeration and the rate among documents sampled at T = 1 agree at all {n_checkpoints} "
        f"checkpoints (worst |z| = {z:.2f}; over these comparisons the limit is |z| ≤ {FAMILY_Z}).", z, None,
        bool(z <= FAMILY_Z)))
    gap = max(abs(c["sum_check"]) for s in sweep for c in s["checkpoints"])
    out.append(headline(
        "mass_closes", f"g(F) + g(H) + malformed, the last summed from the grammar's leaks, is 1 within {gap:.1e} at "
                       f"every checkpoint.", gap, None, bool(gap <= 1e-4)))

    # Selective upweighting against its matched-compute control (Miao & Kearns).
    upweighting = results.get("upweighting") or []
    if upweighting:
        control = upweighting[0]
        n_shares = len(results["config"]["upweight_shares"])
        for u in upweighting[1: 1 + n_shares]:
            draws = u["hallucination_rate_draws"]
            reductions = [1 - r / control["hallucination_rate"] for r in draws]
            sides = {sign(r - control["hallucination_rate"]) for r in draws}
            why = (f"only {len(draws)} draw of the repeated blocks: no spread to judge it by" if len(draws) < 2 else
                   f"its draws fall on both sides of the control (g(H) {', '.join(f'{r:.4f}' for r in draws)} "
                   f"against {control['hallucination_rate']:.4f})" if len(sides) > 1 else None)
            out.append(headline(
                f"upweighting {u['condition']}",
                f"Upweighting ({u['condition']}) moves g(H) from {control['hallucination_rate']:.4f} to "
                f"{u['hallucination_rate']:.4f} against the matched-compute control "
                f"({relative_change(1 - u['hallucination_rate'] / control['hallucination_rate'])}; draws "
                f"{', '.join(relative_change(r) for r in reductions)}), Mis {control['miscalibration_tv_eps']:.3f} "
                f"→ {u['miscalibration_tv_eps']:.3f}, recall {control['recall_seen']:.3f} → {u['recall_seen']:.3f}.",
                1 - u["hallucination_rate"] / control["hallucination_rate"], [min(reductions), max(reductions)],
                sign(u["hallucination_rate"] - control["hallucination_rate"]), why is None, why))
        mixed = upweighting[1: 1 + n_shares]
        changes = [m - control["miscalibration_tv_eps"] for u in mixed for m in u["miscalibration_tv_eps_draws"]]
        mean = float(np.mean(changes))
        sides = {sign(c) for c in changes}
        why = None if len(changes) >= 2 and len(sides) == 1 else (
            "the mixed conditions' draws move Mis both ways: " + ", ".join(f"{c:+.3f}" for c in changes))
        out.append(headline(
            "upweighting_raises_miscalibration",
            f"Those mixed conditions change the miscalibration Mis by {mean:+.3f} on average (draws "
            + ", ".join(f"{c:+.3f}" for c in changes) + ").", mean, [min(changes), max(changes)], sign(mean),
            why is None, why))

    # The singleton-rate variant: its finite-N term swamps it at these sizes.
    singleton = results.get("singleton") or {}
    if singleton:
        why = None if singleton["bound_rhs"] > 0 else (
            f"vacuous at N = {singleton['n_train']:,}: the finite-N term (35 + 6 ln N)/√N = "
            f"{singleton['finite_n_term']:.2f} makes the right side {singleton['bound_rhs']:+.3f}; without it the "
            f"margin is {singleton['margin_without_finite_n']:+.3f}")
        out.append(headline(
            "singleton_bound", f"The singleton-rate bound (Kalai et al. 2025) holds with margin {singleton['margin']:+.3f}.",
            singleton["margin"], None, bool(singleton["margin"] >= 0), why is None, why))
    return out
