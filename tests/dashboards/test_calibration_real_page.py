"""The calibration page shows the real-model track (runs/calibration_real/) below the toy-world run: labelled with the
model and the question set, the facts model's absence said in a sentence, the multiple-choice table, P(True) and
P(IK) by layer; without such a run, how to make one."""

from experiments.calibration.real import FACTS_MODEL, MODEL_LABEL, QUESTION_SET, real_headlines
from lab.runs import run_and_record
from tests.builders import page, rendered, texts

SETTINGS = ("zero-shot", "zero-shot, chat", "few-shot", "few-shot, chat")


def real_results() -> dict:
    interval = {"auroc": 0.62, "auroc_ci95": [0.51, 0.73], "auroc_why_no_interval": None, "n": 120}
    temperature = {"T": 1.7, "nll_decrease": 0.05, "nll_decrease_ci95": [0.01, 0.09]}
    results = {
        "model": "smollm2",
        "model_label": MODEL_LABEL["smollm2"],
        "question_set": QUESTION_SET,
        "facts_model": FACTS_MODEL,
        "mc": {
            name: {
                "n": 40,
                "accuracy": 0.25,
                "accuracy_ci95": [0.12, 0.4],
                "chance": 0.25,
                "ece": 0.3,
                "ece_ci95": [0.2, 0.4],
                "brier": 0.4,
                "brier_ci95": [0.3, 0.5],
                "temperature": temperature,
            }
            for name in SETTINGS
        },
        "short_answers": {"n_questions": 48, "greedy_accuracy": 0.3, "sample_accuracy": 0.2, "examples": []},
        "p_true": {"alone": interval, "brainstorm": interval},
        "p_ik": {
            "chosen_layer": 12,
            "auroc": 0.7,
            "auroc_ci95": [0.6, 0.8],
            "baseline_auroc": 0.6,
            "baseline_auroc_ci95": [0.5, 0.7],
            "why_not": None,
            "layers": [{"layer": k, "auroc": 0.5 + k / 100, "auroc_ci95": [0.4, 0.8]} for k in range(31)],
        },
    }
    return results | {"headlines": real_headlines(results)}


def test_the_page_shows_the_real_model_run_below_the_toy_run(empty):
    run_and_record("calibration_real", {"model": "smollm2", "quick": True}, lambda config, folder: real_results())
    at = page("calibration").run()
    assert not at.exception, at.exception
    # what a reader sees: the page escapes the run's own words (dashboards.display.plain)
    said = " ".join(rendered(e.value) for e in [*at.info, *at.warning, *at.markdown, *at.caption])
    assert "On a real language model" in [h.value for h in at.header]
    assert MODEL_LABEL["smollm2"] in said and "countryinfo" in said
    assert "synthetic world" in said
    assert "real_p_ik_layers" in {chart.key for chart in at.get("plotly_chart")}


def test_without_a_real_model_run_the_page_says_how_to_make_one(empty):
    at = page("calibration").run()
    assert not at.exception, at.exception
    assert "forma run calibration --model smollm2 --quick" in texts(at)
