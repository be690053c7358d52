"""lab.analysis.sweeps in one process: prompt pairs read alike from CSV and JSONL (text or ids), each table row the
pair's own patching result (the sweeps lab.analysis.patching runs, themselves held to TransformerLens's in
tests/lab/analysis/test_patching_fast.py), averaged over the pairs the batch sweep's numbers, and a sweep
interrupted anywhere that resumes to the same bytes. (Under torchrun with 2 gloo ranks, killed and rerun:
tests/lab/cli/test_cli_datasets.py.)"""

import csv
import json
import re

import pytest
import torch

from lab import HookedTransformer
from lab.analysis.patching import patch_heads, patch_positions
from lab.analysis.sweeps import SWEEPS, PromptPair, load_sweep, read_pairs, sweep_pair, sweep_pairs
from lab.data.tokenizers import word_level
from tests.builders import patchable, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

NAMES = ["Mary", "John", "Alice", "Bob"]
WORDS = NAMES + ["When", "and", "went", "to", "the", "store", ",", "gave", "a", "drink"]


@pytest.fixture(scope="module")
def model() -> HookedTransformer:
    tokenizer = word_level(WORDS)
    return patchable(
        HookedTransformer(tiny_config(d_vocab=tokenizer.get_vocab_size(), n_ctx=16), seed=2, tokenizer=tokenizer)
    )


def ioi_rows(n: int) -> list[dict]:
    """IOI-style pairs: the clean prompt names the indirect object last; the corrupted one swaps in a third name.
    Every third pair leaves out "When" (a prompt one token shorter)."""
    rows = []
    for i in range(n):
        a, b, c = NAMES[i % 4], NAMES[(i + 1) % 4], NAMES[(i + 2) % 4]
        start = "" if i % 3 == 2 else "When "
        rows.append(
            {
                "clean": f"{start}{a} and {b} went to the store , {b} gave a drink to",
                "corrupted": f"{start}{a} and {b} went to the store , {c} gave a drink to",
                "answer": a,
                "wrong": b,
            }
        )
    return rows


def write_csv(path, rows: list[dict], fields=("clean", "corrupted", "answer", "wrong", "template")) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows({**row, "template": "ioi"} for row in rows)


def same_pairs(a: list[PromptPair], b: list[PromptPair]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x.clean, y.clean)
        and torch.equal(x.corrupted, y.corrupted)
        and (x.answer, x.wrong) == (y.answer, y.wrong)
        for x, y in zip(a, b)
    )


def test_pairs_read_alike_from_csv_and_from_jsonl_of_text_or_ids(tmp_path, model):
    rows = ioi_rows(5)
    write_csv(tmp_path / "pairs.csv", rows)  # an extra column (template) is ignored
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    from_csv = read_pairs(tmp_path / "pairs.csv", model)
    assert same_pairs(from_csv, read_pairs(tmp_path / "pairs.jsonl", model))
    ids = [
        {"clean": p.clean.tolist(), "corrupted": p.corrupted.tolist(), "answer": p.answer, "wrong": p.wrong}
        for p in from_csv
    ]
    (tmp_path / "ids.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ids))
    assert same_pairs(from_csv, read_pairs(tmp_path / "ids.jsonl", model))
    assert from_csv[0].answer == model.to_single_token("Mary") and len(from_csv[2].clean) == len(from_csv[0].clean) - 1


def test_a_bad_dataset_is_refused_with_its_line_named(tmp_path, model):
    good = ioi_rows(2)
    long_pair = good[0] | {"clean": "When " * 3 + good[0]["clean"], "corrupted": "When " * 3 + good[0]["corrupted"]}
    cases = {
        "no-column.csv": (
            lambda p: write_csv(p, good, fields=("clean", "corrupted", "answer")),
            (
                "no column 'wrong' (the header must name clean, corrupted, answer, wrong; it names "
                "clean, corrupted, answer)"
            ),
        ),
        "lengths.csv": (
            lambda p: write_csv(p, [good[0], good[1] | {"corrupted": "Mary and Bob went"}]),
            "lengths.csv:3: the clean prompt is 14 tokens and the corrupted one 4",
        ),
        "answer.jsonl": (
            lambda p: p.write_text(json.dumps(good[0] | {"answer": "Mary John"}) + "\n"),
            "answer.jsonl:1: answer: 'Mary John' is 2 tokens, not one",
        ),
        "range.jsonl": (
            lambda p: p.write_text(json.dumps(good[0] | {"wrong": 10**6}) + "\n"),
            "range.jsonl:1: wrong: token id 1000000 is out of range",
        ),
        "json.jsonl": (lambda p: p.write_text(json.dumps(good[0]) + "\n{oops\n"), "json.jsonl:2: not a JSON object"),
        "key.jsonl": (
            lambda p: p.write_text(json.dumps({"clean": "Mary"}) + "\n"),
            "key.jsonl:1: no 'corrupted' (a pair has the keys clean, corrupted, answer, wrong)",
        ),
        "empty.csv": (lambda p: write_csv(p, []), "holds no prompt pair"),
        "long.jsonl": (  # 17 tokens in a context of 16: cut, clean and corrupted would be one prompt
            lambda p: p.write_text(json.dumps(good[0]) + "\n" + json.dumps(long_pair) + "\n"),
            "long.jsonl:2: the clean prompt is 17 tokens, more than the model's context n_ctx = 16",
        ),
        "ids.jsonl": (
            lambda p: p.write_text(json.dumps(good[0] | {"corrupted": [1] * 40}) + "\n"),
            "ids.jsonl:1: the corrupted prompt is 40 tokens, more than the model's context n_ctx = 16",
        ),
        "cell.csv": (
            lambda p: write_csv(p, [good[0], good[1] | {"clean": "Mary " * 30_000}]),
            "cell.csv, line 3: a cell is longer than the 131,072 characters the csv module reads",
        ),
        "pairs.tsv": (lambda p: p.write_text(""), "a .csv or a .jsonl file"),
    }
    for name, (write, message) in cases.items():
        write(tmp_path / name)
        with pytest.raises(ValueError, match=re.escape(message)):
            read_pairs(tmp_path / name, model)


def test_each_table_row_is_its_pairs_own_sweep_and_the_mean_is_the_batch_sweep(tmp_path, model):
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ioi_rows(6)))
    pairs = read_pairs(tmp_path / "pairs.jsonl", model)
    tables = sweep_pairs(model, pairs, list(SWEEPS), tmp_path / "sweep", parts=4, progress=False)
    width = max(len(p.clean) for p in pairs)
    for name, table in tables.items():
        assert table.values.shape[0] == 6 and table.component == SWEEPS[name][0] and table.axis == SWEEPS[name][1]
        for i, pair in enumerate(pairs):
            own = sweep_pair(model, pair, name)
            cut = table.values[i][..., : own.values.shape[-1]]
            assert torch.equal(cut, own.values) and (table.clean[i], table.corrupted[i]) == (own.clean, own.corrupted)
            if table.axis != "head" and len(pair.clean) < width:
                assert table.values[i][..., len(pair.clean) :].isnan().all()  # no such position
    loaded = load_sweep(tmp_path / "sweep")
    for name, table in tables.items():
        for key in ("values", "clean", "corrupted", "lengths"):
            assert torch.equal(getattr(loaded[name], key).nan_to_num(7.0), getattr(table, key).nan_to_num(7.0))
        assert (loaded[name].component, loaded[name].axis, loaded[name].direction) == (
            table.component,
            table.axis,
            "denoise",
        )
    # The pairs of one length, averaged: what one batch sweep of them gives (the mean of the logit differences).
    same = [i for i, p in enumerate(pairs) if len(p.clean) == width]
    clean, corrupted = (torch.stack([getattr(pairs[i], k) for i in same]) for k in ("clean", "corrupted"))
    answer, wrong = (torch.tensor([getattr(pairs[i], k) for i in same]) for k in ("answer", "wrong"))
    for name, batch in (
        ("resid_pre", patch_positions(model, clean, corrupted, "resid_pre", answer=answer, wrong=wrong)),
        ("head", patch_heads(model, clean, corrupted, answer=answer, wrong=wrong)),
    ):
        table = tables[name]
        ours = type(table)(
            table.values[same],
            table.clean[same],
            table.corrupted[same],
            table.lengths[same],
            table.component,
            table.axis,
            table.direction,
        ).mean()
        assert torch.allclose(ours.values, batch.values, atol=1e-5)
        assert ours.clean == pytest.approx(batch.clean, abs=1e-5) and ours.corrupted == pytest.approx(
            batch.corrupted, abs=1e-5
        )
        assert ours.normalized().shape == batch.normalized().shape and batch.values.abs().max() > 0.1
    assert not tables["resid_pre"].mean().values.isnan().any()  # a position some pair lacks is left out, not NaN


class Interrupted(Exception):
    pass


@pytest.mark.parametrize("at", [5, 14])
def test_a_sweep_interrupted_anywhere_resumes_to_the_same_bytes(tmp_path, model, at):
    """Interrupted in its first pair or its third (5 pairs, a part each), then rerun: the tables and the manifest are
    byte for byte an uninterrupted sweep's."""
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ioi_rows(5)))
    pairs = read_pairs(tmp_path / "pairs.jsonl", model)
    sweep_pairs(model, pairs, ["resid_pre", "head"], tmp_path / "whole", progress=False)
    calls = [0]

    def interrupt(module, args):
        calls[0] += 1
        if calls[0] == at:
            raise Interrupted

    handle = model.blocks[0].register_forward_pre_hook(interrupt)
    try:
        with pytest.raises(Interrupted):
            sweep_pairs(model, pairs, ["resid_pre", "head"], tmp_path / "cut", progress=False)
    finally:
        handle.remove()
    done = sorted(p.name for p in (tmp_path / "cut" / "parts").glob("part-*"))
    assert not (tmp_path / "cut" / "sweep.json").exists() and len(done) == {5: 0, 14: 2}[at]  # of 5 parts
    sweep_pairs(model, pairs, ["resid_pre", "head"], tmp_path / "cut", progress=False)
    for name in ("plan.json", "sweep.json", "resid_pre.safetensors", "head.safetensors"):
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name


def test_a_rerun_refuses_other_arguments_and_a_finished_sweep(tmp_path, model):
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ioi_rows(3)))
    pairs = read_pairs(tmp_path / "pairs.jsonl", model)
    sweep_pairs(model, pairs, ["head"], tmp_path / "s", progress=False)
    with pytest.raises(FileExistsError, match="already holds a complete sweep"):
        sweep_pairs(model, pairs, ["head"], tmp_path / "s", progress=False)
    (tmp_path / "s" / "sweep.json").unlink()
    with pytest.raises(
        ValueError,
        match=r"patching sweep begun with other arguments \(direction: 'denoise' then, "
        r"'noise' now\)",
    ):
        sweep_pairs(model, pairs, ["head"], tmp_path / "s", direction="noise", progress=False)
    with pytest.raises(ValueError, match=r"\(pairs_sha256: "):
        sweep_pairs(model, pairs[:1] + pairs[2:] + pairs[1:2], ["head"], tmp_path / "s", progress=False)
    noised = sweep_pairs(model, pairs, ["head"], tmp_path / "s", direction="noise", overwrite=True, progress=False)
    assert noised["head"].direction == "noise" and load_sweep(tmp_path / "s")["head"].direction == "noise"
    with pytest.raises(ValueError, match="sweeps must be distinct names of resid_pre, "):
        sweep_pairs(model, pairs, ["heads"], tmp_path / "t", progress=False)
