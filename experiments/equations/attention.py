"""Claims 3 and 4: scaling scores by 1/√d_k (the variance of q·k, the saturation of the softmax without it)
and the causal mask."""

import math

import einops
import torch
from jaxtyping import Float
from torch import Tensor

from experiments.equations.check import Check, all_close
from experiments.equations.seeded import F64, attention_config, capturing, seeded_attention, seeded_generator
from lab.model.attention import Attention


# ============================================================================================
# 3. Scaling by √d_k
# ============================================================================================
def check_dot_product_variance(
    d_ks: tuple[int, ...] = (16, 64, 128, 256), n_samples: int = 20000, seed: int = 0
) -> Check:
    """Vaswani et al. 2017 §3.2.1 footnote 4: q, k with independent unit-variance components give
    Var(q·k) = d_k — the reason for dividing by √d_k."""
    g = seeded_generator(seed)
    measured, intervals = [], []
    for d_k in d_ks:
        q = torch.randn(n_samples, d_k, generator=g, dtype=F64)
        k = torch.randn(n_samples, d_k, generator=g, dtype=F64)
        dot = einops.einsum(q, k, "sample d, sample d -> sample")
        measured.append(float(dot.var()) / d_k)
        # Gaussian q·k has E[(q·k)^4] = 3d² + 6d, so Var(sample variance) ≈ (2d² + 6d)/n.
        intervals.append(math.sqrt((2 + 6 / d_k) / n_samples))
    tolerance = [4 * se for se in intervals]  # 4 standard errors: a false alarm once in ~16 000 seeds
    expected = [1.0] * len(d_ks)
    return Check(
        name="dot_product_variance",
        item=3,
        equation=r"q,k\sim\mathcal N(0,I_{d_k})\;\Rightarrow\;\operatorname{Var}(q\cdot k)=d_k",
        measured=measured,
        expected=expected,
        tolerance=tolerance,
        passed=all_close(measured, expected, tolerance),
        what=[f"Var(q·k)/d_k at d_k = {d_k}" for d_k in d_ks],
        note=f"Var(q·k)/d_k by Monte Carlo ({n_samples} pairs) for d_k ∈ {list(d_ks)}; 95% intervals "
        + ", ".join(f"{m:.3f} ± {1.96 * se:.3f}" for m, se in zip(measured, intervals)),
    )


def _model_scores(attention: Attention, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The model's masked, scaled scores and pattern, with its q and k, for input x."""
    with (
        torch.no_grad(),
        capturing(attention.hook_q, attention.hook_k, attention.hook_attn_scores, attention.hook_pattern) as seen,
    ):
        attention(x)
    q, k, scores, pattern = seen
    return q, k, scores, pattern


def _unit_attention(d_k: int, n_ctx: int, attention: Attention | None, seed: int) -> Attention:
    """One head with W_Q = I and W_K a random rotation: q = x, k = xQ, so for independent unit-variance rows
    of x, q_i and k_j (i ≠ j) are independent with unit-variance components."""
    attention = attention if attention is not None else seeded_attention(attention_config(d_k, 1, n_ctx), seed)
    g = seeded_generator(seed)
    rotation, _ = torch.linalg.qr(torch.randn(d_k, d_k, generator=g, dtype=F64))
    with torch.no_grad():
        attention.W_Q.copy_(torch.eye(d_k)[None])
        attention.W_K.copy_(rotation.float()[None])
        attention.W_V.copy_(torch.eye(d_k)[None])
        attention.W_O.copy_(torch.eye(d_k)[None])
    return attention


def check_attention_scaling(
    attention: Attention | None = None, d_k: int = 128, n_samples: int = 20000, seed: int = 0
) -> Check:
    """The model's scores q·k/√d_k have unit variance when q and k have unit-variance components.

    `attention`: an Attention with d_model = d_head = d_k, one head and n_ctx ≥ 2 (its weights are set here).
    """
    attention = _unit_attention(d_k, 2, attention, seed)
    x = torch.randn(n_samples, 2, d_k, generator=seeded_generator(seed + 1))
    _, _, scores, _ = _model_scores(attention, x)
    sample = scores[:, 0, 1, 0].to(F64)  # query 1 reads key 0: one independent q·k per sequence
    measured = float(sample.var())
    se = math.sqrt((2 + 6 / d_k) / n_samples)
    return Check(
        name="attention_scaling",
        item=3,
        equation=r"\operatorname{Var}\!\left(\frac{q\cdot k}{\sqrt{d_k}}\right)=1",
        measured=measured,
        expected=1.0,
        tolerance=4 * se,
        passed=abs(measured - 1.0) <= 4 * se,
        what=["Var(q·k/√d_k) of the scores Forma's Attention computes"],
        note=f"variance of the scores Forma's Attention computes (hook_attn_scores, d_k = {d_k}, {n_samples} "
        f"samples; 95% interval ± {1.96 * se:.3f}, pass within 4 standard errors); without the 1/√d_k it "
        f"would be {d_k}",
    )


def _entropy_nats(probs: Tensor) -> Tensor:
    return -(probs * probs.clamp_min(1e-300).log()).sum(-1)


def softmax_jacobian_norm(probs: Float[Tensor, "... n"]) -> Float[Tensor, "..."]:
    """‖∂softmax(s)/∂s‖_F from p = softmax(s): the Jacobian is diag(p) − p pᵀ, whose squared Frobenius norm is
    Σp² − 2Σp³ + (Σp²)². It vanishes as p approaches one-hot — the saturation."""
    squares = probs.pow(2).sum(-1)
    return (squares - 2 * probs.pow(3).sum(-1) + squares.pow(2)).clamp_min(0).sqrt()


VANISHED = 0.01  # a row whose softmax Jacobian has Frobenius norm below this passes back almost no gradient


def softmax_saturation(
    attention: Attention | None = None, d_k: int = 128, n_keys: int = 64, batch: int = 256, seed: int = 0
) -> dict[str, float]:
    """Entropy and Jacobian norm of the last query's softmax over n_keys keys: the model's (scaled) pattern
    against softmax of the raw q·k, both from the same q and k."""
    attention = _unit_attention(d_k, n_keys, attention, seed)
    x = torch.randn(batch, n_keys, d_k, generator=seeded_generator(seed + 2))
    q, k, _, pattern = _model_scores(attention, x)
    raw = einops.einsum(q[:, -1, 0].to(F64), k[:, :, 0].to(F64), "batch d, batch key d -> batch key")
    scaled = pattern[:, 0, -1].to(F64)  # the model's softmax(q k / √d_k) for the last query
    unscaled = raw.softmax(-1)
    stats = {}
    for name, probs in (("scaled", scaled), ("unscaled", unscaled)):
        jacobian = softmax_jacobian_norm(probs)
        stats |= {
            f"entropy_{name}": float(_entropy_nats(probs).mean()),
            f"jacobian_mean_{name}": float(jacobian.mean()),
            f"jacobian_median_{name}": float(jacobian.median()),
            f"vanished_{name}": float((jacobian < VANISHED).to(F64).mean()),
            f"max_weight_{name}": float(probs.max(-1).values.mean()),
        }
    return stats


def check_softmax_saturation(
    attention: Attention | None = None, d_k: int = 128, n_keys: int = 64, batch: int = 256, seed: int = 0
) -> Check:
    """Vaswani et al. 2017 §3.2.1: unscaled dot products "push the softmax function into regions where it has
    extremely small gradients". With the scaling, logits have unit variance and H ≈ log n − ½ (second order
    in σ²); without, H → 0 and a share of queries pass back no gradient at all."""
    s = softmax_saturation(attention, d_k, n_keys, batch, seed)
    measured = [s["entropy_scaled"], s["entropy_unscaled"], s["vanished_scaled"], s["vanished_unscaled"]]
    expected = [math.log(n_keys) - 0.5, 0.0, 0.0]
    tolerance = [0.25 * math.log(n_keys)] * 2 + [0.01]
    saturates = s["vanished_unscaled"] >= 0.1
    return Check(
        name="softmax_saturation",
        item=3,
        equation=r"H\!\left(\mathrm{softmax}\tfrac{qK^\top}{\sqrt{d_k}}\right)\approx\log n-\tfrac12"
        r"\quad\text{vs}\quad H\!\left(\mathrm{softmax}\,qK^\top\right)\to0,\;"
        r"\Bigl\lVert\tfrac{\partial\,\mathrm{softmax}}{\partial s}\Bigr\rVert_F\to0",
        measured=measured,
        expected=expected + [0.1],
        tolerance=tolerance + [0.0],
        passed=all_close(measured[:3], expected, tolerance) and saturates,
        what=[
            "entropy with 1/√d_k (nats)",
            "entropy without it (nats)",
            "share of vanished gradients with it",
            "share of vanished gradients without it",
        ],
        rules=["within", "within", "within", "at least"],
        note=f"[entropy with √d_k (the model's pattern), without, share of queries whose softmax Jacobian "
        f"‖diag p − ppᵀ‖_F < {VANISHED} with, without]; d_k = {d_k}, last query over {n_keys} keys, {batch} "
        f"sequences, entropies in nats. Pass: entropies within {tolerance[0]:.2f} nats of log n − ½ and 0, "
        f"no vanished gradient with the scaling, at least 10% without (the last entry is a lower bound). "
        f"Median ‖J‖_F "
        f"{s['jacobian_median_scaled']:.3f} with vs {s['jacobian_median_unscaled']:.3f} without; the mean "
        f"moves less ({s['jacobian_mean_scaled']:.3f} vs {s['jacobian_mean_unscaled']:.3f}) because near-ties "
        f"keep some rows' gradient alive; mean top weight {s['max_weight_scaled']:.2f} vs "
        f"{s['max_weight_unscaled']:.2f}",
    )


# ============================================================================================
# 4. The causal mask
# ============================================================================================
class ReversedMaskAttention(Attention):
    """The mask one seed writes: M_ij = 0 for i ≤ j, so query i reads keys j ≥ i — itself and the future.

    Only the explicit path reads `_causal_mask`; ask for the pattern (a hook) to run it.
    """

    def _causal_mask(self, q_len: int, k_len: int, offset: int, device: torch.device) -> Tensor:
        i = torch.arange(q_len, device=device)[:, None] + offset
        j = torch.arange(k_len, device=device)[None, :]
        return j >= i


def _mask_probe(attention: Attention, x: Tensor, position: int, seed: int) -> dict[str, float]:
    """Pattern mass above/below the diagonal, and how much outputs before `position` move when x[position] does."""
    _, _, _, pattern = _model_scores(attention, x)  # the explicit path: a hook wants the pattern
    n = x.shape[1]
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    nudged = x.clone()
    nudged[:, position] += torch.randn(x.shape[0], x.shape[2], generator=seeded_generator(seed))
    with torch.no_grad(), capturing(attention.hook_pattern):  # explicit path on both inputs
        before, after = attention(x), attention(nudged)
    return {
        "future_weight_max": float(pattern.masked_fill(~(j > i), 0).max()),
        "past_mass_mean": float(pattern.masked_fill(~(j < i), 0).sum(-1)[..., 1:].mean()),
        "future_mass_mean": float(pattern.masked_fill(~(j > i), 0).sum(-1)[..., :-1].mean()),
        "last_self_weight": float(pattern[..., -1, -1].mean()),
        "leak_from_future": float((after[:, :position] - before[:, :position]).abs().max()),
    }


def check_causal_mask(attention: Attention | None = None, n_pos: int = 12, seed: int = 0) -> Check:
    """A = softmax(qkᵀ/√d + M), M_ij = −∞ for j > i: future keys get weight exactly zero, so changing a later
    token cannot change an earlier output; the explicit path (Forma's mask) agrees with the fused one."""
    attention = attention if attention is not None else seeded_attention(attention_config(32, 4, n_pos), seed)
    x = torch.randn(3, n_pos, attention.W_Q.shape[1], generator=seeded_generator(seed))
    probe = _mask_probe(attention, x, n_pos // 2, seed + 1)
    with torch.no_grad(), capturing(attention.hook_pattern):
        explicit = attention(x)
    with torch.no_grad():
        fused = attention(x)  # no hook wants the pattern: scaled_dot_product_attention(is_causal=True)
    agreement = float((explicit - fused).abs().max())
    measured = [probe["future_weight_max"], probe["leak_from_future"], agreement]
    tolerance = [0.0, 1e-6, 1e-5]
    return Check(
        name="causal_mask",
        item=4,
        equation=r"A=\mathrm{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}}+M\right),\;M_{ij}=\begin{cases}0&j\le i\\"
        r"-\infty&j>i\end{cases}",
        measured=measured,
        expected=[0.0, 0.0, 0.0],
        tolerance=tolerance,
        passed=all_close(measured, [0.0, 0.0, 0.0], tolerance),
        what=["largest weight on a future key", "largest change of earlier outputs", "largest |explicit − fused|"],
        note=f"[max attention weight on a future key, max change of outputs before position {n_pos // 2} when "
        f"its input changes, max |explicit − fused|] for Forma's Attention ({n_pos} positions, 4 heads); "
        f"mean mass on past keys {probe['past_mass_mean']:.2f}",
    )


def check_reversed_mask(n_pos: int = 12, seed: int = 0) -> Check:
    """The reversed inequality (M_ij = 0 for i ≤ j) run through the same Attention: it hides the past."""
    correct = seeded_attention(attention_config(32, 4, n_pos), seed)
    reversed_ = seeded_attention(attention_config(32, 4, n_pos), seed, ReversedMaskAttention)
    reversed_.load_state_dict(correct.state_dict())
    x = torch.randn(3, n_pos, 32, generator=seeded_generator(seed))
    probe = _mask_probe(reversed_, x, n_pos // 2, seed + 1)
    measured = [probe["past_mass_mean"], probe["last_self_weight"]]
    expected = [0.0, 1.0]
    tolerance = [0.0, 1e-6]
    leaks = probe["leak_from_future"] > 1e-3
    return Check(
        name="reversed_mask_hides_past",
        item=4,
        equation=r"M_{ij}=0\text{ for }i\le j\;\Rightarrow\;A_{ij}=0\text{ for }j<i",
        measured=measured,
        expected=expected,
        tolerance=tolerance,
        passed=all_close(measured, expected, tolerance) and leaks,
        what=["mean attention mass on past keys", "weight of the last query on itself"],
        note=f"[mean attention mass on past keys, weight of the last query on itself] with the reversed mask: "
        f"every query sees only itself and the future (mean future mass {probe['future_mass_mean']:.2f}), "
        f"the last token sees nothing but itself, and changing token {n_pos // 2} moves earlier outputs by "
        f"{probe['leak_from_future']:.3f} (pass needs > 1e-3): the model would read the answer it must predict",
    )
