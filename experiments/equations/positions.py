"""Claims 1 and 2: sinusoidal positions (PE(pos + k) is a fixed rotation of PE(pos)) and rotary embeddings
(⟨R_m q, R_n k⟩ depends on n − m only)."""

import math
from collections.abc import Callable

import einops
import torch
from torch import Tensor, nn

from experiments.equations.check import Check, all_close
from experiments.equations.seeded import F64, seeded_generator
from lab.model.attention import Rotary
from lab.model.config import ModelConfig
from lab.model.embeddings import sinusoidal_table


# ============================================================================================
# 1. Sinusoidal positions: PE(pos + k) is a fixed rotation of PE(pos)
# ============================================================================================
def check_sinusoidal_shift(
    table_fn: Callable[[int, int], Tensor] = sinusoidal_table,
    d_model: int = 512,
    n_ctx: int = 2048,
    base: float = 10000.0,
) -> Check:
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
        name="sinusoidal_shift_is_rotation",
        item=1,
        equation=r"\begin{pmatrix}PE_{pos+k,2i}\\PE_{pos+k,2i+1}\end{pmatrix}="
        r"\begin{pmatrix}\cos k\omega_i&\sin k\omega_i\\"
        r"-\sin k\omega_i&\cos k\omega_i\end{pmatrix}\begin{pmatrix}PE_{pos,2i}\\PE_{pos,2i+1}\end{pmatrix},"
        r"\;\omega_i=10000^{-2i/d}",
        measured=worst,
        expected=0.0,
        tolerance=tolerance,
        passed=worst <= tolerance,
        what=["largest |PE(pos+k) − R_k PE(pos)|"],
        note=f"max |PE(pos+k) − R_k PE(pos)| over pos < {n_ctx} − k, every pair, k ∈ {shifts}, d = {d_model}; "
        f"per-shift max errors {[f'{e:.1e}' for e in errors]}",
    )


def check_sinusoidal_wavelengths(
    table_fn: Callable[[int, int], Tensor] = sinusoidal_table, d_model: int = 512, base: float = 10000.0
) -> Check:
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
        name="sinusoidal_wavelengths",
        item=1,
        equation=r"\lambda_i=\frac{2\pi}{\omega_i}=2\pi\cdot10000^{2i/d}\in[2\pi,\;10000\cdot2\pi)",
        measured=measured,
        expected=expected,
        tolerance=tolerance,
        passed=all_close(measured, expected, tolerance),
        what=["shortest wavelength", "longest wavelength", "largest ÷ smallest ratio of consecutive wavelengths"],
        note=f"[shortest, longest wavelength, max/min ratio of consecutive wavelengths] measured from the table "
        f"(d = {d_model}); a geometric series has a constant ratio ({float(ratios.mean()):.5f}); "
        f"the longest is {expected[1] / (2 * math.pi):.0f}·2π",
    )


# ============================================================================================
# 2. Rotary: ⟨R_m q, R_n k⟩ depends on n − m only
# ============================================================================================
def check_rotary_relative(
    rotary_cls: Callable[[ModelConfig], nn.Module] = Rotary, d_head: int = 64, n_ctx: int = 256, seed: int = 0
) -> Check:
    """Su et al. 2021 (RoFormer) §3.4.2: rotating q to m and k to n makes their product a function of n − m."""
    cfg = ModelConfig(d_vocab=2, d_model=d_head, n_layers=1, n_heads=1, n_ctx=n_ctx, positions="rotary")
    rotary = rotary_cls(cfg)
    q, k = torch.randn(2, d_head, generator=seeded_generator(seed))
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
        name="rotary_relative_position",
        item=2,
        equation=r"\langle R_m q,\,R_n k\rangle=\langle q,\,R_{n-m}k\rangle=g(q,k,n-m)",
        measured=deviation,
        expected=0.0,
        tolerance=tolerance,
        passed=deviation <= tolerance and spread > 0.1,
        what=["largest spread of ⟨R_m q, R_n k⟩ along one n − m, relative to |q||k|"],
        note=f"max over n − m of the spread of ⟨R_m q, R_n k⟩ along that diagonal, relative to |q||k| "
        f"(d_head = {d_head}, {n_ctx} positions); across different n − m the product varies by "
        f"{spread:.2f}·|q||k| (must exceed 0.1: a rotary that ignored position would pass trivially)",
    )
