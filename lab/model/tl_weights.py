"""HookedTransformer's weights under TransformerLens's names, and what TransformerLens's analysis code reads from
them: every layer's W_Q … W_out stacked, the QK and OV circuits, `accumulated_bias`, `tl_parameters` and
`tokens_to_residual_directions`.

Every weight is read through `read_weight`, so that on a model spread over devices by accelerate (lab.hf.load_hf
with a device_map) an offloaded block's weights come from its offload store instead of the meta device.
"""

from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens import FactoredMatrix

from lab.model.offload import read_weight


class TLWeights:
    """The weight views of a model with `cfg`, `blocks`, `pos_embed`, `ln_final` and its parameters' names."""

    @property
    def W_E(self) -> Tensor:
        return read_weight(self, "embed.W_E")

    @property
    def W_pos(self) -> Tensor:
        if not hasattr(self.pos_embed, "W_pos"):
            raise AttributeError(f"a model with positions = {self.cfg.positions!r} has no W_pos")
        return read_weight(self, "pos_embed.W_pos")

    @property
    def W_U(self) -> Tensor:
        return read_weight(self, "unembed.W_U")

    @property
    def b_U(self) -> Tensor:
        return read_weight(self, "unembed.b_U")

    def _stack(self, name: str, module: str = "attn") -> Tensor:
        """blocks.{l}.{module}.{name} for every layer l, stacked on the first layer's device."""
        layers = [read_weight(self, f"blocks.{layer}.{module}.{name}") for layer in range(self.cfg.n_layers)]
        return torch.stack([w.to(layers[0].device) for w in layers])

    @property
    def W_Q(self) -> Tensor:  # [layer, head, d_model, d_head]
        return self._stack("W_Q")

    @property
    def W_K(self) -> Tensor:  # [layer, kv_head, d_model, d_head]
        return self._stack("W_K")

    @property
    def W_V(self) -> Tensor:  # [layer, kv_head, d_model, d_head]
        return self._stack("W_V")

    @property
    def W_O(self) -> Tensor:  # [layer, head, d_head, d_model]
        return self._stack("W_O")

    @property
    def W_in(self) -> Tensor:  # [layer, d_model, d_mlp]
        return self._stack("W_in", "mlp")

    @property
    def W_out(self) -> Tensor:  # [layer, d_mlp, d_model]
        return self._stack("W_out", "mlp")

    def _per_query_head(self, W: Tensor, head_axis: int = -3) -> Tensor:
        """Key/value weights (head axis −3) or biases (−2) repeated to one per query head: query head h reads
        key/value head ⌊h · n_kv_heads / n_heads⌋."""
        group = self.cfg.n_heads // self.cfg.n_kv_heads
        return W.repeat_interleave(group, dim=head_axis) if group > 1 else W

    @property
    def QK(self) -> FactoredMatrix:  # [layer, head, d_model, d_model]: W_Q^h (W_K^h)ᵀ
        """Every head's QK circuit W_Q^h W_K^hᵀ, factored; grouped key/value heads repeated per query head."""
        return FactoredMatrix(self.W_Q, self._per_query_head(self.W_K).transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:  # [layer, head, d_model, d_model]: W_V^h W_O^h
        """Every head's OV circuit W_V^h W_O^h, factored; grouped key/value heads repeated per query head."""
        return FactoredMatrix(self._per_query_head(self.W_V), self.W_O)

    def accumulated_bias(
        self, layer: int, mlp_input: bool = False, include_mlp_biases: bool = True
    ) -> Float[Tensor, " d_model"]:
        """Σ of the biases written into the residual stream before `layer`: b_O of every attention and (with
        include_mlp_biases) b_out of every MLP in blocks 0 … layer − 1, plus block `layer`'s b_O when
        mlp_input (the stream entering its MLP; a parallel block's MLP reads the block's input, before its
        attention). TransformerLens's `get_full_resid_decomposition` reads it."""
        n_layers = self.cfg.n_layers
        if not 0 <= layer <= n_layers or (mlp_input and layer == n_layers):
            raise ValueError(f"layer must lie in [0, {n_layers}] ([0, {n_layers - 1}] with mlp_input), got {layer}")
        total = torch.zeros(self.cfg.d_model, device=self.W_E.device, dtype=self.W_E.dtype)
        after_attention = mlp_input and self.cfg.block != "parallel"
        include_mlp_biases = include_mlp_biases and self.cfg.block != "attn_only"
        for index in range(layer + after_attention):  # read_weight: a block's biases may be offloaded
            b_O = read_weight(self, f"blocks.{index}.attn.b_O")
            b_out = read_weight(self, f"blocks.{index}.mlp.b_out") if include_mlp_biases and index < layer else None
            for bias in (b_O, b_out):
                if bias is not None:
                    total = total + bias.to(total.device)
        return total

    def tl_parameters(self) -> dict[str, Tensor]:
        """Every weight under its TransformerLens name, as TransformerLens's SVDInterpreter reads them: key/value
        weights and biases repeated per query head, and unembed.W_U present when it is tied to W_E."""
        params = dict(self.named_parameters())
        for layer, block in enumerate(self.blocks):
            for name, head_axis in (("W_K", -3), ("W_V", -3), ("b_K", -2), ("b_V", -2)):
                value = getattr(block.attn, name)
                if value is not None:
                    params[f"blocks.{layer}.attn.{name}"] = self._per_query_head(value, head_axis)
        params["unembed.W_U"] = self.W_U
        return params

    def tokens_to_residual_directions(self, tokens: Any) -> Tensor:
        """The direction(s) the final-normed residual stream is read along for token id(s) or a string:
        w ⊙ W_U[:, t], with w the final norm's gain (TransformerLens's API).

        logit_t = (x̂ ⊙ w + b) · W_U[:, t] + b_U[t] for the normed stream x̂, so w ⊙ W_U[:, t] is the part that
        depends on x̂, and b · W_U[:, t] + b_U[t] is a constant no component writes. TransformerLens folds w into
        W_U when it loads a model; Forma keeps its weights as they are, and puts w here instead, so that
        `cache.logit_attrs` and TransformerLens's direct logit attribution decompose the real logit."""
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        if isinstance(tokens, Tensor) and tokens.numel() == 1 and tokens.ndim <= 1:
            tokens = int(tokens.item())
        # a post-LN stack has no final norm: W_U reads the stream (read_weight: the gain may be offloaded)
        gain = read_weight(self, "ln_final.w") if hasattr(self.ln_final, "w") else None
        W_U = self.W_U if gain is None else gain[:, None].to(self.W_U.device) * self.W_U
        if isinstance(tokens, int):
            return W_U[:, tokens]
        tokens = torch.as_tensor(tokens, device=W_U.device)
        return W_U[:, tokens].movedim(0, -1)
