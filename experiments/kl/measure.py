"""What the kl experiment measures on held-out prefixes: the draw and its exact laws (HeldOut), the model's
logits, both measurements of CE = H + KL per prefix (exact and sampled), their summaries by region with the
two checks that could fail, the entropy-rate check, the ground-truth lens and KL by position."""

import math
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lab.analysis.lens import ground_truth_lens as lens_against_truth
from lab.data.sources import HiddenMarkovSource, MarkovSource
from lab.metrics.information import cross_entropy, entropy, kl
from lab.model.transformer import HookedTransformer

Source = MarkovSource | HiddenMarkovSource


@dataclass
class HeldOut:
    """Held-out sequences and their exact next-token laws: what every measurement is compared with."""

    tokens: Int[Tensor, "seq pos"]
    p: Float[Tensor, "seq pos-1 vocab"]  # p(x_{t+1} = · | x_≤t) for t = 0 … pos − 2, float64
    # First t whose prefix x_≤t is a complete context (prefix length ≥ the chain's order: t = order − 1).
    # From there on the context is π-distributed, so E[H_t] is the entropy rate; earlier positions condition
    # through π's marginals and have a larger entropy. None for a source of no finite order (hidden Markov).
    complete_from: int | None

    @classmethod
    def draw(cls, source: Source, n: int, length: int, seed: int) -> "HeldOut":
        tokens = source.sample(n, length, seed=seed)
        p = torch.from_numpy(source.conditionals(tokens)[:, :-1])
        order = getattr(source, "order", None)
        return cls(torch.from_numpy(tokens), p, None if order is None else order - 1)

    @property
    def n_prefixes(self) -> int:
        return self.p.shape[0] * self.p.shape[1]

    def regions(self) -> dict[str, slice]:
        """The prefix positions each reported average runs over: "all", and for a Markov chain "complete"
        (prefix length ≥ order) and "first" (the shorter prefixes before it)."""
        if self.complete_from is None:
            return {"all": slice(None)}
        return {"all": slice(None), "complete": slice(self.complete_from, None), "first": slice(0, self.complete_from)}


@torch.inference_mode()
def model_logits(
    model: HookedTransformer, tokens: Int[Tensor, "seq pos"], batch: int = 256
) -> Float[Tensor, "seq pos-1 vocab"]:
    """The model's logits at every prefix that has a next token, in float64."""
    model.eval()
    return torch.cat([model(tokens[i : i + batch])[:, :-1].double() for i in range(0, len(tokens), batch)])


@dataclass
class Decomposition:
    """Per-prefix exact terms and per-token sampled terms, in nats."""

    entropy: Float[Tensor, "seq pos"]  # H_t = H(p(·|x_≤t))
    kl: Float[Tensor, "seq pos"]  # KL_t = KL(p(·|x_≤t) ‖ P_θ(·|x_≤t))
    cross_entropy: Float[Tensor, "seq pos"]  # CE_t = −Σ p log P_θ
    nll_model: Float[Tensor, "seq pos"]  # −log P_θ(x_{t+1} | x_≤t) at the token that came
    nll_true: Float[Tensor, "seq pos"]  # −log p(x_{t+1} | x_≤t) at the token that came


def decompose(logits: Float[Tensor, "seq pos vocab"], held_out: HeldOut) -> Decomposition:
    """Both measurements of CE = H + KL at every held-out prefix."""
    q = torch.softmax(logits, dim=-1)
    target = held_out.tokens[:, 1:, None]
    return Decomposition(
        entropy=entropy(held_out.p),
        kl=kl(held_out.p, q),
        cross_entropy=cross_entropy(held_out.p, q),
        nll_model=-torch.log_softmax(logits, dim=-1).gather(-1, target)[..., 0],
        nll_true=-held_out.p.gather(-1, target)[..., 0].log(),
    )


def paired_mean_se(values: Float[Tensor, "seq pos"]) -> tuple[float, float]:
    """Mean over prefixes, and its standard error from the per-sequence means (tokens of one sequence are
    correlated, sequences are independent)."""
    per_sequence = values.mean(dim=1)
    n = per_sequence.shape[0]
    se = float(per_sequence.std(correction=1) / math.sqrt(n)) if n > 1 else math.nan
    return float(values.mean()), se


def z_score(difference: float, se: float) -> float:
    return difference / se if se > 0 else (0.0 if difference == 0 else math.copysign(math.inf, difference))


def summarise(d: Decomposition, region: slice = slice(None)) -> dict[str, float]:
    """Means over the prefixes of `region` (positions t), exact and sampled — the exact H and KL with their standard
    errors over the held-out sequences (`entropy_se`, `kl_se`: how far another held-out draw could move them) —,
    with two checks that could fail:

    * the sampled CE, −log P_θ at the token that came from the model's own log-softmax, against the exact
      CE_t = H_t + KL_t from the source's conditionals and the model's softmax: E[−log P_θ(x_{t+1})|x_≤t] = CE_t,
      so their paired difference has mean 0 (`sampled_ce_minus_exact_in_se`);
    * the sampled KL̂ = mean(−log P_θ + log p) against the exact KL (`sampled_minus_exact_in_se`).
    Both paths share only the held-out tokens: a model read at the wrong position, conditionals that are not
    the sampler's, or a wrong log-softmax moves them apart.
    """
    entropy, kl_t, ce = d.entropy[:, region], d.kl[:, region], d.cross_entropy[:, region]
    nll_model, nll_true = d.nll_model[:, region], d.nll_true[:, region]
    exact_kl, kl_se = paired_mean_se(kl_t)
    exact_entropy, entropy_se = paired_mean_se(entropy)
    exact_ce = float(ce.mean())
    sampled_kl, se = paired_mean_se(nll_model - nll_true)
    ce_gap, ce_se = paired_mean_se(nll_model - (entropy + kl_t))
    return {
        "prefixes": int(entropy.numel()),
        "cross_entropy_nats": exact_ce,
        "entropy_nats": exact_entropy,
        "kl_nats": exact_kl,
        "entropy_se": entropy_se,
        "kl_se": kl_se,
        "sampled_cross_entropy_nats": float(nll_model.mean()),
        "sampled_entropy_nats": float(nll_true.mean()),
        "sampled_kl_nats": sampled_kl,
        "sampled_kl_se": se,
        "sampled_minus_exact_in_se": z_score(sampled_kl - exact_kl, se),
        "sampled_ce_minus_exact_nats": ce_gap,
        "sampled_ce_se": ce_se,
        "sampled_ce_minus_exact_in_se": z_score(ce_gap, ce_se),
    }


def summarise_regions(d: Decomposition, held_out: HeldOut) -> dict[str, Any]:
    """`summarise` over every region of the held-out prefixes ("all", "complete", "first"), each with the
    prefix lengths it covers."""
    length = d.entropy.shape[1]
    out = {}
    for name, region in held_out.regions().items():
        start, stop, _ = region.indices(length)
        if stop > start:
            out[name] = summarise(d, region) | {"prefix_lengths": [start + 1, stop]}
    return out


def entropy_rate_check(entropy: Float[Tensor, "seq pos"], rate: float, complete_from: int) -> dict[str, Any]:
    """The closed-form entropy rate Σ_c π(c)·H(p(·|c)) against the mean of H_t over the held-out prefixes with
    a complete context, which start π-distributed: E[H_t] = rate exactly there. Two computations that share
    nothing but the chain (π by power iteration and the transition rows, against the sampler and
    `conditionals`); the check passes when they agree within 3 standard errors of the sample mean."""
    mean, se = paired_mean_se(entropy[:, complete_from:])
    z = z_score(mean - rate, se)
    return {
        "entropy_rate_nats": rate,
        "mean_complete_context_entropy_nats": mean,
        "se": se,
        "z": z,
        "within_3se": bool(abs(z) <= 3),
    }


def measure(model: HookedTransformer, held_out: HeldOut) -> dict[str, Any]:
    return summarise_regions(decompose(model_logits(model, held_out.tokens), held_out), held_out)


@torch.inference_mode()
def ground_truth_lens(model: HookedTransformer, held_out: HeldOut, batch: int = 256) -> list[dict[str, Any]]:
    """Mean KL(p ‖ P^(l)) over the held-out prefixes of every region for the logit lens at every layer's input
    and after the last layer (lab.analysis.lens.ground_truth_lens: P^(l) = softmax(LN_final(x^(l)) W_U + b_U),
    the final norm recomputed on x^(l)). `kl_nats` is over complete contexts where the source has them (else
    every position), `kl_se` its standard error over the held-out sequences."""
    model.eval()
    n_layers = model.cfg.n_layers
    regions = held_out.regions()
    headline = "complete" if "complete" in regions else "all"
    per_sequence = []  # [layer, sequence, position] in chunks
    for i in range(0, len(held_out.tokens), batch):
        # p covers the prefixes that end before the last token: the lens of those prefixes, the last one dropped.
        lens = lens_against_truth(model, held_out.tokens[i : i + batch, :-1], held_out.p[i : i + batch])
        per_sequence.append(lens.kl_nats.double())
    kl_t = torch.cat(per_sequence, dim=1)
    per_position = kl_t.mean(dim=1)
    labels = [f"{layer}_pre" for layer in range(n_layers)] + ["final_post"]
    return [
        {
            "layer": layer,
            "label": labels[layer],
            "kl_nats": float(per_position[layer, regions[headline]].mean()),
            "kl_se": paired_mean_se(kl_t[layer][:, regions[headline]])[1],
            **{
                f"kl_{name}_nats": float(per_position[layer, region].mean())
                for name, region in regions.items()
                if per_position[layer, region].numel()
            },
        }
        for layer in range(n_layers + 1)
    ]


def kl_by_position(d: Decomposition, held_out: HeldOut) -> list[dict[str, Any]]:
    """Mean KL_t and H_t over sequences for each prefix length t + 1, and whether that prefix is a complete
    context (prefix length ≥ the chain's order)."""
    kls, hs = d.kl.mean(dim=0), d.entropy.mean(dim=0)
    start = held_out.complete_from
    return [
        {
            "prefix_length": t + 1,
            "kl_nats": float(kls[t]),
            "entropy_nats": float(hs[t]),
            "complete_context": None if start is None else t >= start,
        }
        for t in range(len(kls))
    ]


def lengths_in_words(first: int, last: int) -> str:
    """A run of prefix lengths in words, for the regions' descriptions and the headlines."""
    return f"prefix length {first}" if first == last else f"prefix lengths {first} … {last}"
