"""What a scoreboard run shows, computed from its table: one sentence per claim, with the number behind it, its
interval, the direction a quick run must share with the default one, and — where the run cannot support it —
why not, in words. A claim is supported only by a check its own numbers could fail: its controls at chance,
and its interval clear of chance (or of its controls' intervals, or of another method's) on one side or the
other — which side is its direction. An interval that straddles is "cannot tell", said in words."""

import math
from typing import Any

from lab.names import name as display
from lab.runs import headline

WORLD_WORDS = {"markov": "the order-2 chain", "induction": "the induction world", "facts": "the fact world"}
RELEVANT_WORDS = {
    "markov": "the two relevant positions",
    "induction": "the copied position",
    "facts": "the name's two words",
}
# Of K fair controls, each clears chance at the 95% level (one side) with probability 2.5%; more than this many
# clearing it among the run's controls would happen by accident less than once in 1,000 runs at K ≤ 400.
CONTROL_SIDE = 0.025


def find(results: dict[str, Any], method: str, world: str, readout: str, grade: str) -> dict[str, Any]:
    """The table's row for method × world × readout × grade; a KeyError naming it when there is none."""
    for row in results["table"]:
        if (row["method"], row["world"], row["readout"], row["grade"]) == (method, world, readout, grade):
            return row
    raise KeyError(f"no row {method} × {world} × {readout} × {grade}")


def _interval(row: dict[str, Any]) -> list[float] | None:
    low, high = row["low"], row["high"]
    return [low, high] if low is not None and math.isfinite(low) and math.isfinite(high) else None


def _said(row: dict[str, Any]) -> str:
    interval = _interval(row)
    return f"{row['value']:.2f}" + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "")


def _clears(row: dict[str, Any], level: float) -> bool:
    """The row's interval lies wholly on the good side of `level`."""
    interval = _interval(row)
    if interval is None:
        return False
    return interval[0] > level if row["better"] == "higher" else interval[1] < level


def _apart(row: dict[str, Any], level: float) -> bool:
    """The row's interval lies wholly on one side of `level`: the run can tell which."""
    interval = _interval(row)
    return interval is not None and (interval[0] > level or interval[1] < level)


def _judged(controls_at_chance: bool, apart: bool, what: str) -> tuple[bool, str]:
    """(supported, why not): a claim needs its controls at chance and its interval clear of what it is set against."""
    if not controls_at_chance:
        return False, "a control clears chance, so the grade rewards something other than the truth"
    return apart, f"the interval includes {what}: at this size the run cannot tell which side it is on"


def binomial_upper(k_total: int, p: float, tail: float = 1e-3) -> int:
    """The smallest k with P(Binomial(k_total, p) > k) < tail."""
    cumulative, k = 0.0, 0
    while k <= k_total:
        cumulative += math.comb(k_total, k) * p**k * (1 - p) ** (k_total - k)
        if 1 - cumulative < tail:
            return k
        k += 1
    return k_total


def attribution_headline(results: dict[str, Any], world: str) -> dict[str, Any]:
    methods = ("integrated_gradients", "occlusion", "attention")
    rows = {m: find(results, m, world, "last prediction", "relevant_mass") for m in methods}
    ig = rows["integrated_gradients"]
    chance = ig["chance"]
    controls = all(r["control_at_chance"] for r in rows.values())
    graph = [
        r
        for r in results["table"]
        if (r["method"], r["world"], r["grade"]) == ("attribution_graph", world, "relevant_mass")
    ]
    sentence = (
        f"On {WORLD_WORDS[world]}, integrated gradients puts {_said(ig)} of its mass on "
        f"{RELEVANT_WORDS[world]}, occlusion {_said(rows['occlusion'])}, attention "
        f"{_said(rows['attention'])}"
        + (f", the attribution graph {_said(graph[0])}" if graph else "")
        + f" (chance {chance:.2f}; {ig['n']} prompts)."
    )
    return headline(
        f"attribution_{world}",
        sentence,
        ig["value"],
        _interval(ig),
        _clears(ig, chance),
        *_judged(controls, _apart(ig, chance), "chance"),
    )


def effects_headline(results: dict[str, Any], world: str) -> dict[str, Any]:
    rows = [r for r in results["table"] if r["world"] == world and r["grade"] == "rank_correlation"]
    best = max(rows, key=lambda r: r["value"])
    return headline(
        f"attribution_effects_{world}",
        f"Against the model's own exhaustive effects on {WORLD_WORDS[world]}, {display(best['method'])} ranks the "
        f"positions best (Spearman ρ = {_said(best)}); "
        + ", ".join(f"{display(r['method'])} {r['value']:.2f}" for r in rows if r is not best)
        + ".",
        best["value"],
        _interval(best),
        _clears(best, 0.0),
        *_judged(bool(best["control_at_chance"]), _apart(best, 0.0), "0"),
    )


def lens_headline(results: dict[str, Any], world: str) -> dict[str, Any]:
    layer = "resid_pre 1"
    kl = {lens: find(results, f"{lens} lens", world, layer, "kl_true") for lens in ("logit", "tuned", "jacobian")}
    jacobian, logit = kl["jacobian"], kl["logit"]
    direction = int(jacobian["value"] < logit["value"]) - int(jacobian["value"] > logit["value"])
    sentence = (
        f"On {WORLD_WORDS.get(world, 'the ' + world + ' world')}, read {display(layer)} (after one of two blocks), "
        f"KL(p ‖ lens) is {_said(kl['tuned'])} nats for the tuned lens, {_said(jacobian)} for the Jacobian "
        f"lens and {_said(logit)} for the logit lens: the Jacobian lens reads the truth "
        f"{'better' if direction > 0 else 'worse'} than the logit lens here."
    )
    jacobian_apart = (
        _interval(jacobian)
        and _interval(logit)
        and (jacobian["high"] < logit["low"] or logit["high"] < jacobian["low"])
    )
    controls = all(kl[lens]["control_at_chance"] for lens in kl)
    return headline(
        f"lens_{world}",
        sentence,
        jacobian["value"] - logit["value"],
        None,
        direction,
        bool(jacobian_apart and controls),
        "the Jacobian and logit lenses' intervals overlap"
        if not jacobian_apart
        else "a lens's other-prompt control reads the truth better than any prompt-blind law",
    )


def belief_headline(results: dict[str, Any]) -> dict[str, Any]:
    readout = "all layers"
    r2 = find(results, "linear probe", "mess3", readout, "r2 belief state")
    untrained = find(results, "linear probe", "mess3", readout, "r2 untrained")
    beyond = find(results, "linear probe", "mess3", readout, "r2 beyond the token")
    beyond_untrained = find(results, "linear probe", "mess3", readout, "r2 beyond the token untrained")
    selectivity = find(results, "linear probe", "mess3", readout, "selectivity")
    controls = max(beyond["control_high"], beyond_untrained["high"])
    carries = bool(_interval(beyond) and _interval(beyond_untrained) and beyond["low"] > controls)
    below = bool(_interval(beyond) and beyond["high"] < controls)
    sentence = (
        f"A linear probe on every layer's residual stream reads the Mess3 belief state with R² {_said(r2)} on "
        f"held-out prompts, an untrained model of the same shape {_said(untrained)}: the current token gives "
        f"most of it (Hewitt & Liang's selectivity {_said(selectivity)}). What the belief holds beyond the "
        f"token, the trained model's stream gives with R² {_said(beyond)}, the untrained one's "
        f"{_said(beyond_untrained)} (shuffled targets {beyond['control']:.2f})."
    )
    return headline(
        "belief_probe",
        sentence,
        beyond["value"],
        _interval(beyond),
        carries,
        *_judged(
            bool(r2["control_at_chance"] and beyond["control_at_chance"]), carries or below, "its controls' intervals"
        ),
    )


def value_headline(results: dict[str, Any]) -> dict[str, Any]:
    readout = "final"
    accuracy = find(results, "linear probe", "facts", readout, "accuracy fact value")
    untrained = find(results, "linear probe", "facts", readout, "accuracy untrained")
    selectivity = find(results, "linear probe", "facts", readout, "selectivity")
    controls = max(accuracy["control_high"], untrained["high"])
    carries = bool(_interval(accuracy) and _interval(untrained) and accuracy["low"] > controls)
    below = bool(_interval(accuracy) and accuracy["high"] < controls)
    sentence = (
        f"A linear probe on the final residual stream reads a fact's value for persons it was not fitted on "
        f"with accuracy {_said(accuracy)} (chance {accuracy['chance']:.2f}); shuffled labels give "
        f"{accuracy['control']:.2f}, an untrained model {_said(untrained)} (selectivity {_said(selectivity)})."
    )
    return headline(
        "value_probe",
        sentence,
        accuracy["value"],
        _interval(accuracy),
        carries,
        *_judged(bool(accuracy["control_at_chance"]), carries or below, "its controls' intervals"),
    )


def heads_headline(results: dict[str, Any]) -> dict[str, Any]:
    """Are the heads the induction detector flags the heads that write the copy? Each head's necessity is its
    Shapley value over every set of heads ablated together, along the path its kind works on; the margin is the
    least value among the flagged heads over the best of the others (lab.analysis.grading.flagged_margin)."""
    grades = ("margin_induction", "margin_previous_token", "spearman_induction", "spearman_previous_token")
    rows = {g: find(results, "head detectors", "long_induction", "every head", g) for g in grades}
    margin, previous = rows["margin_induction"], rows["margin_previous_token"]
    sentence = (
        f"On the long-span induction world the heads the induction detector flags write the copy: the least of "
        f"their Shapley values on the prediction (every set of heads ablated together, the heads' direct path) "
        f"leads the best other head's by {_said(margin)} nats of copying (above 0: they are the copying heads). "
        f"The previous-token detector's heads lead the others through the later heads' keys by {_said(previous)}; "
        f"across heads the induction score follows the copy with Spearman ρ {_said(rows['spearman_induction'])}, "
        f"the previous-token score the keys with {_said(rows['spearman_previous_token'])}."
    )
    return headline(
        "head_detectors",
        sentence,
        margin["value"],
        _interval(margin),
        _clears(margin, 0.0),
        *_judged(bool(margin["control_at_chance"]), _apart(margin, 0.0), "0"),
    )


def patching_headline(results: dict[str, Any]) -> dict[str, Any]:
    heads = find(results, "attribution patching", "induction", "heads", "pearson r")
    resid = find(results, "attribution patching", "induction", "resid_pre", "pearson r")
    sentence = (
        f"Attribution patching's first-order estimates follow the exhaustive patching sweep on the induction "
        f"world: Pearson r {_said(heads)} across heads and {_said(resid)} across the residual stream's "
        f"(layer, position) cells, per prompt ({heads['n']} prompts)."
    )
    return headline(
        "attribution_patching",
        sentence,
        heads["value"],
        _interval(heads),
        _clears(heads, 0.0),
        *_judged(bool(heads["control_at_chance"]), _apart(heads, 0.0), "0"),
    )


def controls_headline(results: dict[str, Any]) -> dict[str, Any]:
    judged = [r for r in results["table"] if r["control_at_chance"] is not None]
    cleared = [r for r in judged if not r["control_at_chance"]]
    limit = binomial_upper(len(judged), CONTROL_SIDE)
    names = ", ".join(
        " × ".join(display(r[k]) if k != "world" else r[k] for k in ("method", "world", "readout", "grade"))
        for r in cleared[:4]
    )
    sentence = (
        f"{len(judged) - len(cleared)} of {len(judged)} controls score at chance; {len(cleared)} clear it at "
        f"the 95% level, where fair controls would by accident about {CONTROL_SIDE * len(judged):.1f} times "
        f"(at most {limit} in 999 runs of 1,000)" + (f": {names}" if cleared else "") + "."
    )
    fair = len(cleared) <= limit
    return headline(
        "controls_at_chance",
        sentence,
        len(cleared),
        None,
        fair,
        fair,
        f"{len(cleared)} controls clear chance where fair ones would at most {limit} times: a grade "
        f"rewards something other than the truth",
    )


def headlines(results: dict[str, Any]) -> list[dict[str, Any]]:
    """What the run shows, one headline per claim, computed from results["table"] (see the module's docstring)."""
    out = [attribution_headline(results, world) for world in ("markov", "induction", "facts")]
    out += [effects_headline(results, world) for world in ("markov", "induction", "facts")]
    out += [lens_headline(results, world) for world in ("markov", "mess3", "induction")]
    out += [
        belief_headline(results),
        value_headline(results),
        heads_headline(results),
        patching_headline(results),
        controls_headline(results),
    ]
    return [with_seeds(h, results) for h in out]


def with_seeds(headline: dict[str, Any], results: dict[str, Any]) -> dict[str, Any]:
    """The headline's sentence with how many training seeds its numbers combine (a run that records them)."""
    seeds = results.get("seeds")
    if not seeds:
        return headline
    return dict(
        headline,
        sentence=headline["sentence"] + f" Over {len(seeds)} training seeds per world; each interval covers the "
        "spread between them as well as over prompts.",
    )
