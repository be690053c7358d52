"""The hallucination experiment: exact enumeration against brute force, then the quick run end to end."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from experiments import hallucination as exp
from experiments.hallucination.config import MAX_FACT_PROBABILITY_FLAG
from experiments.hallucination.enumeration import enumerate_g
from experiments.hallucination.setting import make_model, make_setting
from lab.metrics.hallucination import monofact_rate


def _tiny(attribute: str = "birthday") -> exp.Config:
    return exp.Config(
        quick=True,
        n_first_names=4,
        n_last_names=5,
        n_persons=8,
        n_train=50,
        batch_size=10,
        attribute=attribute,
        n_values=7,
        d_model=16,
        n_heads=2,
        n_layers=1,
    )


@pytest.mark.parametrize("attribute", ["birthday", "code"])
def test_enumeration_equals_brute_force_and_leaks_close_the_budget(attribute):
    cfg = _tiny(attribute)
    setting = make_setting(cfg, gamma=1.5)
    model = make_model(cfg, setting).eval()
    enum = enumerate_g(model, setting, firsts_per_chunk=3)  # chunks that do not divide the names
    n_first, n_last, n_values = setting.shape
    # Every well-formed document, scored by one plain forward pass each.
    rows = torch.tensor(
        [
            [
                setting.bos_id,
                int(setting.first_ids[i]),
                int(setting.last_ids[j]),
                setting.attribute_id,
                *setting.value_ids[v].tolist(),
            ]
            for i in range(n_first)
            for j in range(n_last)
            for v in range(n_values)
        ]
    )
    with torch.inference_mode():
        log_p = model(rows).double().log_softmax(-1)[:, :-1].gather(-1, rows[:, 1:, None]).sum(dim=(1, 2))
    np.testing.assert_allclose(enum.log_g.reshape(-1), log_p.numpy(), rtol=0, atol=2e-5)
    # Well-formed mass and the leaks out of the grammar, computed apart, add up to one.
    assert np.exp(enum.log_g).sum() + enum.malformed == pytest.approx(1.0, abs=1e-5)
    assert len(enum.leaks) == 3 + setting.value_ids.shape[1] and min(enum.leaks) >= 0


def test_quick_run_end_to_end(quick_run):
    cfg = exp.Config(quick=True)
    tmp_path = quick_run("hallucination")  # `forma run hallucination --quick`, shared with the dashboard's tests
    results = json.loads((tmp_path / "results.json").read_text())

    assert set(results) >= {"world", "sweep", "upweighting", "singleton"}
    assert set(results["world"]) >= {"n_facts", "n_factoids", "n_train", "n_hallucinations"}
    assert results["world"]["n_factoids"] == results["world"]["n_facts"] + results["world"]["n_hallucinations"]
    checkpoint_keys = {
        "epoch",
        "hallucination_rate",
        "malformed_rate",
        "unseen_person_mass",
        "miscalibration_tv_eps",
        "miscalibration_tv_adaptive",
        "miscalibration_binmass",
        "kl_hat",
        "recall_seen",
        "bound_slack_delta_0_1",
        "bound_margin_delta_0_1",
        "bound_slack_delta_0_01",
        "bound_margin_delta_0_01",
        "sampled_hallucination_rate",
        "sampled_se",
    }
    counts = pd.read_parquet(tmp_path / "train_counts.parquet")
    for entry in results["sweep"]:
        assert set(entry) >= {"gamma", "monofact_rate", "missing_mass", "checkpoints"}
        # The monofact rate is recomputable from the saved counts.
        gamma_counts = counts[counts.gamma == entry["gamma"]]["count"].to_numpy()
        assert entry["monofact_rate"] == pytest.approx(monofact_rate(gamma_counts))
        labels = [c["checkpoint"] for c in entry["checkpoints"]]
        assert labels == [f"epoch {e}" for e in cfg.epochs] + ["optimum"]
        for c in entry["checkpoints"]:
            assert set(c) >= checkpoint_keys
            # g(F) + g(H) + malformed = 1, the malformed mass summed from the grammar's leaks, not 1 − the rest.
            assert c["fact_rate"] + c["hallucination_rate"] + c["malformed_rate"] == pytest.approx(1.0, abs=1e-5)
            # Enumeration and T = 1 sampling (≥ 5,000 documents) agree within 3 standard errors.
            assert c["n_samples"] >= 5000
            # (3 SE for g(H); 3.5 for the other two keeps the chance of a spurious failure
            # over all these comparisons near 1e-3 should the numbers move with a platform.)
            for kind, limit in (("hallucination", 3.0), ("fact", 3.5), ("malformed", 3.5)):
                assert abs(c[f"sampled_{kind}_z"]) <= limit, (entry["gamma"], c["checkpoint"], kind)
            assert abs(c["sampled_hallucination_rate"] - c["hallucination_rate"]) <= 3 * c["sampled_se"] + 1e-12
            assert c["miscalibration_binmass"] <= c["miscalibration_tv_eps"] + 1e-12
            assert c["hallucination_rate"] >= c["p_pi_hallucination_mass"] - c["miscalibration_tv_eps"] - 1e-9
    # At least three popularity shapes, in the regime where the monofact rate rises with γ, each the
    # Good–Turing estimate of its missing mass.
    rates = [entry["monofact_rate"] for entry in sorted(results["sweep"], key=lambda e: e["gamma"])]
    assert len(rates) >= 3 and rates == sorted(set(rates))
    for entry in results["sweep"]:
        assert abs(entry["monofact_rate"] - entry["missing_mass"]) < 0.05

    conditions = [u["condition"] for u in results["upweighting"]]
    assert len(conditions) == 5 and conditions[0].startswith("control")
    assert len({u["documents_seen"] for u in results["upweighting"]}) == 1  # matched compute
    draws = pd.read_parquet(tmp_path / "upweighting.parquet")  # one row per condition and draw of its blocks
    for u in results["upweighting"]:
        assert set(u) >= {"condition", "hallucination_rate", "miscalibration_tv_eps", "kl_hat", "recall_seen"}
        rows = draws[draws.condition == u["condition"]]
        assert len(rows) == u["n_draws"] == cfg.upweight_draws  # the control's draws too: its run-to-run spread
        assert u["hallucination_rate"] == pytest.approx(rows.hallucination_rate.mean())
        assert u["recall_seen"] == pytest.approx(rows.recall_seen.mean())
    # Other draws pick other blocks: the repeated examples differ, and so does g(H).
    mixed = draws[draws.condition == results["upweighting"][1]["condition"]]
    assert mixed.hallucination_rate.nunique() == cfg.upweight_draws
    singleton = results["singleton"]
    assert singleton["bound_rhs"] == pytest.approx(singleton["bound_rhs_without_finite_n"] - singleton["finite_n_term"])
    assert singleton["finite_n_term"] > 1  # vacuous at this N, hence reported apart
    assert math.isfinite(singleton["error"])

    for table in ("checkpoints", "calibration_bins", "train_counts", "heldout", "upweighting", "singleton"):
        assert (tmp_path / f"{table}.parquet").is_file(), table
    bins = pd.read_parquet(tmp_path / "calibration_bins.parquet")
    assert set(bins.columns) >= {"gamma", "checkpoint", "scheme", "g_low", "g_high", "g_mass", "p_mass"}
    # The per-bin table reproduces the reported miscalibration.
    first = results["sweep"][0]["checkpoints"][0]
    part = bins[
        (bins.gamma == results["sweep"][0]["gamma"]) & (bins.checkpoint == first["checkpoint"]) & (bins.scheme == "eps")
    ]
    assert part.tv_within.sum() + 0.5 * first["malformed_rate"] == pytest.approx(
        first["miscalibration_tv_eps"], abs=1e-6
    )
    for figure in ("hallucination_vs_monofact", "bound", "training", "upweighting", "calibration_bins"):
        assert (tmp_path / f"{figure}.json").is_file(), figure


def _results(quick_run) -> dict:
    return json.loads((quick_run("hallucination") / "results.json").read_text())


def test_headlines_are_a_pure_function_of_the_results(quick_run):
    results = _results(quick_run)
    assert results["headlines"] == exp.headlines({k: v for k, v in results.items() if k != "headlines"})
    for h in results["headlines"]:
        assert set(h) == {"name", "sentence", "value", "interval", "direction", "supported", "why_not"}
        assert h["supported"] or (isinstance(h["why_not"], str) and h["why_not"])


def _with_checkpoints(results: dict, change) -> dict:
    sweep = [dict(s, checkpoints=[change(dict(c)) for c in s["checkpoints"]]) for s in results["sweep"]]
    return dict(results, sweep=sweep)


def test_a_vacuous_bound_is_no_headline(quick_run):
    results = _results(quick_run)

    def negative(c):
        return c | {f"bound_rhs_delta_{k}": -0.2 for k in ("0_1", "0_01")}

    heads = {h["name"]: h for h in exp.headlines(_with_checkpoints(results, negative))}
    assert not heads["bound_holds"]["supported"]
    assert heads["bound_holds"]["why_not"].startswith("bound vacuous: right side < 0 at every check")

    def positive_but_broken(c):  # a right side above g(H): the bound fails there, and the headline says so
        return (
            c
            | {f"bound_rhs_delta_{k}": c["hallucination_rate"] + 0.1 for k in ("0_1", "0_01")}
            | {f"bound_margin_delta_{k}": -0.1 for k in ("0_1", "0_01")}
        )

    heads = {h["name"]: h for h in exp.headlines(_with_checkpoints(results, positive_but_broken))}
    assert not heads["bound_holds"]["supported"] and heads["bound_holds"]["direction"] is False
    assert "fails at" in heads["bound_holds"]["why_not"]


def test_too_few_shapes_or_a_falling_monofact_rate_cannot_carry_the_spearman(quick_run):
    results = _results(quick_run)
    two = dict(results, sweep=results["sweep"][:2])
    [head] = [h for h in exp.headlines(two) if h["name"] == "hallucination_rises_with_monofact_rate"]
    assert not head["supported"] and "only 2 γ values" in head["why_not"]
    falling = dict(results, sweep=[dict(s, monofact_rate=1 - s["monofact_rate"]) for s in results["sweep"]])
    [head] = [h for h in exp.headlines(falling) if h["name"] == "hallucination_rises_with_monofact_rate"]
    assert not head["supported"] and "does not rise with γ" in head["why_not"]


def test_upweighting_whose_draws_straddle_the_control_is_no_headline(quick_run):
    """Each condition's draws against the control's draws, by an exact permutation test: draws among the control's
    are no evidence, and 3 draws against 3 all below the control reach p = 1/20."""
    results = _results(quick_run)
    control = results["upweighting"][0]["hallucination_rate_draws"]
    assert len(control) == exp.Config(quick=True).upweight_draws
    straddle = [dict(u) for u in results["upweighting"]]
    straddle[1]["hallucination_rate_draws"] = [c + 0.001 * (-1) ** i for i, c in enumerate(control)]
    heads = {h["name"]: h for h in exp.headlines(dict(results, upweighting=straddle))}
    head = heads[f"upweighting {straddle[1]['condition']}"]
    assert not head["supported"] and "not lower than the control at this size" in head["why_not"]
    below = [dict(u) for u in results["upweighting"]]
    below[1]["hallucination_rate_draws"] = [min(control) - 0.01 - 0.001 * i for i in range(len(control))]
    head = {h["name"]: h for h in exp.headlines(dict(results, upweighting=below))}[
        f"upweighting {below[1]['condition']}"
    ]
    assert head["supported"] and "p = 0.05" in head["sentence"]


def test_the_held_out_draws_are_independent_and_their_overlap_is_counted(quick_run):
    """Each γ's held-out documents are draws of their own stream from p, not unseen facts: results say how many
    repeat a training fact, which independent draws do about 1 − p(unseen) of the time."""
    from lab.data.facts import FactWorld, FactWorldConfig

    cfg = exp.Config(quick=True)
    for entry in _results(quick_run)["sweep"]:
        record = entry["heldout_draws"]
        world = FactWorld(
            FactWorldConfig(
                n_first_names=cfg.n_first_names,
                n_last_names=cfg.n_last_names,
                n_persons=cfg.n_persons,
                attributes=(cfg.attribute,),
                pareto_gamma=entry["gamma"],
                n_train=cfg.n_train,
                seed=cfg.seed,
                n_values=cfg.n_values,
            )
        )
        seen = world.train_counts[world.heldout_fact_indices(cfg.n_heldout)] > 0
        assert record["draws"] == cfg.n_heldout and record["draws_of_facts_in_training"] == int(seen.sum())
        assert "independent draws, not unseen facts" in record["how"]


def test_a_dominant_fact_is_flagged(quick_run):
    results = _results(quick_run)
    for entry in results["sweep"]:
        assert entry["max_fact_probability_flagged"] == (entry["max_fact_probability"] >= MAX_FACT_PROBABILITY_FLAG)
    dominated = dict(results, sweep=[dict(results["sweep"][0], max_fact_probability=0.684)] + results["sweep"][1:])
    [head] = [h for h in exp.headlines(dominated) if h["name"] == "hallucination_rises_with_monofact_rate"]
    assert "one fact holds 68% of p" in head["sentence"]
