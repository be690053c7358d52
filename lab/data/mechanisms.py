"""Worlds whose mechanism is known as well as their law: what a model must compute to predict them, against
which interpretability methods are graded (lab.analysis.grading).

* `Mess3Source` — the Mess3 process (Marzen & Crutchfield 2017), the world of Shai et al. 2024
  ("Transformers represent belief state geometry in their residual stream", NeurIPS 2024): three hidden
  states, three tokens, an edge-emitting HMM whose token-labelled matrices T^(a)_ij = P(a, s' = j | s = i)
  make the belief state η_t = P(s_{t+1} | x_{≤t}) (η_{t} ∝ η_{t−1} T^(x_t), η_0 = π) wander a fractal
  in the 2-simplex. η_t is the sufficient statistic: p(x_{t+1} = a | x_{≤t}) = η_t T^(a) 1.

* `InductionSource` — random tokens with a repeated span: the first m tokens are distinct (drawn without
  replacement), m uniform in [min_period, max_period], and from then on the span x_s … x_{m−1} repeats from a
  random start s, x_t = x_{t−d} with d = m − s. Inside the repeat the next token is the token after the previous
  occurrence of the current one, x_{t+1} = x_{t+1−d} (an induction head's rule), found by content: the offset d
  differs between sequences and no position marks it.

Both answer the interface of lab.data.sources (sample, conditionals, log_prob, to_dict / from_dict,
`source_from_dict`), with the same shapes: row t of `conditionals` is the law of the token after position t.
"""

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from lab.data.checks import (
    as_tokens,
    check_int,
    check_kind,
    check_open_unit,
    check_sample,
)
from lab.data.draws import (
    EntropyEstimate,
    FloatArray,
    IntArray,
    burn_in_rate,
    draw_categorical,
    every_earlier_position,
    stationary_of,
)

__all__ = ["InductionSource", "Mess3Source"]


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
        self.x = check_open_unit("Mess3Source", "x", x, high=0.5)
        self.alpha = check_open_unit("Mess3Source", "alpha", alpha)
        self.seed = check_int("Mess3Source", "seed", seed, minimum=0)
        a, b, y, x = self.alpha, (1 - self.alpha) / 2, 1 - 2 * self.x, self.x
        self.matrices: FloatArray = np.array(
            [
                [[a * y, b * x, b * x], [a * x, b * y, b * x], [a * x, b * x, b * y]],
                [[b * y, a * x, b * x], [b * x, a * y, b * x], [b * x, a * x, b * y]],
                [[b * y, b * x, a * x], [b * x, b * y, a * x], [b * x, b * x, a * y]],
            ]
        )  # [token, from, to]
        self.emission: FloatArray = self.matrices.sum(axis=2).T  # E[i, a] = P(x = a | s = i)
        self.initial: FloatArray = stationary_of(self.matrices.sum(axis=0))
        self._sample_rng = np.random.default_rng([self.seed, 1])

    def stationary(self) -> FloatArray:
        """π over hidden states, shape (3,)."""
        return self.initial.copy()

    def initial_distribution(self) -> FloatArray:
        """p(x_1) = π E, shape (3,)."""
        return self.initial @ self.emission

    def sample(self, n: int, length: int, seed: int | None = None) -> IntArray:
        """`n` token sequences of `length`, the hidden chain started in π."""
        n, length = check_sample("Mess3Source.sample", n, length)
        rng = self._sample_rng if seed is None else np.random.default_rng(seed)
        S = self.n_states
        joint = np.cumsum(self.matrices.transpose(1, 0, 2).reshape(S, -1), axis=1)  # [from, (token, to)]
        out = np.empty((n, length), dtype=np.int64)
        state = rng.choice(S, size=n, p=self.initial)
        for t in range(length):
            drawn = draw_categorical(rng, joint[state])
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
        return self._filter(as_tokens(tokens, self.vocab_size))[0]

    def conditionals(self, tokens: Any) -> FloatArray:
        """p(x_{t+1} = · | x_{≤t}) = η_t E, shape (batch, length, 3)."""
        return self._filter(as_tokens(tokens, self.vocab_size))[1]

    def relevant_positions(self, tokens: Any) -> NDArray[np.bool_]:
        """(batch, length, length): every position ≤ t (the belief state reads the whole past)."""
        return every_earlier_position(as_tokens(tokens, self.vocab_size))

    def log_prob(self, tokens: Any) -> FloatArray:
        """log p(x_1..x_L) in nats per sequence, shape (batch,)."""
        tokens = as_tokens(tokens, self.vocab_size)
        first = np.log(self.initial_distribution()[tokens[:, 0]])
        cond = self.conditionals(tokens)
        picked = np.take_along_axis(cond[:, :-1], tokens[:, 1:, None], axis=2)[..., 0]
        return first + np.log(picked).sum(axis=1)

    def entropy_rate_estimate(self, n: int, length: int, seed: int = 0, burn_in: int | None = None) -> EntropyEstimate:
        """Monte-Carlo estimate of the entropy rate over positions t ≥ burn_in: `lab.data.draws.burn_in_rate`."""
        return burn_in_rate(self, n, length, seed, burn_in)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "x": self.x, "alpha": self.alpha, "seed": self.seed}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Mess3Source":
        check_kind("Mess3Source", data, cls.kind, {"x", "alpha", "seed"})
        return cls(**{key: value for key, value in data.items() if key != "kind"})

    def __repr__(self) -> str:
        return f"Mess3Source(x={self.x}, alpha={self.alpha}, seed={self.seed})"


# --- the induction world -------------------------------------------------------------------------


class InductionSource:
    """Random tokens with a repeated span, whose next token inside the repeat is a copy found by content.

    A sequence draws m uniformly from [min_period, max_period], its first m tokens without replacement from the V
    symbols, and a start s uniformly from [0, m − 2]; from position m on it repeats the span x_s … x_{m−1}, so
    x_t = x_{t−d} for t ≥ m with the offset d = m − s ∈ [2, m]. The offset differs from sequence to sequence
    and no position marks it: a model finds it by matching the current token with its earlier occurrence (the
    induction head's rule), not by counting positions. The exact law:

        inside the repeat (t ≥ m, known once a token has come twice):  x_{t+1} = x_{t+1−d}, the token after the
            previous occurrence of x_t (at j = t − d): p = δ(x_{j+1});
        before it (x_0 … x_t distinct):  p = h_t · Uniform(x_0 … x_{t−1}) + (1 − h_t) · Uniform(the V − t − 1
            unseen tokens), with h_t = P(m = t + 1 | m ≥ t + 1) = [min_period ≤ t + 1] / (max_period −
            max(min_period, t + 1) + 1), the chance that the repeat starts now (at an earlier token, never x_t).

    The mechanism's ground truth (`relevant_positions`): inside the repeat, every lawful copy source — the
    successor j + 1 of each earlier occurrence j of x_t (j = t − d, t − 2d, … down to the span's start), each
    holding the token that comes next, since the rule x_{t+1} = x_{j+1} holds for every one of them; before it,
    none (the law reads the set of tokens seen, no single position). Once the span has come round more than
    once, a prediction has several sources, and the truth is the set; `sample_unique_source` draws the world's
    prompts whose last prediction has exactly one.
    """

    kind = "induction"

    def __init__(self, vocab_size: int, min_period: int, max_period: int, seed: int = 0) -> None:
        self.vocab_size = check_int("InductionSource", "vocab_size", vocab_size, minimum=3)
        self.min_period = check_int("InductionSource", "min_period", min_period, minimum=2)
        self.max_period = check_int("InductionSource", "max_period", max_period, minimum=2)
        self.seed = check_int("InductionSource", "seed", seed, minimum=0)
        if not self.min_period <= self.max_period <= self.vocab_size:
            raise ValueError(
                f"InductionSource: need min_period ≤ max_period ≤ vocab_size (the first m tokens are "
                f"distinct), got {self.min_period}, {self.max_period}, {self.vocab_size}"
            )
        self._sample_rng = np.random.default_rng([self.seed, 1])

    def initial_distribution(self) -> FloatArray:
        """p(x_1): uniform over the V symbols."""
        return np.full(self.vocab_size, 1.0 / self.vocab_size)

    def sample(self, n: int, length: int, seed: int | None = None) -> IntArray:
        """`n` sequences of `length` tokens, each with its own segment length, start and offset."""
        n, length = check_sample("InductionSource.sample", n, length, self.vocab_size)
        rng = self._sample_rng if seed is None else np.random.default_rng(seed)
        m = rng.integers(self.min_period, self.max_period + 1, size=n)
        start = np.floor(rng.random(n) * (m - 1)).astype(np.int64)  # uniform in [0, m − 2]
        segments = np.argsort(rng.random((n, self.vocab_size)), axis=1)  # a random permutation per row
        t = np.arange(length)[None, :]
        offset = (m - start)[:, None]
        positions = np.where(t < m[:, None], t, start[:, None] + (t - m[:, None]) % offset)
        return np.take_along_axis(segments, positions, axis=1).astype(np.int64)

    def offsets(self, tokens: Any) -> tuple[IntArray, IntArray]:
        """Each row's (m, d) as far as its tokens show them: the position m where a token first comes again and
        the distance d to its earlier occurrence; (0, 0) before the repeat has begun. A row that no draw of this
        world can give is a ValueError naming it."""
        tokens = as_tokens(tokens, self.vocab_size)
        batch, length = tokens.shape
        m, d = np.zeros(batch, dtype=np.int64), np.zeros(batch, dtype=np.int64)
        for row in range(batch):
            x = tokens[row]
            seen: dict[int, int] = {}
            for t in range(length):
                token = int(x[t])
                if m[row] == 0:
                    if token in seen:
                        if not (self.min_period <= t <= self.max_period and seen[token] <= t - 2):
                            raise ValueError(
                                f"InductionSource: row {row} is not a draw of this world (position {t} "
                                f"repeats position {seen[token]}; segments of {self.min_period} … "
                                f"{self.max_period} tokens repeat from an earlier token than the last)"
                            )
                        m[row], d[row] = t, t - seen[token]
                    elif t >= self.max_period:
                        raise ValueError(
                            f"InductionSource: row {row} is not a draw of this world (no repeat by position {t})"
                        )
                    seen[token] = t
                elif token != x[t - d[row]]:
                    raise ValueError(
                        f"InductionSource: row {row} is not a draw of this world (position {t} breaks "
                        f"the repeat of offset {d[row]})"
                    )
        return m, d

    def copy_positions(self, tokens: Any) -> NDArray[np.bool_]:
        """(batch, length): True at t where x_{t+1} is a copy, determined by the tokens so far (t ≥ m)."""
        m, _ = self.offsets(tokens)
        t = np.arange(np.shape(tokens)[-1])[None, :]
        return (m[:, None] > 0) & (t >= m[:, None])

    def conditionals(self, tokens: Any) -> FloatArray:
        """p(x_{t+1} = · | x_{≤t}), shape (batch, length, V) (see the class's docstring)."""
        tokens = as_tokens(tokens, self.vocab_size)
        batch, length = tokens.shape
        V, low, high = self.vocab_size, self.min_period, self.max_period
        m, d = self.offsets(tokens)
        out = np.zeros((batch, length, V))
        rows = np.arange(batch)
        for t in range(length):
            inside = (m > 0) & (t >= m)
            if inside.any():
                out[rows[inside], t, tokens[inside, t + 1 - d[inside]]] = 1.0
            before = ~inside
            if before.any():
                hazard = 1.0 / (high - max(low, t + 1) + 1) if low <= t + 1 <= high else 0.0
                unseen = np.ones((int(before.sum()), V), dtype=bool)
                np.put_along_axis(unseen, tokens[before, : t + 1], False, axis=1)
                law = unseen * ((1.0 - hazard) / max(V - t - 1, 1))
                if t > 0:
                    earlier = np.zeros_like(law)
                    np.put_along_axis(earlier, tokens[before, :t], hazard / t, axis=1)
                    law += earlier
                out[before, t] = law
        return out

    def relevant_positions(self, tokens: Any) -> NDArray[np.bool_]:
        """(batch, length, length): inside the repeat, row t marks every j + 1 with j < t and x_j = x_t — the
        successor of each earlier occurrence of the current token, every one holding the token that comes next
        (the most recent is t + 1 − d); rows before the repeat mark nothing. A position that holds the next token
        without following an occurrence of x_t (the span's first, x_s) is not marked: no induction rule reaches
        it."""
        tokens = as_tokens(tokens, self.vocab_size)
        batch, length = tokens.shape
        m, _ = self.offsets(tokens)
        out = np.zeros((batch, length, length), dtype=bool)
        for row in np.flatnonzero(m):
            x = tokens[row]
            for t in range(m[row], length):
                out[row, t, np.flatnonzero(x[:t] == x[t]) + 1] = True
        return out

    def sample_unique_source(self, n: int, length: int, seed: int | None = None) -> IntArray:
        """`n` of the world's draws of `length` tokens whose last prediction has exactly one lawful copy source:
        the repeat has begun (m ≤ length − 1) and not yet come round a second time (length − 1 < m + d), so the
        current token came once before. The world's own draws, kept by rejection (the law and offsets are the
        world's, conditioned on that event); a length no draw can give that way is a ValueError."""
        n, length = check_sample("InductionSource.sample_unique_source", n, length, self.vocab_size)
        feasible = [
            (m, d)
            for m in range(self.min_period, min(self.max_period, length - 1) + 1)
            for d in range(max(2, length - m), m + 1)
        ]
        if not feasible:
            raise ValueError(
                f"InductionSource: no draw of this world has one copy source at position {length - 1} (spans of "
                f"{self.min_period} … {self.max_period} tokens have come round twice by then)"
            )
        rng = self._sample_rng if seed is None else np.random.default_rng(seed)
        kept: list[IntArray] = []
        while sum(len(k) for k in kept) < n:
            drawn = self.sample(max(4 * n, 64), length, seed=int(rng.integers(2**63)))
            m, d = self.offsets(drawn)
            kept.append(drawn[(m > 0) & (length - 1 < m + d)])
        return np.concatenate(kept)[:n]

    def log_prob(self, tokens: Any) -> FloatArray:
        """log p(x_1..x_L) in nats per sequence, shape (batch,)."""
        tokens = as_tokens(tokens, self.vocab_size)
        cond = self.conditionals(tokens)
        picked = np.take_along_axis(cond[:, :-1], tokens[:, 1:, None], axis=2)[..., 0]
        return -math.log(self.vocab_size) + np.log(picked).sum(axis=1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "vocab_size": self.vocab_size,
            "min_period": self.min_period,
            "max_period": self.max_period,
            "seed": self.seed,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "InductionSource":
        check_kind("InductionSource", data, cls.kind, {"vocab_size", "min_period", "max_period", "seed"})
        return cls(**{key: value for key, value in data.items() if key != "kind"})

    def __repr__(self) -> str:
        return (
            f"InductionSource(vocab_size={self.vocab_size}, min_period={self.min_period}, "
            f"max_period={self.max_period}, seed={self.seed})"
        )
