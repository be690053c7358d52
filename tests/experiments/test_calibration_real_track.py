"""The calibration experiment's real-model track without a model (experiments.calibration.real): `--model NAME` alone
is the real track and runs into runs/calibration_real/, the rule that judges a short answer, Kadavath's P(True)
format, the one draw of facts every part asks, and headlines that hold only where their interval excludes the
null. The model's own numbers are tests/real/test_calibration_real.py's."""

import pytest

import experiments
from experiments.calibration import Config
from experiments.calibration.real import (
    FACTS_MODEL,
    draw_facts,
    is_correct,
    normalise,
    p_true_prompt,
    part,
    real_headlines,
)
from lab.cli.parser import main
from lab.data.questions import load_questions


def test_model_alone_is_the_real_track_and_runs_into_its_own_folder():
    assert Config(model="smollm2").real_track
    assert experiments.run_name("calibration", Config(model="smollm2", quick=True)) == "calibration_real"
    assert not Config().real_track and experiments.run_name("calibration", Config()) == "calibration"
    assert not Config(model="smollm2", mmlu="x.csv").real_track  # the MMLU-CSV mode stays
    with pytest.raises(ValueError, match="--mmlu needs --model"):
        Config(mmlu="x.csv")
    with pytest.raises(ValueError, match="pretrained zoo model"):
        Config(model="facts")  # trained on a synthetic world: no country question can be asked of it


@pytest.mark.parametrize(
    ("reply", "answer", "right"),
    [
        ("Paris", "Paris", True),
        (" paris.\nQuestion: next", "Paris", True),  # the first line only, case and punctuation aside
        ("Paris, France", "Paris", True),  # begins with the answer's words
        ("Parisian", "Paris", False),  # not a word of its own
        ("Tunisians", "Tunisian", True),  # a demonym's plural
        ("Bogotá", "Bogota", True),  # accents folded
        ("the Euro", "Euro", True),
        ("Sub Saharan Africa", "Sub-Saharan Africa", True),
        ("Africa", "Sub-Saharan Africa", False),  # less than the answer
        ("South Africa", "Africa", False),
        ("", "Paris", False),
    ],
)
def test_a_short_answer_is_judged_by_the_stated_rule(reply, answer, right):
    assert is_correct(reply, answer) is right


def test_normalise_folds_case_accents_punctuation_and_a_leading_article():
    assert normalise("  The  Côte-d'Ivoire! ") == "cote d ivoire"


def test_p_true_prompt_is_kadavaths_format_with_and_without_brainstormed_samples():
    q = next(q for q in load_questions(form="short") if q.kind == "capital" and q.subject == "France")
    assert p_true_prompt(q, "Lyon") == (
        "Question: What is the capital of France?\nProposed Answer: Lyon\n"
        "Is the proposed answer:\n (A) True\n (B) False\nThe proposed answer is: ("
    )
    assert p_true_prompt(q, "Lyon", ["Paris", "Lyon"]) == (
        "Question: What is the capital of France?\nHere are some brainstormed ideas: Paris\nLyon\n"
        "Possible Answer: Lyon\nIs the possible answer:\n (A) True\n (B) False\nThe possible answer is: ("
    )


def test_every_part_asks_the_same_facts_and_no_shot_is_asked():
    mc, mc_shots, short, short_shots = draw_facts(30, 20, seed=0)
    fact = lambda q: q.id.rsplit("/", 1)[0]  # noqa: E731
    assert [fact(q) for q in short] == [fact(q) for q in mc[:20]]
    assert all(q.form == "short" for q in short + short_shots) and all(q.form == "mc" for q in mc + mc_shots)
    assert not {fact(q) for q in mc + short} & {fact(q) for q in mc_shots + short_shots}
    assert draw_facts(30, 20, seed=0) == (mc, mc_shots, short, short_shots)
    assert "synthetic world" in FACTS_MODEL


def results(accuracy_ci, nll_ci, p_true_ci, probe_ci, confidence_ci):
    setting = {"accuracy": sum(accuracy_ci) / 2, "accuracy_ci95": accuracy_ci, "chance": 0.25}
    mc = {name: dict(setting) for name in ("zero-shot", "zero-shot, chat", "few-shot", "few-shot, chat")}
    mc["zero-shot"]["temperature"] = {"nll_decrease": sum(nll_ci) / 2, "nll_decrease_ci95": nll_ci}
    p_true = {"auroc": 0.6, "auroc_ci95": p_true_ci, "auroc_why_no_interval": None if p_true_ci else "too few"}
    return {
        "mc": mc,
        "p_true": {"alone": p_true, "brainstorm": p_true},
        "p_ik": {
            "chosen_layer": 7,
            "auroc": 0.7,
            "auroc_ci95": probe_ci,
            "baseline_auroc": 0.6,
            "baseline_auroc_ci95": confidence_ci,
            "why_not": None,
        },
    }


def test_headlines_hold_only_where_the_interval_excludes_the_null():
    held = {
        h["name"]: h for h in real_headlines(results([0.3, 0.4], [0.01, 0.02], [0.55, 0.7], [0.8, 0.9], [0.5, 0.7]))
    }
    assert all(h["supported"] for h in held.values()), held
    assert held["multiple_choice_accuracy_zero_shot"]["direction"] == 1
    assert held["p_ik_versus_confidence"]["direction"] == 1
    failed = {h["name"]: h for h in real_headlines(results([0.2, 0.3], [-0.01, 0.02], None, [0.45, 0.75], [0.5, 0.7]))}
    assert not any(h["supported"] for h in failed.values()), failed
    assert "includes 0.25" in failed["multiple_choice_accuracy_few_shot_chat"]["why_not"]
    assert failed["p_true_auroc_alone"]["why_not"] == "too few"
    assert "overlap" in failed["p_ik_versus_confidence"]["why_not"]
    below = {
        h["name"]: h for h in real_headlines(results([0.1, 0.2], [0.01, 0.02], [0.3, 0.4], [0.8, 0.9], [0.5, 0.7]))
    }
    assert (
        below["multiple_choice_accuracy_zero_shot"]["direction"] == -1
        and below["p_true_auroc_alone"]["direction"] == -1
    )


def test_a_finished_part_is_read_back_not_measured_again(tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return {"values": [1.5, 2.5]}

    first = part(tmp_path, "mc", compute)
    again = part(tmp_path, "mc", compute)
    assert calls == [1] and again == first and first["values"] == [1.5, 2.5] and "seconds" in first
    assert sorted(p.name for p in (tmp_path / "parts").iterdir()) == ["mc.json"]


def test_forma_run_refuses_a_model_the_real_track_cannot_ask_in_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("FORMA_RUNS_DIR", str(tmp_path / "runs"))
    assert main(["run", "calibration", "--model", "facts", "--quick"]) == 2
    said = capsys.readouterr().err.strip()
    assert said.count("\n") == 0 and "facts" in said, said
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.json"))
