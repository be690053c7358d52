"""Forma's HookedTransformer against TransformerLens 3.9's on the same tiny checkpoints (GPT-2, LLaMA with grouped
key/value heads, GPT-NeoX), with TransformerLens's weight processing on and off: every hook's activation, the
logits and the loss, on token ids, on text (BOS by default) and on a batch of texts padded on either side; the
processing leaves the logits unchanged up to a constant per position; and a padded batch gives each text's own
numbers."""

import pytest
import torch

from tests.transformer_lens.models import IMPLEMENTATIONS, checkpoint, forma_of

FAMILIES = ["gpt2", "llama", "pythia"]  # GPT-2, LLaMA with grouped K/V heads, GPT-NeoX
TEXTS = ["When John and Mary went to the shops, John gave the bag to", "Hello world!", "I am happy."]
TOL = 1e-5


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    return request.param


@pytest.fixture(scope="module", params=["processed", "unprocessed"])
def pair(request, family):
    load = "from_pretrained" if request.param == "processed" else "from_pretrained_no_processing"
    return [getattr(IMPLEMENTATIONS[name], load)(family) for name in ("reference", "forma")]


def same(a: torch.Tensor, b: torch.Tensor, tol: float = TOL) -> None:
    """Equal to tol, infinities (masked attention scores) in the same places."""
    assert a.shape == b.shape, (a.shape, b.shape)
    a, b = a.float(), b.float()
    assert torch.equal(a.isinf(), b.isinf())
    finite = a.isfinite()
    assert (a[finite] - b[finite]).abs().max().item() <= tol


def test_processing_gives_transformer_lens_architecture(pair):
    reference, forma = pair
    assert forma.cfg.normalization_type == reference.cfg.normalization_type
    assert forma.cfg.default_prepend_bos == reference.cfg.default_prepend_bos
    for name in ("W_U", "b_U", "W_E", "W_Q", "W_O", "W_in"):
        same(getattr(forma, name), getattr(reference, name))


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_every_hook_the_logits_and_the_loss_agree(pair, padding_side):
    reference, forma = pair
    for model in pair:
        model.tokenizer.padding_side = padding_side
    for input in (TEXTS[0], TEXTS, forma.to_tokens(TEXTS[1:2])):
        with torch.no_grad():
            logits, cache = reference.run_with_cache(input)
            ours, our_cache = forma.run_with_cache(input)
        same(ours, logits)
        assert set(cache.keys()) - set(our_cache.keys()) == set()  # every hook TransformerLens fires, Forma fires
        for name in cache.keys():
            same(our_cache[name], cache[name])
        loss_tokens = forma.to_tokens(input) if not isinstance(input, torch.Tensor) else input
        mask = torch.ones_like(loss_tokens) if isinstance(input, torch.Tensor) else None
        if isinstance(input, list):  # TransformerLens masks padding in its loss only when given the mask
            _, mask = forma.tokenize(input)
        with torch.no_grad():
            same(forma(input, return_type="loss"), reference(loss_tokens, return_type="loss", attention_mask=mask))


def test_processing_leaves_the_logits_unchanged_up_to_a_constant(family):
    forma = IMPLEMENTATIONS["forma"]
    plain, processed = forma.from_pretrained_no_processing(family), forma.from_pretrained(family)
    tokens = plain.to_tokens(TEXTS)
    with torch.no_grad():
        a, b = plain(tokens), processed(tokens)
    same(a.log_softmax(-1), b.log_softmax(-1))
    shift = (b - a) - (b - a).mean(-1, keepdim=True)  # center_unembed moves each position's logits by a constant
    assert shift.abs().max() <= 1e-4
    again = forma.from_pretrained_no_processing(family)
    again.process_weights_()
    with torch.no_grad():
        same(again(tokens), b)


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_a_padded_batch_equals_each_text_alone(family, padding_side):
    model = IMPLEMENTATIONS["forma"].from_pretrained(family)
    tokens, mask = model.tokenize(TEXTS, padding_side=padding_side)
    assert mask is not None and not mask.all()
    with torch.no_grad():
        logits, cache = model.run_with_cache(TEXTS, padding_side=padding_side)
        losses = model(TEXTS, return_type="loss", loss_per_token=True, padding_side=padding_side)
        for row, text in enumerate(TEXTS):
            alone, alone_cache = model.run_with_cache(text)
            real = mask[row]
            same(logits[row, real], alone[0])
            for name in ("blocks.1.hook_resid_post", "blocks.0.attn.hook_pattern", "hook_embed"):
                theirs = alone_cache[name][0]
                ours = cache[name][row]
                if name.endswith("hook_pattern"):  # [head, query, key]: the real rows and columns
                    ours = ours[:, real][:, :, real]
                else:
                    ours = ours[real]
                same(ours, theirs)
            alone_loss = model(text, return_type="loss", loss_per_token=True)[0]
            kept = (real[:-1] & real[1:])
            same(losses[row][kept], alone_loss)
        generated = model.generate(TEXTS, 4, do_sample=False, stop_at_eos=False, padding_side=padding_side,
                                   return_type="str", verbose=False)
        assert generated == [model.generate(text, 4, do_sample=False, stop_at_eos=False, verbose=False)
                             for text in TEXTS]


@pytest.mark.parametrize("split", [False, True])
def test_ungrouped_key_value_hooks_agree(split):
    """set_ungroup_grouped_query_attention on a LLaMA with grouped K/V heads: every hook (hook_k, hook_v and,
    split, hook_k_input, hook_v_input one per query head) and the logits equal TransformerLens's."""
    pair = [IMPLEMENTATIONS[name].from_pretrained("llama") for name in ("reference", "forma")]
    for model in pair:
        model.set_ungroup_grouped_query_attention(True)
        model.set_use_split_qkv_input(split)
    reference, forma = pair
    assert forma.cfg.n_key_value_heads < forma.cfg.n_heads
    with torch.no_grad():
        logits, cache = reference.run_with_cache(TEXTS)
        ours, our_cache = forma.run_with_cache(TEXTS)
    same(ours, logits)
    assert our_cache["blocks.0.attn.hook_k"].shape[2] == forma.cfg.n_heads
    for name in cache.keys():
        same(our_cache[name], cache[name])


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_shortformer_positions_agree(split, padding_side):
    """Shortformer positions (W_pos added to every attention's query and key inputs, not to the residual stream),
    on a TransformerLens model and Forma's copy of its weights: every hook, the logits and the loss on a padded
    batch of texts, with the per-head inputs on and off, and greedy generation through the KV cache."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint("gpt2"), local_files_only=True, trust_remote_code=False)
    cfg = HookedTransformerConfig(n_layers=2, d_model=32, n_heads=4, d_head=8, d_mlp=64, n_ctx=64, d_vocab=1024,
                                  act_fn="gelu_new", normalization_type="LN", positional_embedding_type="shortformer",
                                  seed=0, default_prepend_bos=True)
    reference = HookedTransformer(cfg, tokenizer, move_to_device=False)
    forma = forma_of(reference)
    assert forma.cfg.positional_embedding_type == "shortformer"
    for model in (reference, forma):
        model.tokenizer.padding_side = padding_side
        model.set_use_split_qkv_input(split)
    with torch.no_grad():
        logits, cache = reference.run_with_cache(TEXTS)
        ours, our_cache = forma.run_with_cache(TEXTS)
        same(ours, logits)
        assert "blocks.0.hook_resid_pre" in cache and set(cache.keys()) - set(our_cache.keys()) == set()
        for name in cache.keys():
            same(our_cache[name], cache[name])
        same(forma(TEXTS[0], return_type="loss"), reference(TEXTS[0], return_type="loss"))
        generated = [model.generate(TEXTS[0], 5, do_sample=False, stop_at_eos=False, verbose=False,
                                    use_past_kv_cache=True) for model in (reference, forma)]
    assert generated[0] == generated[1]
