"""The real-model track's biography corpus (experiments.hallucination.biographies): its monofact rate is the one
designed, counted from the training sentences themselves; held-out persons never appear in training; names are
invented (no word of the real question set), seeded, and distinct; the world's unseen mass is MF."""

from collections import Counter

import numpy as np
import pytest

from experiments.hallucination.biographies import (
    CITIES,
    build_corpus,
    design,
    invented_names,
    question_words,
)
from lab.metrics.hallucination import monofact_rate


@pytest.mark.parametrize("rate", [0.1, 0.3, 0.5, 0.8])
def test_the_monofact_rate_counted_from_the_sentences_is_the_designed_one(rate):
    corpus = build_corpus(120, rate, 4, 20, seed=0)
    sentences = corpus.training_sentences()
    assert len(sentences) == 120
    counts = np.array(list(Counter(sentences).values()))
    n_single, _ = design(120, rate, 4)
    assert monofact_rate(counts) == pytest.approx(n_single / 120) == pytest.approx(corpus.monofact_rate)
    assert abs(corpus.monofact_rate - rate) <= 4 / 120 / 2 + 1e-12  # the nearest that `repeats` allows


def test_held_out_persons_never_appear_in_training_and_are_the_same_at_every_rate():
    low, high = build_corpus(96, 0.2, 4, 24, seed=3), build_corpus(96, 0.8, 4, 24, seed=3)
    for corpus in (low, high):
        text = " ".join(corpus.training_sentences())
        heldout = [n for n, k in zip(corpus.names, corpus.kind) if k == "heldout"]
        assert len(heldout) == 24 and not any(name in text for name in heldout)
    assert [n for n, k in zip(low.names, low.kind) if k == "heldout"] == [
        n for n, k in zip(high.names, high.kind) if k == "heldout"
    ]


def test_the_world_puts_the_monofact_rate_on_the_unseen_persons():
    corpus = build_corpus(96, 0.5, 4, 24, seed=0)
    p = corpus.p
    assert p.sum() == pytest.approx(1.0)
    assert p[corpus.kind == "heldout"].sum() == pytest.approx(corpus.monofact_rate)


def test_names_are_invented_seeded_distinct_and_no_word_of_the_question_set():
    words = question_words()
    assert {"paris", "france"} <= words  # the set it is checked against is the real one
    names = invented_names(500, seed=0, forbidden=words)
    assert len(set(names)) == 500 and names == invented_names(500, seed=0, forbidden=words)
    assert names != invented_names(500, seed=1, forbidden=words)
    assert not {w.lower() for n in names for w in n.split()} & (words | {c.lower() for c in CITIES})


def test_a_sentence_renders_the_fact_in_english():
    corpus = build_corpus(12, 0.5, 2, 2, seed=0)
    assert corpus.sentence(0) == f"{corpus.names[0]} was born in {CITIES[corpus.cities[0]]}."


@pytest.mark.parametrize("args", [(100, 0.0, 4), (100, 1.0, 4), (100, 0.5, 1)])
def test_an_impossible_design_is_refused(args):
    with pytest.raises(ValueError):
        design(*args)
