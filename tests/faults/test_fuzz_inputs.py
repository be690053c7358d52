"""Generated malformations, thrown at every loader of a file from outside: a run's results.json and figures, an MMLU
and a question–answer CSV, an activation set, a Forma model folder, a Hugging Face one, an attribution graph's
description (graph.json: its meta and supernodes), a transcoder set (its config, source and weights), a dataset
of prompt pairs (forma patch --pairs), a harvest corpus (forma harvest --corpus: a .npy of token ids whose
header, values or bytes are changed, or a .txt), and the checkpoints a model's training and a transcoder set's
resume from (a tensor reshaped, retyped, made NaN, removed or added; the state's JSON changed), and a graph
folder as the graphs page finds it: its tensors, and its supernodes (names of markup, unknown nodes, ...).

Each loader gets CASES cases, each drawn by a generator seeded with the loader's name and the case's number (so a
failure names a case that can be rerun): bytes cut short, flipped, inserted or repeated; a byte-order mark; bytes
that are not UTF-8; a JSON value replaced by one of another type, a key removed or added, nesting ten thousand
deep, a number of five thousand digits; a CSV row with an empty question, a cell longer than the csv module reads,
a line break in an answer, a quote left open; shards swapped, cut short or named `../`; and the file itself
replaced by a FIFO, a folder, a link out of its folder, a link to nothing, or a file past the size Forma reads.

The contract, for every case: the loader returns what the file says — the same as an independent reader of the
same bytes (Python's json and csv, safetensors, tokenizers, transformers' own model for a Hugging Face folder;
the activations as they were written) — or raises a ValueError or FileNotFoundError whose message is one line
and names the file's folder. Any other exception, a hang past TIMEOUT_S, a message of several lines or a load
that differs from the independent reader fails the test, naming the loader and the case.
"""

import copy
import csv
import io
import json
import math
import os
import random
import shutil
import signal
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.builders import REPO, hf_model, tiny_config, word_tokenizer

CASES = 200  # per loader
TIMEOUT_S = 20  # a case still running after this is a hang
BOM = b"\xef\xbb\xbf"


class Hang(Exception):
    pass


@contextmanager
def time_limit(seconds: float):
    def expire(signum, frame):
        raise Hang(f"still running after {seconds} s")

    before = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


# --- the generator -----------------------------------------------------------------------------------------------
ODD_BYTES = [b"\xff", b"\xc3", b"\x00", b"\xed\xa0\x80", b"\r", b"\n", b'"', b",", b"\\", b"{", b"]"]


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """One change to a file's bytes."""
    at = rng.randrange(len(data) + 1)
    span = rng.randint(1, 64)
    kind = rng.choice(["cut", "flip", "insert", "delete", "repeat", "bom", "empty", "odd"])
    if kind == "cut":
        return data[:at]
    if kind == "flip" and data:
        at = min(at, len(data) - 1)
        return data[:at] + bytes([data[at] ^ (1 << rng.randrange(8))]) + data[at + 1 :]
    if kind == "insert":
        return data[:at] + bytes(rng.randrange(256) for _ in range(span)) + data[at:]
    if kind == "delete":
        return data[:at] + data[at + span :]
    if kind == "repeat":
        return data[: at + span] + data[at:]
    if kind == "bom":
        return BOM + data
    if kind == "empty":
        return b""
    return data[:at] + rng.choice(ODD_BYTES) + data[at:]


def odd_value(rng: random.Random) -> Any:
    """A JSON value of some type, as a careless edit or a hostile file might put it."""
    return rng.choice(
        [
            None,
            True,
            False,
            0,
            -1,
            1,
            2**70,
            1.5,
            -0.0,
            1e308,
            math.nan,
            math.inf,
            "",
            "x",
            "../../etc/passwd",
            "a" * 5000,
            [],
            {},
            [1, 2],
            {"k": "v"},
            [[[[[[1]]]]]],
            "\u202e\n<b>",
        ]
    )


def paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (keys and indices) to a node of parsed JSON."""
    found = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found += paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value[:20]):
            found += paths(child, (*prefix, index))
    return found


def mutate_json(value: Any, rng: random.Random) -> bytes:
    """One change to a JSON file: a node replaced or removed, a key added, deep nesting, a long number, or one
    change to its bytes."""
    value = copy.deepcopy(value)
    kind = rng.choice(["replace", "replace", "replace", "remove", "add", "nest", "digits", "bytes", "bytes"])
    if kind == "nest":
        depth = rng.choice([70, 1_000, 10_000])
        return ("[" * depth + json.dumps(value) + "]" * depth).encode()
    if kind == "digits":
        return json.dumps(value).replace("1", "1" + "7" * 5000, 1).encode()
    if kind == "bytes":
        return mutate_bytes(json.dumps(value, indent=rng.choice([None, 2])).encode(), rng)
    where = rng.choice(paths(value))
    if not where:
        return json.dumps(odd_value(rng)).encode()
    parent = value
    for step in where[:-1]:
        parent = parent[step]
    if kind == "replace":
        parent[where[-1]] = odd_value(rng)
    elif kind == "remove":
        del parent[where[-1]]
    elif isinstance(parent, dict):
        parent[rng.choice(["unknown_key", "model_type", "auto_map", "dtype", "torch_dtype"])] = odd_value(rng)
    else:
        parent.append(odd_value(rng))
    return json.dumps(value, allow_nan=True).encode()


def replace_file(path: Path, folder: Path, rng: random.Random) -> None:
    """The file at `path` replaced by something that is not a regular file of its folder."""
    kind = rng.choice(["fifo", "folder", "link out", "dangling link", "huge", "missing"])
    data = path.read_bytes() if path.is_file() else b""
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "link out":
        outside = folder.parent / f"outside-{rng.randrange(10**6)}{path.suffix}"
        outside.write_bytes(data)
        path.symlink_to(outside)
    elif kind == "dangling link":
        path.symlink_to(folder / "nothing-here")
    elif kind == "huge":  # sparse: past every size Forma reads, and no disk used
        with path.open("wb") as handle:
            handle.truncate(2**31 + 1)


# --- the contract --------------------------------------------------------------------------------------------------
def same_json(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True, allow_nan=True) == json.dumps(b, sort_keys=True, allow_nan=True)


class Tally:
    def __init__(self):
        self.counts: dict[str, dict[str, int]] = {}

    def check(
        self, loader: str, case: int, folder: Path, load: Callable[[], Any], expected: Callable[[Any], None]
    ) -> None:
        """load() either refuses in one line naming `folder`, or returns what expected() accepts."""
        counts = self.counts.setdefault(loader, {"loaded": 0, "refused": 0})
        label = f"{loader} case {case}"
        try:
            with time_limit(TIMEOUT_S):
                value = load()
        except (ValueError, FileNotFoundError) as err:
            message = str(err)
            assert "\n" not in message, f"{label}: a message of several lines: {message!r}"
            assert str(folder) in message, f"{label}: the message names no file of {folder}: {message!r}"
            counts["refused"] += 1
            return
        except Hang:
            pytest.fail(f"{label}: hangs")
        except Exception as err:  # noqa: BLE001 (the point: no other exception may escape)
            pytest.fail(f"{label}: {type(err).__name__}: {err}")
        try:
            expected(value)
        except Exception as err:  # noqa: BLE001
            pytest.fail(f"{label}: loaded, but not what the file says ({type(err).__name__}: {err})")
        counts["loaded"] += 1


@pytest.fixture(scope="module")
def tally(request):
    tally = Tally()
    yield tally
    report = ", ".join(f"{name}: {c['loaded']} loaded, {c['refused']} refused" for name, c in tally.counts.items())
    print(f"\nfuzzed loaders: {report}")


def assert_counted(tally: Tally, loader: str) -> None:
    counts = tally.counts[loader]
    assert counts["loaded"] + counts["refused"] == CASES
    assert counts["loaded"] > 0 and counts["refused"] > 0, counts  # the cases reach both outcomes


# --- a run folder: results.json, figures ---------------------------------------------------------------------------
def test_results_json(tmp_path, tally):
    from lab.runs import read_results

    original = json.loads((REPO / "docs" / "measured" / "runs" / "kl.json").read_text())
    for case in range(CASES):
        rng = random.Random(f"results-{case}")
        folder = tmp_path / str(case) / "run"
        folder.mkdir(parents=True)
        path = folder / "results.json"
        path.write_bytes(mutate_json(original, rng))
        if rng.random() < 0.1:
            replace_file(path, folder, rng)

        def expected(value, path=path):
            oracle = json.loads(path.read_bytes().removeprefix(BOM).decode("utf-8"))
            assert isinstance(oracle, dict) and same_json(value, oracle)

        tally.check("results.json", case, folder, lambda folder=folder: read_results(folder), expected)
    assert_counted(tally, "results.json")


def test_figures(tmp_path, tally):
    import plotly.graph_objects as go

    from lab.runs import read_figures

    original = json.loads(
        go.Figure(go.Scatter(x=[1, 2, 3], y=[4, 5, 6], name="kl"), layout={"title": {"text": "KL"}}).to_json()
    )
    for case in range(CASES):
        rng = random.Random(f"figure-{case}")
        folder = tmp_path / str(case) / "run"
        folder.mkdir(parents=True)
        path = folder / "figure.json"
        path.write_bytes(mutate_json(original, rng))
        if rng.random() < 0.1:
            replace_file(path, folder, rng)

        def load(folder=folder):
            found, unreadable = read_figures(folder)
            assert len(found) + len(unreadable) <= 1 and all("\n" not in u for u in unreadable), unreadable
            if unreadable:  # read_figures names what it leaves out rather than raising: the same contract
                raise ValueError(f"{folder}: {unreadable[0]}")
            return found

        def expected(found, path=path):
            if not os.path.lexists(path):  # no file, no figure
                assert found == []
                return
            oracle = json.loads(path.read_bytes().removeprefix(BOM).decode("utf-8"))
            assert [name for name, _ in found] == ["figure"]
            assert same_json(found[0][1].to_plotly_json(), go.Figure(oracle).to_plotly_json())

        tally.check("figures", case, folder, load, expected)
    assert_counted(tally, "figures")


# --- question files -------------------------------------------------------------------------------------------------
MMLU_HEADER = ["question", "A", "B", "C", "D", "answer"]


def mutate_csv(rows: list[list[str]], header: list[str], rng: random.Random) -> bytes:
    """A question file with one change: to a row (a cell emptied, made too long, given a line break or a quote; a
    column added or removed; rows dropped) or to its bytes."""
    rows = copy.deepcopy(rows)
    kind = rng.choice(["cell", "cell", "width", "few", "crlf", "bytes", "bytes", "bom"])
    row = rng.randrange(len(rows))
    if kind == "cell":
        column = rng.randrange(len(rows[row]))
        rows[row][column] = rng.choice(
            ["", " ", "x\ny", "\r\n", 'say "hi"', "a" * 140_000, "é", "\x00", "E", " a ", "b"]
        )
    elif kind == "width":
        rows[row] = rows[row] + ["extra"] if rng.random() < 0.5 else rows[row][:-1]
    elif kind == "few":
        rows = rows[: rng.randrange(len(rows))]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n" if kind == "crlf" else "\n")
    if rng.random() < 0.5:
        writer.writerow(header)
    writer.writerows(rows)
    data = buffer.getvalue().encode()
    if kind == "bom":
        return BOM + data
    return mutate_bytes(data, rng) if kind == "bytes" else data


def rows_of(path: Path, header: list[str]) -> list[list[str]]:
    """The independent reader: Python's csv over the UTF-8 text (a BOM dropped), the header and blank rows aside."""
    text = path.read_bytes().removeprefix(BOM).decode("utf-8")
    rows = list(csv.reader(io.StringIO(text, newline=""), strict=True))
    if rows and [c.strip().lower() for c in rows[0]] == [c.lower() for c in header]:
        rows = rows[1:]
    return [row for row in rows if any(cell.strip() for cell in row)]


def test_mmlu_csv(tmp_path, tally):
    from experiments.calibration.mmlu import read_mmlu

    rows = [[f"q{i} w{i}", "one", "two", "three", "four", "ABCD"[i % 4]] for i in range(14)]
    for case in range(CASES):
        rng = random.Random(f"mmlu-{case}")
        folder = tmp_path / str(case)
        folder.mkdir()
        path = folder / "mmlu.csv"
        path.write_bytes(mutate_csv(rows, MMLU_HEADER, rng))
        if rng.random() < 0.1:
            replace_file(path, folder, rng)

        def expected(items, path=path):
            oracle = rows_of(path, MMLU_HEADER)
            assert len(items) == len(oracle) >= 10
            for item, row in zip(items, oracle):
                assert len(row) == 6 and item["question"] == row[0].strip() != ""
                assert item["options"] == [c.strip() for c in row[1:5]]
                assert "ABCD"[item["answer_index"]] == row[5].strip().upper()

        tally.check("MMLU CSV", case, folder, lambda path=path: read_mmlu(path), expected)
    assert_counted(tally, "MMLU CSV")


def test_question_answer_csv(tmp_path, tally):
    from experiments.monitor.qa import read_qa

    rows = [[f"what is w{i}?", f"w{i % 5}"] for i in range(14)]
    for case in range(CASES):
        rng = random.Random(f"qa-{case}")
        folder = tmp_path / str(case)
        folder.mkdir()
        path = folder / "qa.csv"
        path.write_bytes(mutate_csv(rows, ["question", "answer"], rng))
        if rng.random() < 0.1:
            replace_file(path, folder, rng)

        def expected(items, path=path):
            oracle = rows_of(path, ["question", "answer"])
            assert len(items) == len(oracle) >= 10
            for item, row in zip(items, oracle):
                assert len(row) == 2 and [item["question"], item["answer"]] == [c.strip() for c in row]
                assert item["question"] and item["answer"] and "\n" not in item["answer"]

        tally.check("question-answer CSV", case, folder, lambda path=path: read_qa(path), expected)
    assert_counted(tally, "question-answer CSV")


# --- an activation set ------------------------------------------------------------------------------------------------
def test_activation_set(tmp_path, tally):
    from lab import HookedTransformer
    from lab.analysis.activations.store import ActivationStore, save_activations

    model = HookedTransformer(tiny_config(), seed=0).eval()
    data = torch.randint(0, 100, (12, 6), generator=torch.Generator().manual_seed(0))
    written = tmp_path / "written"
    truth = save_activations(
        model,
        data,
        ["blocks.0.hook_resid_post", "blocks.1.attn.hook_pattern"],
        written,
        positions="all",
        batch_size=4,
        shard_mb=0.01,
        progress=False,
    ).load()
    index = json.loads((written / "index.json").read_text())
    shards = [s["file"] for s in index["shards"]]
    assert len(shards) >= 3
    for case in range(CASES):
        rng = random.Random(f"activations-{case}")
        folder = tmp_path / str(case) / "set"
        shutil.copytree(written, folder)
        kind = rng.choice(["index", "index", "index", "shard bytes", "swap", "name", "replace"])
        if kind == "index":
            (folder / "index.json").write_bytes(mutate_json(index, rng))
        elif kind == "shard bytes":
            shard = folder / rng.choice(shards)
            shard.write_bytes(mutate_bytes(shard.read_bytes(), rng))
        elif kind == "swap":
            a, b = rng.sample(shards, 2)
            (folder / a).rename(folder / "swap"), (folder / b).rename(folder / a), (folder / "swap").rename(folder / b)
        elif kind == "name":
            changed = copy.deepcopy(index)
            changed["shards"][rng.randrange(len(shards))]["file"] = rng.choice(
                ["../written/" + shards[0], "/etc/hostname", shards[0], "index.json", ""]
            )
            (folder / "index.json").write_text(json.dumps(changed))
        else:
            replace_file(folder / rng.choice(["index.json", *shards]), folder, rng)

        def expected(loaded):
            for name, tensor in truth.acts.items():
                assert torch.equal(loaded.acts[name], tensor), name
            assert torch.equal(loaded.seq, truth.seq) and torch.equal(loaded.pos, truth.pos)

        tally.check("activation set", case, folder, lambda folder=folder: ActivationStore(folder).load(), expected)
    assert_counted(tally, "activation set")


# --- model folders ---------------------------------------------------------------------------------------------------
def test_forma_model_folder(tmp_path, tally):
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    from lab import HookedTransformer, ModelConfig
    from lab.data.tokenizers import word_level

    saved = tmp_path / "saved"
    tokenizer = word_level([f"w{i}" for i in range(40)])
    cfg = tiny_config(d_vocab=tokenizer.get_vocab_size(), n_ctx=16)
    HookedTransformer(cfg, seed=0, tokenizer=tokenizer).save(saved)
    config = json.loads((saved / "config.json").read_text())
    tokenizer_json = json.loads((saved / "tokenizer.json").read_text())
    for case in range(CASES):
        rng = random.Random(f"forma-{case}")
        folder = tmp_path / str(case) / "model"
        shutil.copytree(saved, folder)
        kind = rng.choice(["config", "config", "config", "weights", "tokenizer", "tokenizer bytes", "replace"])
        if kind == "config":
            (folder / "config.json").write_bytes(mutate_json(config, rng))
        elif kind == "weights":
            (folder / "model.safetensors").write_bytes(mutate_bytes((folder / "model.safetensors").read_bytes(), rng))
        elif kind == "tokenizer":
            (folder / "tokenizer.json").write_bytes(mutate_json(tokenizer_json, rng))
        elif kind == "tokenizer bytes":
            (folder / "tokenizer.json").write_bytes(mutate_bytes((folder / "tokenizer.json").read_bytes(), rng))
        else:
            replace_file(folder / rng.choice(["config.json", "model.safetensors", "tokenizer.json"]), folder, rng)

        def expected(model, folder=folder):
            oracle = json.loads((folder / "config.json").read_bytes().removeprefix(BOM).decode("utf-8"))
            assert model.cfg == ModelConfig.from_dict(oracle)
            weights = load_file(str(folder / "model.safetensors"))
            assert weights.keys() == model.state_dict().keys()
            assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
            if (folder / "tokenizer.json").is_file():
                text = (folder / "tokenizer.json").read_bytes().removeprefix(BOM).decode("utf-8")
                assert model.tokenizer.to_str() == Tokenizer.from_str(text).to_str()
            else:
                assert model.tokenizer is None

        tally.check(
            "Forma model folder",
            case,
            folder,
            lambda folder=folder: HookedTransformer.from_pretrained(folder),
            expected,
        )
    assert_counted(tally, "Forma model folder")


@pytest.mark.slow  # every case loads a Hugging Face folder
def test_hugging_face_model_folder(tmp_path, tally):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lab.hf.loading import load_hf

    saved = tmp_path / "saved"
    hf_model("gpt2").save_pretrained(saved)
    word_tokenizer(saved)
    files = {name: json.loads((saved / name).read_text()) for name in ("config.json", "tokenizer_config.json")}
    index = {"metadata": {}, "weight_map": {"transformer.wte.weight": "model.safetensors"}}
    tokens = torch.tensor([[1, 5, 7, 9]])
    for case in range(CASES):
        rng = random.Random(f"hf-{case}")
        folder = tmp_path / str(case) / "model"
        shutil.copytree(saved, folder)
        kind = rng.choice(["config.json"] * 4 + ["tokenizer_config.json", "index", "tokenizer bytes", "replace"])
        if kind in files:
            (folder / kind).write_bytes(mutate_json(files[kind], rng))
        elif kind == "index":
            (folder / "model.safetensors.index.json").write_bytes(mutate_json(index, rng))
        elif kind == "tokenizer bytes":
            (folder / "tokenizer.json").write_bytes(mutate_bytes((folder / "tokenizer.json").read_bytes(), rng))
        else:
            replace_file(
                folder
                / rng.choice(
                    [
                        "config.json",
                        "model.safetensors",
                        "tokenizer.json",
                        "generation_config.json",
                        "tokenizer_config.json",
                    ]
                ),
                folder,
                rng,
            )

        def expected(model, folder=folder):
            hf = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=False).eval()
            with torch.no_grad():
                # (a mask given: transformers' check for padding fails on a pad_token_id past int64, Forma reads none)
                theirs = hf(tokens, attention_mask=torch.ones_like(tokens)).logits
                torch.testing.assert_close(model(tokens), theirs, atol=1e-4, rtol=1e-4)
            theirs = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
            assert model.tokenizer("w1 w2 w3")["input_ids"] == theirs("w1 w2 w3")["input_ids"]

        tally.check("Hugging Face model folder", case, folder, lambda folder=folder: load_hf(folder), expected)
    assert_counted(tally, "Hugging Face model folder")


# --- an attribution graph's description ------------------------------------------------------------------------------
def test_attribution_graph(tmp_path, tally, one_thread):
    from lab.analysis.graphs.attribute import attribute
    from lab.analysis.graphs.graph import META_FILE, Graph
    from tests.builders import random_transcoders, tiny_model

    model = tiny_model()
    graph = attribute(model, random_transcoders(model), torch.arange(3, 13))
    ids = graph.node_ids()
    graph.supernodes = [{"name": "early", "nodes": ids[:2]}, {"name": "late", "nodes": ids[-3:]}]
    graph.save(tmp_path / "original")
    original = json.loads((tmp_path / "original" / META_FILE).read_text())
    for case in range(CASES):
        rng = random.Random(f"graph-{case}")
        folder = tmp_path / str(case) / "graph"
        shutil.copytree(tmp_path / "original", folder)
        path = folder / META_FILE
        path.write_bytes(mutate_json(original, rng))
        if rng.random() < 0.1:
            replace_file(path, folder, rng)

        def expected(loaded, path=path):
            oracle = json.loads(path.read_bytes().removeprefix(BOM).decode("utf-8"))
            assert loaded.n_layers == oracle["n_layers"] and same_json(loaded.meta, oracle.get("meta", {}))
            assert same_json(loaded.supernodes, oracle.get("supernodes", []))
            assert torch.equal(loaded.adjacency, graph.adjacency)

        tally.check("attribution graph", case, folder, lambda folder=folder: Graph.load(folder), expected)
    assert_counted(tally, "attribution graph")


# --- a transcoder set: config.json, source.json (what it was built from), transcoders.safetensors ------------------
def test_transcoder_set(tmp_path, tally, one_thread):
    """A set loaded against the model it was built from, one of its three files malformed per case: refused in one
    line naming the folder, or loaded as its files say (the config's fields as json reads them, the weights as
    safetensors reads them)."""
    from safetensors.torch import load_file

    from lab.analysis.transcoders.model import (
        CONFIG_FILE,
        SOURCE_FILE,
        WEIGHTS_FILE,
        Transcoders,
        built_from,
        model_fingerprint,
    )
    from tests.builders import random_transcoders, tiny_model

    model = tiny_model()
    random_transcoders(model, d_features=16).save(tmp_path / "original", built_from(model_fingerprint(model), 3))
    originals = {name: json.loads((tmp_path / "original" / name).read_text()) for name in (CONFIG_FILE, SOURCE_FILE)}
    for case in range(CASES):
        rng = random.Random(f"transcoders-{case}")
        folder = tmp_path / str(case) / "tc"
        shutil.copytree(tmp_path / "original", folder)
        target = rng.choice([CONFIG_FILE, SOURCE_FILE, WEIGHTS_FILE])
        path = folder / target
        if target == WEIGHTS_FILE:
            path.write_bytes(mutate_bytes(path.read_bytes(), rng))
        else:
            path.write_bytes(mutate_json(originals[target], rng))
        if rng.random() < 0.1:
            replace_file(path, folder, rng)

        def expected(loaded, folder=folder):
            config = json.loads((folder / CONFIG_FILE).read_bytes().removeprefix(BOM).decode("utf-8"))
            assert all(getattr(loaded.cfg, k) == v for k, v in config.items())
            weights = load_file(str(folder / WEIGHTS_FILE))
            for name, t in loaded.state_tensors().items():
                torch.testing.assert_close(t, weights[name].to(t.dtype), rtol=0, atol=0, equal_nan=True)

        tally.check("transcoder set", case, folder, lambda folder=folder: Transcoders.load(folder, model), expected)
    assert_counted(tally, "transcoder set")


# --- a dataset of prompt pairs (forma patch --pairs): JSONL --------------------------------------------------------
PAIR_WORDS = ["Mary", "John", "went", "to", "the", "store", ",", "gave", "a", "drink"]


def test_pairs_file(tmp_path, tally, one_thread):
    """A JSONL dataset of two pairs (one of text, one of token ids), one row or the file's bytes malformed per case:
    refused in one line naming the file, or read as json reads it (each row's prompts, as text encoded or as ids,
    and its answers)."""
    from lab import HookedTransformer
    from lab.analysis.sweeps import read_pairs
    from lab.data.tokenizers import word_level

    tokenizer = word_level(PAIR_WORDS)
    model = HookedTransformer(tiny_config(d_vocab=tokenizer.get_vocab_size(), n_ctx=16), seed=0, tokenizer=tokenizer)
    rows = [
        {"clean": "Mary and John went to the store", "corrupted": "Mary and Mary went to the store", "answer": "John"},
        {"clean": [3, 4, 5, 6], "corrupted": [3, 4, 7, 6], "answer": 5, "wrong": 7},
    ]
    rows[0]["wrong"] = "Mary"
    for case in range(CASES):
        rng = random.Random(f"pairs-{case}")
        folder = tmp_path / str(case)
        folder.mkdir()
        path = folder / "pairs.jsonl"
        lines = [json.dumps(r).encode() for r in rows]
        if rng.random() < 0.15:  # a token id past the vocabulary, below 0, or past int64
            bad = copy.deepcopy(rows[1])
            bad[rng.choice(["clean", "corrupted"])][rng.randrange(4)] = rng.choice([-1, 2**63, model.cfg.d_vocab])
            lines[1] = json.dumps(bad).encode()
            path.write_bytes(b"\n".join(lines) + b"\n")
        elif rng.random() < 0.5:
            k = rng.randrange(len(lines))
            lines[k] = mutate_json(rows[k], rng).replace(b"\n", b" ")
            path.write_bytes(b"\n".join(lines) + b"\n")
        else:
            path.write_bytes(mutate_bytes(b"\n".join(lines) + b"\n", rng))
        if rng.random() < 0.1:
            replace_file(path, folder, rng)

        def expected(loaded, path=path):
            text = path.read_bytes().removeprefix(BOM).decode("utf-8")
            oracle = [json.loads(line) for line in text.splitlines() if line.strip()]
            assert len(loaded) == len(oracle)
            for pair, row in zip(loaded, oracle):
                for key in ("clean", "corrupted"):
                    ids = row[key] if isinstance(row[key], list) else model.to_tokens(row[key], truncate=False)[0]
                    assert torch.equal(getattr(pair, key), torch.as_tensor(ids))
                    assert all(0 <= int(t) < model.cfg.d_vocab for t in getattr(pair, key))
                for key in ("answer", "wrong"):
                    want = row[key] if isinstance(row[key], int) else model.to_single_token(row[key])
                    assert getattr(pair, key) == want

        tally.check("pairs file", case, folder, lambda path=path: read_pairs(path, model), expected)
    assert_counted(tally, "pairs file")


# --- a harvest corpus (forma harvest --corpus): .npy token ids, .txt text ------------------------------------------
def npy_bytes(header: dict, body: bytes) -> bytes:
    """A .npy file of version 1.0 with this header (written as it is, however odd) and body."""
    text = repr(header).encode()
    text += b" " * (63 - (10 + len(text)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + body


def odd_npy(ids, d_vocab: int, rng: random.Random) -> bytes:
    """A .npy of token ids with one change: its header (a dtype not of integers, an object array, a shape past the
    file or past memory, no shape, three dimensions, Fortran order), a value (below 0, past the vocabulary, NaN),
    a width past the context, no row at all, or its bytes."""
    import numpy as np

    ids = np.array(ids)
    kind = rng.choice(["header", "header", "value", "value", "shape", "bytes", "bytes"])
    if kind == "header":
        header = {"descr": ids.dtype.str, "fortran_order": False, "shape": ids.shape}
        header[rng.choice(["descr", "shape", "fortran_order", "extra"])] = rng.choice(
            ["|O", "<f4", "<f8", "|b1", "<U3", ">i8", "<u8", "|i1", "<c8", "V8", "nonsense", 7, None, True]
            + [(10**12,), (2**62, 8), (2**40, 2**40), (), (2, 2, 16), (-1,), (0,), (3,), "()", [4, 16]]
        )
        return npy_bytes(header, ids.tobytes())
    buffer = io.BytesIO()
    if kind == "value":
        value = rng.choice([-1, d_vocab, 2**31 - 1, math.nan, math.inf, 2**63 - 1])
        ids = ids.astype(np.float64 if isinstance(value, float) else np.int64)
        ids.reshape(-1)[rng.randrange(ids.size)] = value
    elif kind == "shape":
        ids = rng.choice([ids.reshape(-1)[:0], ids.reshape(-1, 2), np.zeros((3, 0), ids.dtype), ids.reshape(-1)[:7]])
        ids = rng.choice([ids, np.tile(ids.reshape(1, -1)[:, :1], (2, 40)), ids.astype(np.uint8), ids.astype(">i4")])
    np.save(buffer, ids, allow_pickle=False)
    return mutate_bytes(buffer.getvalue(), rng) if kind == "bytes" else buffer.getvalue()


CORPUS_WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "é", "日本"]


def test_harvest_corpus(tmp_path, tally, one_thread):
    """A corpus file of each kind forma harvest reads (token ids as a 1-D or 2-D .npy, text as a .txt), one
    change per case, or a file of another kind: refused in one line naming the file, or read as numpy and the
    tokenizer read it (the ids cut into the sequences the file holds, each within the vocabulary)."""
    import numpy as np

    from lab import HookedTransformer
    from lab.analysis.activations.harvest import split_corpus
    from lab.data.tokenizers import word_level

    tokenizer = word_level(CORPUS_WORDS)
    model = HookedTransformer(tiny_config(d_vocab=tokenizer.get_vocab_size(), n_ctx=16), seed=0, tokenizer=tokenizer)
    d_vocab = model.cfg.d_vocab
    stream = np.random.default_rng(0).integers(0, d_vocab, 64, dtype=np.int32)
    text = " ".join(CORPUS_WORDS[i % len(CORPUS_WORDS)] for i in range(70)) + "\n"
    for case in range(CASES):
        rng = random.Random(f"corpus-{case}")
        folder = tmp_path / str(case)
        folder.mkdir()
        kind = rng.choice(["stream", "sequences", "stream", "sequences", "text", "text", "other"])
        if kind == "text":
            path = folder / "corpus.txt"
            path.write_bytes(mutate_bytes(text.encode(), rng) if rng.random() < 0.8 else text.encode() * 400)
        elif kind == "other":
            path = folder / rng.choice(["corpus.jsonl", "corpus.npz", "corpus", "corpus.NPY"])
            path.write_text(json.dumps({"text": text}) + "\n")
        else:
            path = folder / "corpus.npy"
            path.write_bytes(
                odd_npy(stream if kind == "stream" else stream.astype(np.int64).reshape(4, 16), d_vocab, rng)
            )
        if rng.random() < 0.1:
            replace_file(path, folder, rng)

        def expected(loaded, path=path):
            ids, left_over = loaded
            if path.suffix == ".txt":
                oracle = np.array(tokenizer.encode(path.read_bytes().removeprefix(BOM).decode("utf-8")).ids)
            else:
                oracle = np.load(path, allow_pickle=False)
            assert ids.ndim == 2 and ids.shape[0] >= 1 and 1 <= ids.shape[1] <= model.cfg.n_ctx
            assert np.array_equal(np.asarray(ids).reshape(-1), oracle.reshape(-1)[: ids.size])
            assert left_over == oracle.size - ids.size and (oracle.ndim == 1 or left_over == 0)
            assert ((ids >= 0) & (ids < d_vocab)).all()

        tally.check("harvest corpus", case, folder, lambda path=path: split_corpus(path, model), expected)
    assert_counted(tally, "harvest corpus")


# --- training checkpoints (forma build --resume, forma transcoders resuming) --------------------------------------
def odd_safetensors(path: Path, rng: random.Random) -> None:
    """One change to a safetensors file: a tensor given another shape, another dtype, a NaN, removed, or joined by
    one of another name; or its bytes changed."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    kind = rng.choice(["shape", "dtype", "nan", "remove", "add", "bytes", "bytes"])
    if kind == "bytes":
        path.write_bytes(mutate_bytes(path.read_bytes(), rng))
        return
    name = rng.choice(sorted(tensors))
    if kind == "shape":
        tensors[name] = torch.zeros(rng.choice([(0,), (3,), (2, 2), (*tensors[name].shape, 1)]))
    elif kind == "dtype":
        tensors[name] = tensors[name].to(rng.choice([torch.float16, torch.int64, torch.uint8, torch.bool]))
    elif kind == "nan" and tensors[name].is_floating_point() and tensors[name].numel():
        tensors[name] = tensors[name].clone().reshape(-1).index_fill(0, torch.tensor([0]), math.nan)
        tensors[name] = tensors[name].reshape(load_file(str(path))[name].shape)
    elif kind == "remove":
        del tensors[name]
    else:
        tensors[rng.choice(["unknown", "99.exp_avg", "0.", "x.step", "torch_cuda"])] = torch.zeros(3)
    save_file(tensors, str(path))


def checkpoint_case(folder: Path, files: dict[str, Any], rng: random.Random) -> None:
    """One file of a checkpoint folder changed: a JSON file's value or bytes, a safetensors file's tensor or
    bytes, a file replaced (a FIFO, a folder, a link, past the size Forma reads, missing); or the folder left
    aside as a crash between a save's two renames leaves it (`.checkpoint.old`), changed the same way."""
    if rng.random() < 0.1:
        aside = folder.with_name(f".{folder.name}.old")
        folder.rename(aside)
        folder = aside
    name = rng.choice(sorted(files))
    path = folder / name
    if rng.random() < 0.1:
        replace_file(path, folder, rng)
    elif name.endswith(".json"):
        path.write_bytes(mutate_json(files[name], rng))
    else:
        odd_safetensors(path, rng)


def test_training_checkpoint(tmp_path, tally, one_thread):
    """A model's training checkpoint (lab.train.checkpoint), one file changed per case, resumed into a fresh model
    and optimizer: refused in one line naming the folder, or loaded as its files say (the weights, the optimizer's
    moments and the RNG state as safetensors reads them; the step and scalars as json reads them, each of its type
    and range)."""
    from safetensors.torch import load_file

    from lab import HookedTransformer
    from lab.train.checkpoint import (
        CHECKPOINT_FILES,
        OPTIMIZER_FILE,
        RNG_FILE,
        STATE_FILE,
        TrainState,
        load_checkpoint,
        optimizer_tensors,
        save_checkpoint,
    )
    from lab.train.config import TrainConfig
    from lab.train.loop import make_optimizer

    cfg = TrainConfig(steps=8, warmup_steps=1, batch_size=2, seq_len=8)
    model = HookedTransformer(tiny_config(), seed=0)
    optimizer = make_optimizer(model, cfg)
    model(torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(0)), return_type="loss").backward()
    optimizer.step()
    state = TrainState(step=3, train_loss_nats=4.5, best_val_loss_nats=4.75, elapsed_s=1.5, tokens_seen=48)
    save_checkpoint(tmp_path / "original" / "checkpoint", model, optimizer, cfg, state)
    original = tmp_path / "original" / "checkpoint"
    files = {
        name: json.loads((original / name).read_text()) if name.endswith(".json") else None for name in CHECKPOINT_FILES
    }
    rng_before = torch.get_rng_state()
    for case in range(CASES):
        rng = random.Random(f"checkpoint-{case}")
        folder = tmp_path / str(case) / "checkpoint"
        shutil.copytree(original, folder)
        checkpoint_case(folder, files, rng)
        fresh = HookedTransformer(tiny_config(), seed=1)
        fresh_optimizer = make_optimizer(fresh, cfg)

        def load(folder=folder, fresh=fresh, fresh_optimizer=fresh_optimizer):
            return load_checkpoint(folder, fresh, fresh_optimizer, cfg)

        def expected(loaded, folder=folder, fresh=fresh, fresh_optimizer=fresh_optimizer):
            found = folder if folder.is_dir() else folder.with_name(f".{folder.name}.old")
            meta = json.loads((found / STATE_FILE).read_bytes().removeprefix(BOM).decode("utf-8"))
            assert type(loaded.step) is int and 0 <= loaded.step <= cfg.steps and loaded.step == meta["step"]
            assert type(loaded.tokens_seen) is int and loaded.tokens_seen >= 0
            for key in ("train_loss_nats", "best_val_loss_nats", "elapsed_s"):
                value = getattr(loaded, key)
                assert value == meta[key] and (value is None or (type(value) is float and math.isfinite(value)))
            weights = load_file(str(found / "model.safetensors"))
            assert all(torch.equal(weights[k], v) for k, v in fresh.state_dict().items())
            moments = load_file(str(found / OPTIMIZER_FILE))
            assert optimizer_tensors(fresh_optimizer).keys() == moments.keys()
            for k, v in optimizer_tensors(fresh_optimizer).items():
                assert torch.equal(v, moments[k]) and torch.isfinite(v).all(), k
            assert torch.equal(torch.get_rng_state(), load_file(str(found / RNG_FILE))["torch_cpu"])

        tally.check("training checkpoint", case, folder.parent, load, expected)
    torch.set_rng_state(rng_before)
    assert_counted(tally, "training checkpoint")


def test_transcoder_checkpoint(tmp_path, tally, one_thread):
    """A transcoder training's checkpoint (lab.analysis.transcoders.train), one file changed per case, resumed into
    a fresh set and optimizer: refused in one line naming the folder, or loaded as its files say (the weights and
    moments as safetensors reads them, the step of the training's range and the history as json reads them)."""
    from safetensors.torch import load_file

    from lab.analysis.activations.store import save_activations
    from lab.analysis.transcoders.model import TranscoderConfig, Transcoders
    from lab.analysis.transcoders.train import (
        CHECKPOINT_DIR,
        TranscoderTraining,
        load_checkpoint,
        make_optimizer,
        train_transcoders,
    )
    from lab.train.checkpoint import optimizer_tensors
    from tests.builders import tiny_model

    model = tiny_model()
    hooks = [f"blocks.{i}.{h}" for i in range(3) for h in ("ln2.hook_normalized", "hook_mlp_out")]
    store = save_activations(
        model,
        torch.randint(0, 50, (8, 8), generator=torch.Generator().manual_seed(0)),
        hooks,
        tmp_path / "store",
        progress=False,
    )
    cfg = TranscoderConfig(d_model=32, n_layers=3, d_features=16)
    training = TranscoderTraining(steps=6, batch_size=16, lr=1e-3)
    train_transcoders(store, cfg, training, tmp_path / "original", stop_after=3)
    original = tmp_path / "original" / CHECKPOINT_DIR
    files = {
        name: json.loads((original / name).read_text()) if name.endswith(".json") else None
        for name in ("state.json", "config.json", "transcoders.safetensors", "optimizer.safetensors")
    }
    for case in range(CASES):
        rng = random.Random(f"transcoder-checkpoint-{case}")
        folder = tmp_path / str(case) / CHECKPOINT_DIR
        shutil.copytree(original, folder)
        checkpoint_case(folder, files, rng)
        fresh = Transcoders(cfg)
        fresh_optimizer = make_optimizer(fresh, training)

        def load(folder=folder, fresh=fresh, fresh_optimizer=fresh_optimizer):
            return load_checkpoint(folder, fresh, fresh_optimizer, training, store)

        def expected(loaded, folder=folder, fresh=fresh, fresh_optimizer=fresh_optimizer):
            found = folder if folder.is_dir() else folder.with_name(f".{folder.name}.old")
            meta = json.loads((found / "state.json").read_bytes().removeprefix(BOM).decode("utf-8"))
            assert type(loaded.step) is int and 0 <= loaded.step <= training.steps and loaded.step == meta["step"]
            assert same_json(loaded.history, meta["history"])
            weights = load_file(str(found / "transcoders.safetensors"))
            assert all(torch.equal(weights[k], v) for k, v in fresh.state_tensors().items())
            moments = load_file(str(found / "optimizer.safetensors"))
            assert optimizer_tensors(fresh_optimizer).keys() == moments.keys()
            assert all(torch.equal(v, moments[k]) for k, v in optimizer_tensors(fresh_optimizer).items())

        tally.check("transcoder checkpoint", case, folder.parent, load, expected)
    assert_counted(tally, "transcoder checkpoint")


# --- graph folders (the graphs page, lab.analysis.graphs): graph.safetensors and graph.json together -----------
@pytest.fixture(scope="module")
def saved_graph(tmp_path_factory):
    """A tiny model's attribution graph with two supernodes, saved, and its graph.json as json reads it."""
    from lab.analysis.graphs.attribute import attribute
    from lab.analysis.graphs.graph import META_FILE
    from tests.builders import random_transcoders, tiny_model

    with torch.no_grad():
        model = tiny_model()
        graph = attribute(model, random_transcoders(model), torch.arange(3, 13))
    ids = graph.node_ids()
    graph.supernodes = [{"name": "early", "nodes": ids[:2]}, {"name": "late", "nodes": ids[-3:]}]
    folder = graph.save(tmp_path_factory.mktemp("graph") / "original")
    return folder, json.loads((folder / META_FILE).read_text())


def check_graph(loaded, folder: Path) -> None:
    """A loaded graph is what its files say (the tensors as safetensors reads them, n_layers, meta and supernodes
    as json reads them), and holds together: the shapes its node order implies, finite numbers, supernodes naming
    its nodes."""
    from safetensors.torch import load_file

    from lab.analysis.graphs.graph import META_FILE, TENSORS_FILE, check_supernodes, check_tensors

    oracle = json.loads((folder / META_FILE).read_bytes().removeprefix(BOM).decode("utf-8"))
    assert loaded.n_layers == oracle["n_layers"] and same_json(loaded.meta, oracle.get("meta", {}))
    assert same_json(loaded.supernodes, oracle.get("supernodes", []))
    tensors = load_file(str(folder / TENSORS_FILE))
    assert all(torch.equal(getattr(loaded, name), t) for name, t in tensors.items() if hasattr(loaded, name))
    assert check_tensors(loaded) is None
    check_supernodes(loaded.supernodes, set(loaded.node_ids()))


def test_graph_folder(tmp_path, tally, saved_graph):
    """A graph folder as the graphs page finds it, its tensors or its description changed per case (a tensor
    reshaped, retyped, made NaN, removed; n_layers changed; either file's bytes; either file replaced or gone):
    refused in one line naming the folder, or loaded as its files say, whole."""
    from lab.analysis.graphs.graph import META_FILE, TENSORS_FILE, Graph

    original, meta = saved_graph
    for case in range(CASES):
        rng = random.Random(f"graph-folder-{case}")
        folder = tmp_path / str(case) / "graph"
        shutil.copytree(original, folder)
        kind = rng.choice(["tensors", "tensors", "tensors", "n_layers", "replace"])
        if kind == "tensors":
            odd_safetensors(folder / TENSORS_FILE, rng)
        elif kind == "n_layers":
            changed = dict(meta, n_layers=rng.choice([0, 1, 2, 4, 10**9, -1, 2.0, "3", None, True]))
            (folder / META_FILE).write_text(json.dumps(changed))
        else:
            replace_file(folder / rng.choice([TENSORS_FILE, META_FILE]), folder, rng)
        tally.check("graph folder", case, folder, lambda f=folder: Graph.load(f), lambda g, f=folder: check_graph(g, f))
    assert_counted(tally, "graph folder")


def odd_supernodes(supernodes: list, ids: list[str], rng: random.Random) -> Any:
    """Supernodes' JSON text with one change: a name emptied, repeated, made long, of markup or of another type; a
    node id unknown, repeated, of another type; a record without a field or with another; the list of another
    type; or the text's bytes."""
    supernodes = copy.deepcopy(supernodes)
    kind = rng.choice(["name", "name", "node", "node", "record", "list", "json"])
    record = rng.choice(supernodes)
    if kind == "name":
        record["name"] = rng.choice(
            ["", " ", supernodes[0]["name"], "n" * 10_000, "![x](http://127.0.0.1:9/leak.png)", "<b>bold</b>", 7, None]
        )
    elif kind == "node":
        where = rng.randrange(len(record["nodes"]) + 1)
        record["nodes"].insert(where, rng.choice(["0_99999_0", "err_9_0", "", ids[0], 3, None, ["x"], "E_1_99"]))
    elif kind == "record":
        if rng.random() < 0.5:
            del record[rng.choice(["name", "nodes"])]
        record[rng.choice(["nodes", "extra"])] = rng.choice([[], "0_1_2", {}, None, ids[:1]])
    elif kind == "list":
        supernodes = rng.choice([{}, "early", None, [[]], [None], supernodes * 2, supernodes[:0], supernodes[::-1]])
    else:  # the supernodes' own text changed (their bytes, deep nesting, a long number), as it lands in the file
        return mutate_json(supernodes, rng)
    return json.dumps(supernodes).encode()


def test_supernodes(tmp_path, tally, saved_graph):
    """A graph's supernodes (kept in graph.json, what a person groups on the graphs page) changed per case:
    refused in one line naming the folder, or loaded as json reads them, each naming nodes of the graph."""
    from lab.analysis.graphs.graph import META_FILE, Graph

    original, meta = saved_graph
    ids = Graph.load(original).node_ids()
    for case in range(CASES):
        rng = random.Random(f"supernodes-{case}")
        folder = tmp_path / str(case) / "graph"
        shutil.copytree(original, folder)
        text = json.dumps(dict(meta, supernodes="SUPERNODES")).encode()
        (folder / META_FILE).write_bytes(text.replace(b'"SUPERNODES"', odd_supernodes(meta["supernodes"], ids, rng)))
        tally.check("supernodes", case, folder, lambda f=folder: Graph.load(f), lambda g, f=folder: check_graph(g, f))
    assert_counted(tally, "supernodes")
