# Ported from TransformerLens: tests/acceptance/test_generate_batch.py,
# as released in transformer-lens 3.9.0 (sdist transformer_lens-3.9.0.tar.gz, sha256 671f01075af1107e…;
# the file as it is at commit 481040ec9ecb28b5d38ccd9acc9f32d60bf0e94f of github.com/TransformerLensOrg/TransformerLens).
# Only the model under test is substituted (tests/transformer_lens/under_test.py: Forma's HookedTransformer or
# TransformerLens's, over the same tiny checkpoint, tests/transformer_lens/models.py); every test runs on both.
"""Tests that batched HookedTransformer generation matches individual generation."""


def test_ht_generate_batch_matches_individual(gpt2_model):
    """Batched generate() should match one-by-one generate() for left-padded inputs."""
    prompts = ["Hello, my dog is cute", "This is a much longer text. Hello, my cat is cute"]
    individual_outputs = [gpt2_model.generate(p, verbose=False, do_sample=False) for p in prompts]

    batched_outputs = gpt2_model.generate(prompts, verbose=False, do_sample=False)
    for i, prompt in enumerate(prompts):
        assert (
            individual_outputs[i] == batched_outputs[i]
        ), f"Prompt {i} mismatch:\n  individual: {individual_outputs[i]}\n  batched: {batched_outputs[i]}"


def test_ht_generate_batch_without_kv_cache(gpt2_model):
    """Same test with use_past_kv_cache=False."""
    prompts = ["Hello, my dog is cute", "This is a much longer text. Hello, my cat is cute"]
    individual_outputs = [
        gpt2_model.generate(p, verbose=False, do_sample=False, use_past_kv_cache=False)
        for p in prompts
    ]

    batched_outputs = gpt2_model.generate(
        prompts, verbose=False, do_sample=False, use_past_kv_cache=False
    )
    for i, prompt in enumerate(prompts):
        assert (
            individual_outputs[i] == batched_outputs[i]
        ), f"Prompt {i} mismatch:\n  individual: {individual_outputs[i]}\n  batched: {batched_outputs[i]}"
