"""lab.metrics.memory: the lookup of the last k tokens on hand-made sequences, its back-off, and the property that
makes it a fair baseline for a belief probe (a window holding the whole prefix fixes a hidden-Markov belief)."""

import numpy as np
import pytest

from lab.data.mechanisms import Mess3Source
from lab.metrics.memory import last_tokens_lookup


def test_the_lookup_is_the_mean_target_of_training_rows_with_the_same_window():
    tokens = np.array([[0, 1, 1], [1, 1, 0], [0, 1, 0]])
    targets = np.arange(9.0).reshape(3, 3, 1)  # row r's target is r
    train = np.arange(6)  # the first two sequences
    # k = 1: rows whose last token is 1 in training are 1, 2, 3, 4 (mean 2.5); token 0: rows 0, 5 (mean 2.5 too).
    one = last_tokens_lookup(tokens, targets, train, 1)[:, 0]
    assert one[6:].tolist() == [2.5, 2.5, 2.5]
    # k = 2: the third sequence's windows are (start, 0) → row 0; (0, 1) → row 1; (1, 0) → row 5.
    two = last_tokens_lookup(tokens, targets, train, 2)[:, 0]
    assert two[6:].tolist() == [0.0, 1.0, 5.0]
    assert two[:6].tolist() == [0.0, 1.0, 3.0, 3.0, 3.0, 5.0]  # rows 2 and 4 share the window (1, 1)


def test_an_unseen_window_backs_off_to_a_shorter_one_and_finally_to_the_mean():
    tokens = np.array([[0, 0], [2, 1]])
    targets = np.array([[1.0, 3.0], [7.0, 9.0]])
    predicted = last_tokens_lookup(tokens, targets, [0, 1], 2)[:, 0]
    # (start, 2) and (2, 1) never occur in training, nor do 2 or 1 alone: the training mean, 2.
    assert predicted.tolist() == [1.0, 3.0, 2.0, 2.0]


def test_a_window_as_long_as_the_sequence_gives_a_hidden_markov_belief_exactly():
    """Three tokens of Mess3 have 39 prefixes; 400 training sequences hold them all, and a prefix fixes η_t."""
    source = Mess3Source()
    tokens = source.sample(500, 3, seed=1)
    beliefs = source.beliefs(tokens)
    predicted = last_tokens_lookup(tokens, beliefs, np.arange(1200), 3)
    assert np.allclose(predicted, beliefs.reshape(-1, 3), atol=1e-12)
    short = last_tokens_lookup(tokens, beliefs, np.arange(1200), 1)
    assert np.abs(short - beliefs.reshape(-1, 3)).max() > 0.05  # one token does not fix the belief


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="positive integer"):
        last_tokens_lookup(np.zeros((2, 3), dtype=int), np.zeros((2, 3)), [0], 0)
    with pytest.raises(ValueError, match=r"\[batch, pos\]"):
        last_tokens_lookup(np.zeros(3, dtype=int), np.zeros(3), [0], 1)
    with pytest.raises(ValueError, match="row indices"):
        last_tokens_lookup(np.zeros((2, 3), dtype=int), np.zeros((2, 3)), [6], 1)
