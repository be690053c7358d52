"""The token embedding, the absolute position codes (learned, sinusoidal, shortformer, none) and the unembedding,
plain or tied to the embedding; `POSITIONS` maps `cfg.positions` to its class (rotary acts inside attention:
`lab.model.attention`)."""

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn

from lab.model.config import ModelConfig
from lab.model.padding import Padding, offset_positions
from lab.model.primitives import (
    CheckedHookPoint,
    Derived,
    empty_parameter,
    init_normal_,
    linear,
    reset_biases,
    zero_parameter,
)


class Embed(nn.Module):
    """Token embedding: e_t = W_E[x_t], W_E ∈ R^{d_vocab × d_model}."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.init_std = cfg.init_std
        self.W_E = empty_parameter(cfg.d_vocab, cfg.d_model)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """W_E ~ N(0, init_std²)."""
        init_normal_(self.W_E, self.init_std)

    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        # F.embedding, not W_E[tokens]: its CPU backward sums each row's gradients in token order at any thread
        # count, where indexing's adds them atomically from several threads (an order that varies run to run).
        return F.embedding(tokens, self.W_E)


def positions_table(
    W_pos: Tensor, tokens: Tensor, offset: int, attention_mask: Tensor | None, padding: Padding | None
) -> Float[Tensor, "batch pos d_model"]:
    """W_pos at each token's position: offset, offset + 1, ... (every row alike); in a padded batch each token's
    own position within its text, and 0 at padding (TransformerLens's PosEmbed). `attention_mask` is
    TransformerLens's [batch, offset + pos] mask of the cached and the new tokens; the model passes `padding`.
    A tensor of its own, never a view of W_pos: a hook that edits it in place edits this pass's positions, and in
    inference mode a view of the parameter would require grad with no graph behind it, which torch's module
    tracker (FlopCounterMode) cannot follow."""
    if padding is None and attention_mask is not None:
        keys = attention_mask.bool()
        padding = Padding(keys, offset_positions(keys, offset), offset)
    batch, length = tokens.shape[0], tokens.shape[-1]
    if padding is None:
        return W_pos[offset : offset + length].expand(batch, length, W_pos.shape[-1]).clone()
    return W_pos[padding.positions].masked_fill(~padding.new[..., None], 0.0)


class LearnedPositions(nn.Module):
    """Learned absolute positions: x_t = e_t + W_pos[t], W_pos ∈ R^{n_ctx × d_model}. Called as TransformerLens's
    PosEmbed, `pos_embed(tokens, offset, attention_mask)`, it gives the position embedding added to e."""

    into_attention = False  # added to the residual stream

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.init_std = cfg.init_std
        self.W_pos = empty_parameter(cfg.n_ctx, cfg.d_model)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """W_pos ~ N(0, init_std²)."""
        init_normal_(self.W_pos, self.init_std)

    def forward(
        self,
        tokens: Int[Tensor, "batch pos"],
        offset: int = 0,
        attention_mask: Tensor | None = None,
        padding: Padding | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        return positions_table(self.W_pos, tokens, offset, attention_mask, padding)


def sinusoidal_table(n_ctx: int, d_model: int, base: float = 10000.0) -> Float[Tensor, "n_ctx d_model"]:
    """PE[t, 2i] = sin(t / base^(2i/d_model)), PE[t, 2i+1] = cos(t / base^(2i/d_model))."""
    position = torch.arange(n_ctx, dtype=torch.float64)[:, None]
    frequency = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    table = torch.zeros(n_ctx, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency)
    return table.float()


class ShortformerPositions(LearnedPositions):
    """Shortformer positions (Press et al. 2021; TransformerLens's positional_embedding_type="shortformer"): learned
    W_pos[t] added to every attention's query and key inputs, after ln1, and never to the residual stream (nor to
    the values): x_t = e_t."""

    into_attention = True


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal positions (Vaswani et al. 2017, §3.5): x_t = e_t + PE[t]."""

    into_attention = False

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.register_buffer("W_pos", sinusoidal_table(cfg.n_ctx, cfg.d_model), persistent=False)

    def forward(
        self,
        tokens: Int[Tensor, "batch pos"],
        offset: int = 0,
        attention_mask: Tensor | None = None,
        padding: Padding | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        return positions_table(self.W_pos, tokens, offset, attention_mask, padding)


class NoAbsolutePositions(nn.Module):
    """No absolute position added to the residual stream (rotary models, or no positions at all): None."""

    into_attention = False

    def __init__(self, cfg: ModelConfig):
        super().__init__()

    def forward(
        self,
        tokens: Int[Tensor, "batch pos"],
        offset: int = 0,
        attention_mask: Tensor | None = None,
        padding: Padding | None = None,
    ) -> None:
        return None


def is_zero(tensor: Tensor) -> bool:
    return tensor.device.type != "meta" and not bool(tensor.any())  # a meta tensor has no values to be zero


def bias_to_add(unembed: nn.Module) -> Tensor | None:
    """b_U, or None where adding it changes nothing: it is all zero (as in every converted Hugging Face model) and
    no gradient needs to reach it. Adding zeros is one more pass over the whole [batch, pos, d_vocab] logits."""
    b_U = unembed.b_U
    if b_U.requires_grad and torch.is_grad_enabled():
        return b_U
    return None if unembed.b_U_is_zero(b_U) else b_U


class Unembed(nn.Module):
    """logits = x W_U + b_U, W_U ∈ R^{d_model × d_vocab_out}. hook_in is x (the final-normed residual stream), hook_out
    the logits, as in TransformerLens."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.init_std = cfg.init_std
        self.W_U = empty_parameter(cfg.d_model, cfg.d_vocab_out)
        self.b_U = zero_parameter((cfg.d_vocab_out,))
        self.b_U_is_zero = Derived(is_zero)
        self.reset_parameters()
        self.hook_in = CheckedHookPoint()  # [batch, pos, d_model]
        self.hook_out = CheckedHookPoint()  # [batch, pos, d_vocab_out]

    def reset_parameters(self) -> None:
        """W_U ~ N(0, init_std²), b_U = 0."""
        init_normal_(self.W_U, self.init_std)
        reset_biases(self.b_U)

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_vocab"]:
        return self.hook_out(linear(self.hook_in(x), self.W_U, bias_to_add(self)))


class TiedUnembed(nn.Module):
    """logits = x W_Eᵀ + b_U: the unembedding shares the token embedding's weights.

    The embedding is held outside the module tree (a tuple) so that its weight is stored once.
    """

    def __init__(self, cfg: ModelConfig, embed: Embed):
        super().__init__()
        self._embed = (embed,)
        self.b_U = zero_parameter((cfg.d_vocab,))
        self.b_U_is_zero = Derived(is_zero)
        self.hook_in = CheckedHookPoint()  # [batch, pos, d_model]
        self.hook_out = CheckedHookPoint()  # [batch, pos, d_vocab_out]

    def reset_parameters(self) -> None:
        """b_U = 0 (W_E is the embedding's, reset there)."""
        reset_biases(self.b_U)

    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab"]:
        return self._embed[0].W_E.T

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_vocab"]:
        return self.hook_out(linear(self.hook_in(x), self._embed[0].W_E.T, bias_to_add(self)))


POSITIONS: dict[str, type[nn.Module]] = {
    "learned": LearnedPositions,
    "shortformer": ShortformerPositions,
    "sinusoidal": SinusoidalPositions,
    "rotary": NoAbsolutePositions,  # rotary acts inside attention, on q and k
    "none": NoAbsolutePositions,
}
