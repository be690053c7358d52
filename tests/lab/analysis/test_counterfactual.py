"""One-token corruptions for patching: each differs from the clean prompt in exactly one position, changes the
model's top prediction, comes from the model's own most probable substitutes, in a fixed order."""

import itertools

import pytest
import torch

from lab import HookedTransformer
from lab.analysis.counterfactual import corruptions
from tests.builders import tiny_config


def test_each_corruption_swaps_one_plausible_token_and_changes_the_prediction():
    model = HookedTransformer(tiny_config(), seed=3).eval()
    clean = torch.randint(0, 100, (1, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(clean)[0]
    found = list(itertools.islice(corruptions(model, clean, most=8), 20))
    assert found, "a random model changes its prediction for some one-token swap"
    positions = []
    for corrupted in found:
        changed = (corrupted != clean).nonzero()[:, 1].tolist()
        assert len(changed) == 1 and changed[0] > 0
        position = changed[0]
        positions.append(position)
        with torch.no_grad():
            assert model(corrupted)[0, -1].argmax() != logits[-1].argmax()
        rank = (logits[position - 1] > logits[position - 1, corrupted[0, position]]).sum().item()
        assert rank <= 8  # among the `most` most probable (the token already there may be one of them)
    assert positions == sorted(positions)  # earlier positions first
    again = list(itertools.islice(corruptions(model, clean, most=8), 20))
    assert all(torch.equal(a, b) for a, b in zip(found, again))


def test_a_model_whose_prediction_never_changes_gives_none():
    model = HookedTransformer(tiny_config(), seed=3).eval()
    with torch.no_grad():
        model.b_U.copy_(torch.arange(100.0) * 1e3)  # token 99 wins whatever the prompt
    assert list(corruptions(model, torch.tensor([[1, 2, 3]]))) == []


def test_bad_arguments_are_clear_errors():
    model = HookedTransformer(tiny_config())
    with pytest.raises(ValueError, match=r"one prompt, shape \[1, pos\]"):
        next(corruptions(model, torch.zeros(2, 4, dtype=torch.long)))
    with pytest.raises(ValueError, match="most must be ≥ 1"):
        next(corruptions(model, torch.zeros(1, 4, dtype=torch.long), most=0))
