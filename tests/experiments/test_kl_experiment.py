"""The kl experiment: the quick run end to end through `forma run kl`, and its pure parts on
cases with known answers (a model equal to the truth, a tempered truth, a noise-free power law)."""

import json
import math

import numpy as np
import pytest
import torch

from experiments import kl as experiment
from experiments.kl import real
from experiments.kl.config import FIGURES, REAL_QUICK, sample_seed
from experiments.kl.measure import HeldOut, decompose, entropy_rate_check, summarise
from experiments.kl.training import log_spaced_steps
from lab.data.sources import MarkovSource
from lab.metrics.information import temperature_scan
from lab.model.transformer import HookedTransformer

REGION_KEYS = {
    "prefixes",
    "prefix_lengths",
    "cross_entropy_nats",
    "entropy_nats",
    "kl_nats",
    "sampled_cross_entropy_nats",
    "sampled_kl_nats",
    "sampled_kl_se",
    "sampled_ce_minus_exact_in_se",
}


EXPERIMENT = "kl"  # the `quick` fixture (tests/experiments/conftest.py) runs it


# --- the quick run --------------------------------------------------------------------------------
def test_results_json_has_its_documented_shape(quick):
    results, folder = quick
    assert {"source", "checkpoints", "lens", "temperature", "scaling", "hmm"} <= set(results)
    assert {"kind", "entropy_rate_nats"} <= set(results["source"]) and results["source"]["kind"] == "markov"
    for rows, regions in ((results["checkpoints"], {"all", "complete", "first"}), (results["hmm"], {"all"})):
        assert len(rows) >= 10
        assert all(regions == set(row) - {"step", "tokens_seen"} for row in rows)
        assert all(REGION_KEYS <= set(row[region]) for row in rows for region in regions)
        steps = [row["step"] for row in rows]
        assert steps == sorted(set(steps)) and steps[-1] / steps[0] >= 100  # log-spaced over the run
    train = results["train"]
    assert all(r["tokens_seen"] == r["step"] * train["batch_size"] * train["seq_len"] for r in results["checkpoints"])
    assert [r["layer"] for r in results["lens"]] == list(range(results["model"]["n_layers"] + 1))
    assert all({"T", "kl_nats"} <= set(r) for r in results["temperature"])
    scaling = results["scaling"]
    assert {"points", "E_nats", "E_ci95", "true_entropy_nats", "alpha"} <= set(scaling)
    assert len(scaling["points"]) >= 6 and all({"n_params", "loss_nats"} <= set(p) for p in scaling["points"])
    assert len(scaling["E_ci95"]) == 2 and scaling["constraints"].startswith("E ≥ 0 only")
    assert results["eval"]["prefixes"] >= 1000
    assert json.loads((folder / "config.json").read_text()) == {"seed": 0, "quick": True, "workers": 2, "model": None}


def test_complete_contexts_and_first_positions_are_reported_apart(quick):
    """Like with like: the order-2 chain's first prefix (length 1) is conditioned through π's marginal, so its
    H exceeds the rate; complete contexts (length ≥ 2) average to the rate. The regions partition the prefixes."""
    results, _ = quick
    order, length = results["source"]["order"], results["train"]["seq_len"]
    last = results["checkpoints"][-1]
    assert last["complete"]["prefix_lengths"] == [order, length - 1]
    assert last["first"]["prefix_lengths"] == [1, order - 1]
    assert (
        last["complete"]["prefixes"] + last["first"]["prefixes"]
        == last["all"]["prefixes"]
        == results["eval"]["prefixes"]
    )
    for key in ("kl_nats", "entropy_nats", "cross_entropy_nats"):  # "all" is the prefix-weighted mix of the two
        mixed = last["complete"][key] * last["complete"]["prefixes"] + last["first"][key] * last["first"]["prefixes"]
        assert last["all"][key] == pytest.approx(mixed / last["all"]["prefixes"], rel=1e-9)
    assert last["first"]["entropy_nats"] > results["source"]["entropy_rate_nats"] + 0.3
    positions = results["kl_by_position"]
    assert [p["complete_context"] for p in positions] == [p["prefix_length"] >= order for p in positions]


def test_sampled_and_exact_agree_within_3_standard_errors(quick):
    results, _ = quick
    rows = [r[region] for r in results["checkpoints"] for region in ("complete", "first")] + [
        r["all"] for r in results["hmm"]
    ]
    for row in rows:
        assert row["sampled_kl_se"] > 0 and row["sampled_ce_se"] > 0
        assert abs(row["sampled_kl_nats"] - row["kl_nats"]) <= 3 * row["sampled_kl_se"], row
        assert abs(row["sampled_ce_minus_exact_in_se"]) <= 3, row
        # KL̂ is the paired difference CE − Ĥ
        assert row["sampled_kl_nats"] == pytest.approx(
            row["sampled_cross_entropy_nats"] - row["sampled_entropy_nats"], abs=1e-12
        )


def test_training_shrinks_the_kl_term(quick):
    results, _ = quick
    assert results["checkpoints"][-1]["complete"]["kl_nats"] < results["checkpoints"][0]["complete"]["kl_nats"]
    assert results["hmm"][-1]["all"]["kl_nats"] < results["hmm"][0]["all"]["kl_nats"]


def test_entropy_is_the_true_entropy_rate(quick):
    results, _ = quick
    spec = {k: results["source"][k] for k in ("vocab_size", "order", "concentration", "seed")}
    rate = MarkovSource(**spec).entropy_rate()
    assert results["source"]["entropy_rate_nats"] == pytest.approx(rate, abs=1e-12)
    check = results["entropy_rate_check"]  # the closed form against the sample mean over complete contexts
    assert check["within_3se"] and check["mean_complete_context_entropy_nats"] == pytest.approx(
        results["checkpoints"][-1]["complete"]["entropy_nats"], abs=1e-12
    )
    # The scaling sweep runs on its own chain (order 1, same symbols) and compares E with that chain's rate.
    scaling = results["scaling"]["source"]
    assert scaling["order"] == 1 and scaling["vocab_size"] == spec["vocab_size"]
    scaling_rate = MarkovSource(**{k: scaling[k] for k in spec}).entropy_rate()
    assert results["scaling"]["true_entropy_nats"] == pytest.approx(scaling_rate, abs=1e-12)
    assert results["acceptance"]["true_entropy_nats"] == pytest.approx(scaling_rate, abs=1e-12)


def test_the_world_is_the_markov_recipe(quick):
    """Steps 1–3 train the zoo's `markov` recipe: its order-2 chain, changed only in steps and width."""
    from lab.zoo.recipes import load_recipe

    results, _ = quick
    recipe = load_recipe("markov")
    assert {k: results["source"][k] for k in ("vocab_size", "order", "concentration", "seed")} == {
        k: recipe["world"][k] for k in ("vocab_size", "order", "concentration", "seed")
    }
    assert results["source"]["order"] == 2
    assert results["model"]["positions"] == recipe["model"]["positions"]


def test_sampled_cross_entropy_is_the_models_own_loss(quick):
    # The saved final model's next-token loss on the same held-out draw equals the sampled CE.
    results, folder = quick
    model = HookedTransformer.load(folder / "models" / "markov")
    source = MarkovSource(**{k: results["source"][k] for k in ("vocab_size", "order", "concentration", "seed")})
    held_out = HeldOut.draw(
        source, results["eval"]["sequences"], results["train"]["seq_len"], sample_seed(0, "markov-eval")
    )
    with torch.inference_mode():
        loss = model.loss(held_out.tokens).item()
    assert loss == pytest.approx(results["checkpoints"][-1]["all"]["sampled_cross_entropy_nats"], abs=1e-5)


def test_lens_ends_at_the_model_and_temperature_one_is_the_model(quick):
    results, _ = quick
    final_kl = results["checkpoints"][-1]["complete"]["kl_nats"]  # lens and temperature: complete contexts
    assert results["lens"][-1]["kl_nats"] == pytest.approx(final_kl, abs=1e-5)
    assert results["lens"][-1]["kl_all_nats"] == pytest.approx(results["checkpoints"][-1]["all"]["kl_nats"], abs=1e-5)
    at_one = [r for r in results["temperature"] if abs(r["T"] - 1) < 1e-9]
    assert len(at_one) == 1 and at_one[0]["kl_nats"] == pytest.approx(final_kl, abs=1e-9)
    best = results["temperature_min"]
    assert best["kl_nats"] <= min(r["kl_nats"] for r in results["temperature"]) + 1e-9


def test_figures_are_written(quick):
    results, folder = quick
    assert set(results["figures"]) == set(FIGURES)
    for name in FIGURES:
        assert (folder / f"{name}.html").stat().st_size > 0
        assert json.loads((folder / f"{name}.json").read_text())["data"]


# --- the pure parts -------------------------------------------------------------------------------
def _held_out(n: int = 64, length: int = 12) -> HeldOut:
    return HeldOut.draw(MarkovSource(8, order=2, seed=3), n, length, seed=4)


def test_a_model_equal_to_the_truth_has_zero_kl_both_ways():
    held_out = _held_out()
    summary = summarise(decompose(held_out.p.log(), held_out))
    assert summary["kl_nats"] == pytest.approx(0.0, abs=1e-12)
    assert summary["sampled_kl_nats"] == pytest.approx(0.0, abs=1e-12)
    assert summary["cross_entropy_nats"] == pytest.approx(summary["entropy_nats"], abs=1e-12)
    assert abs(summary["sampled_ce_minus_exact_in_se"]) <= 3


def test_the_sampled_ce_check_fails_when_the_conditionals_are_not_the_samplers():
    """The model's own −log P_θ at the sampled tokens against H + KL from the exact laws: with the laws of
    another chain in place of the sampler's (conditionals that do not describe the data), the two paths part
    by many standard errors."""
    held_out = HeldOut.draw(MarkovSource(8, order=2, seed=3), 256, 12, seed=4)
    model_logits = held_out.p.log()  # a model equal to the truth of the chain that made the tokens
    right = summarise(decompose(model_logits, held_out))
    other = MarkovSource(8, order=2, seed=9)
    wrong = HeldOut(
        held_out.tokens, torch.from_numpy(other.conditionals(held_out.tokens.numpy())[:, :-1]), held_out.complete_from
    )
    wrong_summary = summarise(decompose(model_logits, wrong))
    assert abs(right["sampled_ce_minus_exact_in_se"]) <= 3
    assert abs(wrong_summary["sampled_ce_minus_exact_in_se"]) > 10


def test_the_entropy_rate_check_fails_for_a_wrong_rate_or_incomplete_contexts():
    source = MarkovSource(8, order=2, seed=3)
    held_out = HeldOut.draw(source, 512, 12, seed=4)
    d = decompose(held_out.p.log(), held_out)
    rate = source.entropy_rate()
    assert entropy_rate_check(d.entropy, rate, held_out.complete_from)["within_3se"]
    assert not entropy_rate_check(d.entropy, rate + 0.05, held_out.complete_from)["within_3se"]
    # The first position is conditioned through π's marginal: its H is no estimate of the rate.
    assert not entropy_rate_check(d.entropy[:, :1], rate, 0)["within_3se"]


def test_best_truncated_context_models_are_exact():
    from lab.metrics.information import truncated_context_kl_of

    # A chain whose next token copies the token two back: the last token alone says nothing, both say all.
    V = 3
    transition = np.zeros((V * V, V))
    for a in range(V):
        for b in range(V):
            transition[a * V + b, a] = 1.0
    joint = np.full(V * V, 1 / V**2)[:, None] * transition
    assert truncated_context_kl_of(joint, V, 1) == pytest.approx(math.log(V), abs=1e-12)
    assert truncated_context_kl_of(joint, V, 0) == pytest.approx(math.log(V), abs=1e-12)
    with pytest.raises(ValueError, match="width"):
        truncated_context_kl_of(joint, V, 2)


def test_temperature_scan_finds_the_temperature_that_undoes_a_sharpening():
    held_out = _held_out()
    logits = 2.0 * held_out.p.log()  # softmax(z / 2) = p exactly
    _, best = temperature_scan(logits, held_out.p)
    assert best["T"] == pytest.approx(2.0, rel=1e-4)
    assert best["kl_nats"] == pytest.approx(0.0, abs=1e-9) and not best["at_bracket_edge"]


def test_scaling_headline_is_unsupported_when_its_interval_is_open(quick):
    results, _ = quick
    opened = dict(results, scaling=dict(results["scaling"], E_ci95=[0.0, 2.99], E_ci95_open="below", dof=1))
    heads = {h["name"]: h for h in experiment.headlines(opened)}
    assert not heads["scaling_E"]["supported"] and "open below" in heads["scaling_E"]["why_not"]
    assert heads == {h["name"]: h for h in experiment.headlines(opened)}  # a pure function of the results
    assert results["headlines"] == experiment.headlines({k: v for k, v in results.items() if k != "headlines"})


def test_checkpoints_are_log_spaced_and_end_at_the_last_step():
    for steps, n in ((800, 12), (200, 10), (12, 10)):
        points = log_spaced_steps(steps, n)
        assert len(points) == n and points == sorted(set(points)) and points[-1] == steps


def test_the_config_refuses_a_negative_seed_or_no_worker():
    with pytest.raises(ValueError, match="Config: seed must be a non-negative integer, got -1"):
        experiment.Config(seed=-1)
    with pytest.raises(ValueError, match="Config: workers must be a positive integer, got 0"):
        experiment.Config(workers=0)


def test_the_config_names_the_real_track_when_a_model_is_given():
    assert experiment.Config(model="smollm2").real_track and not experiment.Config().real_track
    assert experiment.Config(model="smollm2", quick=True).real_profile == REAL_QUICK
    with pytest.raises(ValueError, match="Config: model must name a model, got an empty string"):
        experiment.Config(model=" ")


def test_the_real_tracks_identity_holds_over_the_full_vocabulary_and_counts_the_mass_off_the_words():
    """On any logits over a vocabulary larger than the world's words: CE − H − KL is round-off, KL is the hand sum
    over the words against the full softmax, and KL ≥ −log P_θ(words) (log-sum inequality): the mass off them counts."""
    generator = torch.Generator().manual_seed(0)
    logits = 4 * torch.randn(3, 5, 50, generator=generator)
    ids = [7, 11, 13]
    p_words = torch.distributions.Dirichlet(torch.full((3,), 0.5, dtype=torch.float64)).sample((3, 5))
    words = torch.multinomial(p_words.view(-1, 3), 1, generator=generator).view(3, 5)
    terms, residual, mass = real.decompose_chunk(logits, p_words, words, ids)
    assert float(residual.abs().max()) <= real.IDENTITY_TOLERANCE_NATS
    q = torch.softmax(logits.double(), dim=-1)[..., ids]
    by_hand = torch.xlogy(p_words, p_words).sum(-1) - torch.xlogy(p_words, q).sum(-1)
    assert torch.allclose(terms.kl, by_hand, atol=1e-12, rtol=0)
    assert torch.allclose(mass, q.sum(-1)) and bool((terms.kl >= -mass.log() - 1e-12).all())
    assert torch.allclose(terms.nll_model, -q.gather(-1, words[..., None])[..., 0].log(), atol=1e-12, rtol=0)


def _real_results(residual: float, before: list[float], after: list[float]) -> dict:
    row = {"prefixes": 8, "identity_max_abs_residual_nats": residual, "sampled_ce_minus_exact_in_se": 0.5}
    return {
        "model_label": "a model",
        "identity": real.identity_check([row]),
        "kl_change": real.kl_change(before, after, seed=0),
        "checkpoints": [row | {"tokens_seen": 0}, row | {"tokens_seen": 96}],
    }


def test_the_real_tracks_headlines_hold_only_what_the_run_supports():
    falls = {
        h["name"]: h for h in experiment.headlines(_real_results(1e-14, [2.0, 2.2, 2.5, 1.9], [0.3, 0.2, 0.4, 0.3]))
    }
    assert falls["kl_identity"]["supported"] and falls["kl_falls_finetuning"]["supported"]
    assert falls["kl_falls_finetuning"]["direction"] == -1
    broken = {
        h["name"]: h for h in experiment.headlines(_real_results(1e-6, [0.3, 0.5, 0.2, 0.4], [0.4, 0.2, 0.5, 0.3]))
    }
    assert not broken["kl_identity"]["supported"] and "above round-off" in broken["kl_identity"]["why_not"]
    assert not broken["kl_falls_finetuning"]["supported"] and "includes 0" in broken["kl_falls_finetuning"]["why_not"]
