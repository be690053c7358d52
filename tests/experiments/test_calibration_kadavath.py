"""Kadavath et al.'s multiple-choice prompts on the real question set (experiments.calibration.kadavath), without a
model: the prompt's exact text, the held-out shots, the prefix the prompts share. The model's readings are
tests/real/test_calibration_real.py's."""

import pytest

from experiments.calibration.kadavath import kadavath_prompt, shared_prefix, split_questions
from lab.data.questions import load_questions


@pytest.fixture(scope="module")
def mc():
    return load_questions(form="mc")


def test_the_prompt_is_kadavaths_format_ending_where_the_letter_comes(mc):
    france = next(q for q in mc if q.kind == "capital" and q.subject == "France")
    japan = next(q for q in mc if q.kind == "currency" and q.subject == "Japan")
    options = "".join(f"\n({letter}) {option}" for letter, option in zip("ABCD", france.options))
    assert kadavath_prompt(france) == f"Question: What is the capital of France?{options}\nAnswer: ("
    shot = kadavath_prompt(japan).removesuffix("(") + f"({japan.label})\n\n"
    assert kadavath_prompt(france, [japan]) == shot + kadavath_prompt(france)
    assert japan.options["ABCD".index(japan.label)] == "Japanese Yen"


def test_shots_are_drawn_from_questions_not_evaluated_and_the_seed_fixes_both(mc):
    evaluated, shots = split_questions(mc, 300, 5, seed=0)
    assert len(evaluated) == 300 and len(shots) == 5
    assert not {q.id for q in evaluated} & {q.id for q in shots}
    assert (evaluated, shots) == split_questions(mc, 300, 5, seed=0)
    assert [q.id for q in evaluated] != [q.id for q in split_questions(mc, 300, 5, seed=1)[0]]
    with pytest.raises(ValueError, match="the set has"):
        split_questions(mc, len(mc), 1, seed=0)


def test_the_shared_prefix_leaves_every_prompt_a_token_of_its_own():
    assert shared_prefix([[1, 2, 3, 4], [1, 2, 5]]) == 2
    assert shared_prefix([[1, 2, 3], [1, 2, 3]]) == 2
    assert shared_prefix([[7], [7, 8]]) == 0
    assert shared_prefix([[1, 2], [3, 2]]) == 0
