"""Readouts of the residual stream: the logit lens, direct logit attribution, residual norms.

Logit lens (nostalgebraist 2020): read each layer's residual stream x^(l) as if it were the last,
    P^(l) = softmax(LN_final(x^(l)) W_U + b_U);
at l = n_layers this is the model's own prediction.

Ground-truth lens: on a world whose next-token law p(· | x_≤t) is known (a Markov or hidden-Markov source),
how far each layer's reading is from the truth,
    KL_t^(l) = KL(p(· | x_≤t) ‖ P_t^(l)) = Σ_x p log(p / P^(l)),
in nats; at l = n_layers it is the model's own KL to the truth, the KL term of CE = H + KL.

Direct logit attribution: with the final norm's scale s frozen at its value on the full stream, the
logit of token t is linear in the residual stream's parts,
    logit_t = Σ_c (LN-centred c / s) ⊙ w · W_U[:, t]  +  (b · W_U[:, t] + b_U[t]),
where c runs over the embeddings, every head's output z^h W_O^h, every attention bias b_O, and every
MLP's output. The parts sum to the logit exactly (tested).
"""

from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lab.metrics.information import kl
from lab.model.offload import read_weight
from lab.model.transformer import HookedTransformer


@torch.inference_mode()
def logit_lens(model: HookedTransformer, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "layer batch pos d_vocab"]:
    """Log-probabilities of the logit lens at every layer's input and after the last layer.

    Row l < n_layers reads blocks.l.hook_resid_pre; the last row reads the final residual stream and
    equals the model's own log-softmax.
    """
    return _lens_logits(model, tokens).log_softmax(dim=-1)


def _lens_logits(model: HookedTransformer, tokens: Tensor) -> Tensor:
    _, cache = model.run_with_cache(
        tokens,
        names_filter=lambda n: (
            n.endswith("hook_resid_pre") or n.endswith("hook_resid_post") or n == "ln_final.hook_scale"
        ),
    )
    stack = cache.accumulated_resid(apply_ln=True)  # final norm recomputed on each layer's stream
    return stack @ model.W_U + model.b_U


def residual_stack(
    model: HookedTransformer, tokens: Int[Tensor, "batch pos"]
) -> Float[Tensor, "layer batch pos d_model"]:
    """The residual stream x^(l) entering each block (blocks.l.hook_resid_pre) and after the last one (the
    final norm's input): the streams every lens reads, row l < n_layers for layer l, the last for the output."""
    last = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_resid_pre") or n == last)
    return cache.accumulated_resid()


def read_out(model: HookedTransformer, residual: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_vocab"]:
    """The model's own readout of a residual-stream vector: LN_final(x) W_U + b_U (the logit lens's map, and the
    tuned and Jacobian lenses' after their translation)."""
    return model.ln_final(residual) @ model.W_U + model.b_U


@dataclass
class GroundTruthLens:
    """The logit lens beside the truth, at every layer (row l < n_layers: resid_pre l; the last: the output)."""

    log_probs: Float[Tensor, "layer batch pos d_vocab"]  # log P^(l), float64
    p: Float[Tensor, "batch pos d_vocab"]  # the true next-token law at each position
    kl_nats: Float[Tensor, "layer batch pos"]  # KL(p ‖ P^(l)) at each position

    @property
    def labels(self) -> list[str]:
        n_layers = self.log_probs.shape[0] - 1
        return [f"resid_pre {layer}" for layer in range(n_layers)] + ["output"]


@torch.inference_mode()
def ground_truth_lens(
    model: HookedTransformer, tokens: Int[Tensor, "batch pos"], p: Float[Tensor, "batch pos d_vocab"] | Any
) -> GroundTruthLens:
    """The logit lens at every layer and KL(p ‖ P^(l)) at every position, where p[b, t] = p(x_{t+1} = · | x_≤t)
    is the world's true law of the token after position t (a source's `conditionals(tokens)`). In float64, as
    the KL decomposition measures the model's own KL."""
    tokens = model.check_tokens(tokens)
    p = torch.as_tensor(p, dtype=torch.float64)
    expected = (*tokens.shape, model.cfg.d_vocab)
    if tuple(p.shape) != expected:
        raise ValueError(
            f"the true distribution p has shape {tuple(p.shape)}; for tokens {tuple(tokens.shape)} it "
            f"must be [batch, pos, d_vocab] = {list(expected)}"
        )
    if (p < 0).any() or not torch.allclose(p.sum(-1), torch.ones((), dtype=torch.float64), atol=1e-6):
        raise ValueError(
            "the true distribution p must be non-negative and sum to 1 over the vocabulary at every position"
        )
    log_probs = _lens_logits(model, tokens).double().log_softmax(dim=-1).cpu()
    return GroundTruthLens(log_probs, p, kl(p[None], log_probs.exp()))


@torch.inference_mode()
def residual_norms(model: HookedTransformer, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "layer batch pos"]:
    """‖x^(l)‖₂ of the residual stream entering each layer, and after the last one."""
    _, cache = model.run_with_cache(
        tokens, names_filter=lambda n: n.endswith("hook_resid_pre") or n.endswith("hook_resid_post")
    )
    return cache.accumulated_resid().norm(dim=-1)


@dataclass
class Attribution:
    labels: list[str]  # "embed", "pos_embed", "L0H3", "L0 attn bias", "L0 mlp", ..., "final norm & unembed bias"
    values: Float[Tensor, " component"]  # contribution of each part to the target's logit
    logit: float  # the model's logit for the target at that position


@torch.inference_mode()
def direct_logit_attribution(
    model: HookedTransformer, tokens: Int[Tensor, " pos"], target: int, position: int = -1
) -> Attribution:
    """Each part of the residual stream's direct contribution to `target`'s logit at `position`."""
    tokens = model.check_tokens(tokens)[:1]
    if not 0 <= target < model.cfg.d_vocab:
        raise ValueError(f"target token id {target} is out of range [0, {model.cfg.d_vocab})")
    wanted = ("hook_embed", "hook_pos_embed", "attn.hook_z", "hook_mlp_out", "ln_final.hook_scale")
    logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith(wanted))
    if model.cfg.block == "post_ln":
        raise ValueError(
            "direct logit attribution needs a pre-LN or parallel model (a post-LN block norms its own output)"
        )
    labels, parts = ["embed"], [cache["hook_embed"][0, position]]
    if "hook_pos_embed" in cache.cache_dict:
        labels.append("pos_embed")
        parts.append(cache["hook_pos_embed"][0, position])
    for layer, block in enumerate(model.blocks):
        z = cache[f"blocks.{layer}.attn.hook_z"][0, position]  # [head, d_head]
        heads = torch.einsum("hd,hdm->hm", z, read_weight(model, f"blocks.{layer}.attn.W_O"))  # [head, d_model]
        labels += [f"L{layer}H{h}" for h in range(heads.shape[0])]
        parts += list(heads)
        if block.attn.b_O is not None:
            labels.append(f"L{layer} attn bias")
            parts.append(read_weight(model, f"blocks.{layer}.attn.b_O"))  # an offloaded block's, read from its store
        labels.append(f"L{layer} mlp")
        parts.append(cache[f"blocks.{layer}.hook_mlp_out"][0, position])
    stack = torch.stack(parts)  # [component, d_model]
    if model.cfg.normalization_type in ("LN", "LNPre"):
        stack = stack - stack.mean(dim=-1, keepdim=True)
    scale = cache["ln_final.hook_scale"][0, position]
    direction = model.tokens_to_residual_directions(target)  # w ⊙ W_U[:, t]; W_U[:, t] once the gain is folded
    values = (stack / scale) @ direction
    constant = model.b_U[target].clone()
    if model.cfg.norm == "layernorm":
        constant += read_weight(model, "ln_final.b") @ model.W_U[:, target]
    labels.append("final norm & unembed bias")
    return Attribution(labels, torch.cat([values, constant[None]]), float(logits[0, position, target]))
