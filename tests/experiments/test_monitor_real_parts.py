"""The monitor's real-model track, the parts that need no model (experiments.monitor.real): the stated match of an
answer against the question's, where an answer is cut, the few-shot prompt and its questions, the Config's switch
to the real track, and the held-out check of conformal risk control — which a wrong threshold rule must fail."""

import math

import numpy as np
import pytest

from experiments import monitor as experiment
from experiments import run_name
from experiments.monitor.config import REAL_QUICK
from experiments.monitor.judging import crc_check
from experiments.monitor.real import answer_key, cut_answer, is_right, length_batches, real_prompt, real_questions
from lab.data.questions import KINDS
from lab.metrics.selective import crc_threshold


@pytest.mark.parametrize(
    ("generated", "answer", "right"),
    [
        ("Paris", "Paris", True),
        (" paris. ", "Paris", True),
        ("the Euro", "Euro", True),
        ("Bogotá", "Bogota", True),
        ("Latin America & the Caribbean", "Latin America and the Caribbean", False),
        ("Latin-America and the Caribbean", "Latin America and the Caribbean", True),
        ("Yen", "Japanese Yen", False),
        ("Japanese Yen (JPY)", "Japanese Yen", False),
        ("Niger", "Nigeria", False),
        ("", "Paris", False),
        ("...", "Paris", False),
    ],
)
def test_an_answer_is_right_when_its_key_equals_the_answers(generated, answer, right):
    assert is_right(generated, answer) is right


def test_the_key_folds_case_accents_punctuation_and_a_leading_article():
    assert answer_key("  The  Côte-d'Ivoire. ") == "cote d ivoire"
    assert answer_key("Theodore") == "theodore"  # "the" only as a word


class Letters:
    """A tokenizer whose ids are characters' code points (special id 0 decodes to a marker)."""

    def decode(self, ids):
        return "".join("<|end|>" if i == 0 else chr(i) for i in ids)


def ids(text):
    return [ord(c) for c in text]


def test_an_answer_is_cut_at_its_first_line_break_or_special_token():
    tok = Letters()
    assert cut_answer(tok, ids(" Paris\n\nQuestion"), {0}) == (" Paris", 6)
    assert cut_answer(tok, ids(" Rome") + [0] + ids("x"), {0}) == (" Rome", 5)
    assert cut_answer(tok, ids("\nx"), {0}) == ("", 1)  # an empty answer keeps its deciding token
    assert cut_answer(tok, ids(" Oslo"), {0}) == (" Oslo", 5)  # ran out of tokens


def test_the_prompt_is_one_solved_question_of_each_kind_then_the_question():
    evaluated, shots = real_questions(20, seed=3)
    assert [q.kind for q in shots] == list(KINDS)
    assert not {q.id for q in shots} & {q.id for q in evaluated}
    assert len({q.id for q in evaluated}) == 20 and all(q.form == "short" for q in evaluated)
    assert real_questions(20, seed=3)[0] == evaluated  # seeded
    prompt = real_prompt(evaluated[0], shots)
    assert prompt.endswith(f"Question: {evaluated[0].text}\nAnswer:")
    assert prompt.startswith(f"Question: {shots[0].text}\nAnswer: {shots[0].answer}\n\n")
    assert prompt.count("Question: ") == len(KINDS) + 1
    with pytest.raises(ValueError, match="n_questions"):
        real_questions(10**6, seed=0)


def test_model_alone_is_the_real_track_into_its_own_folder():
    real = experiment.Config(model="smollm2", quick=True)
    assert real.real_track and run_name("monitor", real) == "monitor_real"
    assert real.n_questions == REAL_QUICK.n_questions == real.real_profile.n_questions
    assert not experiment.Config(model="smollm2", qa="q.csv").real_track  # the CSV mode stays
    assert not experiment.Config().real_track
    with pytest.raises(ValueError, match="n_questions"):
        experiment.Config(model="smollm2", n_questions=0)


def independent_case(n: int = 4000, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scores that carry no signal, half the answers false, 20 questions calibrating: where the finite-sample
    correction decides whether the bound holds (CRC's expected joint rate ≈ ½·2/11 ≈ 0.09 at α = 0.1; the rule
    without it ≈ ½·3/11 ≈ 0.14)."""
    rng = np.random.default_rng(seed)
    split = np.array(["test"] * n, dtype="<U11")
    split[:20] = "calibration"
    return rng.random(n), rng.random(n) < 0.5, split


def empirical_rule(scores, false, alpha):
    """A wrong rule: the largest λ whose empirical joint rate on the calibration split is ≤ α — CRC without its
    finite-sample correction ((Σ L + 1)/(n + 1) ≤ α)."""
    wrong = np.sort(scores[false])
    m = math.floor(len(scores) * alpha + 1e-12)
    return math.inf if m >= len(wrong) else float(np.nextafter(wrong[m], -np.inf))


def test_conformal_risk_control_holds_on_held_out_questions():
    risk, false, split = independent_case()
    check = crc_check(risk, false, split, 0.1, n_draws=2000, seed=0)
    assert check["holds"], check
    assert check["realised_joint_risk"] <= 0.1 and check["bound"] == 0.1
    assert check["n_calibration"] == 20 and check["n_held_out"] == len(risk) - 20
    assert check["one_split_joint_risk"] == np.mean(
        (risk[20:] <= crc_threshold(risk[:20], false[:20], 0.1)) & false[20:]
    )


def test_a_threshold_rule_without_the_finite_sample_correction_fails_the_check():
    risk, false, split = independent_case()
    check = crc_check(risk, false, split, 0.1, n_draws=2000, seed=0, rule=empirical_rule)
    assert not check["holds"], check
    assert check["realised_joint_risk_ci95"][0] > 0.1


def test_answering_everything_fails_the_check():
    risk, false, split = independent_case()
    check = crc_check(risk, false, split, 0.1, n_draws=50, seed=0, rule=lambda s, e, a: math.inf)
    assert not check["holds"] and check["realised_joint_risk"] == pytest.approx(false[20:].mean(), abs=0.02)


def test_length_batches_are_runs_of_one_length_cut_at_the_most_a_batch_holds():
    """Every prompt in exactly one batch, in order; a batch's prompts of one length; none above `most` (the
    memory of a batch's first pass goes with its prompts)."""
    prompts = [[0] * n for n in (3, 3, 3, 3, 3, 4, 5, 5, 5)]
    batches = length_batches(prompts, most=2)
    assert [(b.start, b.stop) for b in batches] == [(0, 2), (2, 4), (4, 5), (5, 6), (6, 8), (8, 9)]
    assert all(len({len(p) for p in prompts[b]}) == 1 for b in batches)
    assert length_batches(prompts, most=10) == [slice(0, 5), slice(5, 6), slice(6, 9)]
