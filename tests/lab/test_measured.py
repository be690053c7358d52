"""Measured numbers in the documents come from the tracked files they cite (lab/measured.py, `forma cards`)."""

import json

import pytest

from lab import measured
from lab.cli.parser import main

MARK = "<!-- measured {file} {field} {fmt} -->{text}<!-- /measured -->"


def mark(text: str, field: str = "val_kl_nats", fmt: str = ".3f", file: str = "docs/measured/cards/toy.json") -> str:
    return MARK.format(file=file, field=field, fmt=fmt, text=text)


@pytest.fixture
def root(tmp_path):
    card = {
        "name": "toy",
        "quick": False,
        "val_kl_nats": 0.0654,
        "val_loss_nats": 4.3214,
        "val_perplexity": 75.27,
        "train_s": 127.46,
        "n_params": 170272,
        "headlines": [{"name": "final_kl", "value": 0.05}, {"name": "min_T", "value": 1.03}],
    }
    (tmp_path / "docs" / "measured" / "cards").mkdir(parents=True)
    (tmp_path / "docs" / "measured" / "cards" / "toy.json").write_text(json.dumps(card))
    return tmp_path


# --- markers ---------------------------------------------------------------------------------
def test_resolve_walks_keys_indices_and_selections():
    data = {"a": [{"name": "x", "v": 1}, {"name": "y", "v": 2}], "b": {"c": [10, 20, 30]}}
    assert measured.resolve(data, "b.c.-1") == 30
    assert measured.resolve(data, "a.name=y.v") == 2
    with pytest.raises(KeyError, match="no field 'd'"):
        measured.resolve(data, "b.d")
    with pytest.raises(KeyError, match="0 entries with name = 'z'"):
        measured.resolve(data, "a.name=z.v")
    with pytest.raises(KeyError, match="no list entry '7'"):
        measured.resolve(data, "b.c.7")


def test_a_matching_marker_passes_and_a_hand_typed_one_fails(root):
    doc = root / "MODEL.md"
    doc.write_text(f"KL {mark('0.065')} nats, loss {mark('4.321', 'val_loss_nats')}.\n")
    assert measured.marker_problems(doc, root) == []
    doc.write_text(f"KL {mark('0.050')} nats.\n")
    [problem] = measured.marker_problems(doc, root)
    assert "reads '0.050'" in problem.message and "'0.065'" in problem.message and problem.line == 1


def test_missing_file_or_field_is_a_problem(root):
    doc = root / "README.md"
    doc.write_text(f"{mark('1', 'no_such_field')}\n\n{mark('1', file='docs/measured/cards/gone.json')}\n")
    problems = measured.marker_problems(doc, root)
    assert [p.line for p in problems] == [1, 3]
    assert "no field 'no_such_field'" in problems[0].message and "no file" in problems[1].message
    before = doc.read_text()
    assert not measured.rewrite_document(doc, root) and doc.read_text() == before  # left as it was, reported


def test_rewrite_fills_every_marker_from_its_file(root):
    doc = root / "README.md"
    doc.write_text(
        f"| ppl | {mark('79.4', 'val_perplexity', '.1f')} | {mark('?', 'n_params', ',d')} "
        f"| {mark('?', 'headlines.name=min_T.value', '.2f')} |\n"
    )
    assert measured.rewrite_document(doc, root)
    text = doc.read_text()
    assert "-->75.3<!--" in text and "-->170,272<!--" in text and "-->1.03<!--" in text
    assert measured.check_document(doc, root) == []
    assert not measured.rewrite_document(doc, root)  # already true: unchanged


def test_a_non_number_field_is_a_problem(root):
    doc = root / "README.md"
    doc.write_text(f"{mark('x', 'headlines')}\n")
    [problem] = measured.marker_problems(doc, root)
    assert "not a number" in problem.message


# --- bare numbers ----------------------------------------------------------------------------
def test_bare_numbers_in_measured_sections_and_tables_are_caught(root):
    doc = root / "MODEL.md"
    doc.write_text(
        "# toy\n\nentropy rate 2.775 nats in prose outside Measured is not checked here\n\n"
        "## Measured (default recipe)\n"
        f"| training time | {mark('127', 'train_s', '.0f')} s |\n"
        "| held-out loss | 4.321 nats |\n"
        "trained on 1,024 sequences in 12 s; torch 2.13.0 and `0.5` in code are not measurements\n\n"
        "```\n0.123 inside a code block\n```\n"
        "## Not done\nthe 3.5 here is outside\n"
    )
    found = [(p.line, p.message.split("'")[1]) for p in measured.bare_numbers(doc)]
    assert found == [(7, "4.321"), (8, "1,024"), (8, "12 s")]


def test_readme_tables_are_measured_regions(root):
    doc = root / "README.md"
    doc.write_text("# Forma\n\nPython ≥ 3.11 in prose.\n\n| model | note |\n|---|---|\n| markov | KL 0.05 nats |\n")
    [problem] = measured.bare_numbers(doc)
    assert problem.line == 7 and "0.05" in problem.message


# --- recording -------------------------------------------------------------------------------
def _card(folder, quick):
    folder.mkdir(parents=True)
    (folder / "card.json").write_text(json.dumps({"name": folder.name, "quick": quick, "train_s": 1.5}))
    return folder


def test_record_card_copies_a_default_card_and_refuses_a_quick_one(root, tmp_path):
    target = measured.record_card(_card(tmp_path / "zoo" / "markov", False), root)
    assert target == root / "docs" / "measured" / "cards" / "markov.json"
    assert json.loads(target.read_text())["train_s"] == 1.5
    with pytest.raises(ValueError, match="--quick"):
        measured.record_card(_card(tmp_path / "zoo2" / "facts", True), root)
    assert not (root / "docs" / "measured" / "cards" / "facts.json").exists()
    with pytest.raises(FileNotFoundError, match="card.json"):
        measured.record_card(tmp_path / "nowhere", root)


def _run(folder, quick, finished=True):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"seed": 0, "quick": quick}))
    provenance = {"experiment": "kl", "seed": 0} | ({"wall_time_s": 12.0, "finished_utc": "now"} if finished else {})
    (folder / "provenance.json").write_text(json.dumps(provenance))
    if finished:
        (folder / "results.json").write_text(json.dumps({"headlines": []}))
    return folder


def test_record_run_copies_results_and_provenance_and_refuses_quick_or_unfinished_runs(root, tmp_path):
    target = measured.record_run(_run(tmp_path / "r1", False), root)
    assert target == root / "docs" / "measured" / "runs" / "kl.json"
    provenance = json.loads((target.parent / "kl.provenance.json").read_text())
    assert provenance["wall_time_s"] == 12.0 and provenance["config"] == {"seed": 0, "quick": False}
    with pytest.raises(ValueError, match="quick run"):
        measured.record_run(_run(tmp_path / "r2", True), root)
    with pytest.raises(ValueError, match="did not finish"):
        measured.record_run(_run(tmp_path / "r3", False, finished=False), root)


def test_cli_cards_check_refuses_to_record(capsys):
    assert main(["cards", "--check", "--model", "markov"]) == 2
    assert "records nothing" in capsys.readouterr().err


def test_cli_cards_help_says_what_it_does(capsys):
    with pytest.raises(SystemExit):
        main(["cards", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for words in (
        "docs/measured/cards/NAME.json",
        "Quick cards, quick runs and unfinished runs are refused",
        "<!-- measured FILE FIELD FORMAT -->",
    ):
        assert words in text


# --- the real documents ----------------------------------------------------------------------
@pytest.mark.parametrize("document", measured.documents(), ids=lambda p: str(p.relative_to(measured.REPO)))
def test_every_marked_number_is_its_files_and_no_measured_number_is_bare(document):
    problems = measured.check_document(document)
    assert not problems, "\n".join(map(str, problems)) + "\n(rewrite the numbers with `forma cards`)"


def test_the_documents_cite_the_reference_measurements():
    cited = {m["file"] for d in measured.documents() for m in measured.MARKER.finditer(d.read_text())}
    for name in ("markov", "facts", "pydoc", "dates"):
        assert f"docs/measured/cards/{name}.json" in cited
