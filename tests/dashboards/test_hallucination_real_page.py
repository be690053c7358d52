"""The hallucination page shows the real-model track's newest run below the toy world's, labelled with the model
and the corpus, its headlines, the pretrained model's replies about invented persons and each monofact rate's
hallucination rate against MF − Mis; with no real-model run it says how to make one."""

import json

from experiments.hallucination.real import CORPUS_LABEL, LABEL, real_headlines
from tests.builders import page, rendered, texts


def real_results() -> dict:
    rate = {
        "monofact_rate": 0.5,
        "hallucination_rate": 0.71,
        "hallucination_rate_interval": [0.65, 0.77],
        "fact_rate": 0.17,
        "miscalibration": 0.42,
        "bound": 0.08,
        "bound_interval": [0.02, 0.12],
        "margin": 0.63,
        "margin_interval": [0.55, 0.7],
        "other_rate": 0.12,
        "bound_full_rhs": -2.8,
        "by_kind": {"heldout": {"wrong_city_mass": 0.77, "hallucinated": 0.94}, "repeated": {"correct": 0.5}},
        "training": {"seconds": 87.0},
    }
    results = {
        "real_track": True,
        "model": "smollm2",
        "model_label": LABEL,
        "corpus": CORPUS_LABEL,
        "trained": {"what": "the last 4 of 30 blocks", "n_parameters": 14155776},
        "pretrained": {
            "verdict": "hallucinates",
            "city_mass": 0.01,
            "greedy_hallucinated": 0.0,
            "greedy_no_answer": 1.0,
            "chat_share": {"abstain": 0.0, "city": 0.0, "asserts": 1.0},
            "chat": [
                {"name": "Fusor Stokrai", "reply": "Fusor Stokrai was born in the city of Kouros", "class": "asserts"}
            ],
        },
        "rates": [
            rate,
            {**rate, "monofact_rate": 0.25, "hallucination_rate": 0.5, "hallucination_rate_interval": [0.4, 0.6]},
        ],
        "toy": {
            "run": "runs/hallucination/2026-01-01T00-00-00Z",
            "quick": True,
            "sweep": [
                {
                    "gamma": 2.0,
                    "monofact_rate": 0.266,
                    "hallucination_rate": 0.288,
                    "miscalibration": 0.33,
                    "bound": -0.066,
                }
            ],
        },
    }
    results["headlines"] = real_headlines(results)
    return results


def made_real_run(runs, results):
    folder = runs / "hallucination_real" / "2026-01-02T03-04-05Z"
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps(results))
    (folder / "config.json").write_text(json.dumps({"seed": 0, "quick": True, "model": "smollm2"}))
    (folder / "provenance.json").write_text(json.dumps({"seed": 0, "git": {"commit": "0123456789abcdef"}}))


def test_the_page_shows_the_real_model_run_labelled_with_model_and_corpus(empty):
    made_real_run(empty / "runs", real_results())
    at = page("hallucination").run()
    assert not at.exception, at.exception
    assert not [w.value for w in at.warning]  # every part of the run is shown, none refused
    shown = rendered(texts(at) + " ".join(m.value for m in [*at.markdown, *at.caption]))
    assert "On a real language model" in [h.value for h in at.header]
    assert LABEL in shown and CORPUS_LABEL in shown
    assert "the model hallucinates" in shown
    tables = rendered(" ".join(str(t.value.to_string()) for t in at.table))
    assert "Fusor Stokrai was born in the city of Kouros" in tables
    assert "runs/hallucination/2026-01-01T00-00-00Z" in shown and "0.266" in tables  # the toy run, cited


def test_with_no_real_model_run_the_page_says_how_to_make_one(empty):
    at = page("hallucination").run()
    assert not at.exception, at.exception
    assert any("forma run hallucination --model smollm2 --quick" in i.value for i in at.info)
