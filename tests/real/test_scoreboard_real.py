"""The scoreboard's real-model track on smollm2 (experiments.scoreboard.real): the relevant positions each task
marks are the ones its construction says (the copy source, the indirect object's name, the subject's tokens) on
hand-checked prompts, and a small run of the track grades induction as the toy worlds are graded, its rows in the
toy table's schema — where a method that reads the copy source beats the random baseline and the same method on an
untrained model of smollm2's shape."""

import dataclasses

import pytest
import torch

from experiments.scoreboard.config import REAL_LENSES_QUICK, REAL_QUICK, REAL_TASKS
from experiments.scoreboard.real import capital_prompt, induction_prompts, ioi_prompts, run_real
from experiments.scoreboard.real_lenses import WORLD
from lab.load import load_model

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def model(zoo):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FORMA_ZOO_DIR", str(zoo.parent))
        return load_model("smollm2").eval()


def test_the_induction_prompts_mark_the_copy_source(model):
    tokens, relevant, answers = induction_prompts(model, 4, 5, seed=0)
    assert tokens.shape == (4, 1 + 5 + 4) and relevant.sum(1).eq(1).all()
    for row, marks, answer in zip(tokens.tolist(), relevant, answers.tolist()):
        source = int(marks.nonzero()[0, 0])
        assert source == 5 and row[source] == answer  # the earlier copy of the answer
        assert row[source - 1] == row[-1]  # right after the earlier occurrence of the last token
        assert len(set(row[1:6])) == 5  # distinct pieces: one source only


def test_the_ioi_prompts_mark_the_indirect_objects_name(model):
    tokens, relevant, answers = ioi_prompts(model, 6, seed=0)
    assert relevant.sum(1).eq(1).all() and tokens.shape[0] == 6
    for row, marks, answer in zip(tokens, relevant, answers):
        text = model.to_string(row[1:])
        io = model.to_string(answer[None])
        assert text.count(io) == 1 and model.to_string(row[marks]) == io, text
        assert text.startswith("When") and text.endswith(" to")
    first = model.to_string(tokens[0, 1:])  # the IO named first in even prompts, second in odd ones
    second = model.to_string(tokens[1, 1:])
    assert first.split()[1] == model.to_string(answers[0][None]).strip()
    assert second.split()[3] == model.to_string(answers[1][None]).strip()


def test_the_capital_prompts_mark_the_subjects_tokens(model):
    tokens, relevant = capital_prompt(model, "France")
    assert model.to_string(tokens[relevant]) == " France"
    tokens, relevant = capital_prompt(model, "South Africa")
    assert model.to_string(tokens[relevant]) == " South Africa" and relevant.sum() >= 2
    assert model.to_string(tokens[~relevant][1:]) == "The capital of is"


TABLE_COLUMNS = {"method", "world", "readout", "grade", "value", "low", "high", "chance", "control", "control_low"}


def test_a_small_run_on_induction_has_a_method_beating_random_and_its_control(zoo, corpus, tmp_path):
    """Induction alone (the other tasks run the same code), no graph: 4 prompts the model answers; the head
    detectors and the lenses over the corpus at a test's size (their grades: tests/real/test_scoreboard_real_lenses.py)
    join the same table."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FORMA_ZOO_DIR", str(zoo.parent))
        model = load_model("smollm2").eval()
    lenses = dataclasses.replace(
        REAL_LENSES_QUICK, layers=(29,), eval_windows=2, fit_windows=1, length=8, tuned_iterations=1, head_sequences=2
    )
    profile = dataclasses.replace(
        REAL_QUICK, prompts=4, tasks=("induction",), graph_prompts=0, n_boot=200, lenses=lenses
    )
    results = run_real((model, None, "left out"), "smollm2", profile, 0, tmp_path, corpus)
    parts = [r for r in results["table"] if r["world"] == WORLD]
    assert {r["method"] for r in parts} == {"logit lens", "tuned lens", "head detectors"}, {r["method"] for r in parts}
    assert results["lenses"]["lenses"].startswith("graded") and {"heads", "lenses"} <= set(results["seconds"])
    results["table"] = [r for r in results["table"] if r["world"] != WORLD]
    world, readout = REAL_TASKS["induction"]
    task = results["worlds"][world]
    assert task["prompts"] == profile.prompts and task["answered"] <= task["tried"]
    rows = {(r["method"], r["grade"]): r for r in results["table"]}
    assert all(TABLE_COLUMNS <= set(r) and (r["world"], r["readout"]) == (world, readout) for r in results["table"])
    random_mass = rows["random", "relevant_mass"]
    beaten = [
        m
        for m in ("gradient_x_input", "attribution_patching", "occlusion")
        if rows[m, "relevant_mass"]["low"] > random_mass["high"] and rows[m, "relevant_mass"]["beats_control"]
    ]
    assert beaten, {m: (rows[m, "relevant_mass"]["value"], rows[m, "relevant_mass"]["control"]) for m, _ in rows}
    assert (tmp_path / "scoreboard.parquet").is_file() and results["headlines"]
    shares = [r["value"] for r in results["table"] if r["grade"] in ("auroc", "relevant_mass")]
    assert len(shares) == 2 * len(rows) // 3 and torch.isfinite(torch.tensor(shares)).all()
