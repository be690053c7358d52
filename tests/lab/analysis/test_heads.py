"""Head detectors: a head whose attention is exactly a kind's pattern scores 1, one that never attends there
scores 0, and on the same weights the scores are TransformerLens's detect_head rescaled by the share of
queries scored."""

import pytest
import torch
from transformer_lens import head_detector

from lab import HookedTransformer
from lab.analysis.heads import (
    HEAD_KINDS,
    detect_heads,
    duplicate_token_pattern,
    head_scores,
    induction_pattern,
    pattern_scores,
    previous_token_pattern,
)
from lab.data.tokenizers import word_level
from tests.builders import tiny_config

LAYER, HEAD = 1, 2


def as_attention(detection: torch.Tensor) -> torch.Tensor:
    """The detection pattern as attention: each row spread evenly over its keys; a row with none attends to
    itself (softmax rows sum to 1)."""
    rows = detection.float() + torch.diag_embed((~detection.any(-1)).float())
    return rows / rows.sum(-1, keepdim=True)


def forced(model, kind: str, tokens: torch.Tensor) -> torch.Tensor:
    """head_scores of `kind` with head (LAYER, HEAD)'s pattern replaced by `kind`'s own pattern."""
    target = as_attention(HEAD_KINDS[kind](tokens))

    def put(pattern, hook):
        pattern = pattern.clone()
        pattern[:, HEAD] = target
        return pattern

    with model.hooks(fwd_hooks=[(f"blocks.{LAYER}.attn.hook_pattern", put)]):
        return head_scores(model, tokens, kind)


def test_the_patterns_on_a_hand_written_sequence():
    tokens = torch.tensor([[5, 6, 5, 6, 7]])
    assert previous_token_pattern(tokens)[0].nonzero().tolist() == [[1, 0], [2, 1], [3, 2], [4, 3]]
    assert duplicate_token_pattern(tokens)[0].nonzero().tolist() == [[2, 0], [3, 1]]
    # the query 5 at 2 looks at what followed the earlier 5 (the 6 at 1); the 6 at 3 at the 5 at 2
    assert induction_pattern(tokens)[0].nonzero().tolist() == [[2, 1], [3, 2]]


@pytest.mark.parametrize("kind", sorted(HEAD_KINDS))
def test_a_head_attending_exactly_as_its_kind_scores_one(kind):
    model = HookedTransformer(tiny_config(), seed=3).eval()
    first = torch.randperm(model.cfg.d_vocab, generator=torch.Generator().manual_seed(0))[:12]  # no repeat inside
    tokens = torch.cat([first, first])[None].repeat(2, 1)
    scores = forced(model, kind, tokens)
    assert scores.shape == (model.cfg.n_layers, model.cfg.n_heads)
    assert scores[LAYER, HEAD].item() == pytest.approx(1.0, abs=1e-6)
    assert ((scores >= -1e-6) & (scores <= 1 + 1e-6)).all()
    others = scores.clone()
    others[LAYER, HEAD] = 0
    assert others.max() < 0.9  # a random head is no such head


def test_a_head_that_attends_to_itself_scores_zero_for_every_kind():
    # no token repeats its predecessor: the induction pattern (t_{j−1} = t_i) then never covers the query itself
    first = torch.randperm(50, generator=torch.Generator().manual_seed(1))[:10]
    tokens = torch.cat([first, first])[None].repeat(3, 1)
    itself = torch.eye(20).expand(3, 4, 20, 20)
    for kind, pattern in HEAD_KINDS.items():
        assert torch.equal(pattern_scores(itself, pattern(tokens)), torch.zeros(4)), kind


def test_scores_are_the_mean_share_over_scored_queries():
    tokens = torch.tensor([[1, 2, 3, 1]])  # one duplicate query: position 3, whose earlier occurrence is at 0
    attention = torch.zeros(1, 1, 4, 4)
    attention[0, 0, :, 0] = 1.0
    attention[0, 0, 3] = torch.tensor([0.25, 0.25, 0.25, 0.25])
    assert pattern_scores(attention, duplicate_token_pattern(tokens)).item() == pytest.approx(0.25)
    # previous-token: queries 1, 2, 3; only query 1 puts weight (1.0) on its previous key, query 3 puts 0.25
    assert pattern_scores(attention, previous_token_pattern(tokens)).item() == pytest.approx((1 + 0 + 0.25) / 3)


def test_nothing_to_score_is_a_clear_error():
    with pytest.raises(ValueError, match="nothing to score"):
        pattern_scores(torch.ones(1, 1, 3, 3) / 3, duplicate_token_pattern(torch.tensor([[1, 2, 3]])))
    with pytest.raises(ValueError, match="unknown head kind 'copying'"):
        head_scores(HookedTransformer(tiny_config()), torch.tensor([[1, 2, 3]]), "copying")
    with pytest.raises(ValueError, match="do not fit the model's context of 64"):
        detect_heads(HookedTransformer(tiny_config()), length=40)


@pytest.mark.parametrize("kind", sorted(HEAD_KINDS))
def test_scores_are_transformer_lens_detect_head_rescaled(kind):
    words = [f"w{i}" for i in range(20)]
    model = HookedTransformer(tiny_config(d_vocab=24), seed=5, tokenizer=word_level(words)).eval()
    text = "w1 w2 w3 w4 w1 w2 w3 w5 w2"
    tokens = model.to_tokens(text)
    theirs = head_detector.detect_head(model, text, f"{kind}_head")
    scored = HEAD_KINDS[kind](tokens).any(-1).sum().item()
    ours = head_scores(model, tokens, kind)
    assert torch.allclose(ours * scored / tokens.shape[1], theirs.float(), atol=1e-6)


def test_detect_heads_is_deterministic_and_reads_repeated_sequences():
    model = HookedTransformer(tiny_config(), seed=3).eval()
    a, b = detect_heads(model, length=8, batch=2, seed=4), detect_heads(model, length=8, batch=2, seed=4)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.induction, b.induction)
    assert torch.equal(a.tokens[:, :8], a.tokens[:, 8:])
    assert a.previous_token.shape == a.duplicate_token.shape == a.induction.shape == (2, 4)
    assert torch.allclose(a.induction, head_scores(model, a.tokens, "induction"))
