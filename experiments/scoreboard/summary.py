"""What a scoreboard run shows, computed from its table: one sentence per claim, with the number behind it, its
interval, the direction a quick run must share with the default one, and — where the run cannot support it —
why not, in words. A claim is supported only by a check its own numbers could fail: its controls at chance (a
control that knows nothing), or its value clear of its control (the same method where the mechanism is absent),
and its interval clear of chance (or of its controls' intervals, or of another method's, or of the best trivial
baseline's) on one side or the other — which side is its direction. An interval that straddles is "cannot tell",
said in words.

Input attribution: a method finds the mechanism on a world (against one of its truths, the row's readout) only
where, on AUROC and on the mass on the relevant positions, its interval lies above the best trivial baseline's
(lab.metrics.grades.BASELINES: recency, the last token, uniform, random; the best is the one whose interval
reaches highest) and above its own control's (the same method on an untrained model and on a model trained on
another world, the hardest of them). The attribution graph is credited only where the graph over trained
transcoders beats the same graph over untrained ones."""

import math
from typing import Any

from experiments.scoreboard.config import LOOKUP
from lab.metrics.grades import BASELINES
from lab.names import name as display
from lab.runs import headline

WORLD_WORDS = {"markov": "the order-2 chain", "induction": "the induction world", "facts": "the fact world"}
RELEVANT_WORDS = {
    ("markov", "last prediction"): "the two relevant positions",
    ("induction", "all sources"): "every lawful copy source",
    ("induction", "unique source"): "the one copy source (prompts built with one)",
    ("facts", "last prediction"): "the name's two words",
}
# The real-model track's tasks (experiments.scoreboard.real), said the same way.
REAL_WORDS = {
    ("repeated_tokens", "copy source"): ("the repeated random tokens", "the copy source"),
    ("ioi", "indirect object"): ("the indirect-object prompts", "the indirect object's name"),
    ("capitals", "subject"): ("the capital prompts", "the subject's tokens"),
}
ATTRIBUTION_TRUTHS = tuple(RELEVANT_WORDS)  # (world, readout): the truths attribution is graded against
FINDING_GRADES = ("auroc", "relevant_mass")  # a method finds the mechanism by both
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


def said(row: dict[str, Any]) -> str:
    """A row's value and interval in two decimals, or in two significant figures where every one of them is
    below 0.01 (a margin of 0.0018 nats is not "0.00")."""
    interval = _interval(row)
    shown = [abs(v) for v in (row["value"], *(interval or ())) if v]
    biggest = max(shown, default=0.0)
    decimals = 2 if biggest == 0.0 or biggest >= 0.01 else 1 - math.floor(math.log10(biggest))
    return f"{row['value']:.{decimals}f}" + (
        f" [{interval[0]:.{decimals}f}, {interval[1]:.{decimals}f}]" if interval else ""
    )


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


def _truth_words(world: str, readout: str) -> tuple[str, str]:
    """(the world, its truth) in words, on the toy worlds or the real-model track's tasks."""
    if (world, readout) in REAL_WORDS:
        return REAL_WORDS[world, readout]
    return WORLD_WORDS[world], RELEVANT_WORDS[world, readout]


def _attribution_name(world: str, readout: str) -> str:
    return f"attribution_{world}" + ("_unique_source" if readout == "unique source" else "")


def best_baseline(results: dict[str, Any], world: str, readout: str, grade: str) -> dict[str, Any]:
    """The trivial baseline's row hardest to beat on this grade: the one whose interval reaches highest."""
    rows = [find(results, b, world, readout, grade) for b in BASELINES]
    return max((r for r in rows if _interval(r)), key=lambda r: r["high"])


def attribution_methods(results: dict[str, Any], world: str, readout: str) -> list[str]:
    """The methods (not the baselines) graded on this world against this truth, in the table's order."""
    seen = [
        r["method"] for r in results["table"] if (r["world"], r["readout"], r["grade"]) == (world, readout, "auroc")
    ]
    return [m for m in dict.fromkeys(seen) if m not in BASELINES]


def finds_mechanism(
    results: dict[str, Any], method: str, world: str, readout: str, grades: tuple[str, ...] = FINDING_GRADES
) -> tuple[bool | None, str]:
    """(True, "") where on every grade the method's interval lies above the best baseline's and its control's;
    (False, why) where on some grade it lies wholly below either; (None, why) where the run cannot tell."""
    undecided = ""
    for grade in grades:
        row, best = find(results, method, world, readout, grade), best_baseline(results, world, readout, grade)
        interval = _interval(row)
        if interval is None:
            return None, f"{display(method)}'s {display(grade)} has no interval"
        if interval[1] < best["low"]:
            return False, f"its {display(grade)} lies below {display(best['method'])}'s"
        if row["control_low"] is not None and interval[1] < row["control_low"]:
            return False, f"its {display(grade)} lies below its control's ({row['control_means']})"
        if not (interval[0] > best["high"] and row["beats_control"]):
            undecided = undecided or (
                f"{display(method)}'s {display(grade)} interval overlaps "
                + (
                    f"the best trivial baseline's ({display(best['method'])})"
                    if interval[0] <= best["high"]
                    else f"its control's ({row['control_means']})"
                )
            )
    return (None, undecided) if undecided else (True, "")


def said_against(row: dict[str, Any]) -> str:
    return (
        f"{said(row)} (control {row['control']:.2f}, {row['control_means']})"
        if row["control"] is not None
        else said(row)
    )


def attribution_headline(results: dict[str, Any], world: str, readout: str = "last prediction") -> dict[str, Any]:
    """Which methods find the mechanism on this world against this truth (`finds_mechanism`): the claim holds for
    those listed, and the run can say so only where every method's verdict is decided."""
    methods = attribution_methods(results, world, readout)
    verdicts = {m: finds_mechanism(results, m, world, readout) for m in methods}
    finders = [m for m, (found, _) in verdicts.items() if found]
    best = {g: best_baseline(results, world, readout, g) for g in FINDING_GRADES}
    ig = {g: find(results, "integrated_gradients", world, readout, g) for g in FINDING_GRADES}
    sentence = (
        "On {}, against {}, ".format(*_truth_words(world, readout))
        + (", ".join(display(m) for m in finders) if finders else "no method")
        + " beats both the best trivial baseline and its control by its interval, on AUROC and on the mass on "
        f"the relevant positions (the best baselines: {display(best['auroc']['method'])}, AUROC "
        f"{said(best['auroc'])}; {display(best['relevant_mass']['method'])}, mass {said(best['relevant_mass'])}). "
        f"Integrated gradients: AUROC {said_against(ig['auroc'])}, mass {said_against(ig['relevant_mass'])} "
        f"(chance {ig['relevant_mass']['chance']:.2f}; {ig['auroc']['n']} prompts)."
    )
    undecided = [f"{why}" for found, why in verdicts.values() if found is None]
    return headline(
        _attribution_name(world, readout),
        sentence,
        ig["relevant_mass"]["value"],
        _interval(ig["relevant_mass"]),
        bool(finders),
        bool(finders) or not undecided,
        "the run cannot tell whether every method beats the best trivial baseline: " + "; ".join(undecided[:3]),
    )


def graph_headline(results: dict[str, Any], world: str, readout: str = "last prediction") -> dict[str, Any]:
    """Does the attribution graph owe its grades to the transcoders? Trained against untrained transcoders of the
    same shape (the graph's control), on AUROC and mass, beside both replacement scores."""
    rows = {g: find(results, "attribution_graph", world, readout, g) for g in FINDING_GRADES}
    replacement = find(results, "attribution_graph", world, readout, "replacement_score")
    beats = all(r["beats_control"] for r in rows.values())
    beaten = any(_interval(r) and r["control_low"] is not None and r["high"] < r["control_low"] for r in rows.values())
    sentence = (
        "On {}, against {}, ".format(*_truth_words(world, readout)) + "the attribution graph over trained "
        f"transcoders has AUROC {said(rows['auroc'])} and mass {said(rows['relevant_mass'])}; over untrained "
        f"transcoders of the same shape {rows['auroc']['control']:.2f} [{rows['auroc']['control_low']:.2f}, "
        f"{rows['auroc']['control_high']:.2f}] and {rows['relevant_mass']['control']:.2f} "
        f"[{rows['relevant_mass']['control_low']:.2f}, {rows['relevant_mass']['control_high']:.2f}]; replacement "
        f"score {said(replacement)} trained, {replacement['control']:.2f} untrained: the transcoders "
        + (
            "add to what the graph finds."
            if beats
            else "leave the graph worse than over untrained transcoders."
            if beaten
            else "add nothing the run can tell to what the graph finds."
        )
    )
    return headline(
        f"graph_{world}" + ("_unique_source" if readout == "unique source" else ""),
        sentence,
        rows["auroc"]["value"] - rows["auroc"]["control"],
        None,
        beats,
        beats or beaten,
        "the graph's intervals over trained and untrained transcoders overlap: at this size the run cannot tell "
        "whether the transcoders add to it",
    )


def effects_headline(results: dict[str, Any], world: str, readout: str = "last prediction") -> dict[str, Any]:
    rows = [find(results, m, world, readout, "rank_correlation") for m in attribution_methods(results, world, readout)]
    best = max(rows, key=lambda r: r["value"])
    baseline = best_baseline(results, world, readout, "rank_correlation")
    found, why = finds_mechanism(results, best["method"], world, readout, ("rank_correlation",))
    return headline(
        f"attribution_effects_{world}",
        f"Against the model's own exhaustive effects on {WORLD_WORDS[world]}, {display(best['method'])} ranks the "
        f"positions best (Spearman ρ = {said_against(best)}; the best trivial baseline, "
        f"{display(baseline['method'])}, {said(baseline)}); "
        + ", ".join(f"{display(r['method'])} {r['value']:.2f}" for r in rows if r is not best)
        + ".",
        best["value"],
        _interval(best),
        bool(found),
        found is not None,
        f"the run cannot tell: {why}",
    )


def _gain_words(lens: str, gain: dict[str, Any]) -> str | None:
    """Why a lens's reading cannot be ranked, from its gain over another prompt's reading; None where it reads the
    prompt (its interval above 0)."""
    if _clears(gain, 0.0):
        return None
    side = "better than" if _interval(gain) and gain["high"] < 0 else "as well as"
    return (
        f"the {display(lens)} reads another prompt's stream {side} its own (gain {said(gain)} nats): it does not "
        "read the prompt, so ranking it against another lens says nothing"
    )


def lens_headline(results: dict[str, Any], world: str) -> dict[str, Any]:
    """Which lens reads the truth better before the last block, the Jacobian or the logit lens: a ranking only where
    both read their prompt (each one's gain over another prompt's reading above 0: the check a lens emitting random
    logits, or one reading for every prompt, fails) and their intervals lie apart."""
    layer = "resid_pre 1"
    kl = {lens: find(results, f"{lens} lens", world, layer, "kl_true") for lens in ("logit", "tuned", "jacobian")}
    gain = {lens: find(results, f"{lens} lens", world, layer, "prompt_gain") for lens in ("logit", "jacobian")}
    jacobian, logit = kl["jacobian"], kl["logit"]
    direction = int(jacobian["value"] < logit["value"]) - int(jacobian["value"] > logit["value"])
    sentence = (
        f"On {WORLD_WORDS.get(world, 'the ' + world + ' world')}, read {display(layer)} (after one of two blocks), "
        f"KL(p ‖ lens) is {said(kl['tuned'])} nats for the tuned lens, {said(jacobian)} for the Jacobian "
        f"lens and {said(logit)} for the logit lens (knowing nothing of the prompt: {logit['chance']:.2f}); each "
        f"reads its own prompt better than another's by {said(gain['jacobian'])} and {said(gain['logit'])} nats: "
        f"the Jacobian lens reads the truth {'better' if direction > 0 else 'worse'} than the logit lens here."
    )
    apart = bool(
        _interval(jacobian)
        and _interval(logit)
        and (jacobian["high"] < logit["low"] or logit["high"] < jacobian["low"])
    )
    blind = [words for lens in gain if (words := _gain_words(f"{lens} lens", gain[lens]))]
    return headline(
        f"lens_{world}",
        sentence,
        jacobian["value"] - logit["value"],
        None,
        direction,
        apart and not blind,
        blind[0] if blind else "the Jacobian and logit lenses' intervals overlap",
    )


def jacobian_headline(results: dict[str, Any], world: str = "induction", layer: str = "resid_pre 0") -> dict[str, Any]:
    """The Jacobian lens's two variants on one world and layer: which reads the truth worse, and why — the summed
    variant adds a position's effect on every later output, which on the induction world is the copy a later
    position makes of it; the same-position variant keeps a position's effect on its own output."""
    summed = find(results, "jacobian lens", world, layer, "kl_true")
    same = find(results, "same-position jacobian lens", world, layer, "kl_true")
    gain = {
        "jacobian": find(results, "jacobian lens", world, layer, "prompt_gain"),
        "same-position jacobian": find(results, "same-position jacobian lens", world, layer, "prompt_gain"),
    }
    direction = int(same["value"] < summed["value"]) - int(same["value"] > summed["value"])
    worse, better = ("summed", "same-position") if direction > 0 else ("same-position", "summed")
    why = (
        ": summing adds each position's effect on the later outputs that copy it, a reading of what follows a later "
        f"occurrence of the token rather than of what comes next here (over another prompt's reading the summed lens "
        f"gains {said(gain['jacobian'])} nats, the same-position one {said(gain['same-position jacobian'])})"
        if direction > 0
        else ""
    )
    sentence = (
        f"On {WORLD_WORDS.get(world, 'the ' + world + ' world')}, read {display(layer)}, the Jacobian lens summed "
        f"over later positions (the reference's estimator) is {said(summed)} nats from the truth and the "
        f"same-position Jacobian lens {said(same)} (knowing nothing of the prompt: {summed['chance']:.2f}): the "
        f"{worse} variant fails, not the lens idea{why}."
    )
    apart = bool(
        _interval(summed) and _interval(same) and (summed["high"] < same["low"] or same["high"] < summed["low"])
    )
    return headline(
        f"jacobian_variants_{world}",
        sentence,
        summed["value"] - same["value"],
        None,
        direction,
        apart,
        f"the two variants' intervals overlap: at this size the run cannot tell the {better} one better",
    )


def belief_headline(results: dict[str, Any]) -> dict[str, Any]:
    """Belief geometry, or a short memory? The probe's R² beside the best lookup of the last k tokens (k = 1 … 6 in
    the scoreboard, the best on the test prompts themselves, which favours the lookup): "belief geometry" only where
    the probe's interval lies above the lookup's."""
    readout = "all layers"
    r2 = find(results, "linear probe", "mess3", readout, "r2 belief state")
    untrained = find(results, "linear probe", "mess3", readout, "r2 untrained")
    lookups = [r for r in results["table"] if r["method"] == LOOKUP and r["world"] == "mess3"]
    best = max(lookups, key=lambda r: r["value"])
    longest = max(int(r["readout"].split()[1]) for r in lookups)
    above = bool(_interval(r2) and _interval(best) and r2["low"] > best["high"])
    below = bool(_interval(r2) and _interval(best) and r2["high"] < best["low"])
    world = results["worlds"]["mess3"]["source"]
    verdict = (
        f"the stream holds the belief geometry, more than any memory of the last {longest} tokens gives"
        if above
        else "a memory of the last few tokens gives the belief as well: the run cannot credit belief geometry"
    )
    sentence = (
        f"A linear probe on every layer's residual stream reads the Mess3 belief state (x = {world['x']}, "
        f"α = {world['alpha']}) with R² {said(r2)} on held-out prompts; the best lookup of the last k tokens "
        f"(k = {best['readout'].split()[1]} of 1 … {longest}, fitted on the probe's training prompts) reaches "
        f"{said(best)} "
        f"and an untrained model of the same shape {said(untrained)}: {verdict}."
    )
    return headline(
        "belief_probe",
        sentence,
        r2["value"],
        _interval(r2),
        above,
        *_judged(bool(r2["control_at_chance"]), above or below, "the best lookup's interval"),
    )


def value_headline(results: dict[str, Any]) -> dict[str, Any]:
    """Does a probe read a fact's value before the model has written it? Graded at the last readout before the
    output (the input of the last block) beside the model's own logit-lens reading there, on the same held-out
    persons: the final stream holds the model's answer, and the model recalls every fact, so a probe there reads
    the answer and its accuracy says nothing."""
    n_layers = results["profile"]["n_layers"]
    readout = f"resid_pre {n_layers - 1}"
    accuracy = find(results, "linear probe", "facts", readout, "accuracy fact value")
    lens = find(results, "linear probe", "facts", readout, "accuracy logit lens")
    beyond = find(results, "linear probe", "facts", readout, "accuracy beyond lens")
    untrained = find(results, "linear probe", "facts", readout, "accuracy untrained")
    final = find(results, "linear probe", "facts", "final", "accuracy fact value")
    recall = results["worlds"]["facts"]["recall_by_template"]
    carries = _clears(beyond, 0.0)
    sentence = (
        f"The fact model recalls at least {min(recall):.0%} of the values in each sentence form, so a probe of its "
        f"final stream reads its answer (accuracy {said(final)}). Read before the last block instead "
        f"({display(readout)}), a linear probe names the value for persons it was not fitted on with accuracy "
        f"{said(accuracy)} (chance "
        f"{accuracy['chance']:.2f}, an untrained model {said(untrained)}), where the model's own logit lens already "
        f"names it for {said(lens)}: the probe reads {said(beyond)} "
        + ("more than the model has written there." if carries else "beyond it, no more than the model has written.")
    )
    return headline(
        "value_probe",
        sentence,
        beyond["value"],
        _interval(beyond),
        carries,
        *_judged(bool(accuracy["control_at_chance"]), _apart(beyond, 0.0), "0"),
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
        f"leads the best other head's by {said(margin)} nats of copying (above 0: they are the copying heads). "
        f"The previous-token detector's heads lead the others through the later heads' keys by {said(previous)}; "
        f"across heads the induction score follows the copy with Spearman ρ {said(rows['spearman_induction'])}, "
        f"the previous-token score the keys with {said(rows['spearman_previous_token'])}."
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
        f"world: Pearson r {said(heads)} across heads and {said(resid)} across the residual stream's "
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
    out = [attribution_headline(results, world, readout) for world, readout in ATTRIBUTION_TRUTHS]
    out += [graph_headline(results, world, readout) for world, readout in ATTRIBUTION_TRUTHS]
    out += [
        effects_headline(results, world, readout)
        for world, readout in (
            ("markov", "last prediction"),
            ("induction", "all sources"),
            ("facts", "last prediction"),
        )
    ]
    out += [lens_headline(results, world) for world in ("markov", "mess3", "induction")]
    out.append(jacobian_headline(results))
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
