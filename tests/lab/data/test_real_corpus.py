"""The real corpus (lab.data.real_corpus, `forma corpus real`): every document names its source and license, no
text is in two documents, documents are held out by module, never by position, the same inputs write the same
bytes, and the manifest's counts are the files'. A slice (the json package of the standard library and einops)
stands for the whole; the whole corpus's totals are read from docs/measured/corpus/real.json."""

import json
import sysconfig
from email.message import Message
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

from lab.cli.corpus import cmd_corpus
from lab.cli.parser import main
from lab.data.real_corpus import (
    CODE,
    ENGLISH,
    PACKAGES,
    SEPARATOR,
    SPLITS,
    STDLIB,
    STDLIB_LICENSE,
    Document,
    collect_documents,
    distinct,
    is_held_out,
    package_license,
    read_split,
    stdlib_documents,
    summary,
    write_corpus,
)
from lab.data.stdlib_corpus import train_bpe
from lab.measured import REPO

FRACTION = 0.3  # a slice of 19 documents: both splits hold some
MEASURED = REPO / "docs" / "measured" / "corpus" / "real.json"


@pytest.fixture(scope="module")
def documents() -> list[Document]:
    return collect_documents(packages=("einops",), stdlib_prefixes=("json/",), reference=False)


@pytest.fixture(scope="module")
def tokenizer(documents):
    """A small byte-level BPE trained on the slice: it has <|endoftext|>, as smollm2's has."""
    return train_bpe("\n\n\n".join(doc.text for doc in documents), vocab_size=400)


@pytest.fixture(scope="module")
def corpus(documents, tokenizer, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("corpus")
    return out, write_corpus(out, documents, tokenizer, seed=0, fraction=FRACTION)


def test_the_slice_has_prose_and_code_from_each_source(documents) -> None:
    kinds = {(doc.source, doc.kind) for doc in documents}
    assert kinds == {(STDLIB, ENGLISH), (STDLIB, CODE), ("einops", ENGLISH)}
    assert len({doc.id for doc in documents}) == len(documents)
    assert any(doc.id == "einops:readme" for doc in documents)


def test_generated_tables_and_the_reference_manuals_dict_are_not_code() -> None:
    documents = [doc for _, doc in stdlib_documents(("encodings/cp1252.py", "pydoc_data/", "textwrap.py"), False)]
    assert {doc.id for doc in documents if doc.kind == CODE} == {f"{STDLIB}:code:textwrap.py"}
    assert f"{STDLIB}:docs:encodings/cp1252.py" in {doc.id for doc in documents}


def test_every_document_names_its_license(documents, corpus) -> None:
    license_text = (Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt").read_text(encoding="utf-8")
    assert STDLIB_LICENSE == "PSF-2.0" and "PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2" in license_text
    einops = package_license(metadata.distribution("einops"))
    for doc in documents:
        assert doc.license == (STDLIB_LICENSE if doc.source == STDLIB else einops)
    _, manifest = corpus
    assert all(row["license"] for row in manifest["documents"])
    assert {name: source["license"] for name, source in manifest["sources"].items()} == {
        STDLIB: STDLIB_LICENSE,
        "einops": einops,
    }


def distribution(version: str = "1.0", **fields: str | list[str]) -> metadata.Distribution:
    """A distribution whose metadata holds `fields` (a list: the field repeated), as importlib.metadata reads it."""
    message = Message()
    message["Name"] = "example"
    for name, value in fields.items():
        for item in value if isinstance(value, list) else [value]:
            message[name.replace("_", "-")] = item

    class Fake(metadata.Distribution):
        def read_text(self, filename):
            return None

        def locate_file(self, path):
            return Path(path)

        @property
        def metadata(self):
            return message

        @property
        def version(self):
            return version

    return Fake()


def test_the_license_is_the_one_the_metadata_names() -> None:
    osi = ["License :: OSI Approved :: MIT License", "Programming Language :: Python"]
    assert package_license(distribution(License_Expression="BSD-3-Clause", Classifier=osi)) == "BSD-3-Clause"
    assert package_license(distribution(Classifier=osi, License="MIT")) == "MIT License"
    assert package_license(distribution(License="Apache 2.0")) == "Apache 2.0"
    with pytest.raises(ValueError, match="names no license"):
        package_license(distribution(License="Copyright (c) someone\n\nRedistribution and use ..."))
    with pytest.raises(ValueError, match="names no license"):
        package_license(distribution())


def test_no_text_is_in_two_documents() -> None:
    def doc(doc_id: str, kind: str = ENGLISH) -> Document:
        return Document(doc_id, doc_id, "example", "1.0", "MIT", kind, "")

    shared = "Return the sum of the two arrays, element by element, broadcasting as numpy does."
    own = "Return the product of the two arrays, element by element, broadcasting as numpy does."
    source = "def add(a, b):\n    return a + b\n" * 10
    kept = distinct(
        [
            ((shared,), doc("a:docs:a.py")),
            ((shared, own), doc("b:docs:b.py")),  # the copied docstring goes, its own stays
            ((shared,), doc("c:docs:c.py")),  # nothing left: the document goes
            ((source,), doc("a:code:a.py", CODE)),
            ((source,), doc("b:code:b.py", CODE)),
        ]
    )
    assert [(d.id, d.text) for d in kept] == [("a:docs:a.py", shared), ("b:docs:b.py", own), ("a:code:a.py", source)]


def test_held_out_by_module_never_by_position(documents, corpus) -> None:
    _, manifest = corpus
    rows = manifest["documents"]
    sides: dict[str, set[str]] = {}
    for row in rows:
        sides.setdefault(row["group"], set()).add(row["split"])
        assert row["split"] == ("held_out" if is_held_out(row["group"], 0, FRACTION) else "train")
    assert all(len(side) == 1 for side in sides.values())  # a module's prose and code on one side
    assert {row["split"] for row in rows} == set(SPLITS)
    docs_and_code = [g for g in sides if sum(row["group"] == g for row in rows) == 2]
    assert docs_and_code, "the slice has modules with both docstrings and source"
    # a document's side stays put when the others change: the first half alone, in reverse order
    alone = collect_documents(packages=(), stdlib_prefixes=("json/",), reference=False)[::-1]
    for doc in alone:
        assert is_held_out(doc.group, 0, FRACTION) == (
            next(r for r in rows if r["id"] == doc.id)["split"] == "held_out"
        )


def test_the_held_out_share_follows_the_fraction_and_the_seed() -> None:
    groups = [f"example:module{i}.py" for i in range(20_000)]
    share = np.mean([is_held_out(g, 0, 0.05) for g in groups])
    assert 0.045 < share < 0.055
    assert [is_held_out(g, 0, 0.5) for g in groups[:200]] != [is_held_out(g, 1, 0.5) for g in groups[:200]]


def test_the_manifest_counts_are_the_files(documents, tokenizer, corpus) -> None:
    out, manifest = corpus
    separator = tokenizer.token_to_id(SEPARATOR)
    by_id = {doc.id: doc for doc in documents}
    for split in SPLITS:
        stream = read_split(out, split)
        rows = [row for row in manifest["documents"] if row["split"] == split]
        totals = manifest["splits"][split]
        assert stream.dtype == np.uint16 and stream.ndim == 1
        assert totals["tokens"] == len(stream) == sum(row["tokens"] for row in rows)
        assert totals["documents"] == len(rows)
        assert totals["english_tokens"] + totals["code_tokens"] == totals["tokens"]
        for row in rows:  # each row's slice of the file is its document's ids and the separator
            ids = stream[row["offset"] : row["offset"] + row["tokens"]]
            assert ids[-1] == separator and separator not in ids[:-1]
            assert tokenizer.decode(ids[:-1].tolist()) == by_id[row["id"]].text
    assert json.loads((out / "manifest.json").read_text(encoding="utf-8")) == manifest
    total = summary(manifest)
    assert total["tokens"] == sum(s["english_tokens"] + s["code_tokens"] for s in manifest["sources"].values())
    assert total["documents"] == len(documents) == sum(s["documents"] for s in manifest["sources"].values())


def test_the_same_inputs_write_the_same_bytes(documents, tokenizer, corpus, tmp_path) -> None:
    out, _ = corpus
    again = collect_documents(packages=("einops",), stdlib_prefixes=("json/",), reference=False)
    assert again == documents
    write_corpus(tmp_path, again, tokenizer, seed=0, fraction=FRACTION)
    for name in ("train.npy", "held_out.npy", "manifest.json"):
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes()
    other = write_corpus(tmp_path / "seed1", again, tokenizer, seed=1, fraction=FRACTION)
    assert other["splits"] != json.loads((out / "manifest.json").read_text())["splits"]


def test_a_split_is_read_without_unpickling(corpus, tmp_path) -> None:
    out, _ = corpus
    with pytest.raises(ValueError, match="no split"):
        read_split(out, "validation")
    np.save(tmp_path / "train.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="Python objects"):
        read_split(tmp_path, "train")
    np.save(tmp_path / "train.npy", np.zeros((2, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="not one uint16 stream"):
        read_split(tmp_path, "train")


def test_harvest_reads_a_split_as_it_is(corpus) -> None:
    from types import SimpleNamespace

    from lab.analysis.activations.harvest import split_corpus

    out, _ = corpus
    model = SimpleNamespace(cfg=SimpleNamespace(n_ctx=64, d_vocab=400))
    rows, left_over = split_corpus(out / "train.npy", model, seq_len=32)
    stream = read_split(out, "train")
    assert rows.shape == (len(stream) // 32, 32) and left_over == len(stream) % 32
    assert np.array_equal(rows.reshape(-1), stream[: rows.size])


def test_the_command_refuses_bad_input_in_one_line(tmp_path, monkeypatch, capsys) -> None:
    for bad in ("1.5", "0", "x"):
        with pytest.raises(SystemExit) as exit:
            main(["corpus", "real", "--out", str(tmp_path / "c"), "--held-out", bad])
        assert exit.value.code == 2 and "--held-out" in capsys.readouterr().err
    assert main(["corpus", "real", "--out", str(tmp_path / "c"), "--seed", "3", "--record"]) == 2
    assert "--record is for the default corpus" in capsys.readouterr().err
    monkeypatch.setenv("FORMA_ZOO_DIR", str(tmp_path / "empty-zoo"))
    (tmp_path / "empty-zoo" / "smollm2").mkdir(parents=True)
    (tmp_path / "empty-zoo" / "smollm2" / "model.toml").write_text((REPO / "models/smollm2/model.toml").read_text())
    assert main(["corpus", "real", "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "forma build smollm2" in err and err.strip().count("\n") == 0
    assert not (tmp_path / "c").exists()


def test_the_help_names_every_source() -> None:
    assert all(name in " ".join(cmd_corpus.__doc__.split()) for name in PACKAGES)


def test_the_recorded_corpus_is_at_least_five_million_tokens_of_the_pinned_packages() -> None:
    """The whole corpus takes minutes to build, so CI reads its record (`forma corpus real --record`): at least
    5M tokens, held-out and train both sizeable, from the package versions installed now (a new pin makes the
    record stale: rebuild it)."""
    record = json.loads(MEASURED.read_text(encoding="utf-8"))
    assert record["tokens"] >= 5_000_000
    assert record["splits"]["held_out"]["tokens"] >= 100_000
    assert set(record["sources"]) == {STDLIB, *PACKAGES}
    for name in PACKAGES:
        assert record["sources"][name]["version"] == metadata.version(name), f"{MEASURED} is stale for {name}"
        assert record["sources"][name]["license"] == package_license(metadata.distribution(name))
    assert record["tokenizer"]["model"] == "smollm2" and record["dtype"] == "uint16"


@pytest.mark.real
def test_smollm2s_tokenizer_round_trips_the_slice(documents, tmp_path) -> None:
    """The slice in smollm2's ids: each document decodes back to its text, and its ids are the ones the model's own
    tokenizer gives (what `forma harvest` encodes a .txt corpus with), no special token added."""
    from lab.hf.folder import local_tokenizer
    from lab.model.checkpoint import read_tokenizer
    from tests.builders import smollm2_folder

    folder = smollm2_folder()
    tokenizer = read_tokenizer(folder / "tokenizer.json", folder)
    models = local_tokenizer(folder)
    manifest = write_corpus(tmp_path, documents, tokenizer, seed=0, fraction=FRACTION)
    by_id = {doc.id: doc for doc in documents}
    for split in SPLITS:
        stream = read_split(tmp_path, split)
        assert int(stream.max()) < tokenizer.get_vocab_size()
        for row in (r for r in manifest["documents"] if r["split"] == split):
            ids = stream[row["offset"] : row["offset"] + row["tokens"]].tolist()
            assert ids[-1] == tokenizer.token_to_id(SEPARATOR) == 0
            assert tokenizer.decode(ids[:-1]) == by_id[row["id"]].text
            assert models(by_id[row["id"]].text, add_special_tokens=False).input_ids == ids[:-1]


@pytest.mark.real
def test_the_command_records_a_build_and_checks_another_against_it(documents, tmp_path, monkeypatch, capsys) -> None:
    """`forma corpus real --record` (on the slice, into a copy of the repository's docs) writes the totals and the
    files' SHA-256 and rewrites docs/corpus.md's numbers; `--check` of a second build finds the same bytes, and
    names a file whose recorded digest differs (exit 1)."""
    import lab.data.real_corpus
    import lab.measured
    from tests.builders import smollm2_folder

    smollm2_folder()
    monkeypatch.setattr(lab.data.real_corpus, "collect_documents", lambda: documents)
    monkeypatch.setattr(lab.measured, "REPO", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "corpus.md").write_text((REPO / "docs" / "corpus.md").read_text(encoding="utf-8"))
    assert main(["corpus", "real", "--out", str(tmp_path / "a"), "--record"]) == 0
    record = json.loads((tmp_path / "docs" / "measured" / "corpus" / "real.json").read_text(encoding="utf-8"))
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text(encoding="utf-8"))
    assert record == {**summary(manifest), **{k: record[k] for k in ("sha256", "build_seconds", "build_cpu_seconds")}}
    assert f"-->{record['tokens']:,}<!--" in (tmp_path / "docs" / "corpus.md").read_text(encoding="utf-8")
    capsys.readouterr()
    assert main(["corpus", "real", "--out", str(tmp_path / "b"), "--check"]) == 0
    assert "the same bytes as" in capsys.readouterr().out
    record["sha256"]["train.npy"] = "0" * 64
    (tmp_path / "docs" / "measured" / "corpus" / "real.json").write_text(json.dumps(record), encoding="utf-8")
    assert main(["corpus", "real", "--out", str(tmp_path / "b"), "--check"]) == 1
    assert "differs from" in (out := capsys.readouterr().out) and "train.npy" in out and "held_out" not in out
    with pytest.raises(SystemExit) as exit:
        main(["corpus", "real", "--out", str(tmp_path / "c"), "--record", "--check"])
    assert exit.value.code == 2
