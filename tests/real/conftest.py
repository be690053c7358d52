"""Fixtures of the real-model tests: a private zoo holding the checkout's smollm2, and a slice of the real corpus in
its token ids (transcoders and a feature's card read them)."""

import os
import shutil

import pytest

from lab.data.real_corpus import collect_documents, write_corpus
from lab.model.checkpoint import TOKENIZER_FILE, read_tokenizer
from tests.builders import smollm2_folder


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """A private zoo whose smollm2 is the checkout's, its files hard-linked (copied where links cannot be made)."""
    source = smollm2_folder()
    folder = tmp_path_factory.mktemp("zoo") / "models" / "smollm2"
    folder.mkdir(parents=True)
    for path in source.iterdir():
        if path.is_file() and not path.name.startswith("."):  # (a build's files are links into its .current/)
            try:
                os.link(path.resolve(), folder / path.name)
            except OSError:
                shutil.copy(path.resolve(), folder / path.name)
    return folder


@pytest.fixture(scope="module")
def corpus(zoo, tmp_path_factory):
    """A slice of the real corpus, written as `forma corpus real` writes it, in smollm2's token ids."""
    documents = collect_documents(packages=("einops",), stdlib_prefixes=("json/",), reference=False)
    out = tmp_path_factory.mktemp("corpus")
    write_corpus(out, documents, read_tokenizer(zoo / TOKENIZER_FILE, zoo), seed=0, fraction=0.3)
    return out
