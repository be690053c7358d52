"""lab.metrics.information on analytic cases, the identity CE = H + KL, the zero conventions, and against
torch.distributions as a peer implementation."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lab.metrics.information import cross_entropy, entropy, kl, perplexity, to_bits


@pytest.mark.parametrize("V", [2, 7, 32, 1000])
def test_uniform_entropy_is_log_V(V):
    uniform = np.full(V, 1.0 / V)
    assert entropy(uniform) == pytest.approx(math.log(V), abs=1e-12)
    assert entropy(uniform, base=2) == pytest.approx(math.log2(V), abs=1e-12)
    assert to_bits(entropy(uniform)) == pytest.approx(math.log2(V), abs=1e-12)


def test_point_mass_has_zero_entropy():
    # 0·log 0 = 0: a one-hot distribution carries no uncertainty (and no NaN).
    assert entropy([0.0, 1.0, 0.0]) == 0.0
    assert entropy(torch.tensor([[1.0, 0.0], [0.5, 0.5]], dtype=torch.float64)).tolist() == [0.0, math.log(2)]


def test_kl_of_a_distribution_with_itself_is_zero():
    p = np.random.default_rng(0).dirichlet(np.full(10, 0.3), size=5)
    np.testing.assert_allclose(kl(p, p), 0.0, atol=1e-15)


def test_two_point_kl_by_hand():
    # KL((½, ½) ‖ (¼, ¾)) = ½ log(½/¼) + ½ log(½/¾) = ½ log(4/3)
    assert kl([0.5, 0.5], [0.25, 0.75]) == pytest.approx(0.5 * math.log(4 / 3), abs=1e-15)
    assert kl([0.5, 0.5], [0.25, 0.75], base=2) == pytest.approx(0.5 * math.log2(4 / 3), abs=1e-15)
    # KL((¼, ¾) ‖ (½, ½)) = log 2 − H(¼, ¾): KL is not symmetric.
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert kl([0.25, 0.75], [0.5, 0.5]) == pytest.approx(math.log(2) - h, abs=1e-15)
    # A point mass against a fair coin: KL = log 2, and the outcome p never sees costs nothing.
    assert kl([1.0, 0.0], [0.5, 0.5]) == pytest.approx(math.log(2), abs=1e-15)


def test_cross_entropy_is_entropy_plus_kl():
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.full(50, 0.2), size=200)
    q = rng.dirichlet(np.full(50, 1.0), size=200)
    np.testing.assert_allclose(cross_entropy(p, q), entropy(p) + kl(p, q), rtol=0, atol=1e-12)
    p_t, q_t = torch.from_numpy(p), torch.from_numpy(q)
    torch.testing.assert_close(cross_entropy(p_t, q_t), entropy(p_t) + kl(p_t, q_t), rtol=0, atol=1e-12)
    assert (kl(p, q) > 0).all()


def test_perplexity_of_uniform_is_V():
    V = 32
    p = np.random.default_rng(2).dirichlet(np.full(V, 0.5), size=100)
    per_position = cross_entropy(p, np.full(V, 1.0 / V))  # −Σ p log(1/V) = log V for every p
    assert perplexity(per_position) == pytest.approx(V, rel=1e-12)
    assert perplexity(torch.tensor([math.log(3.0), math.log(12.0)])).item() == pytest.approx(6.0, rel=1e-6)


def test_zero_where_p_is_positive_is_infinite():
    assert cross_entropy([0.5, 0.5], [1.0, 0.0]) == math.inf
    assert kl([0.5, 0.5], [1.0, 0.0]) == math.inf
    # q = 0 only where p = 0 as well: finite.
    assert kl([1.0, 0.0], [1.0, 0.0]) == 0.0
    assert cross_entropy([1.0, 0.0], [1.0, 0.0]) == 0.0
    assert not np.isnan(kl(np.eye(3), np.eye(3))).any()


def test_matches_torch_distributions():
    g = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(8, 20, generator=g, dtype=torch.float64) * 2, dim=-1)
    q = torch.softmax(torch.randn(8, 20, generator=g, dtype=torch.float64), dim=-1)
    P, Q = torch.distributions.Categorical(probs=p), torch.distributions.Categorical(probs=q)
    torch.testing.assert_close(entropy(p), P.entropy(), rtol=0, atol=1e-12)
    torch.testing.assert_close(kl(p, q), torch.distributions.kl_divergence(P, Q), rtol=0, atol=1e-12)
    torch.testing.assert_close(cross_entropy(p, q), F.cross_entropy(q.log(), p, reduction="none"), rtol=0, atol=1e-12)


def test_gradient_of_cross_entropy_in_the_logits_is_softmax_minus_p():
    # ∂H(p, softmax(z))/∂z = softmax(z) − p (docs/definitions.md §4's ∂ℓ/∂z = p − onehot, with soft targets).
    p = torch.tensor([0.1, 0.6, 0.3], dtype=torch.float64)
    z = torch.tensor([0.2, -1.0, 0.5], dtype=torch.float64, requires_grad=True)
    cross_entropy(p, torch.softmax(z, dim=-1)).backward()
    torch.testing.assert_close(z.grad, torch.softmax(z.detach(), dim=-1) - p, rtol=0, atol=1e-12)


def test_kinds_dims_and_broadcasting():
    p = np.array([[0.2, 0.8], [0.5, 0.5]])
    assert isinstance(entropy(p), np.ndarray) and entropy(p).shape == (2,)
    assert isinstance(kl(torch.tensor(p), p), torch.Tensor)
    q = np.array([0.5, 0.5])  # one q against a batch of p
    np.testing.assert_allclose(kl(p, q), [kl(p[0], q), kl(p[1], q)])
    np.testing.assert_allclose(entropy(p.T, dim=0), entropy(p))


@pytest.mark.parametrize("bad", [[0.5, 0.6], [-0.1, 1.1], [math.nan, 1.0], [0.5, 0.25]])
def test_rejects_what_is_not_a_distribution(bad):
    with pytest.raises(ValueError):
        entropy(bad)
    with pytest.raises(ValueError):
        kl([0.5, 0.5], bad)


def test_rejects_mismatched_outcomes_and_bad_base():
    with pytest.raises(ValueError, match="outcomes"):
        kl([0.5, 0.5], [1 / 3, 1 / 3, 1 / 3])
    with pytest.raises(ValueError, match="base"):
        entropy([0.5, 0.5], base=1)
