"""The standard-library English corpus and the byte-level BPE trained on it."""

import json

import pytest

from lab.data.stdlib_corpus import DOC_SEPARATOR, END_OF_TEXT, split_documents, split_text, stdlib_docstrings, train_bpe


@pytest.fixture(scope="module")
def corpus(stdlib_corpus) -> str:
    """The session's corpus (tests/conftest.py::stdlib_corpus), as stdlib_docstrings wrote it to its cache."""
    return stdlib_corpus.read_text(encoding="utf-8")


@pytest.mark.slow  # parses the standard library's docstrings a second time
def test_corpus_is_large_and_deterministic(corpus: str) -> None:
    assert len(corpus.encode("utf-8")) >= 2_000_000
    assert stdlib_docstrings() == corpus


def test_corpus_documents_are_clean_and_distinct(corpus: str) -> None:
    docs = split_documents(corpus)
    assert len(docs) == len(set(docs)) > 1000
    assert all(len(doc) >= 40 and doc == doc.strip() for doc in docs)
    assert DOC_SEPARATOR.join(docs) == corpus


def test_cache_round_trips(corpus: str, tmp_path) -> None:
    cache = tmp_path / "stdlib.txt"
    cache.write_text(corpus, encoding="utf-8")  # a cache hit must return the file as written
    assert stdlib_docstrings(cache=cache) == corpus
    with pytest.raises(RuntimeError, match="min_bytes"):
        stdlib_docstrings(min_bytes=10**9, cache=cache)


def test_split_is_by_whole_documents(corpus: str) -> None:
    train, held_out = split_text(corpus, held_out_fraction=0.05)
    train_docs, held_docs = split_documents(train), split_documents(held_out)
    assert sorted(train_docs + held_docs) == sorted(split_documents(corpus))
    assert not set(train_docs) & set(held_docs)
    assert 0.03 < len(held_out) / len(corpus) < 0.08
    assert split_text(corpus, 0.05) == (train, held_out)


def test_bpe_round_trips_and_respects_vocab_size(corpus: str, tmp_path) -> None:
    text = corpus[:200_000]
    tokenizer = train_bpe(text, vocab_size=512, path=tmp_path)
    assert tokenizer.get_vocab_size() <= 512
    assert tokenizer.token_to_id(END_OF_TEXT) is not None
    for sentence in (
        "Return the number of items in the container.",
        "  Indented, with   spaces; tabs\tand a newline\n",
        "naïve café — 3.14 ≠ π",
    ):
        assert tokenizer.decode(tokenizer.encode(sentence).ids) == sentence
    encoded = tokenizer.encode("Return a new list containing all items from the iterable.")
    assert len(encoded.ids) < len("Return a new list containing all items from the iterable.")
    saved = json.loads((tmp_path / "tokenizer.json").read_text())
    assert saved["model"]["type"] == "BPE"
    assert train_bpe(text, vocab_size=512).to_str() == tokenizer.to_str()  # deterministic
