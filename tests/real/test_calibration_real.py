"""Kadavath et al.'s multiple-choice calibration of smollm2 on the real question set
(experiments.calibration.kadavath): the readings of batched prompts on a shared prefix equal each prompt run
alone; the summary's accuracy, ECE and Brier are lab.metrics' on the same arrays; and what smollm2 does with the
lettered format: it answers by position — one letter takes most of its choices while the right letters are
spread — so its accuracy is at chance (0.25), which the test of "above chance" records as an expected failure
(strict: it turns into a failure of the suite the day a model or prompt reads the questions above chance)."""

import numpy as np
import pytest
import torch

from experiments.calibration.kadavath import (
    answer_letter_ids,
    chat_prompt,
    read_letters,
    setting_summary,
    split_questions,
    token_ids,
)
from lab.data.questions import load_questions
from lab.folders import is_trained
from lab.metrics.calibration import brier, ece
from lab.model.transformer import HookedTransformer
from tests.builders import smollm2_folder

pytestmark = pytest.mark.real

N_QUESTIONS = 32  # within the test's minute on two loaded cores
N_BOOT = 300


@pytest.fixture(scope="module")
def model():
    return HookedTransformer.from_pretrained("smollm2" if is_trained("smollm2") else smollm2_folder()).eval()


@pytest.fixture(scope="module")
def split():
    return split_questions(load_questions(form="mc"), N_QUESTIONS, 5, seed=0)


def test_batched_readings_on_the_shared_prefix_equal_each_prompt_run_alone(model, split):
    evaluated, _ = split
    questions = evaluated[:3]
    readings = read_letters(model, model.tokenizer, questions, chat=True)
    for row, question in enumerate(questions):
        text = chat_prompt(model.tokenizer, question)
        ids = token_ids(model.tokenizer, text, chat=True)
        letters = answer_letter_ids(model.tokenizer, ids, True, text)
        with torch.inference_mode():
            log_p = model(torch.tensor([ids]))[0, -1].double().log_softmax(-1)[letters]
        alone = (log_p - log_p.logsumexp(0)).exp().numpy()
        np.testing.assert_allclose(readings.probabilities[row], alone, atol=1e-4)
        assert readings.label_mass[row] == pytest.approx(float(log_p.exp().sum()), abs=1e-4)


@pytest.fixture(scope="module")
def readings(model, split):
    evaluated, _ = split
    return read_letters(model, model.tokenizer, evaluated)


def test_the_summary_is_lab_metrics_on_the_same_arrays(readings):
    summary = setting_summary(readings, N_BOOT, seed=0)
    confidence = readings.probabilities.max(axis=1)
    correct = readings.probabilities.argmax(axis=1) == readings.answer_index
    assert summary["ece"] == ece(confidence, correct)
    assert summary["brier"] == brier(confidence, correct).score
    assert summary["accuracy"] == correct.mean()
    assert summary["accuracy_ci95"][0] <= summary["accuracy"] <= summary["accuracy_ci95"][1]
    assert summary["chance"] == 0.25
    chosen = np.bincount(readings.probabilities.argmax(axis=1), minlength=4) / len(correct)
    assert list(summary["chosen_letters"].values()) == pytest.approx(chosen)


def test_smollm2_answers_lettered_questions_by_position(readings):
    chosen = np.bincount(readings.probabilities.argmax(axis=1), minlength=4) / len(readings.answer_index)
    right = np.bincount(readings.answer_index, minlength=4) / len(readings.answer_index)
    assert right.max() < 0.4  # the seed spreads the right letters
    assert chosen.max() > 0.5, chosen  # one letter takes most of the model's choices


@pytest.mark.xfail(strict=True, reason="smollm2 (135M) reads Kadavath's lettered choices at chance, by position")
def test_smollm2_reads_the_questions_above_chance(readings):
    summary = setting_summary(readings, N_BOOT, seed=0)
    assert summary["accuracy_ci95"][0] > summary["chance"], summary
