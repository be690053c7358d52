"""The scoreboard experiment: the quick run end to end through `forma run scoreboard --quick` (its table, figures,
models and headlines), and its headlines on hand-made tables whose answers are known."""

import numpy as np
import pandas as pd
import pytest

import experiments.scoreboard as experiment
from experiments.scoreboard.config import FIGURES, LENSES
from experiments.scoreboard.summary import (
    attribution_headline,
    binomial_upper,
    controls_headline,
    find,
    lens_headline,
)
from lab.analysis.input_attribution import METHODS
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
        ("head detectors", "induction"),
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
    for world in ("markov", "mess3", "induction", "facts"):
        assert (folder / "models" / world / "model.safetensors").is_file()
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
