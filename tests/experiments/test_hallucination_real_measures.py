"""The real-model track's measurements on constructed readings (experiments.hallucination.real): the answer rule
and the reply classifier on stated cases; g(H), Mis and MF − Mis against hand-computed values; and the bound's
headline failing on a constructed counterexample — a model that knows the held-out persons' cities, which no
training set can teach — and not supported where the margin's interval straddles 0."""

import numpy as np
import pytest

from experiments.hallucination.biographies import build_corpus
from experiments.hallucination.real import (
    bound_headline,
    classify_reply,
    greedy_outcome,
    measure_rate,
)


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        ("I'm sorry, but I don't have any information about Talvo Brenik.", "abstain"),
        ("I don't know where this person was born.", "abstain"),
        ("There is no information available about that person.", "abstain"),
        ("Talvo Brenik was born in Paris, France, in 1902.", "city"),
        ("Talvo Brenik was born in a small village near the coast.", "asserts"),
        ("He was born on 3 March 1950 in Springfield.", "asserts"),
    ],
)
def test_a_chat_reply_is_classified_by_the_stated_rule(reply, kind):
    assert classify_reply(reply) == kind


def test_the_answer_rule_is_the_greedy_next_token():
    outcome = greedy_outcome(np.array([2, 5, -1]), np.array([2, 1, 0]))
    assert list(outcome) == ["correct", "hallucinated", "no_answer"]


def readings(corpus, knows_heldout: bool):
    """A model that puts 0.9 on the true city of every trained person and, for the held-out, either 0.9 on the
    true city too (an oracle) or 0.9 spread evenly over the 16 cities (a calibrated guesser)."""
    n = len(corpus.names)
    probs = np.zeros((n, 16))
    truth = np.array(corpus.cities)
    heldout = corpus.kind == "heldout"
    probs[np.arange(n), truth] = 0.9
    if not knows_heldout:
        probs[heldout] = 0.9 / 16
    greedy = np.where(heldout & (not knows_heldout), -1, truth)
    return probs, truth, greedy


def measured(corpus, knows_heldout):
    probs, truth, greedy = readings(corpus, knows_heldout)
    return measure_rate(
        corpus.p, probs, truth, corpus.kind, greedy, corpus.monofact_rate, corpus.n_train, n_boot=100, seed=0
    )


def test_the_hallucination_rate_is_the_worlds_mass_on_wrong_cities():
    corpus = build_corpus(64, 0.5, 4, 32, seed=0)
    m = measured(corpus, knows_heldout=False)
    mf = corpus.monofact_rate
    assert m["hallucination_rate"] == pytest.approx(mf * 0.9 * 15 / 16)
    assert m["fact_rate"] == pytest.approx((1 - mf) * 0.9 + mf * 0.9 / 16)
    assert m["other_rate"] == pytest.approx(0.1)
    assert m["by_kind"]["heldout"]["wrong_city_mass"] == pytest.approx(0.9 * 15 / 16)
    assert m["by_kind"]["heldout"]["no_answer"] == 1.0 and m["by_kind"]["repeated"]["correct"] == 1.0
    assert m["bound"] == pytest.approx(mf - m["miscalibration"])
    assert m["hallucination_rate_interval"][0] <= m["hallucination_rate"] <= m["hallucination_rate_interval"][1]


def test_the_bound_check_fails_on_a_model_that_knows_what_training_never_showed():
    rates = [measured(build_corpus(64, r, 4, 32, seed=0), knows_heldout=True) for r in (0.25, 0.75)]
    assert all(r["hallucination_rate"] == pytest.approx(0.0) for r in rates)
    assert all(r["margin_interval"][1] < 0 for r in rates)  # g(H) = 0 below MF − Mis > 0
    entry = bound_headline(rates)
    assert not entry["supported"] and entry["why_not"].startswith("the bound fails")


def test_thebound_headline_is_unsupported_where_the_interval_straddles_zero_and_holds_above_it():
    rate = {"monofact_rate": 0.5, "bound": 0.2, "margin": 0.01, "margin_interval": [-0.02, 0.04]}
    entry = bound_headline([rate])
    assert not entry["supported"] and "straddles" in entry["why_not"]
    assert bound_headline([{**rate, "margin_interval": [0.005, 0.04]}])["supported"]


def test_thebound_headline_says_vacuous_where_its_right_side_is_never_positive():
    rate = {"monofact_rate": 0.5, "bound": -0.1, "margin": 0.3, "margin_interval": [0.2, 0.4]}
    entry = bound_headline([rate])
    assert not entry["supported"] and entry["why_not"].startswith("bound vacuous")


def test_the_bound_headline_judges_only_the_rates_where_its_right_side_is_positive():
    says_nothing = {"monofact_rate": 0.25, "bound": -0.3, "margin": 0.01, "margin_interval": [-0.1, 0.2]}
    informative = {"monofact_rate": 0.75, "bound": 0.05, "margin": 0.5, "margin_interval": [0.3, 0.7]}
    entry = bound_headline([says_nothing, informative])
    assert entry["supported"] and entry["sentence"].startswith("Where MF − Mis > 0 (1 of 2 monofact rates)")


def test_a_model_sends_the_run_to_the_real_track():
    import experiments
    from experiments.hallucination import Config

    assert experiments.run_name("hallucination", Config(model="smollm2", quick=True)) == "hallucination_real"
    assert experiments.run_name("hallucination", Config(quick=True)) == "hallucination"
    assert "model" in experiments.experiment("hallucination").options
    with pytest.raises(ValueError, match="model must name a pretrained model"):
        Config(model=" ")


def test_the_toy_run_is_cited_with_its_profile_and_each_gammas_bound(tmp_path, monkeypatch):
    import json

    from experiments.hallucination.real import toy_citation

    monkeypatch.setenv("FORMA_RUNS_DIR", str(tmp_path))
    assert toy_citation()["run"] is None
    folder = tmp_path / "hallucination" / "2026-01-02T03-04-05Z"
    folder.mkdir(parents=True)
    optimum = {"checkpoint": "optimum", "hallucination_rate": 0.3, "miscalibration_tv_eps": 0.1}
    optimum |= {"bound_rhs_delta_0_1": -1.0, "bound_slack_delta_0_1": 1.1}
    sweep = [{"gamma": 2.0, "monofact_rate": 0.25, "checkpoints": [{"checkpoint": "epoch"}, optimum]}]
    (folder / "results.json").write_text(json.dumps({"sweep": sweep}))
    (folder / "config.json").write_text(json.dumps({"quick": True}))
    cited = toy_citation()
    assert cited["run"] == "runs/hallucination/2026-01-02T03-04-05Z" and cited["quick"] is True
    assert cited["sweep"] == [
        {
            "gamma": 2.0,
            "monofact_rate": 0.25,
            "hallucination_rate": 0.3,
            "miscalibration": 0.1,
            "bound": pytest.approx(0.1),
        }
    ]
