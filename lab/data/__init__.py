"""Data with known ground truth: sources with exact conditionals, an arbitrary-fact world, and real
English from the Python standard library (see docs/definitions.md §1–§2)."""

from lab.data.draws import EntropyEstimate
from lab.data.facts import Fact, FactWorld, FactWorldConfig, Person
from lab.data.sources import HiddenMarkovSource, MarkovSource, source_from_dict
from lab.data.stdlib_corpus import split_text, stdlib_docstrings, train_bpe

__all__ = [
    "EntropyEstimate",
    "Fact",
    "FactWorld",
    "FactWorldConfig",
    "HiddenMarkovSource",
    "MarkovSource",
    "Person",
    "source_from_dict",
    "split_text",
    "stdlib_docstrings",
    "train_bpe",
]
