"""Claim 12: perplexity = exp(mean cross-entropy), and the KL identity H(p, q) = H(p) + KL(p‖q)."""

import math
from collections.abc import Callable

import torch
from torch import Tensor

from experiments.equations.check import Check, all_close
from experiments.equations.kv_cache import kv_model
from experiments.equations.seeded import F64, seeded_generator
from lab.metrics.information import entropy, kl


# ============================================================================================
# 12. Perplexity and the KL identity
# ============================================================================================
def check_perplexity(seed: int = 0) -> Check:
    """PPL = exp(mean CE) = (Π_t 1/P(x_t | x_<t))^(1/N): Forma's loss against the geometric mean of inverse
    probabilities (a product, not a sum of logs); a model with constant logits has PPL = |V| exactly."""
    model = kv_model(64, seed)
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 20), generator=seeded_generator(seed))
    with torch.no_grad():
        loss = float(model.loss(tokens))
        probs = model(tokens).to(F64).softmax(-1)[:, :-1].gather(-1, tokens[:, 1:, None]).flatten()
        geometric = float(torch.prod(1 / probs) ** (1 / len(probs)))  # ≈ 100^38: well inside float64
        uniform = kv_model(64, seed)
        uniform.unembed.W_U.zero_()
        uniform.unembed.b_U.zero_()
        uniform_ppl = math.exp(float(uniform.loss(tokens)))
    d_vocab = model.cfg.d_vocab
    measured = [math.exp(loss), uniform_ppl]
    expected = [geometric, float(d_vocab)]
    tolerance = [1e-5 * e for e in expected]
    return Check(
        name="perplexity",
        item=12,
        equation=r"\mathrm{PPL}=\exp\Bigl(-\tfrac1N\sum_t\log P(x_t\mid x_{<t})\Bigr)"
        r"=\Bigl(\prod_t\frac1{P(x_t\mid x_{<t})}\Bigr)^{1/N}",
        measured=measured,
        expected=expected,
        tolerance=tolerance,
        passed=all_close(measured, expected, tolerance),
        what=["exp(model.loss)", "exp(loss) with constant logits"],
        note=f"[exp(model.loss), exp(loss) of a model whose logits are constant] against [geometric mean of 1/P over "
        f"{len(probs)} predictions, |V| = {d_vocab}]",
    )


def check_kl_identity(
    d_vocab: int = 50,
    n_samples: int = 20000,
    seed: int = 0,
    entropy_fn: Callable[[Tensor], Tensor] = entropy,
    kl_fn: Callable[[Tensor, Tensor], Tensor] = kl,
) -> Check:
    """E_{x~p}[−log q(x)] = H(p) + KL(p‖q), measured two ways that share nothing but p and q: the right side
    exactly from Forma's `entropy` and `kl` (lab.metrics.information), the left side and both terms by
    sampling x ~ p (mean −log q(x), mean −log p(x), and KL̂ as their paired difference). Each sampled mean
    must land within 4 standard errors of its exact value. (CE − H − KL from the same terms would be 0 by
    algebra and test nothing.)"""
    g = seeded_generator(seed)
    p = -torch.rand(d_vocab, generator=g, dtype=F64).log()  # Exp(1) weights: p ~ Dirichlet(1, …, 1)
    p = p / p.sum()
    q = (1.5 * torch.randn(d_vocab, generator=g, dtype=F64)).softmax(-1)
    exact_entropy, exact_kl = float(entropy_fn(p)), float(kl_fn(p, q))
    x = torch.multinomial(p, n_samples, replacement=True, generator=g)
    nll_q, nll_p = -q[x].log(), -p[x].log()
    measured, expected, tolerance = [], [], []
    for sample, exact in ((nll_q, exact_entropy + exact_kl), (nll_p, exact_entropy), (nll_q - nll_p, exact_kl)):
        measured.append(float(sample.mean()))
        expected.append(exact)
        tolerance.append(4 * float(sample.std() / math.sqrt(n_samples)))
    return Check(
        name="kl_identity",
        item=12,
        equation=r"\mathbb E_{x\sim p}[-\log q(x)]=H(p)+\mathrm{KL}(p\,\Vert\,q)",
        measured=measured,
        expected=expected,
        tolerance=tolerance,
        passed=all_close(measured, expected, tolerance),
        what=["mean −log q(x) (nats)", "mean −log p(x) (nats)", "KL̂ (nats)"],
        note=f"p ~ Dirichlet(1) and q = softmax(1.5·N(0, I)) over {d_vocab} outcomes, {n_samples} draws x ~ p: "
        f"[mean −log q(x), mean −log p(x), KL̂] against [H + KL = {exact_entropy:.4f} + {exact_kl:.4f}, H, KL] "
        f"from lab.metrics.information; pass within 4 standard errors each "
        f"(± {', '.join(f'{t / 4 * 1.96:.4f}' for t in tolerance)} at 95%). The kl experiment makes the "
        f"same comparison on a trained model and a Markov source (`forma run kl`)",
    )
