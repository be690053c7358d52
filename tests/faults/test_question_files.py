"""A question CSV (`forma run calibration --model … --mmlu FILE`, `forma run monitor --model … --qa FILE`) as people
save them: a byte-order mark, another encoding, a cell too long, an empty question, an answer over two lines, too
few rows, prompts longer than the model reads, a file too big for memory. Each is one line naming the file (and
the line), said once, exit 2, before the run folder is made; a large file shows its stage and count."""

import csv
import re

import pytest

import experiments.calibration as calibration
import experiments.monitor as monitor
from experiments.calibration.mmlu import CSV_MEMORY_FACTOR, MMLU_COLUMNS, hf_lettered, read_mmlu
from experiments.monitor.qa import qa_splits, read_qa
from lab.cli.parser import main
from tests.builders import one_error_line

BOM = "\ufeff"
MMLU_ROWS = [[f"w{i} w{i + 1} w{i + 2}", "w1", "w2", "w3", "w4", "ABCD"[i % 4]] for i in range(12)]
QA_ROWS = [[f"w{i} w{i + 1}", f"w{i % 7}"] for i in range(12)]


def write_csv(path, rows, header=None, prefix: str = "", encoding: str = "utf-8"):
    with path.open("w", newline="", encoding=encoding) as f:
        f.write(prefix)
        writer = csv.writer(f)
        if header:
            writer.writerow(header)
        writer.writerows(rows)
    return path


# --- 4. what a CSV can hold ---------------------------------------------------------------------------------------
def test_a_byte_order_mark_is_neither_a_question_nor_part_of_one(tmp_path):
    """Excel's "CSV UTF-8" starts with U+FEFF: the header is still recognised, and without one the first question
    does not begin with it."""
    qa = read_qa(write_csv(tmp_path / "qa.csv", QA_ROWS, ["question", "answer"], BOM))
    assert len(qa) == len(QA_ROWS) and qa[0]["question"] == QA_ROWS[0][0]
    with_header = read_mmlu(write_csv(tmp_path / "h.csv", MMLU_ROWS, MMLU_COLUMNS, BOM))
    without = read_mmlu(write_csv(tmp_path / "n.csv", MMLU_ROWS, None, BOM))
    assert len(with_header) == len(without) == len(MMLU_ROWS)
    assert with_header[0]["question"] == without[0]["question"] == MMLU_ROWS[0][0]


def bad_files(tmp_path):
    """(reader, file, what its one line must say) for each fault of a question file."""
    long_cell = [["w1 " * 70_000, "w1", "w2", "w3", "w4", "A"]] + MMLU_ROWS
    cases = [
        (
            "mmlu",
            write_csv(
                tmp_path / "latin1.csv",
                MMLU_ROWS[:3] + [["café", "w1", "w2", "w3", "w4", "A"]] + MMLU_ROWS,
                encoding="latin-1",
            ),
            r"latin1\.csv, line 4: not UTF-8 \(byte 0xe9 at column 4\)",
        ),
        (
            "qa",
            write_csv(tmp_path / "latin1qa.csv", [["é?", "w1"]] + QA_ROWS, encoding="latin-1"),
            r"latin1qa\.csv, line 1: not UTF-8",
        ),
        ("mmlu", write_csv(tmp_path / "long.csv", long_cell), r"long\.csv, line 1: a cell is longer than the 131,072"),
        (
            "mmlu",
            write_csv(tmp_path / "empty.csv", MMLU_ROWS[:5] + [[" ", "w1", "w2", "w3", "w4", "B"]] + MMLU_ROWS),
            r"empty\.csv, line 6: the question is empty",
        ),
        (
            "qa",
            write_csv(tmp_path / "emptyqa.csv", QA_ROWS + [["", "w1"]]),
            r"emptyqa\.csv, line 13: expected 2 non-empty",
        ),
        (
            "qa",
            write_csv(tmp_path / "newline.csv", QA_ROWS[:2] + [["w1", "first\nsecond"]] + QA_ROWS),
            r"newline\.csv, line 3: the answer holds a line break",
        ),
        (
            "mmlu",
            write_csv(tmp_path / "few.csv", MMLU_ROWS[:3], MMLU_COLUMNS),
            r"few\.csv holds 3 questions; temperature scaling needs at least 10",
        ),
        (
            "qa",
            write_csv(tmp_path / "fewqa.csv", QA_ROWS[:1]),
            r"fewqa\.csv holds 1 question; the monitor needs at least 10",
        ),
        (
            "mmlu",
            write_csv(tmp_path / "quote.csv", MMLU_ROWS[:2], prefix='"w1" w2,w1,w2,w3,w4,A\n'),
            r"quote\.csv, line 1: not a CSV row",
        ),
    ]
    return cases


def test_every_fault_of_a_question_file_is_one_line_naming_file_and_line(tmp_path):
    for reader, path, said in bad_files(tmp_path):
        with pytest.raises(ValueError, match=said) as err:
            (read_mmlu if reader == "mmlu" else read_qa)(path)
        assert "\n" not in str(err.value), said


# --- 12, 13. refused before anything is made, said once ----------------------------------------------------------
def test_a_refused_or_missing_file_is_said_once_and_leaves_no_run_folder(
    tmp_path,
    capsys,
    monkeypatch,
    hf_folder,  # noqa: F811
    qa_folder,  # noqa: F811
):
    model_dir, _ = hf_folder
    monkeypatch.setenv("FORMA_RUNS_DIR", str(tmp_path / "runs"))
    cases = [(kind, path) for kind, path, _ in bad_files(tmp_path)] + [("mmlu", tmp_path / "missing.csv")]
    for kind, path in cases:
        experiment, flag = ("calibration", "--mmlu") if kind == "mmlu" else ("monitor", "--qa")
        model = model_dir if kind == "mmlu" else qa_folder / "gpt2"
        for out in ([], ["--out", str(tmp_path / "out")]):
            assert main(["run", experiment, "--quick", "--model", str(model), flag, str(path), *out]) == 2
            err = capsys.readouterr().err
            assert str(path) in one_error_line(err, "run") and err.count(str(path)) == 1, err
            assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()


def test_a_seed_whose_draw_leaves_a_needed_split_empty_is_named_before_the_model_loads(tmp_path):
    """Ten questions drawn into fit / calibration / test at random: with seed 125 none falls in the test split,
    which the monitor reports on. Said before the model is read (the model named here does not exist)."""
    path = write_csv(tmp_path / "qa.csv", QA_ROWS[:10])
    assert (qa_splits(10, monitor.Config(model="nowhere", qa=str(path), seed=125)) != "test").all()
    with pytest.raises(
        ValueError,
        match=r"qa\.csv: with seed 125, none of the 10 items falls in the test split: use "
        r"more items, or another --seed",
    ):
        monitor.read_inputs(monitor.Config(model="nowhere", qa=str(path), seed=125))


# --- 5. prompts longer than the model reads ------------------------------------------------------------------------
def test_a_prompt_longer_than_the_context_is_refused_naming_its_line_on_every_route(
    tmp_path,
    capsys,
    monkeypatch,
    hf_folder,  # noqa: F811
    qa_folder,  # noqa: F811
):
    """No prompt is cut (a cut from the left drops the question): the converted model, the bridge (a GPT-J, which
    Forma does not convert) and the monitor's prompts with room for the answer each say which line is too long."""
    import torch
    from transformers import GPTJConfig, GPTJForCausalLM

    from tests.builders import VOCAB, letter_tokenizer

    model_dir, _ = hf_folder
    gptj = tmp_path / "gptj"
    torch.manual_seed(0)
    GPTJForCausalLM(
        GPTJConfig(n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_inner=64, vocab_size=VOCAB, n_positions=64)
    ).save_pretrained(gptj)
    letter_tokenizer(gptj)
    monkeypatch.setenv("FORMA_RUNS_DIR", str(tmp_path / "runs"))
    long_mmlu = write_csv(
        tmp_path / "long.csv", MMLU_ROWS[:7] + [[" ".join(["w5"] * 70)] + MMLU_ROWS[0][1:]] + MMLU_ROWS
    )
    for model in (model_dir, gptj):
        assert main(["run", "calibration", "--quick", "--model", str(model), "--mmlu", str(long_mmlu)]) == 2
        line = one_error_line(capsys.readouterr().err, "run")
        assert "1 of 20 prompts are longer than the model reads, its context of 64 tokens" in line
        assert re.search(r"\(the first, line 8, is \d+ tokens\)", line), line
    # 16 answer tokens are kept free: a prompt of 50 words fits 64 tokens but not 64 − 16
    long_qa = write_csv(tmp_path / "long-qa.csv", QA_ROWS[:2] + [[" ".join(["w5"] * 50), "w1"]] + QA_ROWS)
    assert main(["run", "monitor", "--model", str(qa_folder / "gpt2"), "--qa", str(long_qa)]) == 2
    line = one_error_line(capsys.readouterr().err, "run")
    assert "48 tokens (its context of 64 less 16 for the answer)" in line and "line 3, is 52 tokens" in line
    assert not (tmp_path / "runs").exists()


# --- 10. size --------------------------------------------------------------------------------------------------------
def test_a_large_file_shows_its_stage_and_count(tmp_path, capsys, hf_folder):  # noqa: F811
    model_dir, _ = hf_folder
    rows = [[f"w{i % 50} w{(i * 7) % 50}", "w1", "w2", "w3", "w4", "ABCD"[i % 4]] for i in range(2000)]
    cfg = calibration.Config(quick=True, model=str(model_dir), mmlu=str(write_csv(tmp_path / "big.csv", rows)))
    inputs = calibration.read_inputs(cfg)
    hf_lettered(inputs.model, inputs.tokenizer, inputs.items, encoded=inputs.prompts)
    err = capsys.readouterr().err
    assert "tokenise: prompt 2000/2000 (100%)" in err and "lettered: item 2000/2000 (100%)" in err, err
    assert "tokenise: prompt 200/2000 (10%)" in err  # a line at each tenth


def test_what_cannot_fit_in_memory_is_refused_with_the_numbers(tmp_path, monkeypatch, hf_folder):  # noqa: F811
    from lab.model import memory_check

    model_dir, csv_path = hf_folder
    size = csv_path.stat().st_size
    monkeypatch.setattr(memory_check, "available_memory", lambda device: size * 4)
    with pytest.raises(ValueError, match=r"mmlu\.csv is .*: reading it takes about .* of memory, and .* is available"):
        read_mmlu(csv_path)
    # the file fits, what the run holds per item (tokens, and every layer's residual stream twice) does not
    monkeypatch.setattr(memory_check, "available_memory", lambda device: size * CSV_MEMORY_FACTOR + 1)
    cfg = calibration.Config(quick=True, model=str(model_dir), mmlu=str(csv_path))
    with pytest.raises(
        ValueError,
        match=r"40 items need about .* for their tokens and residual streams \(.* each\), "
        r"and .* is available: use fewer items",
    ) as err:
        calibration.read_inputs(cfg)
    assert "\n" not in str(err.value)
    monkeypatch.undo()
    assert len(calibration.read_inputs(cfg).items) == 40
