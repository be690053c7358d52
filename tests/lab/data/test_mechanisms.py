"""The worlds whose mechanism is known (lab.data.mechanisms): the Mess3 process against its published matrices and
brute-force enumeration over hidden paths, the induction world's law summed over every sequence, and both worlds'
samples against their laws and their mechanisms."""

import itertools
import math

import numpy as np
import pytest

from lab.data.mechanisms import InductionSource, Mess3Source
from lab.data.sources import source_from_dict
from tests.builders import chi2_pvalue

# --- Mess3 ------------------------------------------------------------------------------------


def test_mess3_matrices_are_shai_et_al_s() -> None:
    source = Mess3Source()  # x = 0.05, α = 0.85: T^(A)'s first row is αy, βx, βx = 0.765, 0.00375, 0.00375
    np.testing.assert_allclose(source.matrices[0, 0], [0.765, 0.00375, 0.00375])
    np.testing.assert_allclose(source.matrices[1, 1], [0.00375, 0.765, 0.00375])
    np.testing.assert_allclose(source.matrices[2, 0], [0.0675, 0.00375, 0.0425])
    np.testing.assert_allclose(source.matrices.sum(axis=(0, 2)), 1.0, atol=1e-15)
    np.testing.assert_allclose(source.stationary(), 1 / 3, atol=1e-12)


def _mess3_paths(source: Mess3Source, tokens: tuple[int, ...]) -> np.ndarray:
    """Σ over hidden paths of π(s_0) Π_t T^(x_t)[s_{t−1}, s_t], by final state: [S]."""
    out = np.zeros(3)
    for path in itertools.product(range(3), repeat=len(tokens) + 1):
        prob = source.initial[path[0]]
        for t, x in enumerate(tokens):
            prob *= source.matrices[x, path[t], path[t + 1]]
        out[path[-1]] += prob
    return out


def test_mess3_conditionals_and_beliefs_match_brute_force() -> None:
    source = Mess3Source(x=0.1, alpha=0.7)
    tokens = (0, 2, 2, 1)
    cond, beliefs = source.conditionals(np.array([tokens]))[0], source.beliefs(np.array([tokens]))[0]
    for t in range(len(tokens)):
        prefix = tokens[: t + 1]
        joint = _mess3_paths(source, prefix)
        np.testing.assert_allclose(beliefs[t], joint / joint.sum(), rtol=1e-12)
        expected = [_mess3_paths(source, prefix + (x,)).sum() for x in range(3)]
        np.testing.assert_allclose(cond[t], np.array(expected) / sum(expected), rtol=1e-12)
    assert source.log_prob(np.array([tokens]))[0] == pytest.approx(math.log(_mess3_paths(source, tokens).sum()))


def test_mess3_samples_fit_conditionals_chi2() -> None:
    source = Mess3Source()
    tokens = source.sample(40_000, 3, seed=13)
    prefixes = tokens[:, 0] * 3 + tokens[:, 1]
    prefix = int(np.bincount(prefixes).argmax())
    rows = tokens[prefixes == prefix]
    assert chi2_pvalue(np.bincount(rows[:, 2], minlength=3), source.conditionals(rows[:1, :2])[0, 1]) > 1e-3
    assert source.sample(5, 4, seed=1).tolist() == source.sample(5, 4, seed=1).tolist()


def test_mess3_round_trips_and_rejects_bad_arguments() -> None:
    source = Mess3Source(x=0.1, alpha=0.6, seed=2)
    rebuilt = source_from_dict(source.to_dict())
    np.testing.assert_array_equal(rebuilt.matrices, source.matrices)
    with pytest.raises(ValueError, match="x must be a number in"):
        Mess3Source(x=0.5)
    with pytest.raises(ValueError, match="alpha must be a number in"):
        Mess3Source(alpha=1.0)


# --- the induction world ----------------------------------------------------------------------


def test_induction_law_sums_to_one_over_every_sequence() -> None:
    """Over every sequence of 5 tokens from 4 symbols that the world can draw, exp(log_prob) sums to 1; every
    other sequence is refused by name."""
    source = InductionSource(vocab_size=4, min_period=2, max_period=3)
    total, refused = 0.0, 0
    for sequence in itertools.product(range(4), repeat=5):
        try:
            total += math.exp(source.log_prob(np.array([sequence]))[0])
        except ValueError as err:
            assert "is not a draw of this world" in str(err)
            refused += 1
    assert total == pytest.approx(1.0, abs=1e-12)
    assert refused > 0


def test_induction_samples_fit_the_law_and_the_mechanism() -> None:
    source = InductionSource(vocab_size=12, min_period=3, max_period=6, seed=1)
    tokens = source.sample(20_000, 10, seed=4)
    cond = source.conditionals(tokens)
    np.testing.assert_allclose(cond.sum(axis=-1), 1.0, atol=1e-12)
    # Before any repeat, after 3 distinct tokens: the repeat starts with hazard 1/4 at x_0 or x_1 (never at the
    # last token), else an unseen token comes.
    prefix = (tokens[:, 0] == 0) & (tokens[:, 1] == 1) & (tokens[:, 2] == 2)
    law = cond[np.flatnonzero(prefix)[0], 2]
    assert law[0] == law[1] == pytest.approx(1 / 8) and law[2] == 0 and law[3] == pytest.approx(3 / 4 / 9)
    assert chi2_pvalue(np.bincount(tokens[prefix, 3], minlength=12), law) > 1e-3
    # Inside the repeat every relevant position holds the next token (the most recent, t + 1 − d, among them),
    # and the law is a point mass on it.
    relevant = source.relevant_positions(tokens)
    copies = source.copy_positions(tokens)
    rows, t = np.nonzero(copies[:, :-1])
    assert len(rows) > 10_000
    assert (relevant[rows, t].sum(axis=1) >= 1).all() and (relevant[rows, t].sum(axis=1) > 1).any()
    hits, where = np.nonzero(relevant[rows, t])
    np.testing.assert_array_equal(tokens[rows[hits], where], tokens[rows[hits], t[hits] + 1])
    _, d = source.offsets(tokens)
    assert relevant[rows, t, t + 1 - d[rows]].all()
    assert (cond[rows, t, tokens[rows, t + 1]] == 1.0).all()
    assert not relevant[~copies].any()  # before the repeat the law reads no single position
    m, d = source.offsets(tokens)
    assert len(set(d.tolist())) == 5 and (d < m).any()  # every offset 2 … 6 comes, and starts after x_0


def test_induction_round_trips_and_rejects_bad_arguments() -> None:
    source = InductionSource(vocab_size=8, min_period=2, max_period=5, seed=3)
    assert source_from_dict(source.to_dict()).to_dict() == source.to_dict()
    with pytest.raises(ValueError, match="max_period ≤ vocab_size"):
        InductionSource(vocab_size=4, min_period=2, max_period=5)
    with pytest.raises(ValueError, match="row 0 is not a draw of this world"):
        source.conditionals(np.array([[1, 2, 3, 3]]))  # repeats the token just before


def test_induction_truth_marks_every_lawful_copy_source_by_hand() -> None:
    """Prompts whose answer is known by hand: span x_0 … x_4 = 0 1 2 3 4 repeated from s = 0 (m = 5, d = 5), then
    from s = 2 (m = 5, d = 3). Row t marks every j + 1 with j < t and x_j = x_t, the successors of x_t's earlier
    occurrences, each holding the token that comes next."""
    source = InductionSource(vocab_size=8, min_period=3, max_period=5)
    tokens = np.array([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1], [0, 1, 2, 3, 4, 2, 3, 4, 2, 3, 4, 2]])
    relevant = source.relevant_positions(tokens)
    marked = {(b, t): np.flatnonzero(relevant[b, t]).tolist() for b in range(2) for t in range(12)}
    assert all(marked[b, t] == [] for b in range(2) for t in range(5))  # before the repeat: no single position
    # Row 0: x_9 = 4 came once before (at 4), so 5 is marked; position 0 holds the next token too (0) but follows
    # no occurrence of 4, so no induction rule reaches it and it is not marked.
    assert marked[0, 5] == [1] and marked[0, 9] == [5] and marked[0, 10] == [1, 6] and marked[0, 11] == [2, 7]
    assert marked[1, 5] == [3] and marked[1, 7] == [5] and marked[1, 8] == [3, 6] and marked[1, 11] == [3, 6, 9]
    assert marked[1, 10] == [5, 8]  # x_10 = 4 at 4 and 7: successors 5 and 8, both the token 2
    for b in range(2):
        for t in range(11):
            assert all(tokens[b, j] == tokens[b, t + 1] for j in marked[b, t])
    # Both last predictions have several lawful sources: the most recent alone would be one truth among several.
    assert [len(marked[b, 11]) for b in range(2)] == [2, 3]


def test_unique_source_prompts_have_exactly_one_lawful_source_at_their_last_position() -> None:
    source = InductionSource(vocab_size=16, min_period=3, max_period=7, seed=0)
    tokens = source.sample_unique_source(200, 12, seed=5)
    assert tokens.shape == (200, 12)
    last = source.relevant_positions(tokens)[:, -1]
    assert (last.sum(axis=1) == 1).all()
    assert (tokens[np.arange(200), last.argmax(axis=1)] == source.conditionals(tokens)[:, -1].argmax(axis=1)).all()
    m, d = source.offsets(tokens)
    assert len(set(zip(m.tolist(), d.tolist()))) == 4  # (6, 6), (7, 5), (7, 6), (7, 7): every pair the length allows
    # The world's own draws mostly hold the token to copy at several positions.
    several = source.relevant_positions(source.sample(2000, 12, seed=6))[:, -1].sum(axis=1) > 1
    assert several.mean() > 0.5
    np.testing.assert_array_equal(tokens, source.sample_unique_source(200, 12, seed=5))  # seeded
    with pytest.raises(ValueError, match="no draw of this world has one copy source"):
        source.sample_unique_source(4, 16)
