"""lab.metrics.grades: the grades on hand-built cases, the trivial baselines by hand, and controls that are at
chance (or beaten) when they should be and not when they should not."""

import numpy as np
import pytest

from lab.metrics.discrimination import Metric
from lab.metrics.grades import (
    BASELINES,
    Grade,
    attribution_grades,
    baseline_scores,
    lens_grades,
    mean_over_prompts,
)


def test_perfect_and_reversed_scores_and_a_hand_computed_prompt():
    relevant = np.zeros((40, 6), dtype=bool)
    relevant[:, -2:] = True
    perfect = relevant.astype(float) + 0.01 * np.random.default_rng(0).random((40, 6))
    grades = attribution_grades(perfect, relevant, effects=perfect, seed=1)
    assert grades["auroc"].value.value == 1.0 and grades["rank_correlation"].value.value == pytest.approx(1.0)
    assert grades["relevant_mass"].value.value > 0.97
    assert grades["relevant_mass"].chance == pytest.approx(2 / 6)
    assert all(g.control is None and g.beats_control is None for g in grades.values())  # no control given
    assert attribution_grades(-perfect + 2, relevant)["auroc"].value.value == 0.0  # |score| ranks the others first
    # One prompt by hand: |scores| 3, 1, 2, 0.5 with positions 0 and 2 relevant: AUROC 4/4, mass 5/6.5.
    one = attribution_grades(np.array([[3.0, -1, 2, 0.5]] * 2), np.array([[True, False, True, False]] * 2))
    assert one["auroc"].value.value == 1.0 and one["relevant_mass"].value.value == pytest.approx(5 / 6.5)


def test_a_prompt_with_nothing_or_everything_relevant_is_left_out():
    relevant = np.array([[True, False, False], [True, True, True], [False, False, False], [False, True, False]])
    grades = attribution_grades(np.array([[1.0, 0, 0], [1, 1, 1], [1, 2, 3], [0, 1, 0]]), relevant)
    assert grades["auroc"].n == 2 and grades["auroc"].value.value == 1.0


def test_a_control_that_beats_chance_is_said_to():
    informative = Grade("auroc", Metric(0.9, 0.85, 0.95), Metric(0.8, 0.7, 0.9), 0.5, "higher", 50)
    assert informative.control_at_chance is False
    fair = Grade("auroc", Metric(0.9, 0.85, 0.95), Metric(0.51, 0.45, 0.57), 0.5, "higher", 50)
    assert fair.control_at_chance is True
    kl = Grade("kl", Metric(0.1, 0.05, 0.15), Metric(0.3, 0.25, 0.35), 0.4, "lower", 50)
    assert kl.control_at_chance is False  # a prompt-blind reading cannot get below the floor of 0.4
    assert Grade("kl", Metric(0.1, 0.05, 0.15), Metric(0.45, 0.38, 0.5), 0.4, "lower", 50).control_at_chance


def test_mean_over_prompts_leaves_out_nan_and_refuses_an_interval_for_one_value():
    metric = mean_over_prompts([1.0, np.nan, 3.0, 2.0], n_boot=200)
    assert metric.value == 2.0 and metric.low <= 2.0 <= metric.high
    assert "no interval" in mean_over_prompts([1.0, np.nan]).why_no_interval


def test_lens_grades_against_the_truth_the_model_and_the_blind_floor():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(5), size=(30, 4))  # the true law at 4 positions of 30 prompts
    model = rng.dirichlet(np.ones(5), size=(30, 4))
    lens = np.stack([np.log(p), np.log(model)])  # layer 0 reads the truth exactly, the last row is the model
    grades = lens_grades(lens, p, n_boot=200)
    assert grades[0]["kl_true"].value.value == pytest.approx(0.0, abs=1e-12)
    assert grades[1]["kl_model"].value.value == pytest.approx(0.0, abs=1e-12)
    kl = (p * (np.log(p) - np.log(model))).sum(-1).mean()
    assert grades[1]["kl_true"].value.value == pytest.approx(kl)
    floor = (p * (np.log(p) - np.log(p.mean(axis=0, keepdims=True)))).sum(-1).mean()
    assert grades[0]["kl_true"].chance == pytest.approx(floor)
    assert grades[0]["kl_true"].control is None and grades[0]["kl_true"].control_at_chance is None
    gain = (p * (np.log(p) - np.log(np.roll(p, 1, axis=0)))).sum(-1).mean()  # another prompt's reading, less 0
    assert grades[0]["prompt_gain"].value.value == pytest.approx(gain) and grades[0]["prompt_gain"].value.low > 0
    # A `valid` mask averages each prompt over its valid positions only.
    masked = lens_grades(lens, p, valid=np.array([True, True, False, False]), n_boot=50)
    assert masked[1]["kl_true"].value.value == pytest.approx((p * (np.log(p) - np.log(model))).sum(-1)[:, :2].mean())


def test_the_prompt_gain_is_two_sided_and_fails_a_lens_that_ignores_or_misreads_its_prompt():
    """A lens that reads each prompt's law gains over another prompt's reading; random logits gain nothing (the
    interval holds 0), one reading for every prompt gains exactly 0, and a lens that ranks each prompt's tokens
    backwards loses (its interval below 0): the check can fail on either side."""
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(6) * 0.3, size=(200, 5))
    readings = {
        "truth": np.log(p),
        "random logits": np.log(rng.dirichlet(np.ones(6), size=(200, 5))),
        "one for every prompt": np.broadcast_to(np.log(p.mean(axis=0)), p.shape),
        "backwards": np.log(1 / p) - np.log((1 / p).sum(-1, keepdims=True)),  # the least likely token first
    }
    gains = {
        name: lens_grades(np.stack([lens, lens]), p, n_boot=400)[0]["prompt_gain"].value
        for name, lens in readings.items()
    }
    assert gains["truth"].low > 0
    assert gains["random logits"].low < 0 < gains["random logits"].high
    assert gains["one for every prompt"].value == pytest.approx(0.0, abs=1e-12)
    assert gains["backwards"].high < 0


def test_shapes_are_checked():
    with pytest.raises(ValueError, match=r"must all be \[prompt, position\]"):
        attribution_grades(np.zeros((2, 3)), np.zeros((2, 4), dtype=bool))
    with pytest.raises(ValueError, match="lens log-probabilities"):
        lens_grades(np.zeros((2, 3, 4, 5)), np.ones((3, 4, 6)) / 6)


def test_per_prompt_grades_are_lab_metrics_auroc_and_spearman():
    from lab.metrics.discrimination import auroc
    from lab.metrics.statistics import spearman

    rng = np.random.default_rng(3)
    scores = np.round(rng.normal(size=(30, 7)), 1)  # ties included
    relevant = rng.random((30, 7)) < 0.3
    relevant[:, 0], relevant[:, 1] = True, False
    effects = rng.random((30, 7))
    grades = attribution_grades(scores, relevant, effects, n_boot=50)
    s = np.abs(scores)
    assert grades["auroc"].value.value == pytest.approx(np.mean([auroc(s[i], relevant[i]) for i in range(30)]))
    assert grades["rank_correlation"].value.value == pytest.approx(
        np.mean([spearman(s[i].tolist(), effects[i].tolist()) for i in range(30)])
    )


def test_a_control_is_the_same_method_where_the_mechanism_is_absent_and_the_hardest_of_them_is_kept():
    """A method beats its control only by its interval; scores that do not depend on the model (recency, random
    draws) score the same on every model and never beat theirs; of two controls, the one hardest to beat is kept."""
    rng = np.random.default_rng(4)
    relevant = np.zeros((48, 10), dtype=bool)
    relevant[np.arange(48), rng.integers(0, 9, 48)] = True
    reads = relevant + 0.1 * rng.random((48, 10))
    noise, half = rng.random((48, 10)), relevant * 0.3 + rng.random((48, 10))
    graded = attribution_grades(reads, relevant, controls={"untrained model": noise, "other world": half}, n_boot=400)
    auroc = graded["auroc"]
    assert auroc.control_kind == "beaten" and auroc.control_at_chance is None
    assert auroc.control_means == "other world" and auroc.beats_control  # half-informed is harder than noise
    assert auroc.row()["control_means"] == "other world" and auroc.row()["beats_control"] is True
    recency = baseline_scores("recency", np.ones((48, 10), dtype=bool))
    same = attribution_grades(recency, relevant, controls={"untrained model": recency}, n_boot=400)
    assert not any(g.beats_control for g in same.values())
    fresh = attribution_grades(noise, relevant, controls={"untrained model": rng.random((48, 10))}, n_boot=400)
    assert not any(g.beats_control for g in fresh.values())


def test_the_trivial_baselines_by_hand():
    """The last two of ten positions relevant (an order-2 chain): recency ranks them first (AUROC 1, mass 17/45); the
    last token alone puts all its mass on one of them and ties the other with the rest (AUROC (8 + 8·½)/16 = 0.75);
    uniform scores sit on chance; random ones near it."""
    valid = np.ones((200, 10), dtype=bool)
    relevant = np.zeros((200, 10), dtype=bool)
    relevant[:, -2:] = True
    grades = {b: attribution_grades(baseline_scores(b, valid, seed=2), relevant, n_boot=200) for b in BASELINES}
    assert grades["recency"]["auroc"].value.value == 1.0
    assert grades["recency"]["relevant_mass"].value.value == pytest.approx(17 / 45)
    assert grades["last_token"]["auroc"].value.value == pytest.approx(0.75)
    assert grades["last_token"]["relevant_mass"].value.value == pytest.approx(1.0)
    assert grades["uniform"]["auroc"].value.value == 0.5 and grades["uniform"]["relevant_mass"].value.value == 0.2
    assert abs(grades["random"]["auroc"].value.value - 0.5) < 0.05
    np.testing.assert_array_equal(baseline_scores("random", valid, seed=2), baseline_scores("random", valid, seed=2))
    ragged = np.array([[True, True, False], [True, True, True]])
    np.testing.assert_array_equal(baseline_scores("last_token", ragged), [[0, 1, 0], [0, 0, 1]])
    with pytest.raises(ValueError, match="unknown baseline 'oracle'"):
        baseline_scores("oracle", valid)
