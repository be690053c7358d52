"""Claim 8: the parameter count, exact (ModelConfig.n_params against the model's own parameters) and the
12·L·d² + |V|·d approximation."""

from collections.abc import Callable
from functools import cache

import torch

from experiments.equations.check import Check
from lab.model.config import ModelConfig
from lab.model.transformer import HookedTransformer

# ============================================================================================
# 8. Parameter count
# ============================================================================================
PARAMETER_CONFIGS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(d_vocab=100, d_model=64, n_layers=2, n_heads=4, n_ctx=64),
    "tiny-rotary-gqa-swiglu": ModelConfig(
        d_vocab=100,
        d_model=96,
        n_layers=3,
        n_heads=6,
        n_kv_heads=2,
        n_ctx=64,
        positions="rotary",
        mlp="swiglu",
        norm="rmsnorm",
        bias=False,
    ),
    "tiny-sinusoidal-post-ln-tied": ModelConfig(
        d_vocab=100,
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_ctx=64,
        positions="sinusoidal",
        block="post_ln",
        tied_embeddings=True,
    ),
    "gpt2-small": ModelConfig(
        d_vocab=50257, d_model=768, n_layers=12, n_heads=12, n_ctx=1024, mlp="gelu_tanh", tied_embeddings=True
    ),
    "gpt2-medium": ModelConfig(
        d_vocab=50257, d_model=1024, n_layers=24, n_heads=16, n_ctx=1024, mlp="gelu_tanh", tied_embeddings=True
    ),
    # Touvron et al. 2023 (LLaMA), Table 2: d = 4096, 32 layers, 32 heads; SwiGLU width 11008, |V| = 32000.
    "llama-7b": ModelConfig(
        d_vocab=32000,
        d_model=4096,
        n_layers=32,
        n_heads=32,
        n_ctx=2048,
        d_mlp=11008,
        positions="rotary",
        norm="rmsnorm",
        mlp="swiglu",
        bias=False,
    ),
}


@cache  # a config is frozen, so is its count: the three checks of claim 8 build each config once (≈ 1 s for LLaMA-7B)
def meta_parameter_count(cfg: ModelConfig) -> int:
    """Count the parameters of a HookedTransformer built on the meta device: shapes only, no memory."""
    with torch.device("meta"):
        model = HookedTransformer(cfg)
    return sum(p.numel() for p in model.parameters())


def seed_approximation(cfg: ModelConfig) -> int:
    """12·L·d² + |V|·d: 4d² for W_Q, W_K, W_V, W_O and 8d² for a 4d-wide MLP per layer, plus the embedding."""
    return 12 * cfg.n_layers * cfg.d_model**2 + cfg.d_vocab * cfg.d_model


def check_parameter_count_exact(
    configs: dict[str, ModelConfig] = PARAMETER_CONFIGS, count_fn: Callable[[ModelConfig], int] = meta_parameter_count
) -> Check:
    """ModelConfig.n_params() (closed form) against counting the model's own parameters."""
    rows = {name: (count_fn(cfg), cfg.n_params()) for name, cfg in configs.items()}
    worst = max(abs(counted - formula) for counted, formula in rows.values())
    return Check(
        name="parameter_count_exact",
        item=8,
        equation=r"\texttt{n\_params}(\text{cfg})=\sum_{\theta\in\text{model}}|\theta|",
        measured=float(worst),
        expected=0.0,
        tolerance=0.0,
        passed=worst == 0,
        what=["largest |counted − closed form|"],
        note="max |counted − ModelConfig.n_params()| over "
        + "; ".join(f"{n}: {c:,}" for n, (c, _) in rows.items())
        + " (meta device)",
    )


def check_parameter_approximation(
    configs: dict[str, ModelConfig] = PARAMETER_CONFIGS,
    count_fn: Callable[[ModelConfig], int] = meta_parameter_count,
    names: tuple[str, ...] = ("gpt2-small", "gpt2-medium", "llama-7b"),
) -> Check:
    """12·L·d² + |V|·d against the exact count, for the configs where d² terms dominate."""
    counted = {n: count_fn(configs[n]) for n in names}
    errors = [(seed_approximation(configs[n]) - counted[n]) / counted[n] for n in names]
    tolerance = 0.03
    return Check(
        name="parameter_count_approximation",
        item=8,
        equation=r"N\approx12\,L\,d^2+|V|\,d",
        measured=errors,
        expected=[0.0] * len(errors),
        tolerance=[tolerance] * len(errors),
        passed=all(abs(e) <= tolerance for e in errors),
        what=[f"relative error for {name}" for name in names],
        note=f"relative error (approx − exact)/exact for {list(names)}; the formula leaves out biases, norms, "
        f"learned positions and an untied W_U (|V|·d more for LLaMA), and SwiGLU's 3·d·11008 = 8.06·d² "
        f"stands in for 8·d²",
    )


def check_llama_7b(count_fn: Callable[[ModelConfig], int] = meta_parameter_count) -> Check:
    counted = count_fn(PARAMETER_CONFIGS["llama-7b"])
    tolerance = 0.01 * 6.7e9
    return Check(
        name="llama_7b_parameters",
        item=8,
        equation=r"N_{\text{LLaMA-7B}}\approx6.7\cdot10^9",
        measured=float(counted),
        expected=6.7e9,
        tolerance=tolerance,
        passed=abs(counted - 6.7e9) <= tolerance,
        what=["parameters of a model of LLaMA-7B's shape"],
        note=f"HookedTransformer with LLaMA-7B's shape on the meta device: {counted:,} parameters "
        f"(the paper's 6.7B); the seed's 12·L·d² + |V|·d gives "
        f"{seed_approximation(PARAMETER_CONFIGS['llama-7b']):,}",
    )
