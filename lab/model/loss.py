"""The next-token cross-entropy, mean and per token, in nats; in a padded batch over the real next tokens only."""

import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor


def per_token_loss(
    logits: Float[Tensor, "batch pos d_vocab"],
    tokens: Int[Tensor, "batch pos"],
    mask: Bool[Tensor, "batch pos"] | None = None,
) -> Float[Tensor, "batch pos_minus_1"]:
    """−log P_θ(x_{t+1} | x_≤t) in nats at every position but the last (TransformerLens's loss_per_token); 0 where
    x_t or x_{t+1} is padding (mask False)."""
    if tokens.shape[-1] < 2:  # no prediction to average over: the mean of nothing is NaN
        raise ValueError(
            f"a next-token loss needs at least 2 tokens per sequence (one to predict from, one to "
            f"predict), got {tokens.shape[-1]}"
        )
    loss = F.cross_entropy(logits[:, :-1].transpose(1, 2).float(), tokens[:, 1:], reduction="none")
    return loss if mask is None else loss.masked_fill(~(mask[:, :-1] & mask[:, 1:]), 0.0)


def next_token_loss(
    logits: Float[Tensor, "batch pos d_vocab"],
    tokens: Int[Tensor, "batch pos"],
    mask: Bool[Tensor, "batch pos"] | None = None,
) -> Float[Tensor, ""]:
    """Mean next-token cross-entropy in nats: the logits at t predict the token at t + 1, averaged over every real
    next token (both x_t and x_{t+1} real, in a padded batch)."""
    if mask is None:
        if tokens.shape[-1] < 2:
            raise ValueError(
                f"a next-token loss needs at least 2 tokens per sequence (one to predict from, one to "
                f"predict), got {tokens.shape[-1]}"
            )
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))
    return per_token_loss(logits, tokens, mask).sum() / (mask[:, :-1] & mask[:, 1:]).sum()
