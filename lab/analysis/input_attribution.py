"""Input attribution: how much each input position is credited with one prediction, by the methods in use, and the
model's own exhaustive causal effects to grade them against.

The quantity attributed is m(x) = log P_θ(target | x) at the last position of each prompt (by default the
target is the model's own top token there). The token embeddings e_i = W_E[x_i] (what `hook_embed` carries,
before any position is added) are the input features; each method gives one score per position:

    gradient                 ‖∂m/∂e_i‖₂                             Captum Saliency (Simonyan et al. 2014)
    gradient_x_input         Σ_d e_i,d ∂m/∂e_i,d                    Captum InputXGradient (Shrikumar et al. 2016)
    integrated_gradients     Σ_d e_i,d ∫₀¹ ∂m/∂e_i,d(αe) dα          Captum IntegratedGradients, zero baseline
                                                                    (Sundararajan et al. 2017); Σ_i = m(e) − m(0)
    occlusion                m(e) − m(e with e_i = 0)               Captum Occlusion, one position per window
                                                                    (Zeiler & Fergus 2014; = FeatureAblation)
    attention                mean over layers and heads of the last query's attention to i
    attention_rollout        row `last` of Ã_{L−1} ··· Ã_0, Ã_l = ½ mean_h A_l + ½ I (Abnar & Zuidema 2020)
    attribution_patching     E_v |(W_E[v] − e_i) · ∂m/∂e_i|: the first-order estimate (Nanda 2023) of the
                             exhaustive effect below, every replacement token v at once

Every Captum method runs on Forma's hooks: the forward function replaces hook_embed's output by the embeddings
Captum perturbs (`embedding_forward`), and `layer_integrated_gradients` attributes to the hook point itself with
Captum's LayerIntegratedGradients (the same integral from a baseline prompt's embeddings). Attention and its
rollout are not in Captum and are written here; so is the ground truth the methods are graded against, the
model's own exhaustive causal effect of each position (`resample_effects`):

    effect_i = (1/|V|) Σ_{v ∈ V} |m(x with x_i = v) − m(x)|,

exact over every replacement token v (no sampling), |V| forward passes per position.
"""

from collections.abc import Callable, Sequence
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lab.model.transformer import HookedTransformer

__all__ = [
    "METHODS",
    "attention_rollout",
    "attention_weights",
    "embedding_forward",
    "input_attributions",
    "layer_integrated_gradients",
    "resample_effects",
    "top_tokens",
]

METHODS = (
    "gradient",
    "gradient_x_input",
    "integrated_gradients",
    "occlusion",
    "attention",
    "attention_rollout",
    "attribution_patching",
)


def embedding_forward(model: HookedTransformer) -> Callable[[Tensor, Tensor], Tensor]:
    """forward(embeddings [batch, pos, d_model], tokens [batch, pos]) → log P_θ(· | x) at the last position
    [batch, d_vocab], with hook_embed's output replaced by `embeddings`: the function Captum differentiates and
    perturbs. Positions (learned or rotary) are added by the model as usual."""

    def forward(embeddings: Tensor, tokens: Tensor) -> Tensor:
        def replace(activation: Tensor, hook: Any) -> Tensor:
            return embeddings

        logits = model.run_with_hooks(tokens, fwd_hooks=[("hook_embed", replace)])
        return logits[:, -1].log_softmax(dim=-1)

    return forward


@torch.inference_mode()
def top_tokens(model: HookedTransformer, tokens: Int[Tensor, "batch pos"]) -> Int[Tensor, " batch"]:
    """The model's top next token at each prompt's last position: the default target."""
    return model(tokens)[:, -1].argmax(dim=-1)


def _targets(model: HookedTransformer, tokens: Tensor, target: Any) -> Tensor:
    """One target token id per prompt (the top token by default), as an ordinary tensor autograd may save."""
    if target is None:
        return top_tokens(model, tokens).clone()
    return torch.as_tensor(target, device=tokens.device).expand(tokens.shape[0]).clone()


def _gradients(model: HookedTransformer, tokens: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """(e, ∂m/∂e) at every position, [batch, pos, d_model] each."""
    forward = embedding_forward(model)
    embeddings = model.W_E[tokens].detach().clone().requires_grad_(True)
    with torch.inference_mode(False), torch.enable_grad():
        value = forward(embeddings, tokens).gather(1, target[:, None]).sum()
        (grad,) = torch.autograd.grad(value, embeddings)
    return embeddings.detach(), grad


def attention_weights(model: HookedTransformer, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos"]:
    """The last query's attention to each position, averaged over every layer and head."""
    patterns = _patterns(model, tokens)  # [layer, batch, head, query, key]
    return patterns[:, :, :, -1].mean(dim=(0, 2))


def attention_rollout(model: HookedTransformer, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos"]:
    """Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers", §3): the residual
    connection as half of each layer's mixing, Ã_l = ½·mean_h A_l + ½·I (rows sum to 1), composed from the first
    layer up; the last query's row of Ã_{L−1} ··· Ã_0."""
    patterns = _patterns(model, tokens).mean(dim=2)  # [layer, batch, query, key]
    eye = torch.eye(patterns.shape[-1], dtype=patterns.dtype, device=patterns.device)
    rollout = eye.expand_as(patterns[0])
    for layer in range(patterns.shape[0]):
        rollout = (0.5 * patterns[layer] + 0.5 * eye) @ rollout
    return rollout[:, -1]


@torch.inference_mode()
def _patterns(model: HookedTransformer, tokens: Tensor) -> Tensor:
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(model.cfg.n_layers)]
    _, cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
    return torch.stack([cache[name] for name in names]).float()


def input_attributions(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    target: Any = None,
    methods: Sequence[str] = METHODS,
    *,
    ig_steps: int = 32,
) -> dict[str, Float[Tensor, "batch pos"]]:
    """Each method's score for every position of every prompt, {method: [batch, pos]}, for the log-probability of
    `target` (one token id per prompt; default the model's top token) at the prompt's last position."""
    from captum.attr import InputXGradient, IntegratedGradients, Occlusion, Saliency

    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown attribution method {unknown[0]!r}: one of {', '.join(METHODS)}")
    tokens = model.check_tokens(tokens)
    target = _targets(model, tokens, target)
    if ((target < 0) | (target >= model.cfg.d_vocab)).any():
        raise ValueError(f"target token ids must lie in [0, {model.cfg.d_vocab})")
    forward = embedding_forward(model)
    embeddings = model.W_E[tokens].detach().clone()
    d_model = embeddings.shape[-1]
    options = {"target": target, "additional_forward_args": (tokens,)}
    out: dict[str, Tensor] = {}
    with torch.inference_mode(False), torch.enable_grad():
        for method in methods:
            if method == "gradient":
                grads = Saliency(forward).attribute(embeddings.clone().requires_grad_(True), abs=True, **options)
                out[method] = grads.norm(dim=-1)
            elif method == "gradient_x_input":
                out[method] = (
                    InputXGradient(forward).attribute(embeddings.clone().requires_grad_(True), **options).sum(-1)
                )
            elif method == "integrated_gradients":
                out[method] = (
                    IntegratedGradients(forward)
                    .attribute(embeddings.clone().requires_grad_(True), baselines=0.0, n_steps=ig_steps, **options)
                    .sum(-1)
                )
            elif method == "occlusion":
                occluded = Occlusion(forward).attribute(
                    embeddings, sliding_window_shapes=(1, d_model), strides=(1, d_model), baselines=0.0, **options
                )
                out[method] = occluded[..., 0]  # every coordinate of a position carries that position's effect
    if "attention" in methods:
        out["attention"] = attention_weights(model, tokens)
    if "attention_rollout" in methods:
        out["attention_rollout"] = attention_rollout(model, tokens)
    if "attribution_patching" in methods:
        e, grad = _gradients(model, tokens, target)
        # (W_E[v] − e_i) · g_i for every v: [batch, pos, vocab], then the mean magnitude over v.
        steps = torch.einsum("vd,bpd->bpv", model.W_E.detach(), grad) - (e * grad).sum(-1, keepdim=True)
        out["attribution_patching"] = steps.abs().mean(dim=-1)
    return {method: out[method].detach().float() for method in methods}


def layer_integrated_gradients(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    baseline: Int[Tensor, "batch pos"],
    target: Any = None,
    *,
    n_steps: int = 32,
) -> Float[Tensor, "batch pos d_model"]:
    """Integrated gradients at hook_embed by Captum's LayerIntegratedGradients: the path runs from the baseline
    prompt's token embeddings to the prompt's, attributions [batch, pos, d_model] on the hook point's output."""
    from captum.attr import LayerIntegratedGradients

    tokens, baseline = model.check_tokens(tokens), model.check_tokens(baseline)
    if baseline.shape != tokens.shape:
        raise ValueError(
            f"the baseline prompt {tuple(baseline.shape)} must have the prompts' shape {tuple(tokens.shape)}"
        )
    target = _targets(model, tokens, target)

    def forward(ids: Tensor) -> Tensor:
        return model(ids)[:, -1].log_softmax(dim=-1)

    with torch.inference_mode(False), torch.enable_grad():
        return (
            LayerIntegratedGradients(forward, model.hook_embed)
            .attribute(tokens, baselines=baseline, target=target, n_steps=n_steps)
            .detach()
        )


@torch.inference_mode()
def resample_effects(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    target: Any = None,
    *,
    values: Int[Tensor, " n"] | None = None,
    rows_per_pass: int = 4096,
) -> Float[Tensor, "batch pos"]:
    """The model's exhaustive causal effect of each position: (1/|V|) Σ_v |m(x with x_i = v) − m(x)| with m the
    log-probability of `target` (default the top token) at the last position, over every replacement token v
    (`values`, default the whole vocabulary), exactly: one forward pass per (position, v), `rows_per_pass` at a
    time."""
    tokens = model.check_tokens(tokens)
    batch, length = tokens.shape
    target = _targets(model, tokens, target)
    values = torch.arange(model.cfg.d_vocab, device=tokens.device) if values is None else torch.as_tensor(values)
    base = model(tokens)[:, -1].log_softmax(-1).gather(1, target[:, None])[:, 0]  # [batch]
    # Every (prompt, position, value) variant, in that order.
    prompt = torch.arange(batch).repeat_interleave(length * len(values))
    position = torch.arange(length).repeat_interleave(len(values)).repeat(batch)
    value = values.repeat(batch * length)
    changed = torch.empty(len(prompt))
    for start in range(0, len(prompt), rows_per_pass):
        rows = slice(start, start + rows_per_pass)
        variants = tokens[prompt[rows]].clone()
        variants[torch.arange(len(variants)), position[rows]] = value[rows]
        log_probs = model(variants)[:, -1].log_softmax(-1)
        changed[rows] = log_probs.gather(1, target[prompt[rows]][:, None])[:, 0].float().cpu()
    deltas = (changed.view(batch, length, len(values)) - base.float().cpu()[:, None, None]).abs()
    return deltas.mean(dim=-1)
