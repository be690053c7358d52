"""Corrupted prompts for activation patching: one token of the clean prompt replaced by another that the model
itself finds plausible there, such that the model's next-token prediction changes.

Patching (lab.analysis.patching) needs a clean and a corrupted prompt of equal length whose predictions
differ: with the same top token there is no logit difference logit(answer) − logit(wrong) to restore. A
one-token substitution keeps every other position aligned (Heimersheim & Nanda 2024, §2: corruptions that
stay on the data distribution), and drawing the substitute from the model's own prediction at that position,
P_θ(· | x_<p), keeps it on the model's distribution — a first name replaced by another first name, a
digit by a digit — without knowing the world.

Candidates come in a fixed order, so the same model and prompt give the same pairs: positions 1, 2, …
(position 0 has no prefix to predict it from), and at each the `most` most probable substitutes under
P_θ(· | x_<p) (ties by token id), skipping the token already there. A candidate is kept when the top
prediction at the last position differs from the clean prompt's.
"""

from collections.abc import Iterator
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

__all__ = ["corruptions"]


@torch.inference_mode()
def corruptions(model: Any, clean: Int[Tensor, "1 pos"], most: int = 32) -> Iterator[Int[Tensor, "1 pos"]]:
    """Every one-token substitution of `clean` (a batch of one) among the `most` most probable at its position
    whose last-position top prediction differs from the clean prompt's, in the module's fixed order."""
    clean = clean[None] if clean.ndim == 1 else clean
    if clean.ndim != 2 or clean.shape[0] != 1:
        raise ValueError(f"clean must be one prompt, shape [1, pos], got {tuple(clean.shape)}")
    if most < 1:
        raise ValueError(f"most must be ≥ 1, got {most}")
    logits = model(clean)[0]  # [pos, d_vocab]
    answer = int(logits[-1].argmax())
    for position in range(1, clean.shape[1]):
        # stable sort by −probability: equal probabilities keep their token order
        order = torch.sort(-logits[position - 1].float(), stable=True).indices
        substitutes = order[order != clean[0, position]][:most]
        batch = clean.repeat(len(substitutes), 1)
        batch[:, position] = substitutes
        predicted = model(batch)[:, -1].argmax(dim=-1)
        for row in (predicted != answer).nonzero()[:, 0].tolist():
            yield batch[row : row + 1].clone()
