"""The scoreboard experiment: the quick run end to end through `forma run scoreboard --quick` (its table, figures,
models and headlines), and its headlines on hand-made tables whose answers are known."""

import json
from functools import partial

import numpy as np
import pandas as pd
import pytest
import torch

import experiments.scoreboard as experiment
from experiments.scoreboard.config import (
    FIGURES,
    LENSES,
    LONG_INDUCTION_WORLD,
    LOOKUP,
    MESS3_WORLD,
    QUICK,
    Config,
    lookup_readout,
    sample_seed,
)
from experiments.scoreboard.per_world import row as table_row
from experiments.scoreboard.seeds import combine_seeds, per_seed_rows, training_seeds
from experiments.scoreboard.summary import (
    ATTRIBUTION_TRUTHS,
    attribution_headline,
    belief_headline,
    binomial_upper,
    controls_headline,
    find,
    finds_mechanism,
    graph_headline,
    heads_headline,
    jacobian_headline,
    lens_headline,
)
from lab.analysis.grading import MEMORY, grade_head_detectors
from lab.analysis.input_attribution import METHODS, input_attributions, resample_effects
from lab.analysis.lens import logit_lens
from lab.analysis.probes.readouts import random_model
from lab.data.sources import source_from_dict
from lab.metrics.grades import BASELINES, attribution_grades
from lab.model.transformer import HookedTransformer
from lab.runs import read_table

EXPERIMENT = "scoreboard"  # the `quick` fixture (tests/experiments/conftest.py) runs it


def test_the_table_grades_every_method_on_every_world_it_applies_to(quick):
    results, folder = quick
    table = results["table"]
    pd.testing.assert_frame_equal(read_table(folder / "scoreboard.parquet"), pd.DataFrame(table), check_dtype=False)
    cells = {(r["method"], r["world"]) for r in table}
    expected = {(f"{lens} lens", world) for lens in LENSES for world in ("markov", "mess3", "induction")}
    expected |= {
        (method, world)
        for method in (*METHODS, "attribution_graph", *BASELINES)
        for world in ("markov", "induction", "facts")
    }
    expected |= {
        ("linear probe", "mess3"),
        (LOOKUP, "mess3"),
        ("linear probe", "facts"),
        ("head detectors", "long_induction"),
        ("attribution patching", "induction"),
    }
    assert cells == expected
    n_layers = results["profile"]["n_layers"]
    for lens in LENSES:
        for world in ("markov", "mess3", "induction"):
            rows = [r for r in table if r["method"] == f"{lens} lens" and r["world"] == world]
            assert [r["readout"] for r in rows] == [f"resid_pre {l}" for l in range(n_layers) for _ in "abc"] + [
                "output"
            ] * 3
    for row in table:
        if row["method"] == "uniform" and row["grade"] == "rank_correlation":
            assert row["why_no_interval"], row  # a constant score ranks nothing
        elif row["grade"] in ("kl_true", "kl_model", "prompt_gain", "auroc", "relevant_mass", "rank_correlation"):
            assert row["low"] <= row["value"] <= row["high"], row  # every grade has its interval
            assert row["chance"] is not None, row
            if row["grade"] in ("auroc", "relevant_mass", "rank_correlation"):
                assert row["control"] is not None, row
    readouts = {(r["world"], r["readout"]) for r in table if r["grade"] == "relevant_mass"}
    assert readouts == set(ATTRIBUTION_TRUTHS)  # the induction world against every source and against one
    assert [r["readout"] for r in table if r["method"] == LOOKUP] == [lookup_readout(k) for k in MEMORY]


def test_each_lens_reads_the_model_exactly_at_the_output_and_the_tuned_lens_best_below(quick):
    results, _ = quick
    for world in ("markov", "mess3", "induction"):
        for lens in LENSES:  # the last row of every lens is the model itself
            assert find(results, f"{lens} lens", world, "output", "kl_model")["value"] == pytest.approx(0, abs=1e-9)
        # Trained to match the model, the tuned lens is at least as close to it as the logit lens at every layer.
        for layer in range(results["profile"]["n_layers"]):
            tuned = find(results, "tuned lens", world, f"resid_pre {layer}", "kl_model")["value"]
            assert tuned <= find(results, "logit lens", world, f"resid_pre {layer}", "kl_model")["value"] + 1e-6


def test_the_models_learned_their_worlds(quick):
    """Each model is far better than knowing nothing: below a third of the prompt-blind floor (KL to the best
    reading that ignores the prompt) at the output, and the fact model recalls most values."""
    results, _ = quick
    for world in ("markov", "mess3", "induction"):
        output = find(results, "logit lens", world, "output", "kl_true")
        assert output["value"] < output["chance"] / 3, (world, output)
    assert min(results["worlds"]["facts"]["recall_by_template"]) > 0.5


def test_figures_models_and_the_belief_simplex_are_written(quick):
    results, folder = quick
    assert results["figures"] == list(FIGURES)
    for name in FIGURES:
        assert (folder / f"{name}.json").is_file() and (folder / f"{name}.html").is_file()
    for world in ("markov", "mess3", "induction", "facts", "long_induction"):
        assert (folder / "models" / world / "model.safetensors").is_file()
        for seed in results["seeds"][1:]:  # every training seed's models are kept
            assert (folder / "seeds" / str(seed) / "models" / world / "model.safetensors").is_file()
    simplex = read_table(folder / "belief_simplex.parquet")
    assert len(simplex) > 100 and np.allclose(simplex[["true_0", "true_1", "true_2"]].sum(axis=1), 1.0)
    points = read_table(folder / "attribution_patching_points.parquet")
    n_layers, n_heads = results["profile"]["n_layers"], results["profile"]["n_heads"]
    patching = results["worlds"]["induction"]["attribution_patching"]
    assert (points["sweep"] == "heads").sum() == patching["prompts"] * n_layers * n_heads
    from lab.zoo.worlds import world_source

    assert world_source(folder / "models" / "mess3").to_dict() == MESS3_WORLD


def _lens_rows(model, world, held_out, p, valid, labels, lens, method) -> list[dict]:
    """The scoreboard's table rows of one lens on one world, graded at the quick profile's size."""
    from lab.analysis.grading import grade_lens

    layers = grade_lens(model, held_out, p, lens, valid=valid, n_boot=QUICK.n_boot)
    return [table_row(method, world, label, g) for label, layer in zip(labels, layers) for g in layer.values()]


def test_a_lens_emitting_random_logits_or_one_reading_for_every_prompt_makes_the_lens_headline_false(quick):
    """The check a wrong lens must fail, at the quick profile's size (its held-out prompts, its bootstrap): each
    trained model read through random logits, or through one reading for every prompt (the model's mean output), in
    the Jacobian lens's place. Neither gains over another prompt's reading (the prompt-blind one exactly 0), so the
    headline that ranks it against the logit lens is not supported; the logit lens itself reads its prompt."""
    from lab.model.transformer import HookedTransformer
    from lab.zoo.worlds import world_source

    _, folder = quick

    def random_logits(model, tokens):
        shape = (model.cfg.n_layers + 1, *tokens.shape, model.cfg.d_vocab)
        return (3 * torch.randn(shape, generator=torch.Generator().manual_seed(0))).log_softmax(-1)

    def one_reading(model, tokens):
        mean = model(tokens).softmax(-1).mean(0).log()
        return mean.expand(model.cfg.n_layers + 1, *tokens.shape, model.cfg.d_vocab)

    for world in ("markov", "mess3", "induction"):
        model = HookedTransformer.load(folder / "models" / world).eval()
        source = world_source(folder / "models" / world)
        held_out = source.sample(QUICK.eval_prompts, QUICK.seq_len, seed=7)
        p, valid = source.conditionals(held_out), np.arange(QUICK.seq_len) < QUICK.seq_len - 1
        labels = [f"resid_pre {layer}" for layer in range(model.cfg.n_layers)] + ["output"]
        graded = partial(_lens_rows, model, world, torch.from_numpy(held_out), p, valid, labels)
        logit = graded(logit_lens, "logit lens")
        tuned = [{**r, "method": "tuned lens"} for r in logit]
        assert find({"table": logit}, "logit lens", world, "resid_pre 1", "prompt_gain")["low"] > 0, world
        for wrong in (random_logits, one_reading):
            table = logit + tuned + graded(wrong, "jacobian lens")
            gain = find({"table": table}, "jacobian lens", world, "resid_pre 1", "prompt_gain")
            assert gain["low"] <= 0 <= gain["high"], (world, wrong.__name__, gain)
            said = lens_headline({"table": table}, world)
            assert not said["supported"] and "does not read the prompt" in said["why_not"], (world, wrong.__name__)


def _said(results: dict, name: str) -> dict:
    return next(h for h in results["headlines"] if h["name"] == name)


def test_the_quick_runs_belief_probe_beats_every_lookup_of_the_last_k_tokens(quick):
    """On the chosen Mess3 world (config.MESS3_WORLD) a memory of six tokens does not give the belief: the all-layer
    probe's R² interval lies above the best lookup's, so the headline credits belief geometry."""
    results, _ = quick
    probe = find(results, "linear probe", "mess3", "all layers", "r2 belief state")
    best = max((r for r in results["table"] if r["method"] == LOOKUP), key=lambda r: r["value"])
    assert probe["low"] > best["high"]
    said = _said(results, "belief_probe")
    assert said["supported"] and said["direction"] is True and "holds the belief geometry" in said["sentence"]


def test_the_quick_runs_summed_jacobian_lens_fails_on_induction_where_the_same_position_one_does_not(quick):
    """Read before block 0 on the induction world, the Jacobian lens summed over later positions is further from the
    truth than the same-position variant, and reads another prompt's stream better than its own."""
    results, _ = quick
    said = _said(results, "jacobian_variants_induction")
    assert said["supported"] and said["direction"] == 1 and "the summed variant fails" in said["sentence"]
    assert find(results, "jacobian lens", "induction", "resid_pre 0", "prompt_gain")["high"] < 0
    assert find(results, "same-position jacobian lens", "induction", "resid_pre 0", "prompt_gain")["low"] > 0


def test_the_quick_runs_value_probe_reads_no_more_than_the_model_has_written(quick):
    """The fact model recalls every value, so its final stream holds the answer; before the last block the model's
    own logit lens already names most values, and the probe does not read more than it there."""
    results, _ = quick
    assert min(results["worlds"]["facts"]["recall_by_template"]) == 1.0
    assert find(results, "linear probe", "facts", "final", "accuracy fact value")["value"] == 1.0
    said = _said(results, "value_probe")
    assert said["direction"] is False and "no more than the model has written" in said["sentence"]


def test_headlines_are_what_headlines_computes(quick):
    results, _ = quick
    assert results["headlines"] == experiment.headlines({k: v for k, v in results.items() if k != "headlines"})


def _wrong_methods(model: HookedTransformer, tokens: torch.Tensor, seed: int) -> dict[str, np.ndarray]:
    """Methods that are wrong by construction: scores drawn at random (a fresh draw for every model), and the
    gradient taken at the wrong position (of the prediction before the last, the last position scored 0)."""
    before = input_attributions(model, tokens[:, :-1], methods=("gradient",))["gradient"].numpy()
    return {
        "wrong: random scores": np.random.default_rng(seed).random(tuple(tokens.shape)),
        "wrong: gradient at the wrong position": np.pad(before, ((0, 0), (0, 1))),
    }


def test_a_deliberately_wrong_method_is_refused_by_every_attribution_headline(quick):
    """On each world and truth, at the quick run's size (its prompts, truths, models, controls and bootstrap), a
    wrong method — random scores, gradients at the wrong position, recency where recency is wrong — does not
    find the mechanism by any attribution grade (AUROC and mass; Spearman ρ with the model's effects): it does not
    beat both the best trivial baseline and its control. The same check credits a method that does read the
    mechanism (integrated gradients on the induction world's one-source prompts)."""
    results, folder = quick
    seed, n_boot = json.loads((folder / "config.json").read_text())["seed"], results["profile"]["n_boot"]
    for world, readout in ATTRIBUTION_TRUTHS:
        block = results["worlds"][world]["attribution_unique_source" if readout == "unique source" else "attribution"]
        tokens, relevant = torch.tensor(block["tokens"]), np.array(block["relevant"])
        model = HookedTransformer.load(folder / "models" / world)
        controls = {
            "untrained": random_model(model, seed=seed + 1),
            "other": HookedTransformer.load(folder / "models" / world / "control"),
        }
        wrong = _wrong_methods(model, tokens, seed)
        theirs = {what: _wrong_methods(other, tokens, seed + 1 + k) for k, (what, other) in enumerate(controls.items())}
        effects = resample_effects(model, tokens).numpy()
        table = list(results["table"])
        for method, scores in wrong.items():
            controls_of = {w: t[method] for w, t in theirs.items()}
            graded = attribution_grades(scores, relevant, effects, controls=controls_of, n_boot=n_boot, seed=seed)
            table += [{"method": method, "world": world, "readout": readout, **g.row()} for g in graded.values()]
        for method in (*wrong, "recency"):  # recency is a baseline: it cannot beat the best of them
            for grades in (("auroc", "relevant_mass"), ("rank_correlation",)):
                found, _ = finds_mechanism({"table": table}, method, world, readout, grades)
                assert found is not True, (world, readout, method, grades)
    found, _ = finds_mechanism(results, "integrated_gradients", "induction", "unique source")
    assert found is True


# --- headlines on hand-made tables ------------------------------------------------------------------------------
def _row(method, world, readout, grade, value, low, high, chance=0.5, control=0.5, at_chance=True, n=40):
    return {
        "method": method,
        "world": world,
        "readout": readout,
        "grade": grade,
        "value": value,
        "low": low,
        "high": high,
        "why_no_interval": None,
        "better": "lower" if grade.startswith("kl") else "higher",
        "n": n,
        "chance": chance,
        "control": control,
        "control_low": control - 0.05,
        "control_high": control + 0.05,
        "control_at_chance": at_chance,
    }


def _attribution_table(ig: tuple[float, float, float], beats_control: bool = True) -> list[dict]:
    """The order-2 chain's attribution rows: the four baselines (recency best, [0.55, 0.65] on both grades),
    occlusion well below them, and integrated gradients at `ig` (value, low, high) on both grades."""
    rows = []
    for grade in ("auroc", "relevant_mass"):
        for method, v in (("recency", 0.6), ("last_token", 0.4), ("uniform", 0.3), ("random", 0.3)):
            rows.append(_row(method, "markov", "last prediction", grade, v, v - 0.05, v + 0.05, chance=0.2))
        rows.append(_row("occlusion", "markov", "last prediction", grade, 0.2, 0.15, 0.25, chance=0.2))
        rows.append(_row("integrated_gradients", "markov", "last prediction", grade, *ig, chance=0.2))
    for r in rows:
        r.update(control=0.3, control_low=0.25, control_high=0.35, control_means="an untrained model")
        r["beats_control"] = beats_control if r["method"] == "integrated_gradients" else r["low"] > 0.35
    return rows


def test_an_attribution_headline_credits_only_a_method_above_the_best_baseline_and_its_control():
    above = attribution_headline({"table": _attribution_table((0.8, 0.75, 0.85))}, "markov")
    assert above["supported"] and above["direction"] is True
    assert "against the two relevant positions, integrated gradients beats both" in above["sentence"]
    straddles = attribution_headline({"table": _attribution_table((0.62, 0.57, 0.67))}, "markov")
    assert not straddles["supported"] and "recency" in straddles["why_not"]
    below = attribution_headline({"table": _attribution_table((0.4, 0.35, 0.45))}, "markov")
    assert below["supported"] and below["direction"] is False and "no method beats" in below["sentence"]
    control = attribution_headline({"table": _attribution_table((0.8, 0.75, 0.85), beats_control=False)}, "markov")
    assert not control["supported"] and "its control's" in control["why_not"]
    assert (
        finds_mechanism({"table": _attribution_table((0.8, 0.75, 0.85))}, "recency", "markov", "last prediction")[0]
        is not True
    )


def test_recency_and_the_last_token_are_hard_to_beat_and_stay_above_chance_elsewhere(quick):
    """On the order-2 chain recency ranks the two relevant positions first (AUROC 1) and the last token alone puts
    all its mass on one of them, so no method finds that mechanism better than the trivial baselines; on the
    induction world (every source) and the fact world recency's AUROC stays above chance."""
    results, _ = quick
    assert find(results, "recency", "markov", "last prediction", "auroc")["value"] == 1.0
    assert find(results, "last_token", "markov", "last prediction", "relevant_mass")["value"] == pytest.approx(1.0)
    for method in (*METHODS, "attribution_graph"):
        assert finds_mechanism(results, method, "markov", "last prediction")[0] is not True, method
    for world, readout in (("induction", "all sources"), ("facts", "last prediction")):
        assert find(results, "recency", world, readout, "auroc")["low"] > 0.5, world


def test_the_graph_is_credited_only_where_trained_transcoders_beat_untrained_ones(quick):
    """Each graph headline credits the transcoders exactly where the graph's AUROC and mass over trained ones lie
    above the same over untrained ones, and states both replacement scores; on a hand-made table where they do
    not, it credits nothing."""
    results, _ = quick
    for world, readout in ATTRIBUTION_TRUTHS:
        rows = [find(results, "attribution_graph", world, readout, g) for g in ("auroc", "relevant_mass")]
        head = graph_headline(results, world, readout)
        assert head["direction"] == all(r["beats_control"] for r in rows), (world, readout)
        replacement = find(results, "attribution_graph", world, readout, "replacement_score")
        assert replacement["control_means"] == "untrained transcoders of the same shape"
        assert f"replacement score {replacement['value']:.2f}" in head["sentence"]
        assert replacement["beats_control"]  # the replacement score tells trained transcoders from untrained ones
    for world, readout in (("markov", "last prediction"), ("induction", "all sources")):
        # … while the graph's AUROC does not: over untrained transcoders it grades as well (the attention paths).
        assert not find(results, "attribution_graph", world, readout, "auroc")["beats_control"], world
    table = [
        {**_row("attribution_graph", "markov", "last prediction", g, 0.9, 0.85, 0.95), "beats_control": False}
        for g in ("auroc", "relevant_mass", "replacement_score")
    ]
    for r in table:
        r.update(control=0.9, control_low=0.85, control_high=0.95)
    same = graph_headline({"table": table}, "markov")
    assert not same["supported"] and not same["direction"] and "add nothing" in same["sentence"]
    for r in table:  # the untrained transcoders' graph above the trained one's by its interval: a finding, said so
        r.update(control=0.99, control_low=0.97, control_high=1.0)
    worse = graph_headline({"table": table}, "markov")
    assert worse["supported"] and not worse["direction"]
    assert "leave the graph worse than over untrained transcoders" in worse["sentence"]
    assert "add nothing" not in worse["sentence"]


def test_a_lens_headline_needs_both_lenses_to_read_their_prompt_and_their_intervals_apart():
    def table(jacobian: tuple[float, float, float], gain: tuple[float, float, float] = (0.5, 0.4, 0.6)) -> list[dict]:
        rows = [
            _row("logit lens", "markov", "resid_pre 1", "kl_true", 0.5, 0.45, 0.55, chance=2.0),
            _row("tuned lens", "markov", "resid_pre 1", "kl_true", 0.3, 0.25, 0.35, chance=2.0),
            _row("jacobian lens", "markov", "resid_pre 1", "kl_true", *jacobian, chance=2.0),
            _row("logit lens", "markov", "resid_pre 1", "prompt_gain", 0.9, 0.8, 1.0, chance=0.0),
        ]
        return rows + [_row("jacobian lens", "markov", "resid_pre 1", "prompt_gain", *gain, chance=0.0)]

    apart = lens_headline({"table": table((0.2, 0.15, 0.25))}, "markov")
    assert apart["supported"] and apart["direction"] == 1 and "better than the logit lens" in apart["sentence"]
    overlapping = lens_headline({"table": table((0.52, 0.47, 0.57))}, "markov")
    assert not overlapping["supported"] and "overlap" in overlapping["why_not"]
    blind = lens_headline({"table": table((3.0, 2.9, 3.1), gain=(0.01, -0.05, 0.07))}, "markov")
    assert not blind["supported"] and "as well as its own" in blind["why_not"]
    wrong = lens_headline({"table": table((3.0, 2.9, 3.1), gain=(-0.5, -0.6, -0.4))}, "markov")
    assert not wrong["supported"] and "better than its own" in wrong["why_not"]


def test_the_jacobian_headline_says_which_variant_fails_where_their_intervals_lie_apart():
    def table(same: tuple[float, float, float]) -> list[dict]:
        kl = {"jacobian lens": (9.0, 8.8, 9.2), "same-position jacobian lens": same}
        rows = [_row(m, "induction", "resid_pre 0", "kl_true", *v, chance=1.9) for m, v in kl.items()]
        gains = {"jacobian lens": (-0.5, -0.6, -0.4), "same-position jacobian lens": (0.3, 0.2, 0.4)}
        return rows + [_row(m, "induction", "resid_pre 0", "prompt_gain", *v, chance=0.0) for m, v in gains.items()]

    summed_fails = jacobian_headline({"table": table((2.2, 2.1, 2.3))})
    assert summed_fails["supported"] and summed_fails["direction"] == 1
    assert "the summed variant fails, not the lens idea: summing adds" in summed_fails["sentence"]
    overlapping = jacobian_headline({"table": table((9.1, 8.9, 9.3))})
    assert not overlapping["supported"] and "overlap" in overlapping["why_not"]


def test_the_belief_headline_says_geometry_only_where_the_probe_beats_the_best_lookup():
    def results(lookup: tuple[float, float, float]) -> dict:
        probe = [
            _row("linear probe", "mess3", "all layers", "r2 belief state", 0.95, 0.94, 0.96, chance=0.0, control=0.0),
            _row("linear probe", "mess3", "all layers", "r2 untrained", 0.88, 0.86, 0.9, chance=None),
        ]
        lookups = [_row(LOOKUP, "mess3", "last 1 token", "r2 belief state", 0.3, 0.25, 0.35, chance=None)]
        lookups.append(_row(LOOKUP, "mess3", "last 5 tokens", "r2 belief state", *lookup, chance=None))
        return {"table": probe + lookups, "worlds": {"mess3": {"source": MESS3_WORLD}}}

    above = belief_headline(results((0.78, 0.75, 0.8)))
    assert above["supported"] and above["direction"] is True and "belief geometry" in above["sentence"]
    assert "(k = 5 of 1 … 5" in above["sentence"] and "the last 5 tokens gives" in above["sentence"]
    short = belief_headline(results((0.95, 0.93, 0.97)))
    assert not short["supported"] and "the best lookup's interval" in short["why_not"]
    assert "cannot credit belief geometry" in short["sentence"]


def test_the_controls_headline_counts_controls_that_clear_chance_against_what_chance_allows():
    rows = [_row("m", "w", "r", "auroc", 0.7, 0.6, 0.8, at_chance=True) for _ in range(200)]
    assert controls_headline({"table": rows})["direction"] is True
    for row in rows[:20]:  # 20 of 200: far more than the ≈ 5 that fair controls clear by accident
        row["control_at_chance"] = False
    counted = controls_headline({"table": rows})
    assert counted["direction"] is False and counted["value"] == 20
    assert binomial_upper(200, 0.025) < 20


# --- training seeds -------------------------------------------------------------------------------------------
def test_every_grade_combines_the_training_seeds_and_its_interval_covers_their_spread(quick):
    results, folder = quick
    assert Config(quick=True).profile.seeds == len(results["seeds"]) >= 3
    assert Config().profile.seeds >= 3
    per_seed = read_table(folder / "scoreboard_seeds.parquet")
    assert sorted(per_seed["seed"].unique()) == results["seeds"]
    for r in results["table"]:
        mine = per_seed[
            (per_seed["method"] == r["method"])
            & (per_seed["world"] == r["world"])
            & (per_seed["readout"] == r["readout"])
            & (per_seed["grade"] == r["grade"])
        ]
        assert len(mine) == r["seeds"] == len(results["seeds"]), r
        values = mine["value"].dropna()
        if values.empty:  # no seed has a value (a constant score ranks nothing): nor has the combined row
            assert r["value"] is None and r["seed_min"] is None, r
            continue
        assert r["value"] == pytest.approx(values.mean()), r
        assert (r["seed_min"], r["seed_max"]) == pytest.approx((values.min(), values.max())), r
        if r["low"] is not None and not np.isnan(r["low"]):
            assert r["low"] <= mine["low"].min() + 1e-12 and r["high"] >= mine["high"].max() - 1e-12, r
            assert r["low"] <= values.min() and r["high"] >= values.max(), r
    assert all(
        h["sentence"].endswith(
            f"Over {len(results['seeds'])} training seeds per world; each interval covers "
            "the spread between them as well as over prompts."
        )
        for h in results["headlines"]
    )


def _grade_row(value, low, high, control=0.5, control_low=0.45, control_high=0.55, chance=0.5):
    return {
        "method": "m",
        "world": "w",
        "readout": "r",
        "grade": "auroc",
        "value": value,
        "low": low,
        "high": high,
        "why_no_interval": None,
        "better": "higher",
        "n": 40,
        "chance": chance,
        "control": control,
        "control_low": control_low,
        "control_high": control_high,
        "control_at_chance": control_low <= chance,
    }


def test_seeds_combine_into_their_mean_and_the_envelope_of_their_intervals():
    tables = {
        0: [_grade_row(0.7, 0.65, 0.75)],
        1: [_grade_row(0.8, 0.78, 0.82, control=0.56, control_low=0.52, control_high=0.60)],
        2: [_grade_row(0.6, 0.55, 0.62)],
    }
    (combined,) = combine_seeds(tables)
    assert combined["value"] == pytest.approx(0.7) and (combined["low"], combined["high"]) == (0.55, 0.82)
    assert (combined["seeds"], combined["seed_min"], combined["seed_max"]) == (3, 0.6, 0.8)
    # One seed's control clears chance; the combined control interval, [0.45, 0.60], does not.
    assert (combined["control_low"], combined["control_high"]) == (0.45, 0.60) and combined["control_at_chance"]
    for seed in (0, 2):
        tables[seed][0].update(control=0.53, control_low=0.51)
    assert not combine_seeds(tables)[0]["control_at_chance"]  # every seed's control clears it: so does theirs
    tables[1][0].update(low=float("nan"), high=float("nan"), why_no_interval="1 prompt(s): no interval")
    unknown = combine_seeds(tables)[0]
    assert unknown["low"] is None and unknown["why_no_interval"] == "1 prompt(s): no interval"
    assert [r["seed"] for r in per_seed_rows(tables)] == [0, 1, 2]
    assert training_seeds(4, 3) == [4, 5, 6]
    beaten = {seed: [_grade_row(0.8, 0.7, 0.9, 0.5, 0.4, 0.6) | {"beats_control": True}] for seed in (0, 1)}
    assert combine_seeds(beaten)[0]["beats_control"] is True
    beaten[2] = [_grade_row(0.65, 0.55, 0.75, 0.5, 0.4, 0.6) | {"beats_control": False}]
    assert combine_seeds(beaten)[0]["beats_control"] is False  # the seeds' envelope [0.55, 0.9] meets [0.4, 0.6]
    with pytest.raises(ValueError, match="positive integer"):
        training_seeds(0, 0)


# --- heads ----------------------------------------------------------------------------------------------------
def _heads_table(margin: tuple[float, float, float]) -> list[dict]:
    rows = [
        _row("head detectors", "long_induction", "every head", "margin_induction", *margin, chance=0.0, control=-0.3),
        _row("head detectors", "long_induction", "every head", "margin_previous_token", 1.0, 0.5, 1.5, chance=0.0),
    ]
    return rows + [
        _row("head detectors", "long_induction", "every head", f"spearman_{k}", 0.7, 0.6, 0.8, chance=0.0)
        for k in ("induction", "previous_token")
    ]


def test_the_heads_headline_needs_the_flagged_heads_to_lead_by_a_clear_margin():
    clear = heads_headline({"table": _heads_table((0.2, 0.1, 0.3))})
    assert clear["supported"] and clear["direction"] is True and "by 0.20 [0.10, 0.30] nats" in clear["sentence"]
    close = heads_headline({"table": _heads_table((0.02, -0.05, 0.09))})
    assert not close["supported"] and "cannot tell" in close["why_not"]
    behind = heads_headline({"table": _heads_table((-0.5, -0.7, -0.3))})
    assert behind["supported"] and behind["direction"] is False


def _detector_rows(folder, results, replace) -> list[dict]:
    """The head-detector rows of every seed's long-span induction model with the induction detector's scores
    replaced by `replace(model, tokens, scores)`, combined over the seeds as the run combines them."""
    source = source_from_dict(LONG_INDUCTION_WORLD)
    tables = {}
    for k, seed in enumerate(results["seeds"]):
        where = folder if k == 0 else folder / "seeds" / str(seed)
        model = HookedTransformer.load(where / "models" / "long_induction")
        eval_seed = sample_seed(seed, "long_induction", "eval")
        tokens = source.sample(results["profile"]["eval_prompts"], model.cfg.n_ctx, seed=eval_seed)
        tokens = tokens[source.offsets(tokens)[1] >= 3]
        scored = torch.from_numpy(source.copy_positions(tokens))
        scores = {"induction": replace(model, torch.from_numpy(tokens), np.random.default_rng(seed))}
        graded = grade_head_detectors(
            model, torch.from_numpy(tokens), scored, kinds=("induction",), scores=scores, n_boot=200, seed=seed
        )
        tables[seed] = [
            table_row("head detectors", "long_induction", "every head", g) for g in graded["grades"].values()
        ]
    return combine_seeds(tables)


def test_a_random_or_wrong_kind_detector_fails_the_heads_headline_at_the_runs_size(quick):
    """The run's own induction detector clears the headline; scoring the heads at random, or with the
    previous-token detector in its place, makes it false (or unsupported) on the same models and prompts."""
    results, folder = quick
    real = heads_headline(results)
    assert real["supported"] and real["direction"] is True, real
    from lab.analysis.heads import head_scores

    def layers(model, tokens, scores):
        return scores.expand(len(tokens), -1, -1).numpy()

    wrong = {
        "random": lambda model, tokens, rng: np.broadcast_to(  # one random score per head, on every prompt
            rng.random((model.cfg.n_layers, model.cfg.n_heads)), (len(tokens), model.cfg.n_layers, model.cfg.n_heads)
        ),
        "previous-token": lambda model, tokens, rng: layers(
            model, tokens, head_scores(model, tokens, "previous_token")
        ),
    }
    for name, replace in wrong.items():
        rows = _detector_rows(folder, results, replace)  # the induction detector's grades, the wrong detector's now
        replaced = {r["grade"] for r in rows}
        kept = [r for r in results["table"] if r["method"] != "head detectors" or r["grade"] not in replaced]
        judged = heads_headline({"table": kept + rows})
        assert not (judged["supported"] and judged["direction"] is True), (name, judged["sentence"])


def test_a_value_below_a_hundredth_is_said_in_two_significant_figures_not_as_zero():
    from experiments.scoreboard.summary import said

    assert said(_row("m", "w", "r", "g", 0.0018, 0.0005, 0.0037)) == "0.0018 [0.0005, 0.0037]"
    assert said(_row("m", "w", "r", "g", 0.25, 0.1, 0.37)) == "0.25 [0.10, 0.37]"
    assert said(_row("m", "w", "r", "g", 0.0, 0.0, 0.0)) == "0.00 [0.00, 0.00]"


def test_a_model_sends_the_scoreboard_to_its_real_track_and_its_own_folder():
    """`forma run scoreboard --model smollm2` is the real-model track (experiments.scoreboard.real), into
    runs/scoreboard_real/; an empty name is refused."""
    import experiments

    assert experiment.Config(model="smollm2").real_track and not experiment.Config().real_track
    assert experiments.run_name("scoreboard", experiment.Config(model="smollm2")) == "scoreboard_real"
    assert "model" in experiments.experiment("scoreboard").options
    assert (
        experiment.Config(quick=True, model="smollm2").real_profile.prompts < experiment.Config().real_profile.prompts
    )
    with pytest.raises(ValueError, match="model must name a model"):
        experiment.Config(model=" ")
    assert "corpus" in experiments.experiment("scoreboard").options
    assert experiment.Config(quick=True, model="smollm2").real_profile.lenses.eval_windows >= 2
    with pytest.raises(ValueError, match="corpus is for the real-model track"):
        experiment.Config(corpus="corpora/real")


def test_forma_run_refuses_a_corpus_that_is_no_folder_or_an_experiment_without_one(capsys, tmp_path):
    from lab.cli.parser import main

    assert main(["run", "scoreboard", "--model", "smollm2", "--corpus", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert f"--corpus {tmp_path / 'none'}: no such folder" in err and len(err.strip().splitlines()) == 1, err
    assert main(["run", "kl", "--corpus", str(tmp_path)]) == 2
    assert "experiment 'kl' takes no --corpus" in capsys.readouterr().err
