"""TransformerLens's weight processing, on a HookedTransformer's own weights: the same network (logits to float
round-off, log-probabilities exactly up to it) in weights that are easier to read. Each step follows
`transformer_lens.weight_processing.ProcessWeights`, in its order:

- fold_ln: a norm's gain w (and LayerNorm's bias b) move into the maps that read it — W ← w ⊙ W and
  b_W ← b_W + b · W for W_Q, W_K, W_V (ln1), W_in and W_gate (ln2), W_U (the final norm; its bias into b_U) —
  and, for LayerNorm, those W are centred over d_model (the normed stream has zero mean, so the centred map reads
  it the same). The norms become LayerNormPre / RMSNormPre: normalisation only (cfg.norm "layernorm_pre",
  "rmsnorm_pre"; TransformerLens's normalization_type "LNPre", "RMSPre").
- center_writing_weights (LayerNorm models): every map writing the residual stream (W_E, learned W_pos, W_O, b_O,
  W_out, b_out) is centred over d_model; every reader normalises the stream first, so nothing it reads changes.
- center_unembed: W_U and b_U centred over the vocabulary; softmax does not see a constant shift of the logits.
- fold_value_biases: b_V's contribution is the same at every query (a pattern sums to 1), so it moves into b_O:
  b_O ← b_O + Σ_h b_V^h W_O^h, b_V ← 0 (re-centred when writing weights are centred).
- refactor_factored_attn_matrices: W_Q, W_K (with their biases as an extra input row) become the balanced factors
  of the same W_Q W_Kᵀ, and W_V, W_O the SVD factors U S and Vᵀ of W_V W_O (b_V folded into b_O first).

A tied unembedding is untied first (W_U stops being W_Eᵀ once either moves), as TransformerLens keeps W_U apart.
What a model cannot hold is refused with the reason: folding or centring a post-LN model (its norms read the
branch outputs), folding a LayerNorm's bias into maps that have no bias, refactoring rotary attention (its QK
circuit depends on positions), grouped key/value heads or a model without attention biases. Value biases stay
where they are in a model with no b_O to take them (Qwen2's layout).
"""

from typing import Any

import torch
from torch import Tensor, nn
from transformer_lens import FactoredMatrix

from lab.model.embeddings import Unembed
from lab.model.errors import Misuse
from lab.model.norms import NORMS, NoNorm

FOLDED = {"layernorm": "layernorm_pre", "rmsnorm": "rmsnorm_pre"}


def process_weights(
    model: Any,
    fold_ln: bool = True,
    center_writing_weights: bool = True,
    center_unembed: bool = True,
    fold_value_biases: bool = True,
    refactor_factored_attn_matrices: bool = False,
) -> None:
    """Process `model`'s weights in place, as TransformerLens's `process_weights_` / `from_pretrained` does."""
    cfg = model.cfg
    fold_ln = fold_ln and cfg.norm in FOLDED  # already folded: nothing to fold (TransformerLens skips it too)
    layernorm = cfg.norm in ("layernorm", "layernorm_pre")
    center_writing_weights = center_writing_weights and layernorm
    _check(model, fold_ln, center_writing_weights, refactor_factored_attn_matrices)
    if any(p.device.type == "meta" for p in model.parameters()):
        raise Misuse(
            "weight processing needs every weight in memory: load the model without a device_map, or "
            "process it before spreading it"
        )
    dtype = model.W_E.dtype
    with torch.no_grad():
        W = {name: p.detach().float().clone() for name, p in model.named_parameters()}
        W["unembed.W_U"] = model.W_U.detach().float().clone()
        if fold_ln:
            _fold_ln(W, model, center=layernorm)
        if center_writing_weights:
            _center_writing_weights(W, model)
        if center_unembed:
            W["unembed.W_U"] -= W["unembed.W_U"].mean(-1, keepdim=True)
            W["unembed.b_U"] -= W["unembed.b_U"].mean()
        if fold_value_biases:
            _fold_value_biases(W, model, recenter=center_writing_weights)
        if refactor_factored_attn_matrices:
            _refactor(W, model)
        _rebuild(model, fold_ln, untie=cfg.tied_embeddings and (fold_ln or center_writing_weights or center_unembed))
        for name, parameter in model.named_parameters():
            parameter.copy_(W[name].to(dtype))
    model.setup()


def _check(model: Any, fold_ln: bool, center_writing_weights: bool, refactor: bool) -> None:
    cfg = model.cfg
    if cfg.block == "post_ln" and (fold_ln or center_writing_weights):
        raise Misuse(
            "fold_ln and center_writing_weights need pre-LN or parallel blocks: a post-LN block's norms read "
            "the branch outputs, not the stream the next maps read; pass fold_ln=False, "
            "center_writing_weights=False"
        )
    if cfg.positions == "shortformer" and (fold_ln or center_writing_weights):
        raise Misuse(
            "fold_ln and center_writing_weights cannot be done on shortformer positions, which are added to "
            "the attention's normed input: pass fold_ln=False, center_writing_weights=False"
        )
    if fold_ln and cfg.norm == "layernorm":
        if not cfg.has_qkv_bias or (not cfg.bias):
            raise Misuse(
                "fold_ln moves LayerNorm's bias into the biases of W_Q, W_K, W_V and W_in; this model has "
                "none (bias = false): pass fold_ln=False"
            )
        if cfg.mlp == "swiglu":
            raise Misuse("fold_ln would move LayerNorm's bias into a gate that has no bias: pass fold_ln=False")
    if refactor:
        if cfg.positions == "rotary":
            raise Misuse(
                "You can't refactor the QK circuit when using rotary embeddings (as the QK matrix depends on "
                "the position of the query and key)"
            )
        if cfg.n_kv_heads != cfg.n_heads or not cfg.bias:
            raise Misuse(
                "refactor_factored_attn_matrices needs one key/value head per query head and attention "
                "biases (b_Q, b_K, b_V, b_O)"
            )


def _fold_ln(W: dict[str, Tensor], model: Any, center: bool) -> None:
    """Each norm's gain (and bias) into the maps that read it; centred over d_model for LayerNorm."""
    for layer in range(len(model.blocks)):
        p = f"blocks.{layer}."
        _fold_into(W, p + "ln1", [p + f"attn.W_{x}" for x in "QKV"], center)
        if p + "ln2.w" in W:  # not in an attention-only block
            _fold_into(
                W,
                p + "ln2",
                [p + "mlp.W_in"] + ([p + "mlp.W_gate"] if p + "mlp.W_gate" in W else []),
                center,
                centred=[p + "mlp.W_in"],
            )
    if "ln_final.w" in W:
        w, b = W.pop("ln_final.w"), W.pop("ln_final.b", None)
        if b is not None:
            W["unembed.b_U"] += b @ W["unembed.W_U"]
        W["unembed.W_U"] *= w[:, None]
        if center:
            W["unembed.W_U"] -= W["unembed.W_U"].mean(0, keepdim=True)


def _fold_into(
    W: dict[str, Tensor], norm: str, readers: list[str], center: bool, centred: list[str] | None = None
) -> None:
    """w ⊙ W and b_W + b · W for each reader W (attention's [head, d_model, d_head], the MLP's [d_model, d_mlp])."""
    w, b = W.pop(norm + ".w"), W.pop(norm + ".b", None)
    for name in readers:
        axis = -2 if W[name].ndim == 3 else 0  # the d_model axis; w[:, None] lines up with it either way
        if b is not None:
            bias = name.replace(".W_", ".b_")
            W[bias] = W[bias] + (W[name] * b[:, None]).sum(axis)
        W[name] = W[name] * w[:, None]
        if center and name in (readers if centred is None else centred):
            W[name] = W[name] - W[name].mean(axis, keepdim=True)


def _center_writing_weights(W: dict[str, Tensor], model: Any) -> None:
    for name in ["embed.W_E", "pos_embed.W_pos"] + [
        f"blocks.{l}.{m}" for l in range(model.cfg.n_layers) for m in ("attn.W_O", "attn.b_O", "mlp.W_out", "mlp.b_out")
    ]:
        if name in W:
            W[name] = W[name] - W[name].mean(-1, keepdim=True)


def _fold_value_biases(W: dict[str, Tensor], model: Any, recenter: bool) -> None:
    group = model.cfg.n_heads // model.cfg.n_kv_heads
    for layer in range(model.cfg.n_layers):
        b_V, b_O = f"blocks.{layer}.attn.b_V", f"blocks.{layer}.attn.b_O"
        if b_V not in W or b_O not in W:
            continue
        per_head = W[b_V].repeat_interleave(group, dim=0)  # [head, d_head]
        W[b_O] = W[b_O] + (per_head[:, :, None] * W[f"blocks.{layer}.attn.W_O"]).sum((0, 1))
        W[b_V] = torch.zeros_like(W[b_V])
        if recenter:
            W[b_O] = W[b_O] - W[b_O].mean()


def _refactor(W: dict[str, Tensor], model: Any) -> None:
    for layer in range(model.cfg.n_layers):
        a = f"blocks.{layer}.attn."
        W_Q_eff = torch.cat([W[a + "W_Q"], W[a + "b_Q"][:, None, :]], dim=1)
        W_K_eff = torch.cat([W[a + "W_K"], W[a + "b_K"][:, None, :]], dim=1)
        W_Q_even, W_K_even_T = FactoredMatrix(W_Q_eff, W_K_eff.transpose(-1, -2)).make_even().pair
        W_K_even = W_K_even_T.transpose(-1, -2)
        W[a + "W_Q"], W[a + "b_Q"] = W_Q_even[:, :-1, :], W_Q_even[:, -1, :]
        W[a + "W_K"], W[a + "b_K"] = W_K_even[:, :-1, :], W_K_even[:, -1, :]
        W[a + "b_O"] = W[a + "b_O"] + (W[a + "b_V"][:, :, None] * W[a + "W_O"]).sum(1).sum(0)
        W[a + "b_V"] = torch.zeros_like(W[a + "b_V"])
        U, S, Vh = FactoredMatrix(W[a + "W_V"], W[a + "W_O"]).svd()
        W[a + "W_V"], W[a + "W_O"] = U @ S.diag_embed(), Vh.transpose(-1, -2)


def _rebuild(model: Any, folded: bool, untie: bool) -> None:
    """Give the model the architecture its processed weights describe: norms without gain or bias once folded, and
    an unembedding of its own once untied. Its config changes to say so; its run-time settings stay."""
    cfg = model.cfg
    new = cfg.replace(norm=FOLDED[cfg.norm] if folded else cfg.norm, tied_embeddings=cfg.tied_embeddings and not untie)
    object.__setattr__(new, "_runtime", cfg.runtime)  # the same switches, read by every component
    model.cfg = new
    where = dict(device=model.W_E.device, dtype=model.W_E.dtype)  # and each new module in the model's mode
    if folded:
        for block in model.blocks:
            for name in ("ln1", "ln2"):
                if hasattr(block, name) and not isinstance(getattr(block, name), NoNorm):
                    setattr(block, name, NORMS[new.norm](new).to(**where).train(model.training))
        if not isinstance(model.ln_final, NoNorm):
            model.ln_final = NORMS[new.norm](new).to(**where).train(model.training)
    if untie:
        unembed: nn.Module = Unembed(new).to(**where).train(model.training)
        model.unembed = unembed
