"""Token sources whose next-token distribution is known exactly (SCIENCE.md §1).

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

* `Mess3Source` — the Mess3 process (Marzen & Crutchfield 2017), the world of Shai et al. 2024
  ("Transformers represent belief state geometry in their residual stream", NeurIPS 2024): three hidden
  states, three tokens, an edge-emitting HMM whose token-labelled matrices T^(a)_ij = P(a, s' = j | s = i)
  make the belief state η_t = P(s_{t+1} | x_{≤t}) (η_{t} ∝ η_{t−1} T^(x_t), η_0 = π) wander a fractal
  in the 2-simplex. η_t is the sufficient statistic: p(x_{t+1} = a | x_{≤t}) = η_t T^(a) 1.

* `InductionSource` — random tokens with a repeated segment: the first m tokens are distinct (drawn
  without replacement), m uniform in [min_period, max_period], and from then on the segment repeats,
  x_t = x_{t−m}. Inside the repeat the next token is the token after the previous occurrence of the
  current one, x_{t+1} = x_{t+1−m} (an induction head's rule); before it, the next token is x_0 (the
  repeat begins) with the hazard h_t = P(m = t+1 | m ≥ t+1), else uniform over the unseen tokens.

The ground truth of each world's mechanism is exposed beside its law: `relevant_positions(tokens)`, a
(batch, length, length) boolean array whose row t marks the positions the true law of x_{t+1} is read
from (the last k tokens of an order-k chain; in the repeat, the one position the induction world copies;
none where the law reads no single position), and, for the hidden-Markov sources, `beliefs(tokens)`,
the posterior over hidden states after each token.

Shapes: token arrays are int64 `(batch, length)`; `conditionals` returns `(batch, length, V)` whose row
t is the law of the token *after* position t — the quantity a language model's logits at position t
predict. The law of the very first token is `initial_distribution()`.
"""

import math
import numbers
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

_POWER_TOL = 1e-14  # L1 change between power-iteration steps at which π counts as converged
_POWER_MAX_ITERS = 200_000
# Size limits, checked before anything is allocated (a world of V^(k+1) laws grows fast: order 12 over
# 32 symbols would be 3.7e19 of them). A probability table of MAX_TABLE_ENTRIES float64 entries is
# 256 MiB, and the chain keeps two (the laws and their cumulative sums) plus a power-iteration
# temporary; MAX_SAMPLE_TOKENS int64 ids are 1 GiB.
MAX_TABLE_ENTRIES = 2**25
MAX_SAMPLE_TOKENS = 2**27


# --- shared helpers ---------------------------------------------------------------------------


def _check_int(owner: str, name: str, value: Any, minimum: int = 1) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{owner}: {name} must be an integer ≥ {minimum}, got {value!r}")
    return int(value)


def _check_size(owner: str, what: str, entries: int, limit: int, advice: str) -> None:
    if entries > limit:
        raise ValueError(f"{owner}: {what} = {entries:,} entries ({_bytes(entries * 8)} as 64-bit numbers) "
                         f"exceeds the limit of {limit:,} ({_bytes(limit * 8)}); {advice}")


def _bytes(n: float) -> str:
    """A byte count in binary units: 256 MiB, 2.62e+05 PiB."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    for unit in units:
        if n < 1024:
            return f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} PiB"


def _check_concentration(owner: str, value: Any) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not (
            math.isfinite(value) and value > 0):
        raise ValueError(f"{owner}: concentration must be a finite number > 0, got {value!r}")
    return float(value)


def _as_tokens(tokens: Any, vocab_size: int) -> IntArray:
    """Validate and view `tokens` as an int64 `(batch, length)` array (a 1-D array is one sequence)."""
    array = np.asarray(tokens)
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2 or array.shape[1] < 1:
        raise ValueError(f"tokens must have shape (batch, length ≥ 1), got {array.shape}")
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"tokens must be integers, got dtype {array.dtype}")
    if array.size and (array.min() < 0 or array.max() >= vocab_size):
        raise ValueError(f"tokens must lie in [0, {vocab_size}), got range "
                         f"[{array.min()}, {array.max()}]")
    return array.astype(np.int64, copy=False)


def _entropy_nats(probs: FloatArray) -> FloatArray:
    """H(p) = −Σ p log p along the last axis, with 0 log 0 = 0."""
    logs = np.log(np.where(probs > 0, probs, 1.0))
    return -(probs * logs).sum(axis=-1)


def _draw_categorical(rng: np.random.Generator, cumulative: FloatArray) -> IntArray:
    """One draw per row of a batch of cumulative distributions `(n, V)` by inversion."""
    u = rng.random(cumulative.shape[0])[:, None] * cumulative[:, -1:]
    draws = (cumulative < u).sum(axis=1)
    return np.minimum(draws, cumulative.shape[1] - 1).astype(np.int64)


def _stationary_of(transition: FloatArray) -> FloatArray:
    """Stationary law of a small dense row-stochastic matrix: the left eigenvector for eigenvalue 1."""
    n = transition.shape[0]
    # Solve π (A − I) = 0 with Σ π = 1 as one least-squares system (exact for an irreducible chain).
    system = np.vstack([transition.T - np.eye(n), np.ones((1, n))])
    rhs = np.zeros(n + 1)
    rhs[-1] = 1.0
    pi, *_ = np.linalg.lstsq(system, rhs, rcond=None)
    pi = np.clip(pi, 0.0, None)
    return pi / pi.sum()


def _check_kind(owner: str, data: dict[str, Any], kind: str, known: set[str]) -> None:
    if not isinstance(data, dict):
        raise ValueError(f"{owner}: expected a mapping, got {type(data).__name__}")
    if data.get("kind") != kind:
        raise ValueError(f"{owner}: expected kind {kind!r}, got {data.get('kind')!r}")
    unknown = sorted(set(data) - known - {"kind"})
    if unknown:
        raise ValueError(f"{owner}: unknown keys {unknown}; known keys are {sorted(known)}")


class EntropyEstimate(NamedTuple):
    """A Monte-Carlo estimate in nats per token with its standard error (unpacks as a pair)."""

    value: float
    standard_error: float


def _monte_carlo_rate(conditionals: FloatArray, tokens: IntArray, burn_in: int) -> EntropyEstimate:
    """Mean of −log p(x_{t+1}|x_{≤t}) over positions t ≥ burn_in; SE from per-sequence means."""
    nll = -np.log(np.take_along_axis(conditionals[:, :-1], tokens[:, 1:, None], axis=2)[..., 0])
    per_sequence = nll[:, burn_in:].mean(axis=1)
    n = per_sequence.shape[0]
    se = float(per_sequence.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
    return EntropyEstimate(float(per_sequence.mean()), se)


# --- order-k Markov chain ---------------------------------------------------------------------


class MarkovSource:
    """Order-k Markov chain over `vocab_size` tokens with Dirichlet(concentration) transitions.

    Context index: the last `order` tokens read as a base-V number, oldest token most significant.
    `transition[c]` is p(· | c); its memory is V^(order+1) floats.
    """

    kind = "markov"

    def __init__(self, vocab_size: int, order: int = 2, concentration: float = 0.5,
                 seed: int = 0) -> None:
        self.vocab_size = _check_int("MarkovSource", "vocab_size", vocab_size, minimum=2)
        self.order = _check_int("MarkovSource", "order", order)
        self.concentration = _check_concentration("MarkovSource", concentration)
        self.seed = _check_int("MarkovSource", "seed", seed, minimum=0)
        vocab_size, order = self.vocab_size, self.order
        _check_size("MarkovSource", f"the transition table vocab_size^(order + 1) = {vocab_size}^{order + 1}",
                    vocab_size ** (order + 1), MAX_TABLE_ENTRIES, "lower order or vocab_size")
        self.n_contexts = vocab_size ** order
        rng = np.random.default_rng(self.seed)
        self.transition: FloatArray = rng.dirichlet(np.full(vocab_size, self.concentration),
                                                    size=self.n_contexts)
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
        raise RuntimeError(f"MarkovSource: power iteration for π did not converge in "
                           f"{_POWER_MAX_ITERS} steps (concentration {self.concentration} too small?)")

    def stationary(self) -> FloatArray:
        """π over the V^order contexts, shape (V^order,)."""
        return self._pi.copy()

    def prefix_marginal(self, j: int) -> FloatArray:
        """Law m_j of the first j ≤ order tokens of a π-distributed context, shape (V^j,)."""
        if not 0 <= j <= self.order:
            raise ValueError(f"prefix length must be in [0, {self.order}], got {j}")
        return self._pi.reshape(self.vocab_size ** j, -1).sum(axis=1)

    def initial_distribution(self) -> FloatArray:
        """p(x_1): the law of the first token, shape (V,)."""
        return self.prefix_marginal(1)

    def entropy_rate(self) -> float:
        """H_rate = Σ_c π(c) H(p(·|c)) in nats per token (exact)."""
        return float(self._pi @ _entropy_nats(self.transition))

    # --- sampling ---
    def sample(self, n: int, length: int, seed: int | None = None) -> IntArray:
        """`n` sequences of `length` tokens: the first `order` from π, then the chain."""
        n = _check_int("MarkovSource.sample", "n", n)
        length = _check_int("MarkovSource.sample", "length", length)
        _check_size("MarkovSource.sample", f"n × length = {n:,} × {max(length, self.order)}",
                    n * max(length, self.order), MAX_SAMPLE_TOKENS, "draw fewer or shorter sequences")
        rng = self._sample_rng if seed is None else np.random.default_rng(seed)
        V, k = self.vocab_size, self.order
        out = np.empty((n, max(length, k)), dtype=np.int64)
        start = rng.choice(self.n_contexts, size=n, p=self._pi)
        for i in range(k):  # digits of the context index, oldest first
            out[:, i] = (start // V ** (k - 1 - i)) % V
        context = start.astype(np.int64)
        for t in range(k, length):
            out[:, t] = _draw_categorical(rng, self._cumulative[context])
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
        tokens = _as_tokens(tokens, self.vocab_size)
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
        tokens = _as_tokens(tokens, self.vocab_size)
        length = tokens.shape[1]
        t, i = np.arange(length)[:, None], np.arange(length)[None, :]
        window = (i <= t) & (i > t - self.order)
        return np.broadcast_to(window, (tokens.shape[0], length, length)).copy()

    def log_prob(self, tokens: Any) -> FloatArray:
        """log p(x_1..x_L) in nats per sequence, shape (batch,), first token under π's marginal."""
        tokens = _as_tokens(tokens, self.vocab_size)
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
        return _monte_carlo_rate(self.conditionals(tokens), tokens, burn_in=self.order - 1)

    # --- provenance ---
    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "vocab_size": self.vocab_size, "order": self.order,
                "concentration": self.concentration, "seed": self.seed}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "MarkovSource":
        known = {"vocab_size", "order", "concentration", "seed"}
        _check_kind("MarkovSource", data, cls.kind, known)
        return cls(**{key: value for key, value in data.items() if key != "kind"})

    def __repr__(self) -> str:
        return (f"MarkovSource(vocab_size={self.vocab_size}, order={self.order}, "
                f"concentration={self.concentration}, seed={self.seed})")


# --- hidden Markov model ----------------------------------------------------------------------


class HiddenMarkovSource:
    """HMM with `n_states` hidden states emitting `vocab_size` tokens; A, B rows ~ Dirichlet.

    `transition` is A (S, S), `emission` is B (S, V), `initial` is π = stationary law of A.
    """

    kind = "hmm"

    def __init__(self, n_states: int, vocab_size: int, concentration: float = 0.5,
                 seed: int = 0) -> None:
        self.n_states = _check_int("HiddenMarkovSource", "n_states", n_states)
        self.vocab_size = _check_int("HiddenMarkovSource", "vocab_size", vocab_size, minimum=2)
        self.concentration = _check_concentration("HiddenMarkovSource", concentration)
        self.seed = _check_int("HiddenMarkovSource", "seed", seed, minimum=0)
        n_states, vocab_size = self.n_states, self.vocab_size
        _check_size("HiddenMarkovSource", f"the tables n_states × (n_states + vocab_size) = "
                    f"{n_states} × {n_states + vocab_size}", n_states * (n_states + vocab_size), MAX_TABLE_ENTRIES,
                    "lower n_states or vocab_size")
        rng = np.random.default_rng(self.seed)
        alpha = self.concentration
        self.transition: FloatArray = rng.dirichlet(np.full(n_states, alpha), size=n_states)
        self.emission: FloatArray = rng.dirichlet(np.full(vocab_size, alpha), size=n_states)
        self.initial: FloatArray = _stationary_of(self.transition)
        self._sample_rng = np.random.default_rng([self.seed, 1])

    def stationary(self) -> FloatArray:
        """π over hidden states, shape (S,)."""
        return self.initial.copy()

    def initial_distribution(self) -> FloatArray:
        """p(x_1) = π B, shape (V,)."""
        return self.initial @ self.emission

    def sample(self, n: int, length: int, seed: int | None = None) -> IntArray:
        """`n` token sequences of `length`, hidden chain started in π."""
        n = _check_int("HiddenMarkovSource.sample", "n", n)
        length = _check_int("HiddenMarkovSource.sample", "length", length)
        _check_size("HiddenMarkovSource.sample", f"n × length = {n:,} × {length}", n * length, MAX_SAMPLE_TOKENS,
                    "draw fewer or shorter sequences")
        rng = self._sample_rng if seed is None else np.random.default_rng(seed)
        cum_a = np.cumsum(self.transition, axis=1)
        cum_b = np.cumsum(self.emission, axis=1)
        out = np.empty((n, length), dtype=np.int64)
        state = rng.choice(self.n_states, size=n, p=self.initial)
        for t in range(length):
            out[:, t] = _draw_categorical(rng, cum_b[state])
            state = _draw_categorical(rng, cum_a[state])
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
        return self._filter(_as_tokens(tokens, self.vocab_size))[0]

    def beliefs(self, tokens: Any) -> FloatArray:
        """The belief state f_t = p(s_t = · | x_{≤t}) after each token, shape (batch, length, S): the posterior
        over the hidden state that emitted x_t, from which p(x_{t+1} | x_{≤t}) = f_t A B."""
        return self._filter(_as_tokens(tokens, self.vocab_size))[2]

    def log_prob(self, tokens: Any) -> FloatArray:
        """log p(x_1..x_L) in nats per sequence, shape (batch,)."""
        tokens = _as_tokens(tokens, self.vocab_size)
        cond, first, _ = self._filter(tokens)
        picked = np.take_along_axis(cond[:, :-1], tokens[:, 1:, None], axis=2)[..., 0]
        return first + np.log(picked).sum(axis=1)

    def entropy_rate_estimate(self, n: int, length: int, seed: int = 0,
                              burn_in: int | None = None) -> EntropyEstimate:
        """Monte-Carlo ESTIMATE of the entropy rate in nats per token, with its standard error.

        Averages −log p(x_{t+1}|x_{≤t}) over positions t ≥ burn_in (default length // 2). Each term's
        expectation H(X_{t+1}|X_{≤t}) decreases to the rate as t grows, so the estimate is biased
        upward by at most H(X_{burn_in+1}|X_{≤burn_in}) − rate; the standard error counts
        sequences, not tokens, since tokens within one sequence are correlated.
        """
        burn_in = length // 2 if burn_in is None else burn_in
        if not 0 <= burn_in < length - 1:
            raise ValueError(f"burn_in must be in [0, length − 1), got {burn_in} for length {length}")
        tokens = self.sample(n, length, seed=seed)
        return _monte_carlo_rate(self.conditionals(tokens), tokens, burn_in=burn_in)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "n_states": self.n_states, "vocab_size": self.vocab_size,
                "concentration": self.concentration, "seed": self.seed}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "HiddenMarkovSource":
        known = {"n_states", "vocab_size", "concentration", "seed"}
        _check_kind("HiddenMarkovSource", data, cls.kind, known)
        return cls(**{key: value for key, value in data.items() if key != "kind"})

    def __repr__(self) -> str:
        return (f"HiddenMarkovSource(n_states={self.n_states}, vocab_size={self.vocab_size}, "
                f"concentration={self.concentration}, seed={self.seed})")


# --- the Mess3 process -------------------------------------------------------------------------


def _check_open_unit(owner: str, name: str, value: Any, high: float = 1.0) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not (0.0 < value < high):
        raise ValueError(f"{owner}: {name} must be a number in (0, {high:g}), got {value!r}")
    return float(value)


def _every_earlier_position(tokens: IntArray) -> NDArray[np.bool_]:
    """(batch, length, length): row t marks every position ≤ t."""
    length = tokens.shape[1]
    return np.broadcast_to(np.tri(length, dtype=bool), (tokens.shape[0], length, length)).copy()


class Mess3Source:
    """The Mess3 process: 3 hidden states, tokens {0, 1, 2}, token-labelled transition matrices (Marzen &
    Crutchfield 2017, "Nearly maximally predictive features and their dimensions"; Shai et al. 2024, App. D)

        T^(a)_ij = P(x_{t+1} = a, s_{t+1} = j | s_t = i),   β = (1 − α)/2,  y = 1 − 2x,
        T^(0) = [[αy, βx, βx], [αx, βy, βx], [αx, βx, βy]],
        T^(1) = [[βy, αx, βx], [βx, αy, βx], [βx, αx, βy]],
        T^(2) = [[βy, βx, αx], [βx, βy, αx], [βx, βx, αy]],

    at Shai et al.'s x = 0.05, α = 0.85 by default. Σ_a T^(a) is a stochastic matrix with the uniform law as its
    stationary one; sequences start there. The belief state after x_{≤t} is η_t = η_{t−1} T^(x_t) / (η_{t−1}
    T^(x_t) 1) with η_0 = π, and the next token's law is p(a | x_{≤t}) = η_t T^(a) 1.
    """

    kind = "mess3"
    n_states = 3
    vocab_size = 3

    def __init__(self, x: float = 0.05, alpha: float = 0.85, seed: int = 0) -> None:
        self.x = _check_open_unit("Mess3Source", "x", x, high=0.5)
        self.alpha = _check_open_unit("Mess3Source", "alpha", alpha)
        self.seed = _check_int("Mess3Source", "seed", seed, minimum=0)
        a, b, y, x = self.alpha, (1 - self.alpha) / 2, 1 - 2 * self.x, self.x
        self.matrices: FloatArray = np.array([
            [[a * y, b * x, b * x], [a * x, b * y, b * x], [a * x, b * x, b * y]],
            [[b * y, a * x, b * x], [b * x, a * y, b * x], [b * x, a * x, b * y]],
            [[b * y, b * x, a * x], [b * x, b * y, a * x], [b * x, b * x, a * y]]])  # [token, from, to]
        self.emission: FloatArray = self.matrices.sum(axis=2).T  # E[i, a] = P(x = a | s = i)
        self.initial: FloatArray = _stationary_of(self.matrices.sum(axis=0))
        self._sample_rng = np.random.default_rng([self.seed, 1])

    def stationary(self) -> FloatArray:
        """π over hidden states, shape (3,)."""
        return self.initial.copy()

    def initial_distribution(self) -> FloatArray:
        """p(x_1) = π E, shape (3,)."""
        return self.initial @ self.emission

    def sample(self, n: int, length: int, seed: int | None = None) -> IntArray:
        """`n` token sequences of `length`, the hidden chain started in π."""
        n = _check_int("Mess3Source.sample", "n", n)
        length = _check_int("Mess3Source.sample", "length", length)
        _check_size("Mess3Source.sample", f"n × length = {n:,} × {length}", n * length, MAX_SAMPLE_TOKENS,
                    "draw fewer or shorter sequences")
        rng = self._sample_rng if seed is None else np.random.default_rng(seed)
        S = self.n_states
        joint = np.cumsum(self.matrices.transpose(1, 0, 2).reshape(S, -1), axis=1)  # [from, (token, to)]
        out = np.empty((n, length), dtype=np.int64)
        state = rng.choice(S, size=n, p=self.initial)
        for t in range(length):
            drawn = _draw_categorical(rng, joint[state])
            out[:, t], state = drawn // S, drawn % S
        return out

    def _filter(self, tokens: IntArray) -> tuple[FloatArray, FloatArray]:
        """Beliefs η_t (batch, length, S) and predictive laws η_t E (batch, length, V)."""
        batch, length = tokens.shape
        beliefs = np.empty((batch, length, self.n_states))
        belief = np.broadcast_to(self.initial, (batch, self.n_states))
        for t in range(length):
            belief = np.einsum("bi,bij->bj", belief, self.matrices[tokens[:, t]])
            belief = belief / belief.sum(axis=1, keepdims=True)
            beliefs[:, t] = belief
        return beliefs, beliefs @ self.emission

    def beliefs(self, tokens: Any) -> FloatArray:
        """The belief state η_t = P(s_{t+1} = · | x_{≤t}) after each token, shape (batch, length, 3): the
        sufficient statistic of the past for the future (points of the 2-simplex)."""
        return self._filter(_as_tokens(tokens, self.vocab_size))[0]

    def conditionals(self, tokens: Any) -> FloatArray:
        """p(x_{t+1} = · | x_{≤t}) = η_t E, shape (batch, length, 3)."""
        return self._filter(_as_tokens(tokens, self.vocab_size))[1]

    def relevant_positions(self, tokens: Any) -> NDArray[np.bool_]:
        """(batch, length, length): every position ≤ t (the belief state reads the whole past)."""
        return _every_earlier_position(_as_tokens(tokens, self.vocab_size))

    def log_prob(self, tokens: Any) -> FloatArray:
        """log p(x_1..x_L) in nats per sequence, shape (batch,)."""
        tokens = _as_tokens(tokens, self.vocab_size)
        first = np.log(self.initial_distribution()[tokens[:, 0]])
        cond = self.conditionals(tokens)
        picked = np.take_along_axis(cond[:, :-1], tokens[:, 1:, None], axis=2)[..., 0]
        return first + np.log(picked).sum(axis=1)

    def entropy_rate_estimate(self, n: int, length: int, seed: int = 0,
                              burn_in: int | None = None) -> EntropyEstimate:
        """Monte-Carlo estimate of the entropy rate (as HiddenMarkovSource.entropy_rate_estimate)."""
        burn_in = length // 2 if burn_in is None else burn_in
        if not 0 <= burn_in < length - 1:
            raise ValueError(f"burn_in must be in [0, length − 1), got {burn_in} for length {length}")
        tokens = self.sample(n, length, seed=seed)
        return _monte_carlo_rate(self.conditionals(tokens), tokens, burn_in=burn_in)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "x": self.x, "alpha": self.alpha, "seed": self.seed}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Mess3Source":
        _check_kind("Mess3Source", data, cls.kind, {"x", "alpha", "seed"})
        return cls(**{key: value for key, value in data.items() if key != "kind"})

    def __repr__(self) -> str:
        return f"Mess3Source(x={self.x}, alpha={self.alpha}, seed={self.seed})"


# --- the induction world -------------------------------------------------------------------------


class InductionSource:
    """Random tokens with a repeated segment, whose next token inside the repeat is a copy.

    A sequence draws its period m uniformly from [min_period, max_period] and its first m tokens without
    replacement from the V symbols; then it repeats them, x_t = x_{t−m} for t ≥ m. The exact law:

        inside the repeat (t ≥ m, known once x_m = x_0 has come):  x_{t+1} = x_{t+1−m}, the token after the
            previous occurrence of x_t (at j = t − m): p = δ(x_{j+1});
        before it (x_0 … x_t distinct):  p = h_t δ(x_0) + (1 − h_t) · Uniform(the V − t − 1 unseen tokens),
            h_t = P(m = t + 1 | m ≥ t + 1) = [min_period ≤ t + 1] / (max_period − max(min_period, t + 1) + 1).

    The mechanism's ground truth (`relevant_positions`): inside the repeat, the one position j + 1 whose token
    is copied; before it, none (the law reads the set of tokens seen, no single position).
    """

    kind = "induction"

    def __init__(self, vocab_size: int, min_period: int, max_period: int, seed: int = 0) -> None:
        self.vocab_size = _check_int("InductionSource", "vocab_size", vocab_size, minimum=2)
        self.min_period = _check_int("InductionSource", "min_period", min_period, minimum=2)
        self.max_period = _check_int("InductionSource", "max_period", max_period, minimum=2)
        self.seed = _check_int("InductionSource", "seed", seed, minimum=0)
        if not self.min_period <= self.max_period <= self.vocab_size:
            raise ValueError(f"InductionSource: need min_period ≤ max_period ≤ vocab_size (the first m tokens are "
                             f"distinct), got {self.min_period}, {self.max_period}, {self.vocab_size}")
        self._sample_rng = np.random.default_rng([self.seed, 1])

    def initial_distribution(self) -> FloatArray:
        """p(x_1): uniform over the V symbols."""
        return np.full(self.vocab_size, 1.0 / self.vocab_size)

    def sample(self, n: int, length: int, seed: int | None = None) -> IntArray:
        """`n` sequences of `length` tokens, each with its own period and segment."""
        n = _check_int("InductionSource.sample", "n", n)
        length = _check_int("InductionSource.sample", "length", length)
        _check_size("InductionSource.sample", f"n × V = {n:,} × {self.vocab_size}", n * max(length, self.vocab_size),
                    MAX_SAMPLE_TOKENS, "draw fewer or shorter sequences")
        rng = self._sample_rng if seed is None else np.random.default_rng(seed)
        periods = rng.integers(self.min_period, self.max_period + 1, size=n)
        segments = np.argsort(rng.random((n, self.vocab_size)), axis=1)  # a random permutation per row
        positions = np.arange(length)[None, :] % periods[:, None]
        return np.take_along_axis(segments, positions, axis=1).astype(np.int64)

    def periods(self, tokens: Any) -> IntArray:
        """Each row's period m as far as its tokens show it: the first k ≥ 1 with x_k = x_0, or 0 before the
        repeat has begun. A row that no draw of this world can give is a ValueError naming it."""
        tokens = _as_tokens(tokens, self.vocab_size)
        batch, length = tokens.shape
        out = np.zeros(batch, dtype=np.int64)
        for row in range(batch):
            x = tokens[row]
            seen: set[int] = set()
            for t in range(length):
                if out[row] == 0:
                    if t > 0 and x[t] == x[0] and t >= self.min_period:
                        out[row] = t
                    elif int(x[t]) in seen or t >= self.max_period:
                        raise ValueError(f"InductionSource: row {row} is not a draw of this world (position {t}: "
                                         f"token {int(x[t])} after {t} distinct tokens, periods "
                                         f"{self.min_period} … {self.max_period})")
                    seen.add(int(x[t]))
                if out[row] and x[t] != x[t - out[row]]:
                    raise ValueError(f"InductionSource: row {row} is not a draw of this world (position {t} breaks "
                                     f"the repeat of period {out[row]})")
        return out

    def copy_positions(self, tokens: Any) -> NDArray[np.bool_]:
        """(batch, length): True at t where x_{t+1} is a copy, determined by the tokens so far (t ≥ m)."""
        tokens = _as_tokens(tokens, self.vocab_size)
        m = self.periods(tokens)
        t = np.arange(tokens.shape[1])[None, :]
        return (m[:, None] > 0) & (t >= m[:, None])

    def conditionals(self, tokens: Any) -> FloatArray:
        """p(x_{t+1} = · | x_{≤t}), shape (batch, length, V) (see the class's docstring)."""
        tokens = _as_tokens(tokens, self.vocab_size)
        batch, length = tokens.shape
        V, low, high = self.vocab_size, self.min_period, self.max_period
        m = self.periods(tokens)
        out = np.zeros((batch, length, V))
        rows = np.arange(batch)
        for t in range(length):
            inside = (m > 0) & (t >= m)
            if inside.any():
                out[rows[inside], t, tokens[inside, t + 1 - m[inside]]] = 1.0
            before = ~inside
            if before.any():
                hazard = 1.0 / (high - max(low, t + 1) + 1) if low <= t + 1 <= high else 0.0
                unseen = np.ones((int(before.sum()), V), dtype=bool)
                np.put_along_axis(unseen, tokens[before, :t + 1], False, axis=1)
                law = unseen * ((1.0 - hazard) / max(V - t - 1, 1))
                law[np.arange(len(law)), tokens[before, 0]] += hazard
                out[before, t] = law
        return out

    def relevant_positions(self, tokens: Any) -> NDArray[np.bool_]:
        """(batch, length, length): inside the repeat, row t marks j + 1 = t + 1 − m, the position whose token comes
        next; rows before the repeat mark nothing."""
        tokens = _as_tokens(tokens, self.vocab_size)
        batch, length = tokens.shape
        m = self.periods(tokens)
        out = np.zeros((batch, length, length), dtype=bool)
        for row in np.flatnonzero(m):
            t = np.arange(m[row], length)
            out[row, t, t + 1 - m[row]] = True
        return out

    def log_prob(self, tokens: Any) -> FloatArray:
        """log p(x_1..x_L) in nats per sequence, shape (batch,)."""
        tokens = _as_tokens(tokens, self.vocab_size)
        cond = self.conditionals(tokens)
        picked = np.take_along_axis(cond[:, :-1], tokens[:, 1:, None], axis=2)[..., 0]
        return -math.log(self.vocab_size) + np.log(picked).sum(axis=1)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "vocab_size": self.vocab_size, "min_period": self.min_period,
                "max_period": self.max_period, "seed": self.seed}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "InductionSource":
        _check_kind("InductionSource", data, cls.kind, {"vocab_size", "min_period", "max_period", "seed"})
        return cls(**{key: value for key, value in data.items() if key != "kind"})

    def __repr__(self) -> str:
        return (f"InductionSource(vocab_size={self.vocab_size}, min_period={self.min_period}, "
                f"max_period={self.max_period}, seed={self.seed})")


Source = MarkovSource | HiddenMarkovSource | Mess3Source | InductionSource


def source_from_dict(data: dict[str, Any]) -> Source:
    """Rebuild a source from `to_dict()` output, dispatching on `kind`."""
    kinds: dict[str, type[Source]] = {
        cls.kind: cls for cls in (MarkovSource, HiddenMarkovSource, Mess3Source, InductionSource)}
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in kinds:
        raise ValueError(f"unknown source kind {kind!r}; known kinds are {sorted(kinds)}")
    return kinds[kind].from_dict(data)
