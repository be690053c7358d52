"""The real question set (lab.data.questions): its size, its three forms, the rules that check its answers,
hand-checked facts, the same bytes for the same seed (and the shipped file is a rebuild's), the loader and
`forma questions`."""

import importlib.metadata
import json
from collections import Counter

import pytest

from lab.cli.parser import main
from lab.data.questions import (
    DEFAULT_SEED,
    FORMS,
    KINDS,
    LETTERS,
    SHIPPED,
    UNIQUE_KINDS,
    Question,
    ascii_fold,
    build_questions,
    load_questions,
    package_values,
    questions_text,
    read_question_set,
)
from lab.outside_files import InputError


@pytest.fixture(scope="module")
def shipped() -> tuple[dict, list[Question]]:
    return read_question_set()


@pytest.fixture(scope="module")
def questions(shipped) -> list[Question]:
    return shipped[1]


def by_id(questions: list[Question]) -> dict[str, Question]:
    return {q.id: q for q in questions}


def test_the_set_has_at_least_a_thousand_questions_in_each_form(shipped, questions):
    meta, _ = shipped
    sizes = Counter(q.form for q in questions)
    assert all(sizes[form] >= 1000 for form in FORMS), sizes
    counts = Counter((q.form, q.kind) for q in questions)
    assert meta["counts"] == {form: {kind: counts[form, kind] for kind in KINDS} for form in FORMS}
    # every fact gives one question of each form
    facts = {form: {q.id.rpartition("/")[0] for q in questions if q.form == form} for form in FORMS}
    assert facts["short"] == facts["mc"] == facts["tf"]
    assert len({q.id for q in questions}) == len(questions)


def test_every_multiple_choice_question_has_one_correct_option_among_four_distinct_of_its_kind(questions):
    values = {kind: {q.answer for q in questions if q.kind == kind} for kind in KINDS}
    mc = [q for q in questions if q.form == "mc"]
    for q in mc:
        assert len(q.options) == 4 and len({o.casefold() for o in q.options}) == 4, q
        assert [o for o in q.options if o == q.answer] == [q.answer]
        assert q.options[LETTERS.index(q.label)] == q.answer
        assert sorted(o for o in q.options if o != q.answer) == sorted(q.distractors)
        assert set(q.options) <= values[q.kind], q  # distractors are other subjects' values of the same kind
    # the answer's place is drawn, not fixed: every letter is used, none overwhelmingly
    letters = Counter(q.label for q in mc)
    assert set(letters) == set(LETTERS) and max(letters.values()) < 0.35 * len(mc), letters


def test_true_false_is_balanced_within_each_kind_and_its_claim_decides_it(questions):
    for kind in KINDS:
        tf = [q for q in questions if q.form == "tf" and q.kind == kind]
        assert sum(q.label == "True" for q in tf) == len(tf) // 2, kind
        for q in tf:
            assert q.label == str(q.claim == q.answer) and q.claim in (q.answer, q.distractors[0])
            assert q.claim in q.text and q.subject in q.text


def test_short_answers_carry_the_answer_as_their_label_and_three_distractors(questions):
    for q in (q for q in questions if q.form == "short"):
        assert q.label == q.answer and q.options == () and q.claim == ""
        assert len(set(q.distractors)) == 3 and q.answer not in q.distractors


def test_every_question_is_ascii_names_its_subject_verbatim_and_says_where_its_answer_came_from(shipped, questions):
    meta, _ = shipped
    for q in questions:
        for text in (q.text, q.subject, q.answer, *q.distractors, *q.options):
            assert text.isascii() and text.isprintable() and text == text.strip(), (q.id, text)
        assert q.subject in q.text, q.id
        assert q.source.package == "countryinfo" and q.source.version == meta["sources"]["countryinfo"]["version"]
        assert q.id.split("/")[1] == q.source.key and len(q.source.key) == 3
        if q.kind in ("currency", "language"):  # an ISO code, named by CLDR after CLDR agreed (A4)
            assert q.source.checked_with.startswith("babel ") and q.source.value.isalpha(), q.id
        else:  # the package's own value, folded to ASCII (A2)
            assert ascii_fold(q.source.value) == q.answer and q.source.checked_with == "", q.id


def test_no_capital_or_demonym_names_two_subjects_and_no_subject_is_written_twice(questions):
    for kind in UNIQUE_KINDS:
        holders = Counter(q.answer.casefold() for q in questions if q.form == "short" and q.kind == kind)
        assert [value for value, n in holders.items() if n > 1] == []
    subjects = {q.source.key: q.subject for q in questions}
    assert len(set(subjects.values())) == len(subjects)
    assert not any(mark in s for s in subjects.values() for mark in ",()[]")  # S3


def test_hand_checked_facts(questions):
    """Facts checked by hand, and entries the rules drop (the docstring's examples)."""
    q = by_id(questions)
    assert q["capital/FRA/short"].answer == "Paris" and q["capital/FRA/short"].subject == "France"
    assert q["capital/JPN/short"].answer == "Tokyo"
    assert q["currency/JPN/short"].answer == "Japanese Yen" and q["currency/JPN/short"].source.value == "JPY"
    assert q["currency/USA/short"].answer == "US Dollar"  # USN and USS are fund codes, not currencies (A1)
    assert q["currency/FRA/short"].answer == q["currency/DEU/short"].answer == "Euro"
    assert q["language/DEU/short"].answer == "German" and q["language/BRA/short"].answer == "Portuguese"
    assert q["region/PER/short"].answer == "Americas" and q["subregion/DEU/short"].answer == "Western Europe"
    assert q["demonym/ITA/short"].answer == "Italian"
    # A2: folded to ASCII, the package's spelling kept in the source
    assert (q["capital/COL/short"].answer, q["capital/COL/short"].source.value) == ("Bogota", "Bogotá")
    assert q["capital/MDA/short"].answer == "Chisinau"
    assert q["capital/STP/short"].subject == "Sao Tome and Principe"
    # A3: Kingston is Jamaica's and Norfolk Island's capital, Jerusalem two subjects'
    assert "capital/JAM/short" not in q and "capital/NFK/short" not in q and "capital/ISR/short" not in q
    # A4: countryinfo says the kuna; CLDR, the euro since 2023. Panama has two currencies (A1)
    assert "currency/HRV/short" not in q and "currency/PAN/short" not in q
    assert "language/CHE/short" not in q  # Switzerland: German, French and Italian
    # S1: one subject per ISO code ("Burma" is an alias of Myanmar, "Wales" of the United Kingdom)
    assert q["capital/MMR/short"].subject == "Myanmar" and q["capital/GBR/short"].subject == "United Kingdom"
    assert not any(x.subject in ("Burma", "Wales", "Scotland") for x in questions)


def test_the_rules_on_single_values():
    assert ascii_fold("Bogotá") == "Bogota" and ascii_fold("Chișinău") == "Chisinau"
    assert ascii_fold("Åland  Islands") == "Aland Islands" and ascii_fold("Papeetē") == "Papeete"
    assert ascii_fold("Nukuʻalofa") is None and ascii_fold("日本") is None and ascii_fold(" ") is None
    assert package_values("capital", "Kralendijk / Oranjestad / The Bottom") == []
    assert package_values("capital", "Pretoria, Bloemfontein") == []
    assert package_values("capital", ["Vatican City"]) == [] and package_values("capital", None) == []
    assert package_values("capital", " Paris ") == ["Paris"] and package_values("region", "") == []
    assert package_values("currency", ["USD", "USN", ""]) == ["USD", "USN"] and package_values("language", "en") == []


def test_the_same_seed_writes_the_same_bytes_and_the_shipped_set_is_a_rebuild():
    """The shipped file is what `forma questions` writes with the default seed from the pinned packages; a rebuild
    with another countryinfo or babel than constraints.txt pins differs, and says so here."""
    first = questions_text(*build_questions(DEFAULT_SEED))
    assert first == questions_text(*build_questions(DEFAULT_SEED))
    assert SHIPPED.read_bytes() == first.encode(), "rebuild it: forma questions (with the pinned packages)"
    other = questions_text(*build_questions(DEFAULT_SEED + 1))
    assert other != first
    assert facts(other) == facts(first)  # the seed draws distractors and orders, not the facts


def facts(text: str) -> list[dict]:
    """Each question's id, subject, answer and source in a question set's text."""
    return [{key: row[key] for key in ("id", "subject", "answer", "source")} for row in json.loads(text)["questions"]]


def test_load_questions_filters_by_form_and_kind_and_refuses_what_is_not_a_question_set(tmp_path, questions):
    mc = load_questions(form="mc")
    assert mc == [q for q in questions if q.form == "mc"] and all(isinstance(q, Question) for q in mc)
    capitals = load_questions("tf", "capital")
    assert capitals and {(q.form, q.kind) for q in capitals} == {("tf", "capital")}
    assert capitals[0].prompt.startswith("True or false: The capital of ") and capitals[0].prompt.endswith("Answer:")
    assert mc[0].prompt.splitlines()[1:] == [*(f"{x}. {o}" for x, o in zip(LETTERS, mc[0].options)), "Answer:"]
    with pytest.raises(ValueError, match="no question form 'essay'"):
        load_questions(form="essay")
    with pytest.raises(ValueError, match="no question kind 'flag'"):
        load_questions(kind="flag")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"meta": {}, "questions": [{"id": "x"}]}))
    with pytest.raises(InputError, match="question 0 is not a question record"):
        load_questions(path=bad)
    bad.write_text("[]")
    with pytest.raises(InputError, match="not an object"):
        load_questions(path=bad)


def test_forma_questions_writes_the_shipped_bytes_and_checks_them(tmp_path, capsys):
    out = tmp_path / "q.json"
    assert main(["questions", "--out", str(out)]) == 0
    assert out.read_bytes() == SHIPPED.read_bytes()
    assert "short 1," in capsys.readouterr().out
    assert main(["questions", "--out", str(out), "--check"]) == 0
    assert main(["questions", "--out", str(out), "--check", "--seed", "1"]) == 1
    assert "differs from a rebuild with seed 1" in capsys.readouterr().out
    assert main(["questions", "--out", str(out), "--seed", "1"]) == 0  # a question set is overwritten
    assert out.read_bytes() != SHIPPED.read_bytes()


def test_forma_questions_overwrites_no_file_of_the_users_and_says_what_a_rebuild_needs(tmp_path, capsys, monkeypatch):
    mine = tmp_path / "notes.json"
    mine.write_text("my notes")
    assert main(["questions", "--out", str(mine)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "is not a question set; not overwritten" in err
    assert mine.read_text() == "my notes"

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert main(["questions", "--out", str(tmp_path / "new.json")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "needs countryinfo and babel" in err and "countryinfo is not installed" in err and "loads without" in err
    assert not (tmp_path / "new.json").exists()
    assert load_questions("mc")  # the shipped set loads without them
