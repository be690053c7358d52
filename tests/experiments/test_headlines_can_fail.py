"""Every headline can fail: a headline is "supported" only by a test that could have refused it at the run's size.

CLAIMS is the table: for each experiment, every headline (a pattern of names), the test behind it in words, results
where its claim holds and results where it does not, both made from the committed default run
(docs/measured/runs/NAME.json) by changing the numbers the claim rests on. Where the claim holds the headline is
supported; where it does not, the headline is not supported — or, for a headline with two truthful outcomes
(`two_way`: "contains" or "misses", "carries the signal" or not), it is supported pointing the other way. A
headline that no entry names fails `test_every_headline_has_a_claim`, so a new headline comes with its test.
"""

import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

import experiments
from lab.analysis.probes.readouts import judge_readouts
from tests.builders import REPO

REFERENCE = REPO / "docs" / "measured" / "runs"
Results = dict[str, Any]


def same(results: Results, name: str) -> Results:
    return results


@dataclass(frozen=True)
class Claim:
    pattern: str  # the headline names it covers (a regular expression, matched in full)
    test: str  # the test behind the headline, in words
    false: Callable[[Results, str], Results]  # results where the claim does not hold
    true: Callable[[Results, str], Results] = same  # results where it holds (default: the reference's own)
    two_way: bool = False  # its sentence has two truthful outcomes: where the claim fails it may point the other way


# --------------------------------------------------------------------------------------------
# monitor
# --------------------------------------------------------------------------------------------
def _signal_block(results: Results, name: str) -> dict[str, Any]:
    if name.startswith("max_prob_separates_"):
        row = next(r for r in results["signals"] if r["signal"] == "max_prob")
        return row["by_kind"][name.removeprefix("max_prob_separates_")]
    return next(r for r in results["signals"] if r["signal"] == name.removesuffix("_separates"))


def _separation(auroc: float, half: float) -> Callable[[Results, str], Results]:
    def change(results: Results, name: str) -> Results:
        _signal_block(results, name).update(
            auroc=auroc,
            auroc_ci95=[auroc - half / 1.5, auroc + half / 1.5],
            auroc_familywise_ci=[auroc - half, auroc + half],
        )
        return results

    return change


def _abstention(results: Results, name: str) -> dict[str, Any]:
    alpha = float(name.rsplit("_", 1)[1])
    return next(a for a in results["abstention"] if a["signal"] == results["abstention_signal"] and a["alpha"] == alpha)


def _crc(mean_above_alpha: float) -> Callable[[Results, str], Results]:
    def change(results: Results, name: str) -> Results:
        entry = _abstention(results, name)
        mean = entry["alpha"] + mean_above_alpha
        entry["resplits"].update(crc_joint_risk=mean, crc_joint_risk_ci95=[mean - 0.003, mean + 0.003])
        return results

    return change


def _ltt(answering: int, above: int) -> Callable[[Results, str], Results]:
    def change(results: Results, name: str) -> Results:
        again = _abstention(results, name)["resplits"]
        n = again["n_resplits"]
        again.update(
            ltt_n_certifying=answering,
            ltt_n_answering=answering,
            ltt_n_above_alpha=above,
            ltt_share_above_alpha=above / n,
            ltt_coverage=0.3 * answering / n,
            ltt_coverage_answering=0.3,
            ltt_selective_risk=0.1,
            ltt_pooled_selective_risk=0.1,
            ltt_selective_risk_range90=[0.0, 0.2],
        )
        return results

    return change


MONITOR = [
    Claim(
        r"(?:\w+_separates|max_prob_separates_(?:seen|unseen|invented))",
        "DeLong interval at the familywise level (Bonferroni over every separation claim of the run) excludes ½",
        false=_separation(0.53, 0.09),
        true=_separation(0.8, 0.09),
    ),
    Claim(
        r"crc_keeps_joint_risk_alpha_[\d.]+",
        "mean joint rate over re-draws of the calibration subjects, 95% interval (± 1.96 SE) not above α",
        false=_crc(0.05),
        true=_crc(0.0),
    ),
    Claim(
        r"ltt_keeps_selective_risk_alpha_[\d.]+",
        "share of re-draws whose test answers exceed α within δ + 3 binomial SE, shown only when more draws answer "
        "than δ + that slack (else the check cannot fail)",
        false=_ltt(150, 100),
        true=_ltt(150, 10),
    ),
]


# --------------------------------------------------------------------------------------------
# hallucination
# --------------------------------------------------------------------------------------------
def _rates_at(results: Results, checkpoint: str, rates: list[float]) -> Results:
    sweep = sorted(results["sweep"], key=lambda s: s["gamma"])
    for entry, rate in zip(sweep, rates):
        next(c for c in entry["checkpoints"] if c["checkpoint"] == checkpoint)["hallucination_rate"] = rate
    return results


def _monofact(order: list[int], epochs: bool) -> Callable[[Results, str], Results]:
    """g(H) across γ in the rank order `order` of the monofact rate (the identity: a perfect rise)."""

    def change(results: Results, name: str) -> Results:
        rates = [0.1 + 0.1 * k for k in order]
        labels = (
            [f"epoch {e}" for e in results["acceptance"]["spearman_monofact_vs_hallucination"]]
            if epochs
            else ["optimum"]
        )
        for label in labels:
            _rates_at(results, label, rates)
        return results

    return change


def _monofact_one_epoch_falls(results: Results, name: str) -> Results:
    results = _monofact([0, 1, 2, 3, 4], True)(results, name)
    first = next(iter(results["acceptance"]["spearman_monofact_vs_hallucination"]))
    return _rates_at(results, f"epoch {first}", [0.5, 0.4, 0.3, 0.2, 0.1])


def _every_check(change: Callable[[dict[str, Any]], None]) -> Callable[[Results, str], Results]:
    def apply(results: Results, name: str) -> Results:
        for entry in results["sweep"]:
            for checkpoint in entry["checkpoints"]:
                change(checkpoint)
        return results

    return apply


def _bound(margin: float) -> Callable[[Results, str], Results]:
    def change(checkpoint: dict[str, Any]) -> None:
        for key in ("0_1", "0_01"):
            checkpoint[f"bound_rhs_delta_{key}"] = 0.05
            checkpoint[f"bound_margin_delta_{key}"] = margin

    return _every_check(change)


def _upweighting(key: str, shift: Callable[[int], float], conditions: str) -> Callable[[Results, str], Results]:
    """Draws of the upweighted conditions (`conditions`: "named" — the headline's own — or "mixed") at the
    control's draws plus shift(draw)."""

    def change(results: Results, name: str) -> Results:
        control = results["upweighting"][0]
        n_shares = len(results["config"]["upweight_shares"])
        chosen = (
            results["upweighting"][1 : 1 + n_shares]
            if conditions == "mixed"
            else [u for u in results["upweighting"] if f"upweighting {u['condition']}" == name]
        )
        base = control[f"{key}_draws"]
        for u in chosen:
            u[f"{key}_draws"] = [base[i % len(base)] + shift(i) for i in range(len(u[f"{key}_draws"]))]
            u[key] = sum(u[f"{key}_draws"]) / len(u[f"{key}_draws"])
        return results

    return change


def _singleton(rhs: float, margin: float) -> Callable[[Results, str], Results]:
    def change(results: Results, name: str) -> Results:
        results["singleton"].update(bound_rhs=rhs, margin=margin)
        return results

    return change


HALLUCINATION = [
    Claim(
        "hallucination_rises_with_monofact_rate",
        "exact one-sided permutation test of Spearman's ρ(MF, g(H)) at each γ's held-out optimum, p ≤ 0.05 (n γ "
        "values: p ≥ 1/n!)",
        false=_monofact([0, 3, 1, 4, 2], False),
        true=_monofact([0, 1, 2, 3, 4], False),
    ),
    Claim(
        "hallucination_rises_with_monofact_rate_at_every_epoch",
        "the same test at every listed epoch, an intersection–union test: the largest p ≤ 0.05",
        false=_monofact_one_epoch_falls,
        true=_monofact([0, 1, 2, 3, 4], True),
    ),
    Claim(
        "bound_holds",
        "every check with a positive right side has g(H) ≥ MF − Mis − slack (vacuous: not shown)",
        false=_bound(-0.01),
        true=_bound(0.02),
    ),
    Claim(
        "enumeration_matches_sampling",
        "worst |z| of enumeration against T = 1 samples over all checkpoints ≤ 4",
        false=_every_check(
            lambda c: c.update(sampled_hallucination_rate=c["hallucination_rate"] + 5 * c["sampled_se"])
        ),
    ),
    Claim(
        "mass_closes",
        "g(F) + g(H) + malformed within 1e-4 of 1 at every checkpoint",
        false=_every_check(lambda c: c.update(sum_check=1e-3)),
    ),
    Claim(
        r"upweighting .+",
        "exact one-sided permutation test of the condition's draws against the control's draws (lower g(H)), "
        "p ≤ 0.05 (k draws against k: p ≥ 1/C(2k, k))",
        false=_upweighting("hallucination_rate", lambda i: 0.001 * (-1) ** i, "named"),
        true=_upweighting("hallucination_rate", lambda i: -0.05, "named"),
    ),
    Claim(
        "upweighting_raises_miscalibration",
        "exact one-sided permutation test of the mixed conditions' Mis draws against the control's (higher), p ≤ 0.05",
        false=_upweighting("miscalibration_tv_eps", lambda i: 0.001 * (-1) ** i, "mixed"),
        true=_upweighting("miscalibration_tv_eps", lambda i: 0.05, "mixed"),
    ),
    Claim(
        "singleton_bound",
        "error ≥ the singleton bound's right side, where that side is positive (vacuous: not shown)",
        false=_singleton(0.1, -0.02),
        true=_singleton(0.1, 0.02),
    ),
]


# --------------------------------------------------------------------------------------------
# kl
# --------------------------------------------------------------------------------------------
def _no_change(
    get: Callable[[Results], tuple[dict[str, Any], dict[str, Any]]], keys: tuple[str, str] = ("kl_nats", "kl_se")
) -> Callable[[Results, str], Results]:
    """The later measurement equal to the earlier, within its standard error."""

    def change(results: Results, name: str) -> Results:
        before, after = get(results)
        after[keys[0]] = before[keys[0]] + 0.5 * before[keys[1]]
        after[keys[1]] = before[keys[1]]
        return results

    return change


def _first_positions_at_rate(results: Results, name: str) -> Results:
    early = results["checkpoints"][-1]["first"]
    early["entropy_nats"] = results["source"]["entropy_rate_nats"] + 0.5 * early["entropy_se"]
    return results


def _scaling_misses(results: Results, name: str) -> Results:
    low, high = results["scaling"]["E_ci95"]
    results["scaling"]["true_entropy_nats"] = high + 0.1
    results["scaling"]["E_ci95_below_heldout_entropy"] = not results["scaling"]["E_ci95_below_heldout_entropy"]
    return results


KL = [
    Claim(
        "kl_falls",
        "95% interval of the change in exact KL between the first and last checkpoints "
        "(± 1.96·√(se₁² + se₂²), standard errors over held-out sequences) excludes 0",
        false=_no_change(lambda r: (r["checkpoints"][0]["complete"], r["checkpoints"][-1]["complete"])),
    ),
    Claim(
        "hmm_kl_falls",
        "the same on the hidden-Markov source",
        false=_no_change(lambda r: (r["hmm"][0]["all"], r["hmm"][-1]["all"])),
    ),
    Claim(
        "lens",
        "the same between the first layer's lens and the model's output",
        false=_no_change(lambda r: (r["lens"][0], r["lens"][-1])),
    ),
    Claim(
        "first_positions",
        "95% interval of the first positions' mean entropy minus the entropy rate excludes 0",
        false=_first_positions_at_rate,
    ),
    Claim(
        "sampled_matches_exact",
        "worst |z| of sampled against exact CE and KL over every checkpoint and region ≤ 4",
        false=lambda r, n: (r["checkpoints"][-1]["complete"].update(sampled_minus_exact_in_se=6.0), r)[1],
    ),
    Claim(
        "entropy_rate_check",
        "|z| of the closed-form rate against the mean complete-context entropy ≤ 3",
        false=lambda r, n: (r["entropy_rate_check"].update(z=5.0, within_3se=False), r)[1],
    ),
    Claim(
        "temperature",
        "the KL-minimising temperature lies inside the searched bracket and within [0.8, 1.25]",
        false=lambda r, n: (r["temperature_min"].update(T=1.6), r)[1],
    ),
    Claim(
        "scaling_E",
        "the fit's 95% interval for E (closed, ≥ 2 degrees of freedom) contains the true entropy rate",
        false=_scaling_misses,
        two_way=True,
    ),
    Claim(
        "scaling_E_vs_heldout_entropy",
        "the fit's 95% interval for E lies below the held-out entropy",
        false=_scaling_misses,
        two_way=True,
    ),
]


# --------------------------------------------------------------------------------------------
# calibration
# --------------------------------------------------------------------------------------------
def _partial_or_end(results: Results, name: str) -> dict[str, Any]:
    return results if name.endswith("_partial") else results["at_end"]


def _exposure_flat(results: Results, name: str) -> Results:
    for row in _partial_or_end(results, name)["mc"]["by_exposure"]:
        row["accuracy"] = 0.5
    return results


def _unseen(**values: float) -> Callable[[Results, str], Results]:
    def change(results: Results, name: str) -> Results:
        next(r for r in results["at_end"]["mc"]["by_exposure"] if r["exposure"] == "0").update(values)
        return results

    return change


def _ece_straddles(where: Callable[[Results], dict[str, Any]], key: str) -> Callable[[Results, str], Results]:
    def change(results: Results, name: str) -> Results:
        block = where(results)
        p95 = block[f"noise_floor_{key}_p95"]
        block[key], block[f"{key}_ci95"] = p95, [p95 - 0.01, p95 + 0.01]
        return results

    return change


def _lettered_as_cloze(results: Results, name: str) -> Results:
    end = results["at_end"]
    end["lettered"]["accuracy"] = end["mc"]["accuracy"]
    return results


def _interval(
    where: Callable[[Results], dict[str, Any]], key: str, value: float, half: float
) -> Callable[[Results, str], Results]:
    def change(results: Results, name: str) -> Results:
        where(results).update({key: value, f"{key}_ci95": [value - half, value + half]})
        return results

    return change


def _verdict_path(name: str) -> tuple[Callable[[Results], dict[str, Any]], str]:
    return {
        "p_ik_verdict": (lambda r: r["at_end"]["p_ik_verdicts"], "all readouts"),
        "p_ik_verdict_partial": (lambda r: r["p_ik_verdicts"], "all readouts"),
        "linear_probe_verdict": (lambda r: r["at_end"]["p_ik_verdicts"], "logistic probes"),
        "p_true_verdict": (lambda r: r["at_end"]["p_true"]["layers"], "verdict"),
    }[name]


def _rejudged(above_controls: bool) -> Callable[[Results, str], Results]:
    """The chosen readout's test interval moved clear above both controls' intervals, or onto the controls'
    estimates, and the verdict given again by lab.analysis.probes.readouts.judge_readouts."""

    def change(results: Results, name: str) -> Results:
        holder, key = _verdict_path(name)
        verdict = holder(results)[key]
        chosen = dict(verdict["chosen"])
        top = max(chosen["control_shuffled_auroc_ci95"][1], chosen["control_untrained_auroc_ci95"][1])
        centre = (
            min(top + 0.1, 0.95)
            if above_controls
            else max(chosen["control_shuffled_auroc"], chosen["control_untrained_auroc"])
        )
        chosen.update(auroc=centre, auroc_ci95=[centre - 0.04, centre + 0.04], candidate=True, constant=False)
        holder(results)[key] = judge_readouts([chosen], verdict["what"])
        return results

    return change


CALIBRATION = [
    Claim(
        r"accuracy_rises_with_exposure_(?:end|partial)",
        "Wald 95% interval of the accuracy gap between persons seen ≥ 2 times and never-seen persons excludes 0",
        false=_exposure_flat,
    ),
    Claim(
        "never_seen_at_chance",
        "Wilson 95% interval of the never-seen persons' accuracy contains chance and lies "
        'within chance ± 0.1 (excludes chance: "not at chance")',
        false=_unseen(accuracy=0.6),
        two_way=True,
    ),
    Claim(
        "never_seen_overconfident",
        "95% interval (± 1.96 SE over persons) of the mean of confidence − correctness "
        "on never-seen persons excludes 0",
        false=_unseen(overconfidence=0.01, overconfidence_se=0.02),
    ),
    Claim(
        "cloze_ece_beyond_noise",
        "bootstrap 95% interval of the ECE above (or below) a calibrated model's "
        "95th-percentile ECE at the same confidences",
        false=_ece_straddles(lambda r: r["at_end"]["mc"], "ece_15_equal_width"),
    ),
    Claim(
        "token_level_ece_beyond_noise",
        "the same for next-token prediction",
        false=_ece_straddles(lambda r: r["token_level"], "ece"),
    ),
    Claim(
        "lettered_does_not_transfer",
        "Wald 95% interval of the cloze − lettered accuracy gap excludes 0",
        false=_lettered_as_cloze,
    ),
    Claim(
        "temperature_above_1",
        "bootstrap 95% interval of the fitted T (refitted per resample) excludes 1",
        false=_interval(lambda r: r["at_end"]["temperature"], "T", 1.0, 0.1),
    ),
    Claim(
        "temperature_lowers_test_nll",
        "paired bootstrap 95% interval of the test NLL's change excludes 0",
        false=_interval(lambda r: r["at_end"]["temperature"], "nll_decrease", 0.0, 0.01),
    ),
    Claim(
        "own_confidence_separates",
        "stratified bootstrap 95% interval of the AUROC excludes ½",
        false=_interval(lambda r: r["at_end"], "p_ik_baseline_auroc", 0.5, 0.05),
    ),
    Claim(
        "own_confidence_beats_linear_probes",
        "bootstrap 95% interval of the AUROC gap excludes 0",
        false=lambda r, n: (
            r["at_end"]["p_ik_verdicts"]["logistic probes"]["chosen"].update(
                baseline_minus_chosen_auroc=0.0, baseline_minus_chosen_auroc_ci95=[-0.05, 0.05]
            ),
            r,
        )[1],
    ),
    Claim(
        r"p_ik_verdict(?:_partial)?|linear_probe_verdict|p_true_verdict",
        "the chosen readout (chosen on validation) carries the signal when its test interval clears both controls' "
        "intervals; no signal when it reaches a control's estimate; else not shown",
        false=_rejudged(False),
        true=_rejudged(True),
        two_way=True,
    ),
]


# --------------------------------------------------------------------------------------------
# equations
# --------------------------------------------------------------------------------------------
def _check_fails(results: Results, name: str) -> Results:
    next(c for c in results["checks"] if c["name"] == name)["passed"] = False
    return results


EQUATIONS = [
    Claim(
        r"\w+",
        "the check's measured value against the equation's, within its tolerance (each check is "
        "handed a wrong implementation in tests/experiments/test_equations.py)",
        false=_check_fails,
    )
]


# --------------------------------------------------------------------------------------------
# scoreboard
# --------------------------------------------------------------------------------------------
def _rows(results: Results, **match: str) -> list[dict[str, Any]]:
    rows = [r for r in results["table"] if all(r[k] == v for k, v in match.items())]
    assert rows, f"no table row {match}"
    return rows


def _straddling(
    select: Callable[[Results, str], list[dict[str, Any]]], level: Callable[[dict[str, Any]], float]
) -> Callable[[Results, str], Results]:
    """Results where every selected row's interval straddles what it is set against (chance, 0, ½, its controls)."""

    def change(results: Results, name: str) -> Results:
        for row in select(results, name):
            at = level(row)
            row.update(value=at, low=at - 0.05, high=at + 0.05)
        return results

    return change


def _clear_of(select: Callable[[Results, str], list[dict]], by: float) -> Callable[[Results, str], Results]:
    """Results where every selected row's interval lies `by` above 0."""

    def change(results: Results, name: str) -> Results:
        for row in select(results, name):
            row.update(value=by, low=by / 2, high=1.5 * by)
        return results

    return change


def _world(name: str) -> str:
    return name.rsplit("_", 1)[1]


def _lens_overlap(results: Results, name: str) -> Results:
    """The Jacobian lens's interval laid over the logit lens's."""
    logit = _rows(results, method="logit lens", world=_world(name), readout="resid_pre 1", grade="kl_true")[0]
    jacobian = _rows(results, method="jacobian lens", world=_world(name), readout="resid_pre 1", grade="kl_true")[0]
    jacobian.update(value=logit["value"] * 1.01, low=logit["low"], high=logit["high"])
    return results


def _lens_apart(results: Results, name: str) -> Results:
    """The Jacobian lens's interval above the logit lens's before block 1, and both lenses' gains over another
    prompt's reading above 0 there."""
    world = _world(name)
    logit = _rows(results, method="logit lens", world=world, readout="resid_pre 1", grade="kl_true")[0]
    jacobian = _rows(results, method="jacobian lens", world=world, readout="resid_pre 1", grade="kl_true")[0]
    jacobian.update(value=logit["high"] + 0.2, low=logit["high"] + 0.1, high=logit["high"] + 0.3)
    for lens in ("logit lens", "jacobian lens"):
        gain = _rows(results, method=lens, world=world, readout="resid_pre 1", grade="prompt_gain")[0]
        gain.update(value=0.5, low=0.4, high=0.6)
    return results


def _lens_blind(results: Results, name: str) -> Results:
    """The Jacobian lens reading another prompt's stream as well as its own: its gain over that reading at 0."""
    gain = _rows(results, method="jacobian lens", world=_world(name), readout="resid_pre 1", grade="prompt_gain")[0]
    gain.update(value=0.0, low=-0.05, high=0.05)
    return results


def _jacobian_variants_overlap(results: Results, name: str) -> Results:
    """The same-position Jacobian lens's interval laid over the summed one's."""
    world = _world(name)
    summed = _rows(results, method="jacobian lens", world=world, readout="resid_pre 0", grade="kl_true")[0]
    same = _rows(results, method="same-position jacobian lens", world=world, readout="resid_pre 0", grade="kl_true")
    same[0].update(value=summed["value"] * 1.01, low=summed["low"], high=summed["high"])
    return results


def _lookup_reaches_the_probe(results: Results, name: str) -> Results:
    """Every lookup of the last k tokens as good as the all-layer probe, its interval laid over the probe's."""
    probe = _rows(results, method="linear probe", world="mess3", readout="all layers", grade="r2 belief state")[0]
    for row in _rows(results, method="last-tokens lookup", world="mess3"):
        row.update(value=probe["value"], low=probe["low"], high=probe["high"])
    return results


def _controls_clear(results: Results, name: str) -> Results:
    judged = [r for r in results["table"] if r["control_at_chance"] is not None]
    for row in judged[: len(judged) // 4]:
        row["control_at_chance"] = False
    return results


def _truth(name: str) -> tuple[str, str]:
    """(world, readout) of an attribution or graph headline's name."""
    unique = name.endswith("_unique_source")
    world = name.removesuffix("_unique_source").rsplit("_", 1)[1]
    readout = "unique source" if unique else ("all sources" if world == "induction" else "last prediction")
    return world, readout


def _method_rows(results: Results, name: str, grades: tuple[str, ...]) -> list[dict[str, Any]]:
    from lab.metrics.grades import BASELINES

    world, readout = _truth(name)
    return [
        r
        for r in _rows(results, world=world, readout=readout)
        if r["grade"] in grades and r["method"] not in BASELINES and r["grade"] != "replacement_score"
    ]


def _best_high(results: Results, name: str, grade: str) -> float:
    from lab.metrics.grades import BASELINES

    world, readout = _truth(name)
    highs = [_rows(results, method=b, world=world, readout=readout, grade=grade)[0]["high"] for b in BASELINES]
    return max(h for h in highs if h is not None)  # a constant score (uniform) has no ρ, and so no interval


def _methods_against_baselines(above: bool, grades: tuple[str, ...]) -> Callable[[Results, str], Results]:
    """Results where integrated gradients' intervals lie above the best baseline's and its control's (above), or
    where every method's interval straddles the best baseline's top (not above)."""

    def change(results: Results, name: str) -> Results:
        world, readout = _truth(name)
        for row in _method_rows(results, name, grades):
            top = max(_best_high(results, name, row["grade"]), row["control_high"] or -1.0)
            if above:  # above every row of the grade too, so that it is the best method
                rows = _rows(results, world=world, readout=readout, grade=row["grade"])
                top = max([top] + [r["high"] for r in rows if r["high"] is not None])
            if above and row["method"] == "integrated_gradients":
                row.update(value=top + 0.1, low=top + 0.05, high=top + 0.15, beats_control=True)
            elif not above:
                row.update(value=top, low=top - 0.05, high=top + 0.05, beats_control=False)
        return results

    return change


def _graph_against_untrained(beats: bool) -> Callable[[Results, str], Results]:
    """Results where the graph over trained transcoders beats the same over untrained ones, or lies on them."""

    def change(results: Results, name: str) -> Results:
        world, readout = _truth(name)
        for grade in ("auroc", "relevant_mass"):
            row = _rows(results, method="attribution_graph", world=world, readout=readout, grade=grade)[0]
            if beats:
                row.update(low=row["control_high"] + 0.01, high=row["control_high"] + 0.1, beats_control=True)
            else:
                row.update(value=row["control"], low=row["control_low"], high=row["control_high"], beats_control=False)
        return results

    return change


SCOREBOARD = [
    Claim(
        r"attribution_(?:markov|induction|facts|induction_unique_source)",
        "bootstrap 95% intervals of each method's AUROC and relevant mass above the best trivial baseline's (recency, "
        "last token, uniform, random) and above its control's (the same method on an untrained model and on a "
        "model trained on another world); every method's verdict decided",
        two_way=True,
        false=_methods_against_baselines(False, ("auroc", "relevant_mass")),
        true=_methods_against_baselines(True, ("auroc", "relevant_mass")),
    ),
    Claim(
        r"graph_(?:markov|induction|facts|induction_unique_source)",
        "bootstrap 95% intervals of the attribution graph's AUROC and relevant mass over trained transcoders clear of "
        "those over untrained transcoders of the same shape",
        two_way=True,
        false=_graph_against_untrained(False),
        true=_graph_against_untrained(True),
    ),
    Claim(
        r"attribution_effects_(?:markov|induction|facts)",
        "bootstrap 95% interval of the best method's Spearman ρ with the exhaustive effects above the best trivial "
        "baseline's and its control's",
        two_way=True,
        false=_methods_against_baselines(False, ("rank_correlation",)),
        true=_methods_against_baselines(True, ("rank_correlation",)),
    ),
    Claim(
        r"lens_(?:markov|mess3|induction)",
        "bootstrap 95% intervals of KL(p ‖ lens) for the Jacobian and logit lenses apart, and each lens's gain over "
        "another prompt's reading (paired, per prompt) above 0: a lens emitting random logits or one reading for "
        "every prompt fails it (shown here with the Jacobian lens's gain at 0)",
        two_way=True,
        false=_lens_blind,
        true=_lens_apart,
    ),
    Claim(
        r"jacobian_variants_induction",
        "bootstrap 95% intervals of KL(p ‖ lens) at resid_pre 0 for the summed and same-position Jacobian lenses apart",
        two_way=True,
        false=_jacobian_variants_overlap,
    ),
    Claim(
        "belief_probe",
        "the all-layer probe's R² interval above the best lookup of the last k tokens' (k = 1 … 6), its shuffled "
        "control at chance",
        two_way=True,
        false=_lookup_reaches_the_probe,
    ),
    Claim(
        "value_probe",
        "before the last block, the probe's accuracy less the model's own logit-lens accuracy (paired over held-out "
        "persons) clear of 0, its shuffled-label control at chance",
        two_way=True,
        false=_straddling(
            lambda r, n: _rows(
                r, method="linear probe", world="facts", readout="resid_pre 1", grade="accuracy beyond lens"
            ),
            lambda row: 0.0,
        ),
        true=_clear_of(
            lambda r, n: _rows(
                r, method="linear probe", world="facts", readout="resid_pre 1", grade="accuracy beyond lens"
            ),
            0.1,
        ),
    ),
    Claim(
        "head_detectors",
        "interval (over prompts and training seeds) of the margin by which the heads the induction detector flags "
        "lead the others' Shapley value on the prediction clear of 0",
        two_way=True,
        false=_straddling(lambda r, n: _rows(r, method="head detectors", grade="margin_induction"), lambda row: 0.0),
    ),
    Claim(
        "attribution_patching",
        "bootstrap 95% interval of Pearson's r between attribution patching and the exhaustive sweep across heads "
        "clear of 0",
        two_way=True,
        false=_straddling(
            lambda r, n: _rows(r, method="attribution patching", readout="heads", grade="pearson r"), lambda row: 0.0
        ),
    ),
    Claim(
        "controls_at_chance",
        "no more controls clear chance at 95% than fair ones would in 999 runs of 1,000 (binomial)",
        false=_controls_clear,
    ),
]

CLAIMS = {
    "monitor": MONITOR,
    "hallucination": HALLUCINATION,
    "kl": KL,
    "calibration": CALIBRATION,
    "equations": EQUATIONS,
    "scoreboard": SCOREBOARD,
}


def _reference(name: str) -> Results:
    results = json.loads((REFERENCE / f"{name}.json").read_text())
    results.pop("headlines", None)
    return results


def _headline(name: str, results: Results, headline: str) -> dict[str, Any]:
    return {h["name"]: h for h in experiments.load(name).headlines(results)}[headline]


def _claim(name: str, headline: str) -> Claim:
    found = [c for c in CLAIMS[name] if re.fullmatch(c.pattern, headline)]
    assert len(found) == 1, f"{name}: headline {headline!r} matches {len(found)} claims of the table"
    return found[0]


def test_every_experiment_has_a_table():
    assert set(CLAIMS) == set(experiments.experiment_names())


@pytest.mark.parametrize("name", experiments.experiment_names())
def test_every_headline_has_a_claim(name):
    for head in experiments.load(name).headlines(_reference(name)):
        _claim(name, head["name"])


@pytest.mark.parametrize("name", experiments.experiment_names())
def test_every_headline_is_supported_where_its_claim_holds_and_not_where_it_fails(name):
    reference = _reference(name)
    problems = []
    for head in experiments.load(name).headlines(reference):
        claim = _claim(name, head["name"])
        holds = _headline(name, claim.true(copy.deepcopy(reference), head["name"]), head["name"])
        if not holds["supported"]:
            problems.append(f"{head['name']}: not supported where its claim holds ({holds['why_not']})")
            continue
        fails = _headline(name, claim.false(copy.deepcopy(reference), head["name"]), head["name"])
        shown = fails["supported"] and not (claim.two_way and fails["direction"] != holds["direction"])
        if shown:
            problems.append(f"{head['name']}: still supported where its claim fails ({fails['sentence']})")
    assert not problems, "\n".join(problems)


def table() -> str:
    """The table of every headline with the test behind it (`python -m tests.experiments.test_headlines_can_fail`)."""
    lines = ["| experiment | headline | the test behind it |", "|---|---|---|"]
    for name, claims in CLAIMS.items():
        for claim in claims:
            lines.append(f"| {name} | `{claim.pattern}` | {claim.test} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
