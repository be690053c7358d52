"""Token sources whose next-token distribution is known exactly (docs/definitions.md §1).

For data drawn from p the expected loss of a model splits as E_p[−log P_θ(x)] = H(p) + KL(p ‖ P_θ).
Measuring both terms needs p(x_{t+1} | x_{≤t}) for every prefix, so the sources here are the two
classical ones where that conditional is computable:

* `MarkovSource` — an order-k Markov chain over V tokens. Each context c = (x_{t−k+1}, …, x_t) has a
  next-token distribution p(·|c) ~ Dirichlet(α·1_V). The chain over contexts (V^k states, c → c' by
  shifting in the new token) has a stationary distribution π, found by power iteration; sequences
  start in π, so every window of k tokens is π-distributed and the entropy rate is exactly

      H_rate = Σ_c π(c) · H(p(·|c))          (nats per token).

  Prefixes shorter than k are conditioned on through the marginals of π:
  p(x_{j+1} | x_{1..j}) = m_{j+1}(x_{1..j+1}) / m_j(x_{1..j}) with m_j the law of the first j tokens
  of a π-distributed context.

* `HiddenMarkovSource` — a hidden Markov model with S states, transition matrix A (rows ~
  Dirichlet(α)), emission matrix B (rows ~ Dirichlet(α)) and initial law π = the stationary law of A.
  The exact predictive distribution comes from forward filtering: with f_t(s) = p(s_t = s | x_{≤t}),

      p(x_{t+1} = · | x_{≤t}) = f_t · A · B,      f_{t+1} ∝ (f_t · A) ⊙ B[:, x_{t+1}].

  Its entropy rate has no closed form; `entropy_rate_estimate` gives a Monte-Carlo estimate with a
  standard error.

The worlds whose mechanism is known too — the Mess3 process and the induction world — live in
lab.data.mechanisms; `source_from_dict` rebuilds any of them.

The ground truth of each world's mechanism is exposed beside its law: `relevant_positions(tokens)`, a
(batch, length, length) boolean array whose row t marks the positions the true law of x_{t+1} is read
from (the last k tokens of an order-k chain; in the repeat, every position the induction world may copy
from, the successors of the current token's earlier occurrences; none where the law reads no single
position), and, for the hidden-Markov sources, `beliefs(tokens)`, the posterior over hidden states after
each token.

Shapes: token arrays are int64 `(batch, length)`; `conditionals` returns `(batch, length, V)` whose row
t is the law of the token *after* position t — the quantity a language model's logits at position t
predict. The law of the very first token is `initial_distribution()`.
"""

from typing import Any

import numpy as np
from numpy.typing import NDArray

from lab.data.checks import (
    MAX_TABLE_ENTRIES,
    as_tokens,
    check_concentration,
    check_int,
    check_kind,
    check_sample,
    check_size,
)
from lab.data.draws import (
    EntropyEstimate,
    FloatArray,
    IntArray,
    burn_in_rate,
    draw_categorical,
    entropy_nats,
    monte_carlo_rate,
    stationary_of,
)
from lab.data.mechanisms import InductionSource, Mess3Source

_POWER_TOL = 1e-14  # L1 change between power-iteration steps at which π counts as converged
_POWER_MAX_ITERS = 200_000


# --- order-k Markov chain ---------------------------------------------------------------------


class MarkovSource:
    """Order-k Markov chain over `vocab_size` tokens with Dirichlet(concentration) transitions.

    Context index: the last `order` tokens read as a base-V number, oldest token most significant.
    `transition[c]` is p(· | c); its memory is V^(order+1) floats.
    """

    kind = "markov"

    def __init__(self, vocab_size: int, order: int = 2, concentration: float = 0.5, seed: int = 0) -> None:
        self.vocab_size = check_int("MarkovSource", "vocab_size", vocab_size, minimum=2)
        self.order = check_int("MarkovSource", "order", order)
        self.concentration = check_concentration("MarkovSource", concentration)
        self.seed = check_int("MarkovSource", "seed", seed, minimum=0)
        vocab_size, order = self.vocab_size, self.order
        check_size(
            "MarkovSource",
            f"the transition table vocab_size^(order + 1) = {vocab_size}^{order + 1}",
            vocab_size ** (order + 1),
            MAX_TABLE_ENTRIES,
            "lower order or vocab_size",
        )
        self.n_contexts = vocab_size**order
        rng = np.random.default_rng(self.seed)
        self.transition: FloatArray = rng.dirichlet(np.full(vocab_size, self.concentration), size=self.n_contexts)
        self._cumulative = np.cumsum(self.transition, axis=1)
        self._pi = self._power_iterate()
        self._sample_rng = np.random.default_rng([self.seed, 1])  # used when sample(seed=None)

    # --- stationary law ---
    def _step_context_law(self, law: FloatArray) -> FloatArray:
        """One step of the context chain: π'(x_2..x_k, x) = Σ_{x_1} π(x_1..x_k) p(x | x_1..x_k)."""
        V, k = self.vocab_size, self.order
        joint = (law[:, None] * self.transition).reshape(V, V ** (k - 1), V)
        return joint.sum(axis=0).reshape(-1)

    def _power_iterate(self) -> FloatArray:
        law = np.full(self.n_contexts, 1.0 / self.n_contexts)
        for _ in range(_POWER_MAX_ITERS):
            new = self._step_context_law(law)
            new /= new.sum()
            if np.abs(new - law).sum() < _POWER_TOL:
                return new
            law = new
        raise RuntimeError(
            f"MarkovSource: power iteration for π did not converge in "
            f"{_POWER_MAX_ITERS} steps (concentration {self.concentration} too small?)"
        )

    def stationary(self) -> FloatArray:
        """π over the V^order contexts, shape (V^order,)."""
        return self._pi.copy()

    def prefix_marginal(self, j: int) -> FloatArray:
        """Law m_j of the first j ≤ order tokens of a π-distributed context, shape (V^j,)."""
        if not 0 <= j <= self.order:
            raise ValueError(f"prefix length must be in [0, {self.order}], got {j}")
        return self._pi.reshape(self.vocab_size**j, -1).sum(axis=1)

    def initial_distribution(self) -> FloatArray:
        """p(x_1): the law of the first token, shape (V,)."""
        return self.prefix_marginal(1)

    def entropy_rate(self) -> float:
        """H_rate = Σ_c π(c) H(p(·|c)) in nats per token (exact)."""
        return float(self._pi @ entropy_nats(self.transition))

    # --- sampling ---
    def sample(self, n: int, length: int, seed: int | None = None) -> IntArray:
        """`n` sequences of `length` tokens: the first `order` from π, then the chain."""
        n, length = check_sample("MarkovSource.sample", n, length, self.order)
        rng = self._sample_rng if seed is None else np.random.default_rng(seed)
        V, k = self.vocab_size, self.order
        out = np.empty((n, max(length, k)), dtype=np.int64)
        start = rng.choice(self.n_contexts, size=n, p=self._pi)
        for i in range(k):  # digits of the context index, oldest first
            out[:, i] = (start // V ** (k - 1 - i)) % V
        context = start.astype(np.int64)
        for t in range(k, length):
            out[:, t] = draw_categorical(rng, self._cumulative[context])
            context = (context % V ** (k - 1)) * V + out[:, t]
        return out[:, :length]

    # --- exact probabilities ---
    def _context_index(self, tokens: IntArray, end: int, width: int) -> IntArray:
        """Base-V index of tokens[:, end−width+1 .. end]."""
        index = np.zeros(tokens.shape[0], dtype=np.int64)
        for i in range(end - width + 1, end + 1):
            index = index * self.vocab_size + tokens[:, i]
        return index

    def conditionals(self, tokens: Any) -> FloatArray:
        """p(x_{t+1} = · | x_{≤t}) for every position t, shape (batch, length, V)."""
        tokens = as_tokens(tokens, self.vocab_size)
        batch, length = tokens.shape
        V, k = self.vocab_size, self.order
        out = np.empty((batch, length, V))
        for t in range(min(length, k - 1)):  # partial context: condition through π's marginals
            joint = self.prefix_marginal(t + 2).reshape(V ** (t + 1), V)
            rows = joint[self._context_index(tokens, t, t + 1)]
            out[:, t] = rows / rows.sum(axis=1, keepdims=True)
        for t in range(k - 1, length):
            out[:, t] = self.transition[self._context_index(tokens, t, k)]
        return out

    def relevant_positions(self, tokens: Any) -> NDArray[np.bool_]:
        """(batch, length, length): row t marks the positions p(x_{t+1} | x_{≤t}) reads, the last `order` tokens
        t − k + 1 … t (every position ≤ t while the prefix is shorter than k)."""
        tokens = as_tokens(tokens, self.vocab_size)
        length = tokens.shape[1]
        t, i = np.arange(length)[:, None], np.arange(length)[None, :]
        window = (i <= t) & (i > t - self.order)
        return np.broadcast_to(window, (tokens.shape[0], length, length)).copy()

    def log_prob(self, tokens: Any) -> FloatArray:
        """log p(x_1..x_L) in nats per sequence, shape (batch,), first token under π's marginal."""
        tokens = as_tokens(tokens, self.vocab_size)
        first = np.log(self.initial_distribution()[tokens[:, 0]])
        if tokens.shape[1] == 1:
            return first
        cond = self.conditionals(tokens[:, :-1])
        picked = np.take_along_axis(cond, tokens[:, 1:, None], axis=2)[..., 0]
        return first + np.log(picked).sum(axis=1)

    def entropy_rate_estimate(self, n: int, length: int, seed: int = 0) -> EntropyEstimate:
        """Monte-Carlo check of `entropy_rate`: mean −log p(x_{t+1}|x_{≤t}) over t ≥ order − 1.

        Those positions have a full context drawn from π, so the estimate is unbiased.
        """
        tokens = self.sample(n, length, seed=seed)
        return monte_carlo_rate(self.conditionals(tokens), tokens, burn_in=self.order - 1)

    # --- provenance ---
    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "vocab_size": self.vocab_size,
            "order": self.order,
            "concentration": self.concentration,
            "seed": self.seed,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "MarkovSource":
        known = {"vocab_size", "order", "concentration", "seed"}
        check_kind("MarkovSource", data, cls.kind, known)
        return cls(**{key: value for key, value in data.items() if key != "kind"})

    def __repr__(self) -> str:
        return (
            f"MarkovSource(vocab_size={self.vocab_size}, order={self.order}, "
            f"concentration={self.concentration}, seed={self.seed})"
        )


# --- hidden Markov model ----------------------------------------------------------------------


class HiddenMarkovSource:
    """HMM with `n_states` hidden states emitting `vocab_size` tokens; A, B rows ~ Dirichlet.

    `transition` is A (S, S), `emission` is B (S, V), `initial` is π = stationary law of A.
    """

    kind = "hmm"

    def __init__(self, n_states: int, vocab_size: int, concentration: float = 0.5, seed: int = 0) -> None:
        self.n_states = check_int("HiddenMarkovSource", "n_states", n_states)
        self.vocab_size = check_int("HiddenMarkovSource", "vocab_size", vocab_size, minimum=2)
        self.concentration = check_concentration("HiddenMarkovSource", concentration)
        self.seed = check_int("HiddenMarkovSource", "seed", seed, minimum=0)
        n_states, vocab_size = self.n_states, self.vocab_size
        check_size(
            "HiddenMarkovSource",
            f"the tables n_states × (n_states + vocab_size) = {n_states} × {n_states + vocab_size}",
            n_states * (n_states + vocab_size),
            MAX_TABLE_ENTRIES,
            "lower n_states or vocab_size",
        )
        rng = np.random.default_rng(self.seed)
        alpha = self.concentration
        self.transition: FloatArray = rng.dirichlet(np.full(n_states, alpha), size=n_states)
        self.emission: FloatArray = rng.dirichlet(np.full(vocab_size, alpha), size=n_states)
        self.initial: FloatArray = stationary_of(self.transition)
        self._sample_rng = np.random.default_rng([self.seed, 1])

    def stationary(self) -> FloatArray:
        """π over hidden states, shape (S,)."""
        return self.initial.copy()

    def initial_distribution(self) -> FloatArray:
        """p(x_1) = π B, shape (V,)."""
        return self.initial @ self.emission

    def sample(self, n: int, length: int, seed: int | None = None) -> IntArray:
        """`n` token sequences of `length`, hidden chain started in π."""
        n, length = check_sample("HiddenMarkovSource.sample", n, length)
        rng = self._sample_rng if seed is None else np.random.default_rng(seed)
        cum_a = np.cumsum(self.transition, axis=1)
        cum_b = np.cumsum(self.emission, axis=1)
        out = np.empty((n, length), dtype=np.int64)
        state = rng.choice(self.n_states, size=n, p=self.initial)
        for t in range(length):
            out[:, t] = draw_categorical(rng, cum_b[state])
            state = draw_categorical(rng, cum_a[state])
        return out

    def _filter(self, tokens: IntArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Forward filtering: predictive laws (batch, length, V), log p(x_1) (batch,) and the filtered beliefs
        f_t = p(s_t | x_{≤t}) (batch, length, S)."""
        batch, length = tokens.shape
        out = np.empty((batch, length, self.vocab_size))
        beliefs = np.empty((batch, length, self.n_states))
        first_law = self.initial_distribution()
        belief = self.initial[None, :] * self.emission[:, tokens[:, 0]].T  # p(s_1, x_1)
        belief /= belief.sum(axis=1, keepdims=True)  # f_1 = p(s_1 | x_1)
        for t in range(length):
            beliefs[:, t] = belief
            prior = belief @ self.transition  # p(s_{t+1} | x_{≤t})
            out[:, t] = prior @ self.emission
            if t + 1 < length:
                belief = prior * self.emission[:, tokens[:, t + 1]].T
                belief /= belief.sum(axis=1, keepdims=True)
        return out, np.log(first_law[tokens[:, 0]]), beliefs

    def conditionals(self, tokens: Any) -> FloatArray:
        """p(x_{t+1} = · | x_{≤t}) by forward filtering, shape (batch, length, V)."""
        return self._filter(as_tokens(tokens, self.vocab_size))[0]

    def beliefs(self, tokens: Any) -> FloatArray:
        """The belief state f_t = p(s_t = · | x_{≤t}) after each token, shape (batch, length, S): the posterior
        over the hidden state that emitted x_t, from which p(x_{t+1} | x_{≤t}) = f_t A B."""
        return self._filter(as_tokens(tokens, self.vocab_size))[2]

    def log_prob(self, tokens: Any) -> FloatArray:
        """log p(x_1..x_L) in nats per sequence, shape (batch,)."""
        tokens = as_tokens(tokens, self.vocab_size)
        cond, first, _ = self._filter(tokens)
        picked = np.take_along_axis(cond[:, :-1], tokens[:, 1:, None], axis=2)[..., 0]
        return first + np.log(picked).sum(axis=1)

    def entropy_rate_estimate(self, n: int, length: int, seed: int = 0, burn_in: int | None = None) -> EntropyEstimate:
        """Monte-Carlo estimate of the entropy rate in nats per token, with its standard error, over positions
        t ≥ burn_in (default length // 2): `lab.data.draws.burn_in_rate`."""
        return burn_in_rate(self, n, length, seed, burn_in)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "n_states": self.n_states,
            "vocab_size": self.vocab_size,
            "concentration": self.concentration,
            "seed": self.seed,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "HiddenMarkovSource":
        known = {"n_states", "vocab_size", "concentration", "seed"}
        check_kind("HiddenMarkovSource", data, cls.kind, known)
        return cls(**{key: value for key, value in data.items() if key != "kind"})

    def __repr__(self) -> str:
        return (
            f"HiddenMarkovSource(n_states={self.n_states}, vocab_size={self.vocab_size}, "
            f"concentration={self.concentration}, seed={self.seed})"
        )


Source = MarkovSource | HiddenMarkovSource | Mess3Source | InductionSource


def source_from_dict(data: dict[str, Any]) -> Source:
    """Rebuild a source from `to_dict()` output, dispatching on `kind`."""
    kinds: dict[str, type[Source]] = {
        cls.kind: cls for cls in (MarkovSource, HiddenMarkovSource, Mess3Source, InductionSource)
    }
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in kinds:
        raise ValueError(f"unknown source kind {kind!r}; known kinds are {sorted(kinds)}")
    return kinds[kind].from_dict(data)
