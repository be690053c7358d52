"""The kl experiment (issue 4): the quick run end to end through `forma run kl`, and its pure parts on
cases with known answers (a model equal to the truth, a tempered truth, a noise-free power law)."""

import json
import math

import numpy as np
import pytest
import torch

from experiments import kl as experiment
from lab.data.sources import MarkovSource
from lab.model import HookedTransformer

CHECKPOINT_KEYS = {"step", "tokens_seen", "cross_entropy_nats", "entropy_nats", "kl_nats",
                   "sampled_cross_entropy_nats", "sampled_kl_nats", "sampled_kl_se"}


@pytest.fixture(scope="module")
def quick(quick_run):
    folder = quick_run("kl")  # `forma run kl --quick`, shared with the dashboard's tests
    return json.loads((folder / "results.json").read_text()), folder


# --- the quick run --------------------------------------------------------------------------------
def test_results_json_has_the_shape_of_issue_4(quick):
    results, folder = quick
    assert {"source", "checkpoints", "lens", "temperature", "scaling", "hmm"} <= set(results)
    assert {"kind", "entropy_rate_nats"} <= set(results["source"]) and results["source"]["kind"] == "markov"
    for rows in (results["checkpoints"], results["hmm"]):  # the hmm list has the checkpoint list's shape
        assert len(rows) >= 10
        assert all(CHECKPOINT_KEYS <= set(row) for row in rows)
        steps = [row["step"] for row in rows]
        assert steps == sorted(set(steps)) and steps[-1] / steps[0] >= 100  # log-spaced over the run
    train = results["train"]
    assert all(r["tokens_seen"] == r["step"] * train["batch_size"] * train["seq_len"] for r in results["checkpoints"])
    assert [r["layer"] for r in results["lens"]] == list(range(results["model"]["n_layers"] + 1))
    assert all({"T", "kl_nats"} <= set(r) for r in results["temperature"])
    scaling = results["scaling"]
    assert {"points", "E_nats", "E_ci95", "true_entropy_nats", "alpha"} <= set(scaling)
    assert len(scaling["points"]) >= 4 and all({"n_params", "loss_nats"} <= set(p) for p in scaling["points"])
    assert len(scaling["E_ci95"]) == 2 and scaling["E_ci95"][0] <= scaling["E_nats"] <= scaling["E_ci95"][1]
    assert results["eval"]["prefixes"] >= 1000
    assert json.loads((folder / "config.json").read_text()) == {"seed": 0, "quick": True}


def test_cross_entropy_is_entropy_plus_kl_at_every_checkpoint(quick):
    results, _ = quick
    for row in results["checkpoints"] + results["hmm"]:
        assert abs(row["cross_entropy_nats"] - row["entropy_nats"] - row["kl_nats"]) <= 1e-6
        assert row["identity_error_nats"] <= 1e-6  # per prefix, worst case


def test_sampled_and_exact_agree_within_3_standard_errors(quick):
    results, _ = quick
    for row in results["checkpoints"] + results["hmm"]:
        assert row["sampled_kl_se"] > 0
        assert abs(row["sampled_kl_nats"] - row["kl_nats"]) <= 3 * row["sampled_kl_se"], row
        # KL̂ is the paired difference CE − Ĥ
        assert row["sampled_kl_nats"] == pytest.approx(row["sampled_cross_entropy_nats"] - row["sampled_entropy_nats"],
                                                       abs=1e-12)


def test_training_shrinks_only_the_kl_term(quick):
    results, _ = quick
    for rows in (results["checkpoints"], results["hmm"]):
        assert rows[-1]["kl_nats"] < rows[0]["kl_nats"]
        assert len({round(r["entropy_nats"], 12) for r in rows}) == 1  # same prefixes: H(p) never moves


def test_entropy_is_the_true_entropy_rate(quick):
    results, _ = quick
    spec = {k: results["source"][k] for k in ("vocab_size", "order", "concentration", "seed")}
    rate = MarkovSource(**spec).entropy_rate()
    assert results["source"]["entropy_rate_nats"] == pytest.approx(rate, abs=1e-12)
    assert results["checkpoints"][-1]["entropy_nats"] == pytest.approx(rate, abs=0.05)  # a sample mean of H_t
    # The scaling sweep runs on its own chain (order 1, same symbols) and compares E with that chain's rate.
    scaling = results["scaling"]["source"]
    assert scaling["order"] == 1 and scaling["vocab_size"] == spec["vocab_size"]
    scaling_rate = MarkovSource(**{k: scaling[k] for k in spec}).entropy_rate()
    assert results["scaling"]["true_entropy_nats"] == pytest.approx(scaling_rate, abs=1e-12)
    assert results["acceptance"]["true_entropy_nats"] == pytest.approx(scaling_rate, abs=1e-12)


def test_the_world_is_the_markov_recipe(quick):
    """Steps 1–3 train the zoo's `markov` recipe: its order-2 chain, changed only in steps and width."""
    from lab.zoo import load_recipe

    results, _ = quick
    recipe = load_recipe("markov")
    assert {k: results["source"][k] for k in ("vocab_size", "order", "concentration", "seed")} == {
        k: recipe["world"][k] for k in ("vocab_size", "order", "concentration", "seed")}
    assert results["source"]["order"] == 2
    assert results["model"]["positions"] == recipe["model"]["positions"]


def test_sampled_cross_entropy_is_the_models_own_loss(quick):
    # The saved final model's next-token loss on the same held-out draw equals the sampled CE.
    results, folder = quick
    model = HookedTransformer.load(folder / "models" / "markov")
    source = MarkovSource(**{k: results["source"][k] for k in ("vocab_size", "order", "concentration", "seed")})
    held_out = experiment.HeldOut.draw(source, results["eval"]["sequences"], results["train"]["seq_len"],
                                       experiment._sample_seed(0, "markov-eval"))
    with torch.inference_mode():
        loss = model.loss(held_out.tokens).item()
    assert loss == pytest.approx(results["checkpoints"][-1]["sampled_cross_entropy_nats"], abs=1e-5)


def test_lens_ends_at_the_model_and_temperature_one_is_the_model(quick):
    results, _ = quick
    final_kl = results["checkpoints"][-1]["kl_nats"]
    assert results["lens"][-1]["kl_nats"] == pytest.approx(final_kl, abs=1e-5)
    at_one = [r for r in results["temperature"] if abs(r["T"] - 1) < 1e-9]
    assert len(at_one) == 1 and at_one[0]["kl_nats"] == pytest.approx(final_kl, abs=1e-9)
    best = results["temperature_min"]
    assert best["kl_nats"] <= min(r["kl_nats"] for r in results["temperature"]) + 1e-9


def test_figures_are_written(quick):
    results, folder = quick
    assert set(results["figures"]) == set(experiment.FIGURES)
    for name in experiment.FIGURES:
        assert (folder / f"{name}.html").stat().st_size > 0
        assert json.loads((folder / f"{name}.json").read_text())["data"]


# --- the pure parts -------------------------------------------------------------------------------
def _held_out(n: int = 64, length: int = 12) -> experiment.HeldOut:
    return experiment.HeldOut.draw(MarkovSource(8, order=2, seed=3), n, length, seed=4)


def test_a_model_equal_to_the_truth_has_zero_kl_both_ways():
    held_out = _held_out()
    summary = experiment.summarise(experiment.decompose(held_out.p.log(), held_out))
    assert summary["kl_nats"] == pytest.approx(0.0, abs=1e-12)
    assert summary["sampled_kl_nats"] == pytest.approx(0.0, abs=1e-12)
    assert summary["cross_entropy_nats"] == pytest.approx(summary["entropy_nats"], abs=1e-12)


def test_temperature_scan_finds_the_temperature_that_undoes_a_sharpening():
    held_out = _held_out()
    logits = 2.0 * held_out.p.log()  # softmax(z / 2) = p exactly
    _, best = experiment.temperature_scan(logits, held_out.p)
    assert best["T"] == pytest.approx(2.0, rel=1e-4)
    assert best["kl_nats"] == pytest.approx(0.0, abs=1e-9) and not best["at_bracket_edge"]


def test_power_law_fit_recovers_a_noise_free_law_and_covers_a_noisy_one():
    N = np.array([1e3, 3e3, 1e4, 3e4, 1e5, 3e5])
    exact = 2.0 + 5.0 * N ** -0.5
    fit = experiment.fit_power_law(N, exact)
    assert fit["E_nats"] == pytest.approx(2.0, abs=1e-3) and fit["alpha"] == pytest.approx(0.5, rel=0.02)
    noisy = exact + np.random.default_rng(0).normal(0.0, 0.005, len(N))
    fit = experiment.fit_power_law(N, noisy)
    assert fit["E_ci95"][0] <= 2.0 <= fit["E_ci95"][1] and fit["dof"] == 3
    assert math.isnan(experiment.fit_power_law(N[:3], exact[:3])["E_ci95"][0])  # 3 points: no interval


def test_t_quantiles():
    assert experiment.t_quantile_975(1) == pytest.approx(12.706, abs=1e-3)
    assert experiment.t_quantile_975(10) == pytest.approx(2.2281, abs=1e-4)  # the last table entry
    for dof, table in ((11, 2.2010), (15, 2.1314), (30, 2.0423), (120, 1.9799)):  # the expansion
        assert experiment.t_quantile_975(dof) == pytest.approx(table, abs=2e-4)


def test_checkpoints_are_log_spaced_and_end_at_the_last_step():
    for steps, n in ((800, 12), (200, 10), (12, 10)):
        points = experiment.log_spaced_steps(steps, n)
        assert len(points) == n and points == sorted(set(points)) and points[-1] == steps
