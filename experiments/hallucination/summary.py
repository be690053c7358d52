"""Issue 5's acceptance, checked on the results themselves, and the headlines: what a run supports, in words,
with the direction a smaller profile must agree on."""

import math
from typing import Any

import numpy as np

from experiments.hallucination.config import (
    DELTAS,
    FAMILY_Z,
    MAX_FACT_PROBABILITY_FLAG,
    PERMUTATION_LEVEL,
    Config,
    delta_key,
)
from lab.metrics.statistics import permutation_p, sign, smallest_permutation_p, spearman, spearman_permutation_p
from lab.runs import headline


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
        rates = [
            next(c["hallucination_rate"] for c in s["checkpoints"] if c["checkpoint"] == f"epoch {epoch}")
            for s in sweep
        ]
        by_epoch[str(epoch)] = spearman(mf, rates)
    sides = [
        (c[f"bound_rhs_delta_{delta_key(d)}"], c[f"bound_margin_delta_{delta_key(d)}"])
        for s in sweep
        for c in s["checkpoints"]
        for d in DELTAS
    ]
    informative = [margin for rhs, margin in sides if rhs > 0]  # where the right side is negative it says nothing
    out: dict[str, Any] = {
        "spearman_monofact_vs_hallucination": by_epoch,
        "spearman_at_least_0_9": all(v >= 0.9 for v in by_epoch.values()),
        "min_bound_margin": min(margin for _, margin in sides),
        "min_bound_margin_where_right_side_positive": min(informative) if informative else None,
        "bound_holds_where_right_side_positive": all(m >= 0 for m in informative) if informative else None,
        "bound_checks_with_positive_right_side": len(informative),
        "bound_checks": len(sides),
        "largest_right_side": max(rhs for rhs, _ in sides),
    }
    if upweighting:
        control = upweighting[0]
        mixed = [u for u in upweighting[1 : 1 + len(cfg.upweight_shares)]]
        out["upweighting"] = [
            {
                "condition": u["condition"],
                "hallucination_reduction": 1 - u["hallucination_rate"] / control["hallucination_rate"],
                "hallucination_reduction_draws": [
                    1 - r / control["hallucination_rate"] for r in u["hallucination_rate_draws"]
                ],
                "miscalibration_change": u["miscalibration_tv_eps"] - control["miscalibration_tv_eps"],
                "recall_change": u["recall_seen"] - control["recall_seen"],
            }
            for u in upweighting[1:]
        ]
        out["mixed_upweighting_passes"] = all(
            1 - u["hallucination_rate"] / control["hallucination_rate"] >= 0.15
            and u["miscalibration_tv_eps"] > control["miscalibration_tv_eps"]
            and abs(u["recall_seen"] - control["recall_seen"]) <= 0.05
            for u in mixed
        )
    return out


def _spearman_test(mf: list[float], rates: list[float]) -> tuple[float, float]:
    """ρ(MF, g(H)) and its exact one-sided permutation p-value (every pairing of the γ values; Kalai & Vempala
    predict a rise)."""
    rho = spearman(mf, rates)
    return rho, spearman_permutation_p(mf, rates, "greater") if math.isfinite(rho) else math.nan


def _flag_note(sweep: list[dict[str, Any]]) -> str:
    """The sentence's note on the γ whose world puts ≥ MAX_FACT_PROBABILITY_FLAG of p on one fact ("" if none)."""
    flagged = [s for s in sweep if s["max_fact_probability"] >= MAX_FACT_PROBABILITY_FLAG]
    if not flagged:
        return ""
    return (
        " (one fact holds "
        + ", ".join(f"{s['max_fact_probability']:.0%} of p at γ = {s['gamma']:g}" for s in flagged)
        + f": beyond the theorem's bounded largest fact, flagged at ≥ {MAX_FACT_PROBABILITY_FLAG:.0%})"
    )


def _off_regime(sweep: list[dict[str, Any]], mf: list[float]) -> str | None:
    """Why the sweep cannot carry a rank correlation of g(H) with MF at all (None when it can): fewer than 3 γ, or
    a monofact rate that does not rise with γ."""
    if len(sweep) < 3:
        return f"only {len(sweep)} γ values: a rank correlation of {len(sweep)} points can only be ±1"
    if not all(b > a for a, b in zip(mf, mf[1:])):
        return (
            "the monofact rate does not rise with γ across "
            + ", ".join(f"γ = {s['gamma']:g} (MF {m:.3f})" for s, m in zip(sweep, mf))
            + ": the sweep is outside the regime where "
            "γ moves MF up"
        )
    return None


def _spearman_headline(name: str, rho: float, p: float, sentence: str, regime: str | None, n: int) -> dict[str, Any]:
    """A rise of g(H) with MF over n γ values, supported at p ≤ PERMUTATION_LEVEL in the regime where it can be."""
    why = regime
    if why is None and not p <= PERMUTATION_LEVEL:
        why = (
            f"{sentence[0].lower()}{sentence[1:-1]}: not a rise at this size (one-sided permutation p > "
            f"{PERMUTATION_LEVEL:g}; with {n} γ values the smallest possible is {1 / math.factorial(n):.3g})"
        )
    return headline(
        name, sentence, rho, None, 1 if why is None else (sign(rho) if math.isfinite(rho) else 0), why is None, why
    )


def _monofact_headlines(sweep: list[dict[str, Any]], by_epoch: dict[str, float]) -> list[dict[str, Any]]:
    """g(H) against the monofact rate across γ, by Spearman's ρ with its exact permutation p-value (one-sided, a
    rise), supported at p ≤ PERMUTATION_LEVEL: at each γ's held-out optimum, and at every listed epoch at once
    (an intersection–union test: the claim holds at every epoch when each epoch's test rejects at the level, so
    the largest p-value decides, with no correction). n γ values give p ≥ 1/n!: 3 can never reach 0.05."""
    mf = [s["monofact_rate"] for s in sweep]
    note, regime = _flag_note(sweep), _off_regime(sweep, mf)
    shape = f"Across {len(sweep)} popularity shapes (MF {min(mf):.3f} … {max(mf):.3f})"

    def rates_at(checkpoint: str) -> list[float]:
        return [next(c for c in s["checkpoints"] if c["checkpoint"] == checkpoint)["hallucination_rate"] for s in sweep]

    out = []
    rho, p = _spearman_test(mf, rates_at("optimum"))
    out.append(
        _spearman_headline(
            "hallucination_rises_with_monofact_rate",
            rho,
            p,
            f"{shape}, g(H) at each γ's held-out optimum has Spearman ρ = {rho:+.2f} with the monofact rate "
            f"(exact one-sided permutation p = {p:.3g}){note}.",
            regime,
            len(sweep),
        )
    )
    epochs = list(by_epoch)
    tests = {e: _spearman_test(mf, rates_at(f"epoch {e}")) for e in epochs}
    worst = max(p for _, p in tests.values()) if tests else math.nan
    out.append(
        _spearman_headline(
            "hallucination_rises_with_monofact_rate_at_every_epoch",
            min(r for r, _ in tests.values()),
            worst,
            f"{shape}, g(H) rises with the monofact rate at every one of {len(epochs)} fixed epochs: "
            "Spearman ρ "
            + ", ".join(f"{r:+.2f} (epoch {e}, p = {p:.3g})" for e, (r, p) in tests.items())
            + f"; the largest exact one-sided permutation p is {worst:.3g}{note}.",
            regime,
            len(sweep),
        )
    )
    return out


def _upweighting_headline(u: dict[str, Any], control: dict[str, Any]) -> dict[str, Any]:
    """One mixed condition's g(H) against the control's: lower, by an exact one-sided permutation test."""
    base, base_draws = control["hallucination_rate"], control["hallucination_rate_draws"]
    draws = u["hallucination_rate_draws"]
    reductions = [1 - r / base for r in draws]
    p = permutation_p(base_draws, draws, "less")
    text = (
        f"Upweighting ({u['condition']}) moves g(H) from {base:.4f} to {u['hallucination_rate']:.4f} against "
        f"the matched-compute control ({relative_change(1 - u['hallucination_rate'] / base)}; draws "
        f"{', '.join(relative_change(r) for r in reductions)} against the control's mean; "
        f"{len(draws)} draws against the control's {len(base_draws)}, exact one-sided permutation p = "
        f"{p:.3g}), Mis {control['miscalibration_tv_eps']:.3f} → {u['miscalibration_tv_eps']:.3f}, recall "
        f"{control['recall_seen']:.3f} → {u['recall_seen']:.3f}."
    )
    why = (
        None
        if p <= PERMUTATION_LEVEL
        else (
            f"{text[:-1]}: not lower than the control at this size (p > {PERMUTATION_LEVEL:g}; the smallest "
            "possible "
            f"is {smallest_permutation_p(len(base_draws), len(draws), 'less'):.3g})"
        )
    )
    return headline(
        f"upweighting {u['condition']}",
        text,
        1 - u["hallucination_rate"] / base,
        [min(reductions), max(reductions)],
        sign(u["hallucination_rate"] - base),
        why is None,
        why,
    )


def _miscalibration_headline(mixed: list[dict[str, Any]], control: dict[str, Any]) -> dict[str, Any]:
    """The mixed conditions' miscalibration, pooled over their draws, against the control's: higher, by an exact
    one-sided permutation test."""
    control_mis = control["miscalibration_tv_eps_draws"]
    mixed_mis = [m for u in mixed for m in u["miscalibration_tv_eps_draws"]]
    changes = [m - control["miscalibration_tv_eps"] for m in mixed_mis]
    mean = float(np.mean(changes))
    p = permutation_p(control_mis, mixed_mis, "greater")
    text = (
        f"Those mixed conditions change the miscalibration Mis by {mean:+.3f} on average against the control "
        f"(draws " + ", ".join(f"{c:+.3f}" for c in changes) + f"; {len(mixed_mis)} draws against the control's "
        f"{len(control_mis)}, exact one-sided permutation p = {p:.3g})."
    )
    why = (
        None
        if p <= PERMUTATION_LEVEL
        else (
            f"{text[:-1]}: not higher than the control at this size (p > {PERMUTATION_LEVEL:g}; the smallest possible "
            "is "
            f"{smallest_permutation_p(len(control_mis), len(mixed_mis), 'greater'):.3g})"
        )
    )
    return headline(
        "upweighting_raises_miscalibration", text, mean, [min(changes), max(changes)], sign(mean), why is None, why
    )


def _upweighting_headlines(upweighting: list[dict[str, Any]], n_shares: int) -> list[dict[str, Any]]:
    """Each mixed condition against the matched-compute control, and their miscalibration, by exact one-sided
    permutation tests over the draws (Miao & Kearns predict lower g(H) and higher Mis): the control's draws differ
    in batch order, a condition's in its blocks and batch order, and under the null hypothesis the pooled draws
    are exchangeable. k draws against k give p ≥ 1/C(2k, k)."""
    control, mixed = upweighting[0], upweighting[1 : 1 + n_shares]
    return [_upweighting_headline(u, control) for u in mixed] + [_miscalibration_headline(mixed, control)]


def headlines(results: dict[str, Any]) -> list[dict[str, Any]]:
    """What the run shows, one sentence each, computed from the rest of results: {name, sentence, value,
    interval, direction (must agree between the quick and default profiles), supported, why_not}. A headline
    the run cannot support — too small a run for its test to reject, or a check that fails — is kept, unsupported,
    with the reason in words."""
    sweep = sorted(results["sweep"], key=lambda s: s["gamma"])
    out = _monofact_headlines(sweep, results["acceptance"]["spearman_monofact_vs_hallucination"])

    out.append(_bound_headline(sweep))
    out += _check_headlines(sweep)
    # Selective upweighting against its matched-compute control (Miao & Kearns).
    upweighting = results.get("upweighting") or []
    if upweighting:
        out += _upweighting_headlines(upweighting, len(results["config"]["upweight_shares"]))
    singleton = results.get("singleton") or {}
    if singleton:
        out.append(_singleton_headline(singleton))
    return out


def _bound_headline(sweep: list[dict[str, Any]]) -> dict[str, Any]:
    """Both sides of the Kalai–Vempala bound, at every checkpoint and δ: whether it holds where its right side is
    positive; vacuous, and not shown, where it is negative everywhere."""
    checks = [
        (c[f"bound_rhs_delta_{delta_key(d)}"], c[f"bound_margin_delta_{delta_key(d)}"])
        for s in sweep
        for c in s["checkpoints"]
        for d in DELTAS
    ]
    positive = [(rhs, margin) for rhs, margin in checks if rhs > 0]
    if positive:
        worst = min(margin for _, margin in positive)
        broken = sum(margin < 0 for _, margin in positive)
        text = (
            f"Where its right side is positive ({len(positive)} of {len(checks)} checks), the bound "
            f"g(H) ≥ MF − Mis − slack {'holds' if not broken else f'fails at {broken}'} with smallest margin "
            f"{worst:+.3f}."
        )
        return headline("bound_holds", text, worst, None, bool(worst >= 0), not broken, text)
    best = max(rhs for rhs, _ in checks)
    return headline(
        "bound_holds",
        "The Kalai–Vempala bound's right side is negative at every check.",
        best,
        None,
        0,
        False,
        f"bound vacuous: right side < 0 at every check ({len(checks)} of {len(checks)}; the largest is "
        f"{best:+.3f}), so g(H) ≥ right side holds whatever the model does and says nothing",
    )


def _check_headlines(sweep: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The enumeration against sampled documents, and the grammar's mass: two computations that could disagree."""
    z = max(
        abs(c["sampled_hallucination_rate"] - c["hallucination_rate"]) / c["sampled_se"]
        for s in sweep
        for c in s["checkpoints"]
        if c["sampled_se"] > 0
    )
    n_checkpoints = sum(len(s["checkpoints"]) for s in sweep)
    agree = z <= FAMILY_Z
    sampling = (
        f"The exact g(H) by enumeration and the rate among documents sampled at T = 1 "
        f"{'agree' if agree else 'disagree'} over all {n_checkpoints} checkpoints (worst |z| = {z:.2f}; over these "
        f"comparisons the limit is |z| ≤ {FAMILY_Z})."
    )
    gap = max(abs(c["sum_check"]) for s in sweep for c in s["checkpoints"])
    closes = gap <= 1e-4
    mass = (
        f"g(F) + g(H) + malformed, the last summed from the grammar's leaks, is 1 within {gap:.1e} at every "
        f"checkpoint ({'within' if closes else 'beyond'} 1e-4)."
    )
    return [
        headline("enumeration_matches_sampling", sampling, z, None, bool(agree), agree, sampling),
        headline("mass_closes", mass, gap, None, bool(closes), closes, mass),
    ]


def _singleton_headline(singleton: dict[str, Any]) -> dict[str, Any]:
    """The singleton-rate variant (Kalai et al. 2025): its finite-N term swamps it at these sizes."""
    holds = singleton["margin"] >= 0
    text = (
        f"The singleton-rate bound (Kalai et al. 2025) {'holds' if holds else 'fails'} with margin "
        f"{singleton['margin']:+.3f}."
    )
    why = (
        (
            f"vacuous at N = {singleton['n_train']:,}: the finite-N term (35 + 6 ln N)/√N = "
            f"{singleton['finite_n_term']:.2f} makes the right side {singleton['bound_rhs']:+.3f}; without it the "
            f"margin is {singleton['margin_without_finite_n']:+.3f}"
        )
        if singleton["bound_rhs"] <= 0
        else (None if holds else text)
    )
    return headline("singleton_bound", text, singleton["margin"], None, bool(holds), why is None, why)
