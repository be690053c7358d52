"""Sources with known conditionals: normalisation, χ² fit of samples, entropy rate, brute force."""

import itertools
import math

import numpy as np
import pytest

from lab.data.sources import HiddenMarkovSource, MarkovSource, source_from_dict
from tests.builders import chi2_pvalue, chi2_sf

# --- χ² survival function (scipy is not a dependency) -----------------------------------------


@pytest.mark.parametrize(
    "statistic,dof,expected",
    [
        (3.841458820694124, 1, 0.05),
        (9.487729036781154, 4, 0.05),
        (2.0, 2, math.exp(-1.0)),
        (23.209251158954356, 10, 0.01),
        (1.0, 3, 0.8012519569012008),
    ],
)
def test_chi2_sf_matches_tabulated_values(statistic: float, dof: int, expected: float) -> None:
    assert chi2_sf(statistic, dof) == pytest.approx(expected, rel=1e-9)


# --- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def markov() -> MarkovSource:
    return MarkovSource(vocab_size=5, order=2, concentration=0.5, seed=3)


@pytest.fixture(scope="module")
def hmm() -> HiddenMarkovSource:
    return HiddenMarkovSource(n_states=3, vocab_size=6, concentration=0.5, seed=4)


# --- Markov chain -----------------------------------------------------------------------------


def test_markov_conditionals_are_distributions(markov: MarkovSource) -> None:
    tokens = markov.sample(50, 12, seed=0)
    cond = markov.conditionals(tokens)
    assert cond.shape == (50, 12, 5)
    assert np.all(cond >= 0)
    np.testing.assert_allclose(cond.sum(axis=-1), 1.0, atol=1e-12)


def test_markov_stationary_is_a_fixed_point(markov: MarkovSource) -> None:
    pi = markov.stationary()
    V = markov.vocab_size
    dense = np.zeros((V**2, V**2))  # context → context transition matrix, built by hand
    for c in range(V**2):
        for x in range(V):
            dense[c, (c % V) * V + x] += markov.transition[c, x]
    np.testing.assert_allclose(pi @ dense, pi, atol=1e-13)
    assert pi.sum() == pytest.approx(1.0)


def test_markov_partial_context_uses_stationary_marginal(markov: MarkovSource) -> None:
    # p(x_2 | x_1) must equal π(x_1, x_2) / Σ_y π(x_1, y) for an order-2 chain.
    V = markov.vocab_size
    pi = markov.stationary().reshape(V, V)
    tokens = np.arange(V)[:, None]
    cond = markov.conditionals(tokens)[:, 0]
    np.testing.assert_allclose(cond, pi / pi.sum(axis=1, keepdims=True), atol=1e-14)


def test_markov_samples_fit_conditionals_chi2(markov: MarkovSource) -> None:
    # Position 2 given the context (x_0, x_1) = c: draws are i.i.d. from p(·|c) across sequences.
    tokens = markov.sample(40_000, 3, seed=11)
    V = markov.vocab_size
    contexts = tokens[:, 0] * V + tokens[:, 1]
    context = int(np.bincount(contexts, minlength=V * V).argmax())
    nexts = tokens[contexts == context, 2]
    counts = np.bincount(nexts, minlength=V)
    assert counts.sum() > 1000
    assert chi2_pvalue(counts, markov.transition[context]) > 1e-3


def test_markov_first_tokens_fit_stationary_chi2(markov: MarkovSource) -> None:
    tokens = markov.sample(20_000, 2, seed=12)
    contexts = tokens[:, 0] * markov.vocab_size + tokens[:, 1]
    counts = np.bincount(contexts, minlength=markov.n_contexts)
    assert chi2_pvalue(counts, markov.stationary()) > 1e-3


def test_markov_entropy_rate_matches_monte_carlo(markov: MarkovSource) -> None:
    tokens = markov.sample(2000, 128, seed=5)
    cond = markov.conditionals(tokens)
    nll = -np.log(np.take_along_axis(cond[:, :-1], tokens[:, 1:, None], axis=2)[..., 0])
    per_sequence = nll[:, markov.order - 1 :].mean(axis=1)  # full contexts only: π-distributed
    mean = per_sequence.mean()
    se = per_sequence.std(ddof=1) / math.sqrt(len(per_sequence))
    assert abs(mean - markov.entropy_rate()) < 3 * se
    value, standard_error = markov.entropy_rate_estimate(2000, 128, seed=5)
    assert value == pytest.approx(mean) and standard_error == pytest.approx(se)


def test_markov_log_prob_is_sum_of_log_conditionals(markov: MarkovSource) -> None:
    tokens = markov.sample(20, 10, seed=6)
    cond = markov.conditionals(tokens)
    picked = np.take_along_axis(cond[:, :-1], tokens[:, 1:, None], axis=2)[..., 0]
    expected = np.log(markov.initial_distribution()[tokens[:, 0]]) + np.log(picked).sum(axis=1)
    np.testing.assert_allclose(markov.log_prob(tokens), expected, rtol=1e-12)


@pytest.mark.parametrize("order,length", [(1, 3), (2, 4), (3, 2), (3, 5)])
def test_markov_log_prob_normalises_over_all_sequences(order: int, length: int) -> None:
    # Covers prefixes shorter than the order, conditioned through π's marginals.
    source = MarkovSource(vocab_size=3, order=order, seed=1)
    every = np.array(list(itertools.product(range(3), repeat=length)))
    assert np.exp(source.log_prob(every)).sum() == pytest.approx(1.0, abs=1e-12)
    # Consistency: the law of the first `length` tokens is the marginal of the law of `length + 1`.
    longer = np.array(list(itertools.product(range(3), repeat=length + 1)))
    marginal = np.exp(source.log_prob(longer)).reshape(-1, 3).sum(axis=1)
    np.testing.assert_allclose(marginal, np.exp(source.log_prob(every)), atol=1e-14)


def test_markov_sampling_is_seeded(markov: MarkovSource) -> None:
    np.testing.assert_array_equal(markov.sample(4, 9, seed=1), markov.sample(4, 9, seed=1))
    assert markov.sample(3, 1, seed=0).shape == (3, 1)
    assert markov.sample(3, 1, seed=0).dtype == np.int64


def test_markov_round_trips_through_dict(markov: MarkovSource) -> None:
    rebuilt = source_from_dict(markov.to_dict())
    assert isinstance(rebuilt, MarkovSource)
    np.testing.assert_array_equal(rebuilt.transition, markov.transition)
    with pytest.raises(ValueError, match="unknown keys"):
        MarkovSource.from_dict({**markov.to_dict(), "temperature": 1.0})


def test_markov_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="concentration"):
        MarkovSource(4, concentration=0.0)
    with pytest.raises(ValueError, match="order"):
        MarkovSource(4, order=0)
    with pytest.raises(ValueError, match="tokens"):
        MarkovSource(4).conditionals(np.array([[0, 4]]))


# --- hidden Markov model ----------------------------------------------------------------------


def test_hmm_conditionals_are_distributions(hmm: HiddenMarkovSource) -> None:
    cond = hmm.conditionals(hmm.sample(30, 15, seed=0))
    assert cond.shape == (30, 15, 6)
    np.testing.assert_allclose(cond.sum(axis=-1), 1.0, atol=1e-12)


def _brute_force_joint(source: HiddenMarkovSource, tokens: tuple[int, ...]) -> float:
    """p(x_1..x_L) = Σ over every hidden path of π(s_1) B(s_1,x_1) Π A(s_{t−1},s_t) B(s_t,x_t)."""
    total = 0.0
    for path in itertools.product(range(source.n_states), repeat=len(tokens)):
        prob = source.initial[path[0]] * source.emission[path[0], tokens[0]]
        for t in range(1, len(tokens)):
            prob *= source.transition[path[t - 1], path[t]] * source.emission[path[t], tokens[t]]
        total += prob
    return total


def test_hmm_conditionals_match_brute_force_enumeration() -> None:
    source = HiddenMarkovSource(n_states=2, vocab_size=3, seed=7)
    sequences = list(itertools.product(range(3), repeat=4))
    cond = source.conditionals(np.array(sequences))
    for i, seq in enumerate(sequences):
        for t in range(3):  # p(x_{t+2} | x_{≤t+1}) = p(x_{≤t+2}) / p(x_{≤t+1})
            prefix = seq[: t + 1]
            expected = [_brute_force_joint(source, prefix + (x,)) for x in range(3)]
            np.testing.assert_allclose(cond[i, t], np.array(expected) / sum(expected), rtol=1e-12)
        assert source.log_prob(np.array([seq]))[0] == pytest.approx(
            math.log(_brute_force_joint(source, seq)), rel=1e-12
        )


def test_hmm_samples_fit_conditionals_chi2(hmm: HiddenMarkovSource) -> None:
    tokens = hmm.sample(40_000, 3, seed=13)
    prefixes = tokens[:, 0] * hmm.vocab_size + tokens[:, 1]
    prefix = int(np.bincount(prefixes).argmax())
    rows = tokens[prefixes == prefix]
    counts = np.bincount(rows[:, 2], minlength=hmm.vocab_size)
    assert counts.sum() > 1000
    assert chi2_pvalue(counts, hmm.conditionals(rows[:1, :2])[0, 1]) > 1e-3


def test_hmm_initial_is_stationary(hmm: HiddenMarkovSource) -> None:
    np.testing.assert_allclose(hmm.stationary() @ hmm.transition, hmm.stationary(), atol=1e-13)


def test_hmm_entropy_rate_estimate_is_sane(hmm: HiddenMarkovSource) -> None:
    value, se = hmm.entropy_rate_estimate(500, 64, seed=2)
    assert 0 < value < math.log(hmm.vocab_size)
    assert 0 < se < 0.05
    # The rate cannot exceed the conditional entropy given only the hidden-state prior, H(πB).
    first = hmm.initial_distribution()
    assert value < -(first * np.log(first)).sum() + 3 * se


def test_hmm_round_trips_through_dict(hmm: HiddenMarkovSource) -> None:
    rebuilt = source_from_dict(hmm.to_dict())
    assert isinstance(rebuilt, HiddenMarkovSource)
    np.testing.assert_array_equal(rebuilt.emission, hmm.emission)
    with pytest.raises(ValueError, match="kind"):
        HiddenMarkovSource.from_dict({**hmm.to_dict(), "kind": "markov"})


def test_hmm_beliefs_are_the_brute_force_posterior() -> None:
    source = HiddenMarkovSource(n_states=2, vocab_size=3, seed=7)
    tokens = (2, 0, 1, 1)
    beliefs = source.beliefs(np.array([tokens]))[0]
    for t in range(len(tokens)):  # p(s_t | x_≤t) ∝ Σ over paths ending in s_t
        weights = np.zeros(2)
        for path in itertools.product(range(2), repeat=t + 1):
            prob = source.initial[path[0]] * source.emission[path[0], tokens[0]]
            for k in range(1, t + 1):
                prob *= source.transition[path[k - 1], path[k]] * source.emission[path[k], tokens[k]]
            weights[path[-1]] += prob
        np.testing.assert_allclose(beliefs[t], weights / weights.sum(), rtol=1e-12)


def test_markov_relevant_positions_are_exactly_those_the_law_reads(markov: MarkovSource) -> None:
    tokens = markov.sample(20, 7, seed=5)
    relevant = markov.relevant_positions(tokens)
    last = markov.conditionals(tokens)[:, -1]
    np.testing.assert_array_equal(relevant[0, -1], [False] * 5 + [True] * 2)
    for i in range(7):
        changed = tokens.copy()
        changed[:, i] = (changed[:, i] + 1) % markov.vocab_size
        moved = np.abs(markov.conditionals(changed)[:, -1] - last).max(axis=1) > 1e-12
        assert moved.any() if relevant[0, -1, i] else not moved.any()
