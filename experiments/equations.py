"""The seeds' equations, each checked by running it (issue 9; the claims are shared/SCIENCE.md §4).

Every check is a computation with Forma's own implementation where one exists — `sinusoidal_table`,
`Rotary`, `Attention` (its mask and its 1/√d_k), `next_token_loss`, `ModelConfig.n_params` against a
meta-device `HookedTransformer`, `sample_next`, `filter_logits`, `decode` with and without the KV
cache — compared with what the equation predicts. A check returns

    {name, item, equation (LaTeX), measured, expected, tolerance, passed, note, seconds, timing}

where `item` is the claim's number in issue 9 and `note` states the pass rule when it is not
|measured − expected| ≤ tolerance. `seconds` and `timing` (wall times measured alongside, never gated) are
the only fields that differ between two runs with one seed (lab.runs.TIMING_FIELDS); every least-squares
fit uses the SVD driver gelsd, because MKL's default gelsy (QR with column pivoting) gives different
solutions for one input from call to call. The implementation a check tests is a parameter (`attention=`,
`filter_fn=`, `formula=`, …), so a test can hand it a wrong one — the mask written j ≥ i, no √d_k, a
nucleus one token too wide — and see that check fail.

Artefacts in `out`: universal_approximation.html (sup error against width, and the fits) and
softmax_saturation.html (attention entropy against d_k, with and without the scaling).
"""

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import einops
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode
from transformer_lens.hook_points import HookPoint

from lab.configs import check_fields
from lab.generate import decode, filter_logits, sample_next
from lab.model import HookedTransformer, KVCache, KVCacheEntry, ModelConfig, next_token_loss
from lab.model.components import ACTIVATIONS, Attention, Rotary, sinusoidal_table
from lab.metrics.information import entropy, kl
from lab.runs import save_figure

F64 = torch.float64


@dataclass
class Config:
    """The equations experiment: everything is seeded; `quick` shrinks the Monte Carlo samples and timings."""

    seed: int = 0
    quick: bool = False

    def __post_init__(self) -> None:
        check_fields(self)
        if self.seed < 0:
            raise ValueError(f"Config.seed must be a non-negative integer, got {self.seed!r}")


@dataclass
class Check:
    """One claim, computed: the equation, what we measured, what the equation predicts, and the verdict."""

    name: str
    item: int  # the claim's number in issue 9
    equation: str  # LaTeX, for st.latex
    measured: float | list[float]
    expected: float | list[float]
    tolerance: float | list[float]
    passed: bool
    note: str
    seconds: float = 0.0
    timing: dict[str, list[float]] = field(default_factory=dict)  # wall times beside the check, never gated


def _close(measured: list[float], expected: list[float], tolerance: list[float]) -> bool:
    return all(abs(m - e) <= t for m, e, t in zip(measured, expected, tolerance, strict=True))


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@contextmanager
def _capturing(*points: HookPoint) -> Iterator[list[Tensor]]:
    """Record what each HookPoint carries during the block (one slot per point); hooks removed in finally."""
    seen: list[Tensor] = [torch.empty(0)] * len(points)

    def recorder(slot: int) -> Callable[[Tensor, HookPoint], None]:
        def record(activation: Tensor, hook: HookPoint) -> None:
            seen[slot] = activation.detach().clone()

        return record

    try:
        for slot, point in enumerate(points):
            point.add_hook(recorder(slot))
        yield seen
    finally:
        for point in points:
            point.remove_hooks("fwd")


def _seeded_attention(cfg: ModelConfig, seed: int, cls: type[Attention] = Attention) -> Attention:
    """An Attention whose initial weights come from `seed`: modules draw from torch's global generator, whose
    seed is random per process, so an unseeded one would change every run. The caller's generator is kept."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return cls(cfg)


def _attention_config(d_model: int, n_heads: int, n_ctx: int) -> ModelConfig:
    # init_std = 1/√d_model gives q and k components of order one, so patterns are far from uniform.
    return ModelConfig(d_vocab=2, d_model=d_model, n_layers=1, n_heads=n_heads, n_ctx=n_ctx, bias=False,
                       init_std=d_model ** -0.5)


# ============================================================================================
# 1. Sinusoidal positions: PE(pos + k) is a fixed rotation of PE(pos)
# ============================================================================================
def check_sinusoidal_shift(table_fn: Callable[[int, int], Tensor] = sinusoidal_table, d_model: int = 512,
                           n_ctx: int = 2048, base: float = 10000.0) -> Check:
    """Vaswani et al. 2017 §3.5: for each frequency pair, (sin, cos)((pos + k)ω_i) = R_k(ω_i)·(sin, cos)(pos ω_i)
    with R_k built from the equation's ω_i = base^(−2i/d) alone — the same matrix for every pos."""
    table = table_fn(n_ctx, d_model).to(F64)
    pairs = einops.rearrange(table, "pos (pair two) -> pos pair two", two=2)  # (sin, cos) per frequency
    omega = base ** (-torch.arange(0, d_model, 2, dtype=F64) / d_model)
    shifts = sorted({k for k in (1, 2, 7, 50, 333, 1000) if k < n_ctx} | {n_ctx // 2})
    errors = []
    for k in shifts:
        c, s = torch.cos(k * omega), torch.sin(k * omega)
        rotation = torch.stack((torch.stack((c, s), -1), torch.stack((-s, c), -1)), -2)  # [pair, out, in]
        predicted = einops.einsum(rotation, pairs[:-k], "pair out inp, pos pair inp -> pos pair out")
        errors.append(float((pairs[k:] - predicted).abs().max()))
    worst = max(errors)
    tolerance = 1e-5  # the table is stored in float32 (≈ 6e-8 relative), rotated here in float64
    return Check(
        name="sinusoidal_shift_is_rotation", item=1,
        equation=r"\begin{pmatrix}PE_{pos+k,2i}\\PE_{pos+k,2i+1}\end{pmatrix}="
                 r"\begin{pmatrix}\cos k\omega_i&\sin k\omega_i\\"
                 r"-\sin k\omega_i&\cos k\omega_i\end{pmatrix}\begin{pmatrix}PE_{pos,2i}\\PE_{pos,2i+1}\end{pmatrix},"
                 r"\;\omega_i=10000^{-2i/d}",
        measured=worst, expected=0.0, tolerance=tolerance, passed=worst <= tolerance,
        note=f"max |PE(pos+k) − R_k PE(pos)| over pos < {n_ctx} − k, every pair, k ∈ {shifts}, d = {d_model}; "
             f"per-shift max errors {[f'{e:.1e}' for e in errors]}")


def check_sinusoidal_wavelengths(table_fn: Callable[[int, int], Tensor] = sinusoidal_table, d_model: int = 512,
                                 base: float = 10000.0) -> Check:
    """The wavelengths read off the table (ω_i = atan2(PE[1, 2i], PE[1, 2i+1])) form a geometric series from 2π
    to 2π·base^((d−2)/d) — the seed's "2π … 10000·2π", whose top end is approached, not reached."""
    table = table_fn(2, d_model).to(F64)
    omega = torch.atan2(table[1, 0::2], table[1, 1::2])  # PE[1] = (sin ω_i, cos ω_i); ω_i ∈ (0, 1]
    wavelength = 2 * math.pi / omega
    ratios = wavelength[1:] / wavelength[:-1]
    measured = [float(wavelength.min()), float(wavelength.max()), float(ratios.max() / ratios.min())]
    expected = [2 * math.pi, 2 * math.pi * base ** ((d_model - 2) / d_model), 1.0]
    tolerance = [1e-4 * e for e in expected]
    return Check(
        name="sinusoidal_wavelengths", item=1,
        equation=r"\lambda_i=\frac{2\pi}{\omega_i}=2\pi\cdot10000^{2i/d}\in[2\pi,\;10000\cdot2\pi)",
        measured=measured, expected=expected, tolerance=tolerance, passed=_close(measured, expected, tolerance),
        note=f"[shortest, longest wavelength, max/min ratio of consecutive wavelengths] measured from the table "
             f"(d = {d_model}); a geometric series has a constant ratio ({float(ratios.mean()):.5f}); "
             f"the longest is {expected[1] / (2 * math.pi):.0f}·2π")


# ============================================================================================
# 2. Rotary: ⟨R_m q, R_n k⟩ depends on n − m only
# ============================================================================================
def check_rotary_relative(rotary_cls: Callable[[ModelConfig], nn.Module] = Rotary, d_head: int = 64,
                          n_ctx: int = 256, seed: int = 0) -> Check:
    """Su et al. 2021 (RoFormer) §3.4.2: rotating q to m and k to n makes their product a function of n − m."""
    cfg = ModelConfig(d_vocab=2, d_model=d_head, n_layers=1, n_heads=1, n_ctx=n_ctx, positions="rotary")
    rotary = rotary_cls(cfg)
    q, k = torch.randn(2, d_head, generator=_generator(seed))
    with torch.no_grad():  # Forma's rotary on the same vector at every position: R_m q for m < n_ctx
        rotated_q = rotary(q.expand(1, n_ctx, 1, d_head), 0)[0, :, 0].to(F64)
        rotated_k = rotary(k.expand(1, n_ctx, 1, d_head), 0)[0, :, 0].to(F64)
    scores = einops.einsum(rotated_q, rotated_k, "m d, n d -> m n")  # ⟨R_m q, R_n k⟩
    scale = float(q.norm() * k.norm())
    deviation, by_shift = 0.0, []
    for shift in range(-(n_ctx - 1), n_ctx):
        diagonal = torch.diagonal(scores, offset=shift)  # every (m, n) with n − m = shift
        deviation = max(deviation, float(diagonal.max() - diagonal.min()) / scale)
        by_shift.append(float(diagonal.mean()) / scale)
    spread = max(by_shift) - min(by_shift)  # the product does change with n − m: not a constant
    tolerance = 1e-5
    return Check(
        name="rotary_relative_position", item=2,
        equation=r"\langle R_m q,\,R_n k\rangle=\langle q,\,R_{n-m}k\rangle=g(q,k,n-m)",
        measured=deviation, expected=0.0, tolerance=tolerance, passed=deviation <= tolerance and spread > 0.1,
        note=f"max over n − m of the spread of ⟨R_m q, R_n k⟩ along that diagonal, relative to |q||k| "
             f"(d_head = {d_head}, {n_ctx} positions); across different n − m the product varies by "
             f"{spread:.2f}·|q||k| (must exceed 0.1: a rotary that ignored position would pass trivially)")


# ============================================================================================
# 3. Scaling by √d_k
# ============================================================================================
def check_dot_product_variance(d_ks: tuple[int, ...] = (16, 64, 128, 256), n_samples: int = 20000,
                               seed: int = 0) -> Check:
    """Vaswani et al. 2017 §3.2.1 footnote 4: q, k with independent unit-variance components give
    Var(q·k) = d_k — the reason for dividing by √d_k."""
    g = _generator(seed)
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
        name="dot_product_variance", item=3,
        equation=r"q,k\sim\mathcal N(0,I_{d_k})\;\Rightarrow\;\operatorname{Var}(q\cdot k)=d_k",
        measured=measured, expected=expected, tolerance=tolerance, passed=_close(measured, expected, tolerance),
        note=f"Var(q·k)/d_k by Monte Carlo ({n_samples} pairs) for d_k ∈ {list(d_ks)}; 95% intervals "
             + ", ".join(f"{m:.3f} ± {1.96 * se:.3f}" for m, se in zip(measured, intervals)))


def _model_scores(attention: Attention, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The model's masked, scaled scores and pattern, with its q and k, for input x."""
    with torch.no_grad(), _capturing(attention.hook_q, attention.hook_k, attention.hook_attn_scores,
                                     attention.hook_pattern) as seen:
        attention(x)
    q, k, scores, pattern = seen
    return q, k, scores, pattern


def _unit_attention(d_k: int, n_ctx: int, attention: Attention | None, seed: int) -> Attention:
    """One head with W_Q = I and W_K a random rotation: q = x, k = xQ, so for independent unit-variance rows
    of x, q_i and k_j (i ≠ j) are independent with unit-variance components."""
    attention = attention if attention is not None else _seeded_attention(_attention_config(d_k, 1, n_ctx), seed)
    g = _generator(seed)
    rotation, _ = torch.linalg.qr(torch.randn(d_k, d_k, generator=g, dtype=F64))
    with torch.no_grad():
        attention.W_Q.copy_(torch.eye(d_k)[None])
        attention.W_K.copy_(rotation.float()[None])
        attention.W_V.copy_(torch.eye(d_k)[None])
        attention.W_O.copy_(torch.eye(d_k)[None])
    return attention


def check_attention_scaling(attention: Attention | None = None, d_k: int = 128, n_samples: int = 20000,
                            seed: int = 0) -> Check:
    """The model's scores q·k/√d_k have unit variance when q and k have unit-variance components.

    `attention`: an Attention with d_model = d_head = d_k, one head and n_ctx ≥ 2 (its weights are set here).
    """
    attention = _unit_attention(d_k, 2, attention, seed)
    x = torch.randn(n_samples, 2, d_k, generator=_generator(seed + 1))
    _, _, scores, _ = _model_scores(attention, x)
    sample = scores[:, 0, 1, 0].to(F64)  # query 1 reads key 0: one independent q·k per sequence
    measured = float(sample.var())
    se = math.sqrt((2 + 6 / d_k) / n_samples)
    return Check(
        name="attention_scaling", item=3,
        equation=r"\operatorname{Var}\!\left(\frac{q\cdot k}{\sqrt{d_k}}\right)=1",
        measured=measured, expected=1.0, tolerance=4 * se, passed=abs(measured - 1.0) <= 4 * se,
        note=f"variance of the scores Forma's Attention computes (hook_attn_scores, d_k = {d_k}, {n_samples} "
             f"samples; 95% interval ± {1.96 * se:.3f}, pass within 4 standard errors); without the 1/√d_k it "
             f"would be {d_k}")


def _entropy_nats(probs: Tensor) -> Tensor:
    return -(probs * probs.clamp_min(1e-300).log()).sum(-1)


def softmax_jacobian_norm(probs: Float[Tensor, "... n"]) -> Float[Tensor, "..."]:
    """‖∂softmax(s)/∂s‖_F from p = softmax(s): the Jacobian is diag(p) − p pᵀ, whose squared Frobenius norm is
    Σp² − 2Σp³ + (Σp²)². It vanishes as p approaches one-hot — the saturation."""
    squares = probs.pow(2).sum(-1)
    return (squares - 2 * probs.pow(3).sum(-1) + squares.pow(2)).clamp_min(0).sqrt()


VANISHED = 0.01  # a row whose softmax Jacobian has Frobenius norm below this passes back almost no gradient


def softmax_saturation(attention: Attention | None = None, d_k: int = 128, n_keys: int = 64, batch: int = 256,
                       seed: int = 0) -> dict[str, float]:
    """Entropy and Jacobian norm of the last query's softmax over n_keys keys: the model's (scaled) pattern
    against softmax of the raw q·k, both from the same q and k."""
    attention = _unit_attention(d_k, n_keys, attention, seed)
    x = torch.randn(batch, n_keys, d_k, generator=_generator(seed + 2))
    q, k, _, pattern = _model_scores(attention, x)
    raw = einops.einsum(q[:, -1, 0].to(F64), k[:, :, 0].to(F64), "batch d, batch key d -> batch key")
    scaled = pattern[:, 0, -1].to(F64)  # the model's softmax(q k / √d_k) for the last query
    unscaled = raw.softmax(-1)
    stats = {}
    for name, probs in (("scaled", scaled), ("unscaled", unscaled)):
        jacobian = softmax_jacobian_norm(probs)
        stats |= {f"entropy_{name}": float(_entropy_nats(probs).mean()),
                  f"jacobian_mean_{name}": float(jacobian.mean()),
                  f"jacobian_median_{name}": float(jacobian.median()),
                  f"vanished_{name}": float((jacobian < VANISHED).to(F64).mean()),
                  f"max_weight_{name}": float(probs.max(-1).values.mean())}
    return stats


def check_softmax_saturation(attention: Attention | None = None, d_k: int = 128, n_keys: int = 64,
                             batch: int = 256, seed: int = 0) -> Check:
    """Vaswani et al. 2017 §3.2.1: unscaled dot products "push the softmax function into regions where it has
    extremely small gradients". With the scaling, logits have unit variance and H ≈ log n − ½ (second order
    in σ²); without, H → 0 and a share of queries pass back no gradient at all."""
    s = softmax_saturation(attention, d_k, n_keys, batch, seed)
    measured = [s["entropy_scaled"], s["entropy_unscaled"], s["vanished_scaled"], s["vanished_unscaled"]]
    expected = [math.log(n_keys) - 0.5, 0.0, 0.0]
    tolerance = [0.25 * math.log(n_keys)] * 2 + [0.01]
    saturates = s["vanished_unscaled"] >= 0.1
    return Check(
        name="softmax_saturation", item=3,
        equation=r"H\!\left(\mathrm{softmax}\tfrac{qK^\top}{\sqrt{d_k}}\right)\approx\log n-\tfrac12"
                 r"\quad\text{vs}\quad H\!\left(\mathrm{softmax}\,qK^\top\right)\to0,\;"
                 r"\Bigl\lVert\tfrac{\partial\,\mathrm{softmax}}{\partial s}\Bigr\rVert_F\to0",
        measured=measured, expected=expected + [0.1], tolerance=tolerance + [0.0],
        passed=_close(measured[:3], expected, tolerance) and saturates,
        note=f"[entropy with √d_k (the model's pattern), without, share of queries whose softmax Jacobian "
             f"‖diag p − ppᵀ‖_F < {VANISHED} with, without]; d_k = {d_k}, last query over {n_keys} keys, {batch} "
             f"sequences, entropies in nats. Pass: entropies within {tolerance[0]:.2f} nats of log n − ½ and 0, "
             f"no vanished gradient with the scaling, at least 10% without (the last entry is a lower bound). "
             f"Median ‖J‖_F "
             f"{s['jacobian_median_scaled']:.3f} with vs {s['jacobian_median_unscaled']:.3f} without; the mean "
             f"moves less ({s['jacobian_mean_scaled']:.3f} vs {s['jacobian_mean_unscaled']:.3f}) because near-ties "
             f"keep some rows' gradient alive; mean top weight {s['max_weight_scaled']:.2f} vs "
             f"{s['max_weight_unscaled']:.2f}")


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
    nudged[:, position] += torch.randn(x.shape[0], x.shape[2], generator=_generator(seed))
    with torch.no_grad(), _capturing(attention.hook_pattern):  # explicit path on both inputs
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
    attention = attention if attention is not None else _seeded_attention(_attention_config(32, 4, n_pos), seed)
    x = torch.randn(3, n_pos, attention.W_Q.shape[1], generator=_generator(seed))
    probe = _mask_probe(attention, x, n_pos // 2, seed + 1)
    with torch.no_grad(), _capturing(attention.hook_pattern):
        explicit = attention(x)
    with torch.no_grad():
        fused = attention(x)  # no hook wants the pattern: scaled_dot_product_attention(is_causal=True)
    agreement = float((explicit - fused).abs().max())
    measured = [probe["future_weight_max"], probe["leak_from_future"], agreement]
    tolerance = [0.0, 1e-6, 1e-5]
    return Check(
        name="causal_mask", item=4,
        equation=r"A=\mathrm{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}}+M\right),\;M_{ij}=\begin{cases}0&j\le i\\"
                 r"-\infty&j>i\end{cases}",
        measured=measured, expected=[0.0, 0.0, 0.0], tolerance=tolerance,
        passed=_close(measured, [0.0, 0.0, 0.0], tolerance),
        note=f"[max attention weight on a future key, max change of outputs before position {n_pos // 2} when "
             f"its input changes, max |explicit − fused|] for Forma's Attention ({n_pos} positions, 4 heads); "
             f"mean mass on past keys {probe['past_mass_mean']:.2f}")


def check_reversed_mask(n_pos: int = 12, seed: int = 0) -> Check:
    """The reversed inequality (M_ij = 0 for i ≤ j) run through the same Attention: it hides the past."""
    correct = _seeded_attention(_attention_config(32, 4, n_pos), seed)
    reversed_ = _seeded_attention(_attention_config(32, 4, n_pos), seed, ReversedMaskAttention)
    reversed_.load_state_dict(correct.state_dict())
    x = torch.randn(3, n_pos, 32, generator=_generator(seed))
    probe = _mask_probe(reversed_, x, n_pos // 2, seed + 1)
    measured = [probe["past_mass_mean"], probe["last_self_weight"]]
    expected = [0.0, 1.0]
    tolerance = [0.0, 1e-6]
    leaks = probe["leak_from_future"] > 1e-3
    return Check(
        name="reversed_mask_hides_past", item=4,
        equation=r"M_{ij}=0\text{ for }i\le j\;\Rightarrow\;A_{ij}=0\text{ for }j<i",
        measured=measured, expected=expected, tolerance=tolerance,
        passed=_close(measured, expected, tolerance) and leaks,
        note=f"[mean attention mass on past keys, weight of the last query on itself] with the reversed mask: "
             f"every query sees only itself and the future (mean future mass {probe['future_mass_mean']:.2f}), "
             f"the last token sees nothing but itself, and changing token {n_pos // 2} moves earlier outputs by "
             f"{probe['leak_from_future']:.3f} (pass needs > 1e-3): the model would read the answer it must predict")


# ============================================================================================
# 5. Cross-entropy gradient
# ============================================================================================
def ce_gradient_formula(logits: Float[Tensor, "n d_vocab"], targets: Int[Tensor, " n"]) -> Float[Tensor, "n d_vocab"]:
    """∂ℓ/∂z = softmax(z) − onehot(y) for ℓ = −log softmax(z)_y."""
    return logits.softmax(-1) - F.one_hot(targets, logits.shape[-1]).to(logits.dtype)


def check_cross_entropy_gradient(loss_fn: Callable[[Tensor, Tensor], Tensor] = next_token_loss,
                                 formula: Callable[[Tensor, Tensor], Tensor] = ce_gradient_formula,
                                 seed: int = 0) -> Check:
    """Autograd through Forma's next-token loss against the closed form; the mean over N predictions scales
    each position's gradient by 1/N, and the last position (which predicts nothing) gets none."""
    g = _generator(seed)
    batch, pos, d_vocab = 4, 16, 50
    logits = (3 * torch.randn(batch, pos, d_vocab, generator=g)).requires_grad_()
    tokens = torch.randint(0, d_vocab, (batch, pos), generator=g)
    (autograd,) = torch.autograd.grad(loss_fn(logits, tokens), logits)
    n = batch * (pos - 1)
    predicted = torch.zeros_like(autograd)
    flat = formula(logits.detach()[:, :-1].reshape(-1, d_vocab), tokens[:, 1:].reshape(-1))
    predicted[:, :-1] = flat.reshape(batch, pos - 1, d_vocab) / n
    error = float((autograd - predicted).abs().max() * n)
    tolerance = 1e-5
    return Check(
        name="cross_entropy_gradient", item=5,
        equation=r"\frac{\partial}{\partial z}\bigl(-\log\mathrm{softmax}(z)_y\bigr)=\mathrm{softmax}(z)-e_y",
        measured=error, expected=0.0, tolerance=tolerance, passed=error <= tolerance,
        note=f"max |N·autograd − (p − onehot)| over {batch}×{pos} positions, |V| = {d_vocab}, logits with std 3 "
             f"(N = {n} predictions)")


# ============================================================================================
# 6. Composed affine layers collapse
# ============================================================================================
def _affine_stack(widths: tuple[int, ...], seed: int) -> list[nn.Linear]:
    torch.manual_seed(seed)  # nn.Linear draws from the global generator
    return [nn.Linear(a, b, dtype=F64) for a, b in zip(widths, widths[1:])]


def check_affine_collapse(widths: tuple[int, ...] = (16, 64, 48, 8), seed: int = 0) -> Check:
    """W₃(W₂(W₁x + b₁) + b₂) + b₃ = (W₃W₂W₁)x + (W₃W₂b₁ + W₃b₂ + b₃): depth adds nothing without a nonlinearity."""
    with torch.random.fork_rng(devices=[]):
        layers = _affine_stack(widths, seed)
    x = torch.randn(2000, widths[0], generator=_generator(seed), dtype=F64)
    with torch.no_grad():
        deep = x
        for layer in layers:
            deep = layer(deep)
        W, b = torch.eye(widths[0], dtype=F64), torch.zeros(widths[0], dtype=F64)
        for layer in layers:  # fold each layer into one affine map
            W, b = layer.weight @ W, layer.weight @ b + layer.bias
        error = float((deep - (x @ W.T + b)).abs().max())
    tolerance = 1e-12
    return Check(
        name="affine_collapse", item=6,
        equation=r"W_3(W_2(W_1x+b_1)+b_2)+b_3=(W_3W_2W_1)\,x+(W_3W_2b_1+W_3b_2+b_3)",
        measured=error, expected=0.0, tolerance=tolerance, passed=error <= tolerance,
        note=f"max |deep(x) − (Wx + b)| over 2000 inputs, layers {list(widths)}, float64")


def check_nonlinearity_breaks_collapse(activation: Callable[[Tensor], Tensor] = ACTIVATIONS["relu"],
                                       widths: tuple[int, ...] = (16, 64, 48, 8), seed: int = 0) -> Check:
    """With φ between the layers no affine map reproduces the network: the best least-squares affine fit
    leaves a residual. The same fit on the purely affine stack leaves none (the control)."""
    with torch.random.fork_rng(devices=[]):
        layers = _affine_stack(widths, seed)
    x = torch.randn(2000, widths[0], generator=_generator(seed), dtype=F64)

    def relative_residual(with_activation: bool) -> float:
        with torch.no_grad():
            y = x
            for index, layer in enumerate(layers):
                y = layer(y)
                if with_activation and index < len(layers) - 1:
                    y = activation(y)
            design = torch.cat((x, torch.ones(len(x), 1, dtype=F64)), dim=1)
            fit = design @ torch.linalg.lstsq(design, y, driver="gelsd").solution
            return float((y - fit).norm() / (y - y.mean(0)).norm())

    nonlinear, control = relative_residual(True), relative_residual(False)
    threshold = 0.05
    return Check(
        name="nonlinearity_breaks_collapse", item=6,
        equation=r"\min_{W,b}\frac{\lVert W_3\varphi(W_2\varphi(W_1x+b_1)+b_2)+b_3-(Wx+b)\rVert}"
                 r"{\lVert y-\bar y\rVert}>0",
        measured=[nonlinear, control], expected=[threshold, 0.0], tolerance=[0.0, 1e-10],
        passed=nonlinear > threshold and control <= 1e-10,
        note=f"[relative residual of the best affine fit with ReLU between the layers, the same without] over "
             f"2000 inputs; pass: the first exceeds {threshold}, the second (the control) is 0")


# ============================================================================================
# 7. Universal approximation
# ============================================================================================
def _target(x: Float[Tensor, " n"]) -> Float[Tensor, " n"]:
    return torch.sin(2 * math.pi * x) + 0.3 * torch.cos(5 * math.pi * x)


def fit_sigmoid_network(n_neurons: int, x_train: Float[Tensor, " n_train"], x_test: Float[Tensor, " n_test"],
                        iterations: int = 150) -> tuple[float, Float[Tensor, " n_test"]]:
    """f(x) = Σ_i a_i σ(w_i x + b_i) + c fitted to `_target` by least squares: sigmoids centred on a grid, the
    output layer solved exactly, then every parameter refined by L-BFGS. Returns (sup error on x_test, f(x_test))."""
    y = _target(x_train)
    centres = (torch.arange(n_neurons, dtype=F64) + 0.5) / n_neurons
    w = torch.full((n_neurons,), 4.0 * n_neurons, dtype=F64)  # each sigmoid rises over ≈ one grid cell
    b = -w * centres
    features = torch.cat((torch.sigmoid(x_train[:, None] * w + b), torch.ones(len(x_train), 1, dtype=F64)), dim=1)
    solution = torch.linalg.lstsq(features, y[:, None], driver="gelsd").solution[:, 0]
    params = [p.clone().requires_grad_() for p in (w, b, solution[:-1], solution[-1:])]

    def net(x: Tensor) -> Tensor:
        w, b, a, c = params
        return torch.sigmoid(x[:, None] * w + b) @ a + c

    optimiser = torch.optim.LBFGS(params, lr=1.0, max_iter=iterations, history_size=50, line_search_fn="strong_wolfe",
                                  tolerance_grad=1e-12, tolerance_change=1e-15)

    def closure() -> Tensor:
        optimiser.zero_grad()
        loss = (net(x_train) - y).pow(2).mean()
        loss.backward()
        return loss

    optimiser.step(closure)
    with torch.no_grad():
        prediction = net(x_test)
    return float((prediction - _target(x_test)).abs().max()), prediction


def universal_approximation(widths: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)) -> dict[str, Any]:
    x_train = torch.linspace(0, 1, 512, dtype=F64)
    x_test = torch.linspace(0, 1, 4001, dtype=F64)  # 8× finer than training: the sup is not just on the fit points
    errors, fits = [], []
    for n in widths:
        error, prediction = fit_sigmoid_network(n, x_train, x_test)
        errors.append(error)
        fits.append(prediction)
    return {"widths": list(widths), "sup_errors": errors, "x": x_test, "fits": fits}


def check_universal_approximation(result: dict[str, Any]) -> Check:
    """Cybenko 1989: one hidden layer of sigmoids approximates any continuous f on a compact set uniformly.
    Measured: sup |f − f_N| on [0, 1] for f(x) = sin 2πx + 0.3 cos 5πx as the width N doubles."""
    widths, errors = result["widths"], result["sup_errors"]
    slope = float(torch.linalg.lstsq(
        torch.stack((torch.log(torch.tensor(widths, dtype=F64)), torch.ones(len(widths), dtype=F64)), 1),
        torch.log(torch.tensor(errors, dtype=F64))[:, None], driver="gelsd").solution[0, 0])
    half = len(widths) // 2
    falls = errors[-1] <= errors[0] / 20 and max(errors[half:]) < min(errors[:half]) and slope < -0.5
    return Check(
        name="universal_approximation", item=7,
        equation=r"\sup_{x\in[0,1]}\Bigl|f(x)-\sum_{i=1}^{N}a_i\,\sigma(w_ix+b_i)-c\Bigr|\xrightarrow[N\to\infty]{}0",
        measured=errors, expected=[0.0] * len(errors), tolerance=[errors[0] / 20] * len(errors), passed=falls,
        note=f"sup error on 4001 points for N = {widths} (least squares then L-BFGS on 512 points); log-log slope "
             f"{slope:.2f}. Pass: the widest is ≤ 1/20 of N = 1, every wide net (N ≥ {widths[half]}) beats every "
             f"narrow one, slope < −0.5. Not strictly monotone: L-BFGS finds local optima, the theorem is about "
             f"the best network of each width")


# ============================================================================================
# 8. Parameter count
# ============================================================================================
PARAMETER_CONFIGS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(d_vocab=100, d_model=64, n_layers=2, n_heads=4, n_ctx=64),
    "tiny-rotary-gqa-swiglu": ModelConfig(d_vocab=100, d_model=96, n_layers=3, n_heads=6, n_kv_heads=2, n_ctx=64,
                                          positions="rotary", mlp="swiglu", norm="rmsnorm", bias=False),
    "tiny-sinusoidal-post-ln-tied": ModelConfig(d_vocab=100, d_model=64, n_layers=2, n_heads=4, n_ctx=64,
                                                positions="sinusoidal", block="post_ln", tied_embeddings=True),
    "gpt2-small": ModelConfig(d_vocab=50257, d_model=768, n_layers=12, n_heads=12, n_ctx=1024, mlp="gelu_tanh",
                              tied_embeddings=True),
    "gpt2-medium": ModelConfig(d_vocab=50257, d_model=1024, n_layers=24, n_heads=16, n_ctx=1024, mlp="gelu_tanh",
                               tied_embeddings=True),
    # Touvron et al. 2023 (LLaMA), Table 2: d = 4096, 32 layers, 32 heads; SwiGLU width 11008, |V| = 32000.
    "llama-7b": ModelConfig(d_vocab=32000, d_model=4096, n_layers=32, n_heads=32, n_ctx=2048, d_mlp=11008,
                            positions="rotary", norm="rmsnorm", mlp="swiglu", bias=False),
}


def meta_parameter_count(cfg: ModelConfig) -> int:
    """Count the parameters of a HookedTransformer built on the meta device: shapes only, no memory."""
    with torch.device("meta"):
        model = HookedTransformer(cfg)
    return sum(p.numel() for p in model.parameters())


def seed_approximation(cfg: ModelConfig) -> int:
    """12·L·d² + |V|·d: 4d² for W_Q, W_K, W_V, W_O and 8d² for a 4d-wide MLP per layer, plus the embedding."""
    return 12 * cfg.n_layers * cfg.d_model ** 2 + cfg.d_vocab * cfg.d_model


def check_parameter_count_exact(configs: dict[str, ModelConfig] = PARAMETER_CONFIGS,
                                count_fn: Callable[[ModelConfig], int] = meta_parameter_count) -> Check:
    """ModelConfig.n_params() (closed form) against counting the model's own parameters."""
    rows = {name: (count_fn(cfg), cfg.n_params()) for name, cfg in configs.items()}
    worst = max(abs(counted - formula) for counted, formula in rows.values())
    return Check(
        name="parameter_count_exact", item=8,
        equation=r"\texttt{n\_params}(\text{cfg})=\sum_{\theta\in\text{model}}|\theta|",
        measured=float(worst), expected=0.0, tolerance=0.0, passed=worst == 0,
        note="max |counted − n_params()| over " + "; ".join(f"{n}: {c:,}" for n, (c, _) in rows.items())
             + " (meta device)")


def check_parameter_approximation(configs: dict[str, ModelConfig] = PARAMETER_CONFIGS,
                                  count_fn: Callable[[ModelConfig], int] = meta_parameter_count,
                                  names: tuple[str, ...] = ("gpt2-small", "gpt2-medium", "llama-7b")) -> Check:
    """12·L·d² + |V|·d against the exact count, for the configs where d² terms dominate."""
    errors = [(seed_approximation(configs[n]) - count_fn(configs[n])) / count_fn(configs[n]) for n in names]
    tolerance = 0.03
    return Check(
        name="parameter_count_approximation", item=8,
        equation=r"N\approx12\,L\,d^2+|V|\,d",
        measured=errors, expected=[0.0] * len(errors), tolerance=[tolerance] * len(errors),
        passed=all(abs(e) <= tolerance for e in errors),
        note=f"relative error (approx − exact)/exact for {list(names)}; the formula leaves out biases, norms, "
             f"learned positions and an untied W_U (|V|·d more for LLaMA), and SwiGLU's 3·d·11008 = 8.06·d² "
             f"stands in for 8·d²")


def check_llama_7b(count_fn: Callable[[ModelConfig], int] = meta_parameter_count) -> Check:
    counted = count_fn(PARAMETER_CONFIGS["llama-7b"])
    tolerance = 0.01 * 6.7e9
    return Check(
        name="llama_7b_parameters", item=8,
        equation=r"N_{\text{LLaMA-7B}}\approx6.7\cdot10^9",
        measured=float(counted), expected=6.7e9, tolerance=tolerance, passed=abs(counted - 6.7e9) <= tolerance,
        note=f"HookedTransformer with LLaMA-7B's shape on the meta device: {counted:,} parameters "
             f"(the paper's 6.7B); the seed's 12·L·d² + |V|·d gives "
             f"{seed_approximation(PARAMETER_CONFIGS['llama-7b']):,}")


# ============================================================================================
# 9. Temperature
# ============================================================================================
def _kl_nats(p: Tensor, q: Tensor) -> float:
    p, q = p.to(F64), q.to(F64)
    return float((p * (p.clamp_min(1e-300).log() - q.log())).where(p > 0, 0.0).sum())


def check_temperature(sample_fn: Callable[..., Tensor] = sample_next, n_draws: int = 20000, seed: int = 0) -> Check:
    """P_T = softmax(z/T): T → 0 gives the argmax every time, T → ∞ the uniform distribution, T = 1 softmax(z).
    Measured on draws from Forma's sampler, with the sampling noise floor E[KL(p̂‖p)] ≈ (V − 1)/(2n)."""
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0, 1.0, -2.0, 2.4, 0.0])
    d_vocab = len(logits)
    rows = logits.expand(n_draws, d_vocab)
    g = _generator(seed)

    def frequencies(temperature: float) -> Tensor:
        draws = sample_fn(rows, temperature=temperature, generator=g)
        return torch.bincount(draws, minlength=d_vocab).to(F64) / n_draws

    uniform = torch.full((d_vocab,), 1.0 / d_vocab, dtype=F64)
    argmax_share = float(frequencies(0.01)[logits.argmax()])  # gap 0.6 ⇒ runner-up has odds e^−60
    kl_hot = _kl_nats(frequencies(1e4), uniform)
    kl_one = _kl_nats(frequencies(1.0), logits.to(F64).softmax(-1))
    kl_uniform_at_one = _kl_nats(logits.to(F64).softmax(-1), uniform)
    floor = (d_vocab - 1) / (2 * n_draws)
    measured = [argmax_share, kl_hot, kl_one]
    tolerance = [0.0, 5 * floor, 5 * floor]
    curve = {T: _kl_nats((logits.to(F64) / T).softmax(-1), uniform) for T in (0.1, 1.0, 10.0, 100.0, 1000.0)}
    return Check(
        name="temperature_limits", item=9,
        equation=r"\mathrm{softmax}(z/T)\xrightarrow[T\to0]{}e_{\arg\max z},\quad"
                 r"\mathrm{KL}\bigl(\mathrm{softmax}(z/T)\,\Vert\,U\bigr)\xrightarrow[T\to\infty]{}0",
        measured=measured, expected=[1.0, 0.0, 0.0], tolerance=tolerance,
        passed=_close(measured, [1.0, 0.0, 0.0], tolerance),
        note=f"{n_draws} draws from sample_next: [share of argmax at T = 0.01, KL(p̂‖U) at T = 10⁴, KL(p̂‖softmax z) "
             f"at T = 1] in nats; noise floor (V−1)/2n = {floor:.1e}, tolerance 5× that; KL(softmax z‖U) = "
             f"{kl_uniform_at_one:.3f} at T = 1, so the T = 10⁴ value is not trivially small. "
             f"Exact KL(softmax(z/T)‖U): "
             + ", ".join(f"T={T:g}: {v:.2e}" for T, v in curve.items()))


# ============================================================================================
# 10. Nucleus sampling
# ============================================================================================
def check_nucleus(filter_fn: Callable[..., Tensor] = filter_logits, n_rows: int = 2000, d_vocab: int = 20,
                  seed: int = 0) -> Check:
    """Holtzman et al. 2020 §3.1: the nucleus is the smallest set of most-probable tokens with mass ≥ p.
    Reference: sort p descending, k* = min{k : Σ_{i≤k} p_(i) ≥ p}; keep exactly the top k*."""
    g = _generator(seed)
    sharpness = torch.rand(n_rows, 1, generator=g) * 4  # from near-uniform to peaked rows
    logits = torch.randn(n_rows, d_vocab, generator=g) * sharpness
    probs = logits.to(F64).softmax(-1)
    sorted_probs, order = probs.sort(-1, descending=True)
    cumulative = sorted_probs.cumsum(-1)
    mismatches, boundary, sizes = 0, 0, []
    for top_p in (0.1, 0.3, 0.5, 0.8, 0.9, 0.95, 0.99):
        kept = torch.isfinite(filter_fn(logits, top_p=top_p))
        k_star = (cumulative < top_p).sum(-1, keepdim=True) + 1
        reference = torch.zeros_like(kept).scatter(-1, order, torch.arange(d_vocab).expand(n_rows, -1) < k_star)
        # float32 cumulative sums can sit on the other side of p within round-off: leave those rows out
        clear = (cumulative - top_p).abs().min(-1).values > 1e-5
        boundary += int((~clear).sum())
        mismatches += int((kept != reference).any(-1)[clear].sum())
        sizes.append(float(kept.sum(-1).to(F64).mean()))
    return Check(
        name="nucleus_smallest_set", item=10,
        equation=r"V^{(p)}=\arg\min_{V'}\Bigl\{|V'|:\sum_{x\in V'}P(x)\ge p\Bigr\}",
        measured=float(mismatches), expected=0.0, tolerance=0.0, passed=mismatches == 0,
        note=f"rows where filter_logits keeps a different set from the smallest top set reaching p, over "
             f"{n_rows} random distributions (|V| = {d_vocab}) × p ∈ (0.1 … 0.99); {boundary} rows within 1e-5 of "
             f"a boundary left out; mean nucleus sizes {[round(s, 2) for s in sizes]}")


# ============================================================================================
# 11. KV cache
# ============================================================================================
def kv_model(n_ctx: int = 600, seed: int = 0, **changes: Any) -> HookedTransformer:
    # init_std 0.1 spreads the logits of an untrained model, so greedy choices are not near-ties.
    cfg = ModelConfig(**({"d_vocab": 100, "d_model": 64, "n_layers": 2, "n_heads": 4, "n_ctx": n_ctx,
                          "init_std": 0.1} | changes))
    return HookedTransformer(cfg, seed=seed).eval()


def check_kv_cache_tokens(models: dict[str, HookedTransformer] | None = None, n_new: int = 40, seed: int = 0) -> Check:
    """decode(use_kv_cache=True) and decode(use_kv_cache=False): same greedy tokens, same sampled tokens under
    one seed, and logits equal to float round-off."""
    if models is None:
        models = {"learned": kv_model(128, seed),
                  "rotary-gqa": kv_model(128, seed, positions="rotary", n_kv_heads=2, mlp="swiglu", norm="rmsnorm")}
    differing, worst = 0, 0.0
    for model in models.values():
        prompt = torch.randint(0, model.cfg.d_vocab, (3, 6), generator=_generator(seed))
        for temperature in (0.0, 1.0):
            cached = decode(model, prompt, n_new, temperature=temperature, seed=seed, use_kv_cache=True)
            fresh = decode(model, prompt, n_new, temperature=temperature, seed=seed, use_kv_cache=False)
            differing += int((cached.tokens != fresh.tokens).sum())
            worst = max(worst, float((cached.logits - fresh.logits).abs().max()))
    measured = [float(differing), worst]
    tolerance = [0.0, 1e-4]
    return Check(
        name="kv_cache_same_tokens", item=11,
        equation=r"\mathrm{decode}_{\text{cache}}(x_{\le t})=\mathrm{decode}_{\text{recompute}}(x_{\le t})",
        measured=measured, expected=[0.0, 0.0], tolerance=tolerance, passed=_close(measured, [0.0, 0.0], tolerance),
        note=f"[tokens that differ, max |Δ logits|] over {n_new} new tokens × 3 rows, greedy and T = 1 with one "
             f"seed, for {list(models)}")


def attention_flops(attention: Attention, q_len: int, k_len: int) -> int:
    """FLOPs of Forma's explicit attention (q kᵀ and A v) for q_len queries over k_len keys."""
    h, dh = attention.n_heads, attention.d_head
    g = _generator(q_len * k_len)  # the values do not change the count; seeded all the same
    q = torch.randn(1, q_len, h, dh, generator=g)
    k = torch.randn(1, k_len, attention.n_kv_heads, dh, generator=g)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        attention._explicit(q, k, k, k_len - q_len)
    return counter.get_total_flops()


def step_flops(model: HookedTransformer, n: int, cached: bool) -> int:
    """FLOPs of one decoding step at prefix length n, explicit attention (FlopCounterMode does not see CPU SDPA)."""
    tokens = torch.zeros(1, n + 1, dtype=torch.long)
    cache = None
    with model.hooks(fwd_hooks=[(lambda name: name.endswith("hook_pattern"), _keep)]):
        if cached:
            cache = KVCache.empty(model.cfg.n_layers)
            with torch.no_grad():
                model(tokens[:, :n], kv_cache=cache)
        # Grad mode on: FlopCounterMode's module tracker trips over no_grad views of parameters.
        with FlopCounterMode(display=False) as counter:
            model(tokens[:, n:] if cached else tokens, kv_cache=cache)
    return counter.get_total_flops()


def _keep(activation: Tensor, hook: HookPoint) -> None:
    """A hook that only asks for the pattern, which switches attention onto its explicit path."""
    return None


def _copy_cache(cache: KVCache) -> KVCache:
    return KVCache([KVCacheEntry(e.keys, e.values) for e in cache.entries])


def step_seconds(model: HookedTransformer, n: int, cached: bool, repeats: int) -> float:
    """Median wall time of one decoding step at prefix length n (the fused path decode uses)."""
    tokens = torch.randint(0, model.cfg.d_vocab, (1, n + 1), generator=_generator(n))
    times = []
    with torch.inference_mode():
        prefix = KVCache.empty(model.cfg.n_layers)
        model(tokens[:, :n], kv_cache=prefix)
        for _ in range(repeats + 1):  # the first call warms up
            cache = _copy_cache(prefix) if cached else None
            start = time.perf_counter()
            model(tokens[:, n:] if cached else tokens, kv_cache=cache)
            times.append(time.perf_counter() - start)
    return sorted(times[1:])[len(times[1:]) // 2]


def check_kv_cache_cost(prefixes: tuple[int, ...] = (128, 256, 512), repeats: int = 7, seed: int = 0) -> Check:
    """Per step, attention over a cached prefix of n costs O(n·d) (one query against n keys); recomputing the
    prefix costs O(n²·d) (n queries against n keys). Counted with FlopCounterMode on Forma's attention."""
    model = kv_model(max(prefixes) + 1, seed)
    attention = model.blocks[0].attn
    cached = [attention_flops(attention, 1, n) for n in prefixes]
    recomputed = [attention_flops(attention, n, n) for n in prefixes]
    ratio_cached = [b / a for a, b in zip(cached, cached[1:])]
    ratio_recomputed = [b / a for a, b in zip(recomputed, recomputed[1:])]
    model_cached = [step_flops(model, n, True) for n in prefixes]
    model_recomputed = [step_flops(model, n, False) for n in prefixes]
    seconds_cached = [step_seconds(model, n, True, repeats) for n in prefixes]
    seconds_recomputed = [step_seconds(model, n, False, repeats) for n in prefixes]
    measured = [max(ratio_cached), min(ratio_recomputed)]
    expected = [2.0, 4.0]
    tolerance = [1e-9, 1e-9]
    d = model.cfg.d_model
    exact = all(c == 4 * n * d for c, n in zip(cached, prefixes))  # 2·n·d for q kᵀ and 2·n·d for A v

    def ratios(values: list[float]) -> str:
        return ", ".join(f"{b / a:.2f}" for a, b in zip(values, values[1:]))

    return Check(
        name="kv_cache_cost", item=11,
        equation=r"C_{\text{cache}}(n)=4nd=O(nd),\qquad C_{\text{recompute}}(n)=4n^2d=O(n^2d)",
        measured=measured, expected=expected, tolerance=tolerance,
        passed=_close(measured, expected, tolerance) and exact,
        note=f"attention FLOPs per step as n doubles (n = {list(prefixes)}, d = {d}): cached {cached} (ratio "
             f"{ratios(cached)}; = 4·n·d: {exact}), recomputed {recomputed} (ratio {ratios(recomputed)}). "
             f"Whole-model FLOPs per step: cached {model_cached} (ratio {ratios(model_cached)}), recomputed "
             f"{model_recomputed} (ratio {ratios(model_recomputed)}). The median wall time per step "
             f"({repeats} repeats) is in `timing`, not gated: on shared CPU cores it is noisy, and a tiny "
             f"model's step is dominated by fixed overhead",
        timing={"prefixes": [float(n) for n in prefixes], "cached_step_s": seconds_cached,
                "recomputed_step_s": seconds_recomputed})


# ============================================================================================
# 12. Perplexity and the KL identity
# ============================================================================================
def check_perplexity(seed: int = 0) -> Check:
    """PPL = exp(mean CE) = (Π_t 1/P(x_t | x_<t))^(1/N): Forma's loss against the geometric mean of inverse
    probabilities (a product, not a sum of logs); a model with constant logits has PPL = |V| exactly."""
    model = kv_model(64, seed)
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 20), generator=_generator(seed))
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
        name="perplexity", item=12,
        equation=r"\mathrm{PPL}=\exp\Bigl(-\tfrac1N\sum_t\log P(x_t\mid x_{<t})\Bigr)"
                 r"=\Bigl(\prod_t\frac1{P(x_t\mid x_{<t})}\Bigr)^{1/N}",
        measured=measured, expected=expected, tolerance=tolerance, passed=_close(measured, expected, tolerance),
        note=f"[exp(model.loss), exp(loss) of a model whose logits are constant] against [geometric mean of 1/P over "
             f"{len(probs)} predictions, |V| = {d_vocab}]")


def check_kl_identity(d_vocab: int = 50, n_samples: int = 20000, seed: int = 0,
                      entropy_fn: Callable[[Tensor], Tensor] = entropy,
                      kl_fn: Callable[[Tensor, Tensor], Tensor] = kl) -> Check:
    """E_{x~p}[−log q(x)] = H(p) + KL(p‖q), measured two ways that share nothing but p and q: the right side
    exactly from Forma's `entropy` and `kl` (lab.metrics.information), the left side and both terms by
    sampling x ~ p (mean −log q(x), mean −log p(x), and KL̂ as their paired difference). Each sampled mean
    must land within 4 standard errors of its exact value. (CE − H − KL from the same terms would be 0 by
    algebra and test nothing.)"""
    g = _generator(seed)
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
        name="kl_identity", item=12,
        equation=r"\mathbb E_{x\sim p}[-\log q(x)]=H(p)+\mathrm{KL}(p\,\Vert\,q)",
        measured=measured, expected=expected, tolerance=tolerance, passed=_close(measured, expected, tolerance),
        note=f"p ~ Dirichlet(1) and q = softmax(1.5·N(0, I)) over {d_vocab} outcomes, {n_samples} draws x ~ p: "
             f"[mean −log q(x), mean −log p(x), KL̂] against [H + KL = {exact_entropy:.4f} + {exact_kl:.4f}, H, KL] "
             f"from lab.metrics.information; pass within 4 standard errors each "
             f"(± {', '.join(f'{t / 4 * 1.96:.4f}' for t in tolerance)} at 95%). The kl experiment makes the "
             f"same comparison on a trained model and a Markov source (`forma run kl`)")


# ============================================================================================
# Figures and the run
# ============================================================================================
def write_figures(out: Path, ua: dict[str, Any], seed: int) -> list[str]:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    figure = make_subplots(rows=1, cols=2, subplot_titles=("sup error against width", "fits"))
    figure.add_trace(go.Scatter(x=ua["widths"], y=ua["sup_errors"], mode="lines+markers", name="sup |f − f_N|"),
                     row=1, col=1)
    every = 4  # 1001 of the 4001 test points are plenty for the eye
    x = ua["x"][::every].tolist()
    figure.add_trace(go.Scatter(x=x, y=_target(ua["x"][::every]).tolist(), line={"color": "black", "width": 3},
                                name="f(x) = sin 2πx + 0.3 cos 5πx"), row=1, col=2)
    for width, fit in zip(ua["widths"], ua["fits"]):
        if width in (1, 4, 16, 64):
            figure.add_trace(go.Scatter(x=x, y=fit[::every].tolist(), name=f"N = {width}", line={"dash": "dot"}),
                             row=1, col=2)
    figure.update_xaxes(type="log", title_text="neurons N", row=1, col=1)
    figure.update_yaxes(type="log", title_text="sup error", row=1, col=1)
    figure.update_layout(title="Universal approximation: one hidden layer of sigmoids (Cybenko 1989)")
    save_figure(figure, out, "universal_approximation")

    d_ks = (8, 16, 32, 64, 128, 256)
    sweep = [softmax_saturation(None, d_k, 64, 128, seed) for d_k in d_ks]
    figure = make_subplots(rows=1, cols=2, subplot_titles=(
        "entropy of the last query's pattern (nats)", f"share of queries with ‖∂softmax/∂s‖_F < {VANISHED}"))
    for key, name in (("scaled", "softmax(q·k/√d_k): Forma's Attention"), ("unscaled", "softmax(q·k)")):
        figure.add_trace(go.Scatter(x=list(d_ks), y=[s[f"entropy_{key}"] for s in sweep], name=name,
                                    mode="lines+markers", legendgroup=key), row=1, col=1)
        figure.add_trace(go.Scatter(x=list(d_ks), y=[s[f"vanished_{key}"] for s in sweep], name=name,
                                    mode="lines+markers", legendgroup=key, showlegend=False), row=1, col=2)
    figure.add_hline(y=math.log(64), line_dash="dash", annotation_text="log 64 (uniform)", row=1, col=1)
    figure.update_xaxes(type="log", title_text="d_k")
    figure.update_layout(title="Without 1/√d_k the softmax saturates as d_k grows (last query over 64 keys, "
                               "128 sequences each)")
    save_figure(figure, out, "softmax_saturation")
    return ["universal_approximation.html", "softmax_saturation.html"]


def run(cfg: Config, out: Path) -> dict:
    """Run every check, write the figures into `out`, return {checks, all_passed, ...} for results.json."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    seed = cfg.seed
    samples = 5000 if cfg.quick else 40000  # Monte Carlo pairs: standard error of Var/d_k ≈ √(2/n)
    ua: dict[str, Any] = {}

    def ua_check() -> Check:
        ua.update(universal_approximation())
        return check_universal_approximation(ua)

    plan: list[Callable[[], Check]] = [
        check_sinusoidal_shift,
        check_sinusoidal_wavelengths,
        partial(check_rotary_relative, seed=seed),
        partial(check_dot_product_variance, n_samples=samples, seed=seed),
        partial(check_attention_scaling, n_samples=samples, seed=seed),
        partial(check_softmax_saturation, seed=seed),
        partial(check_causal_mask, seed=seed),
        partial(check_reversed_mask, seed=seed),
        partial(check_cross_entropy_gradient, seed=seed),
        partial(check_affine_collapse, seed=seed),
        partial(check_nonlinearity_breaks_collapse, seed=seed),
        ua_check,
        check_parameter_count_exact,
        check_parameter_approximation,
        check_llama_7b,
        partial(check_temperature, n_draws=samples, seed=seed),
        partial(check_nucleus, seed=seed),
        partial(check_kv_cache_tokens, seed=seed),
        partial(check_kv_cache_cost, prefixes=(64, 128, 256) if cfg.quick else (128, 256, 512, 1024),
                repeats=3 if cfg.quick else 9, seed=seed),
        partial(check_perplexity, seed=seed),
        partial(check_kl_identity, n_samples=samples, seed=seed),
    ]
    checks = []
    start = time.perf_counter()
    # Every tensor here is tiny: on shared cores, intra-op threads cost more in synchronisation than they
    # gain (measured ≈ 10× slower with 2 threads under load), so run on one and restore the caller's setting.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for make in plan:
            began = time.perf_counter()
            check = make()
            check.seconds = time.perf_counter() - began
            checks.append(check)
        figures = write_figures(out, ua, seed)
    finally:
        torch.set_num_threads(threads)
    results = {
        "checks": [_plain(asdict(c)) for c in checks],
        "all_passed": all(c.passed for c in checks),
        "n_checks": len(checks),
        "n_passed": sum(c.passed for c in checks),
        "failed": [c.name for c in checks if not c.passed],
        "figures": figures,
        "seconds": time.perf_counter() - start,
    }
    results["headlines"] = headlines(results)
    return results


def headlines(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One headline per check, computed from results["checks"]: the claim, what was measured against what the
    equation predicts, and whether it passed (the direction, which the quick and default runs must share).
    Every check is a computation that a wrong implementation fails (the tests hand each one a wrong one)."""
    def show(value: float | list[float]) -> str:
        return ", ".join(f"{x:.4g}" for x in value) if isinstance(value, list) else f"{value:.4g}"

    out = []
    for check in results["checks"]:
        measured, expected, tolerance = check["measured"], check["expected"], check["tolerance"]
        out.append({"name": check["name"],
                    "sentence": f"{check['name'].replace('_', ' ')} (claim {check['item']}): measured "
                                f"[{show(measured)}] against [{show(expected)}] within [{show(tolerance)}] — "
                                f"{'passes' if check['passed'] else 'FAILS'}.",
                    "value": measured if not isinstance(measured, list) else measured[0], "interval": None,
                    "direction": bool(check["passed"]), "supported": True, "why_not": None})
    return out


def _plain(record: dict[str, Any]) -> dict[str, Any]:
    """Python floats and bools only, so results.json is plain JSON (no numpy or torch scalars)."""
    def plain(value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (bool, str)) or value is None:
            return value
        return float(value)

    return {k: plain(v) if k not in ("name", "item", "equation", "note") else v for k, v in record.items()}
