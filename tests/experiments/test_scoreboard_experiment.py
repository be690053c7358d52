"""The scoreboard experiment: the quick run end to end through `forma run scoreboard --quick` (its table, figures,
models and headlines), and its headlines on hand-made tables whose answers are known."""

import numpy as np
import pandas as pd
import pytest
import torch

import experiments.scoreboard as experiment
from experiments.scoreboard.config import FIGURES, LENSES, LONG_INDUCTION_WORLD, Config, sample_seed
from experiments.scoreboard.parts import row as table_row
from experiments.scoreboard.seeds import combine_seeds, per_seed_rows, training_seeds
from experiments.scoreboard.summary import (
    attribution_headline,
    binomial_upper,
    controls_headline,
    find,
    heads_headline,
    lens_headline,
)
from lab.analysis.grading import grade_head_detectors
from lab.analysis.input_attribution import METHODS
from lab.data.sources import source_from_dict
from lab.model import HookedTransformer
from lab.runs import read_table

EXPERIMENT = "scoreboard"  # the `quick` fixture (tests/experiments/conftest.py) runs it


def test_the_table_grades_every_method_on_every_world_it_applies_to(quick):
    results, folder = quick
    table = results["table"]
    pd.testing.assert_frame_equal(read_table(folder / "scoreboard.parquet"), pd.DataFrame(table), check_dtype=False)
    cells = {(r["method"], r["world"]) for r in table}
    expected = {(f"{lens} lens", world) for lens in LENSES for world in ("markov", "mess3", "induction")}
    expected |= {
        (method, world) for method in (*METHODS, "attribution_graph") for world in ("markov", "induction", "facts")
    }
    expected |= {
        ("linear probe", "mess3"),
        ("linear probe", "facts"),
        ("head detectors", "long_induction"),
        ("attribution patching", "induction"),
    }
    assert cells == expected
    n_layers = results["profile"]["n_layers"]
    for lens in LENSES:
        for world in ("markov", "mess3", "induction"):
            rows = [r for r in table if r["method"] == f"{lens} lens" and r["world"] == world]
            assert [r["readout"] for r in rows] == [f"resid_pre {l}" for l in range(n_layers) for _ in "ab"] + [
                "output"
            ] * 2
    for row in table:
        if row["grade"] in ("kl_true", "kl_model", "auroc", "relevant_mass", "rank_correlation"):
            assert row["low"] <= row["value"] <= row["high"], row  # every grade has its interval
            assert row["control"] is not None and row["chance"] is not None, row


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
    from lab.zoo import world_source

    assert world_source(folder / "models" / "mess3").to_dict() == {"kind": "mess3", "x": 0.05, "alpha": 0.85, "seed": 0}


def test_headlines_are_what_headlines_computes(quick):
    results, _ = quick
    assert results["headlines"] == experiment.headlines({k: v for k, v in results.items() if k != "headlines"})


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


def test_an_attribution_headline_needs_its_interval_above_chance_and_its_controls_at_chance():
    table = [
        _row(m, "markov", "last prediction", "relevant_mass", v, v - 0.05, v + 0.05, chance=0.2)
        for m, v in (("integrated_gradients", 0.6), ("occlusion", 0.7), ("attention", 0.25))
    ]
    headline = attribution_headline({"table": table}, "markov")
    assert headline["supported"] and headline["direction"] is True
    assert (
        "integrated gradients puts 0.60 [0.55, 0.65] of its mass on the two relevant positions" in headline["sentence"]
    )
    table[0] = _row("integrated_gradients", "markov", "last prediction", "relevant_mass", 0.22, 0.15, 0.3, chance=0.2)
    straddles = attribution_headline({"table": table}, "markov")
    assert not straddles["supported"] and "cannot tell" in straddles["why_not"]
    table[0] = _row("integrated_gradients", "markov", "last prediction", "relevant_mass", 0.1, 0.05, 0.15, chance=0.2)
    below = attribution_headline({"table": table}, "markov")
    assert below["supported"] and below["direction"] is False
    table[1]["control_at_chance"] = False
    unsupported = attribution_headline({"table": table}, "markov")
    assert not unsupported["supported"] and "clears chance" in unsupported["why_not"]


def test_a_lens_headline_is_unsupported_while_the_jacobian_and_logit_intervals_overlap():
    def table(jacobian: tuple[float, float, float]) -> list[dict]:
        rows = [
            _row("logit lens", "markov", "resid_pre 1", "kl_true", 0.5, 0.45, 0.55, chance=2.0, control=2.2),
            _row("tuned lens", "markov", "resid_pre 1", "kl_true", 0.3, 0.25, 0.35, chance=2.0, control=2.2),
        ]
        return rows + [_row("jacobian lens", "markov", "resid_pre 1", "kl_true", *jacobian, chance=2.0, control=2.2)]

    apart = lens_headline({"table": table((0.2, 0.15, 0.25))}, "markov")
    assert apart["supported"] and apart["direction"] == 1 and "better than the logit lens" in apart["sentence"]
    overlapping = lens_headline({"table": table((0.52, 0.47, 0.57))}, "markov")
    assert not overlapping["supported"] and "overlap" in overlapping["why_not"]


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
