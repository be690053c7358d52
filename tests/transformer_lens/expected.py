"""Which upstream TransformerLens test files are ported (tests/transformer_lens/test_*.py), where each comes from,
and the upstream tests that cannot pass on a tiny stand-in checkpoint, on either implementation (why, for each).
"""

# ported file -> (upstream file, the commit of github.com/TransformerLensOrg/TransformerLens whose copy of it is the
# released 3.9.0's, or None when no commit on record has that content)
UPSTREAM = {
    "test_integration_hooks.py": ("tests/integration/test_hooks.py", "35cc69dccca1d2ad6b9fb6125232b8ba20b866e4"),
    "test_integration_head_detector.py": ("tests/integration/test_head_detector.py", None),
    "test_integration_cache_hook_names.py": ("tests/integration/test_cache_hook_names.py",
                                             "5acc9b70aeff7f3e2cd2e6f418e4f659b7013303"),
    "test_integration_utils_tokens.py": ("tests/integration/test_utils_tokens.py", None),
    "test_unit_patching.py": ("tests/unit/test_patching.py", "388d9b5b57d862e2dbd70168fb1808da91456fa2"),
    "test_unit_svd_interpreter.py": ("tests/unit/test_svd_interpreter.py", None),
    "test_unit_direct_path_patching.py": ("tests/unit/test_direct_path_patching.py",
                                          "ce637ae1458e81bd1d79d36caf931a58a28e7500"),
    "test_acceptance_activation_cache.py": ("tests/acceptance/test_activation_cache.py", None),
    "test_integration_prepend_bos.py": ("tests/integration/test_prepend_bos.py", "6ce62ab299e2472cef8eff88c199af42ed90b87b"),
    "test_integration_left_padding.py": ("tests/integration/test_left_padding.py", "da95cc4eb1329bbda8613550fa215407fe6bc6a7"),
    "test_integration_attention_mask.py": ("tests/integration/test_attention_mask.py", None),
    "test_integration_tokenization_methods.py": ("tests/integration/test_tokenization_methods.py", "6ce62ab299e2472cef8eff88c199af42ed90b87b"),
    "test_integration_kv_cache.py": ("tests/integration/test_kv_cache.py", "da95cc4eb1329bbda8613550fa215407fe6bc6a7"),
    "test_integration_start_at_layer.py": ("tests/integration/test_start_at_layer.py", "2c46ba016d0764ff77688a53b96e5d86ee8489da"),
    "test_integration_stop_at_layer.py": ("tests/integration/test_stop_at_layer.py", "6ce62ab299e2472cef8eff88c199af42ed90b87b"),
    "test_integration_cross_entropy_loss.py": ("tests/integration/test_cross_entropy_loss.py", "7b3cac2d1e0dd1f534a1be4e85f6d27c4efe5d8c"),
    "test_integration_cache_pos_slice.py": ("tests/integration/test_cache_pos_slice.py", "d04479725de1d10c76089003e200eeedd4f1e2fe"),
    "test_integration_grouped_query_attention.py": ("tests/integration/test_grouped_query_attention.py", None),
    "test_integration_d_vocab.py": ("tests/integration/test_d_vocab.py", "6ce62ab299e2472cef8eff88c199af42ed90b87b"),
    "test_integration_match_huggingface.py": ("tests/integration/test_match_huggingface.py", "35cc69dccca1d2ad6b9fb6125232b8ba20b866e4"),
    "test_acceptance_hooked_transformer.py": ("tests/acceptance/test_hooked_transformer.py", None),
    "test_acceptance_generate_batch.py": ("tests/acceptance/test_generate_batch.py", "481040ec9ecb28b5d38ccd9acc9f32d60bf0e94f"),
    "test_acceptance_hook_tokens.py": ("tests/acceptance/test_hook_tokens.py", "3b434e6c22bcd34ce540d56e993d10f1426dcc79"),
    "test_acceptance_tokenizer_special_tokens.py": ("tests/acceptance/test_tokenizer_special_tokens.py", None),
    "test_unit_split_qkv.py": ("tests/unit/test_split_qkv.py", "ce637ae1458e81bd1d79d36caf931a58a28e7500"),
    "test_unit_use_attn_result.py": ("tests/unit/test_use_attn_result.py", "7a7dd6dd539527648f7cfdc5bfab65ad31de884f"),
    "test_unit_generate_no_tokenizer.py": ("tests/unit/test_generate_no_tokenizer.py", "06bc364ddd872c060dea7cafd1b46f878f6a6f5c"),
    "test_unit_utils.py": ("tests/unit/test_utils.py", None),
}
PORTED = tuple(UPSTREAM)

# "ported file::test id" -> why it cannot pass on a tiny checkpoint, on either implementation
PRETRAINED = "asserts numbers of TransformerLens's pretrained {m}, which a tiny random stand-in does not have"
TYPECHECK = ("expects jaxtyping's import-time type checker, which upstream's pytest configuration installs over "
             "transformer_lens (with it, each TransformerLens function annotated to take its HookedTransformer would "
             "refuse any other model)")
HUB = "looks up {what} on Hugging Face's hub"
NO_STAND_IN = "needs {m}, for which there is no stand-in"
TOKENIZER = "asserts {what}, which a tokenizer trained here does not have"
BOTH: dict[str, str] = {
    "test_acceptance_hooked_transformer.py::test_all_pythia_models_exist":
        HUB.format(what="every Pythia model name"),
    "test_acceptance_hooked_transformer.py::test_all_tinystories_models_exist":
        HUB.format(what="every TinyStories model name"),
    "test_acceptance_hooked_transformer.py::test_bloom_similarity_with_hf_model_with_kv_cache_activated":
        NO_STAND_IN.format(m="bigscience/bloom-560m (BLOOM, a family Forma does not convert)"),
    "test_acceptance_hooked_transformer.py::test_bloom_similarity_with_hf_model_with_kv_cache_activated_stream":
        NO_STAND_IN.format(m="bigscience/bloom-560m (BLOOM, a family Forma does not convert)"),
    "test_acceptance_hooked_transformer.py::test_from_pretrained_no_processing[solu-1l-5.256411552429199]":
        PRETRAINED.format(m="solu-1l (its loss)"),
    "test_acceptance_hooked_transformer.py::test_from_pretrained_revision":
        HUB.format(what="a revision of gpt2"),
    "test_acceptance_hooked_transformer.py::test_model[gpt2-small-5.331855773925781]":
        PRETRAINED.format(m="gpt2-small (its loss)"),
    "test_acceptance_hooked_transformer.py::test_model[pythia-70m-4.659344673156738]":
        PRETRAINED.format(m="pythia-70m (its loss)"),
    "test_acceptance_hooked_transformer.py::test_othello_gpt":
        NO_STAND_IN.format(m="othello-gpt (TransformerLens's own checkpoint)"),
    "test_acceptance_hooked_transformer.py::test_process_weights_inplace":
        PRETRAINED.format(m="gpt2-small (its loss)"),
    "test_integration_d_vocab.py::test_d_vocab_from_tokenizer":
        TOKENIZER.format(what="GPT-2's vocabulary size (50257)"),
    "test_integration_d_vocab.py::test_d_vocab_from_tokenizer_name":
        TOKENIZER.format(what="GPT-2's vocabulary size (50257)"),
    "test_integration_d_vocab.py::test_d_vocab_out_set_d_vocab_infer":
        TOKENIZER.format(what="GPT-2's vocabulary size (50257)"),
    "test_unit_utils.py::test_tokenize_and_concatenate_no_spurious_sequence_length_warning":
        HUB.format(what="t5-small's tokenizer"),
    "test_integration_tokenization_methods.py::test_get_token_position_not_found":
        TOKENIZER.format(what="the ids, strings and vocabulary size of solu-1l's and GPT-2's tokenizers (and solu-1l's d_model)"),
    "test_integration_tokenization_methods.py::test_get_token_position_str":
        TOKENIZER.format(what="the ids, strings and vocabulary size of solu-1l's and GPT-2's tokenizers (and solu-1l's d_model)"),
    "test_integration_tokenization_methods.py::test_get_token_position_str_without_bos":
        TOKENIZER.format(what="the ids, strings and vocabulary size of solu-1l's and GPT-2's tokenizers (and solu-1l's d_model)"),
    "test_integration_tokenization_methods.py::test_set_tokenizer_during_initialization":
        TOKENIZER.format(what="the ids, strings and vocabulary size of solu-1l's and GPT-2's tokenizers (and solu-1l's d_model)"),
    "test_integration_tokenization_methods.py::test_set_tokenizer_lazy":
        TOKENIZER.format(what="the ids, strings and vocabulary size of solu-1l's and GPT-2's tokenizers (and solu-1l's d_model)"),
    "test_integration_tokenization_methods.py::test_to_single_str_tokent":
        TOKENIZER.format(what="the ids, strings and vocabulary size of solu-1l's and GPT-2's tokenizers (and solu-1l's d_model)"),
    "test_integration_tokenization_methods.py::test_to_single_token":
        TOKENIZER.format(what="the ids, strings and vocabulary size of solu-1l's and GPT-2's tokenizers (and solu-1l's d_model)"),
    "test_integration_tokenization_methods.py::test_to_str_tokens_default":
        TOKENIZER.format(what="the ids, strings and vocabulary size of solu-1l's and GPT-2's tokenizers (and solu-1l's d_model)"),
    "test_integration_tokenization_methods.py::test_to_str_tokens_without_bos":
        TOKENIZER.format(what="the ids, strings and vocabulary size of solu-1l's and GPT-2's tokenizers (and solu-1l's d_model)"),
    "test_integration_tokenization_methods.py::test_to_string_multiple":
        TOKENIZER.format(what="the ids, strings and vocabulary size of solu-1l's and GPT-2's tokenizers (and solu-1l's d_model)"),
    "test_integration_tokenization_methods.py::test_to_tokens_default":
        TOKENIZER.format(what="the ids, strings and vocabulary size of solu-1l's and GPT-2's tokenizers (and solu-1l's d_model)"),
    "test_integration_tokenization_methods.py::test_to_tokens_without_bos":
        TOKENIZER.format(what="the ids, strings and vocabulary size of solu-1l's and GPT-2's tokenizers (and solu-1l's d_model)"),
    "test_integration_tokenization_methods.py::test_tokens_to_residual_directions":
        TOKENIZER.format(what="the ids, strings and vocabulary size of solu-1l's and GPT-2's tokenizers (and solu-1l's d_model)"),
    "test_integration_cache_hook_names.py::test_cache_hook_names":
        "lists SoLU's hook points (mlp.hook_mid, mlp.ln), an activation Forma does not write down; its stand-in is GPT-2 shaped",
    "test_integration_head_detector.py::Test_detect_head_successful::Test_abs::test_duplicated_sequence[duplicate_token_head-expected1]":
        PRETRAINED.format(m="solu-2l (detect_head scores)"),
    "test_integration_head_detector.py::Test_detect_head_successful::Test_abs::test_duplicated_sequence[induction_head-expected2]":
        PRETRAINED.format(m="solu-2l (detect_head scores)"),
    "test_integration_head_detector.py::Test_detect_head_successful::Test_abs::test_duplicated_sequence[previous_token_head-expected0]":
        PRETRAINED.format(m="solu-2l (detect_head scores)"),
    "test_integration_head_detector.py::Test_detect_head_successful::Test_abs::test_regular_sequence[previous_token_head-expected0]":
        PRETRAINED.format(m="solu-2l (detect_head scores)"),
    "test_integration_head_detector.py::Test_detect_head_successful::Test_mul::test_duplicated_sequence[duplicate_token_head-expected1]":
        PRETRAINED.format(m="solu-2l (detect_head scores)"),
    "test_integration_head_detector.py::Test_detect_head_successful::Test_mul::test_duplicated_sequence[induction_head-expected2]":
        PRETRAINED.format(m="solu-2l (detect_head scores)"),
    "test_integration_head_detector.py::Test_detect_head_successful::Test_mul::test_duplicated_sequence[previous_token_head-expected0]":
        PRETRAINED.format(m="solu-2l (detect_head scores)"),
    "test_integration_head_detector.py::Test_detect_head_successful::Test_mul::test_regular_sequence[previous_token_head-expected0]":
        PRETRAINED.format(m="solu-2l (detect_head scores)"),
    "test_integration_head_detector.py::Test_specific_heads::Test_duplicated_sentence_duplicate_token_head::test_allclose_abs":
        PRETRAINED.format(m="solu-2l (detect_head scores)"),
    "test_integration_head_detector.py::Test_specific_heads::Test_duplicated_sentence_duplicate_token_head::test_allclose_mul":
        PRETRAINED.format(m="solu-2l (detect_head scores)"),
    "test_integration_head_detector.py::Test_specific_heads::Test_duplicated_sentence_induction_head::test_allclose_abs":
        PRETRAINED.format(m="solu-2l (detect_head scores)"),
    "test_integration_head_detector.py::Test_specific_heads::Test_duplicated_sentence_induction_head::test_allclose_mul":
        PRETRAINED.format(m="solu-2l (detect_head scores)"),
    "test_integration_head_detector.py::Test_specific_heads::Test_duplicated_sentence_previous_token_head::test_allclose_abs":
        PRETRAINED.format(m="solu-2l (detect_head scores)"),
    "test_integration_head_detector.py::Test_specific_heads::Test_duplicated_sentence_previous_token_head::test_allclose_mul":
        PRETRAINED.format(m="solu-2l (detect_head scores)"),
    "test_integration_head_detector.py::Test_specific_heads::Test_regular_sentence_previous_token_head::test_allclose_abs":
        PRETRAINED.format(m="solu-2l (detect_head scores)"),
    "test_integration_head_detector.py::Test_specific_heads::Test_regular_sentence_previous_token_head::test_allclose_mul":
        PRETRAINED.format(m="solu-2l (detect_head scores)"),
    "test_integration_head_detector.py::test_detect_head_exclude_bos[abs-expected1]":
        PRETRAINED.format(m="solu-2l (detect_head scores)"),
    "test_integration_head_detector.py::test_detect_head_exclude_bos[mul-expected0]":
        PRETRAINED.format(m="solu-2l (detect_head scores)"),
    "test_integration_head_detector.py::test_detect_head_exclude_bos_and_current_token[abs-expected1]":
        PRETRAINED.format(m="solu-2l (detect_head scores)"),
    "test_integration_head_detector.py::test_detect_head_exclude_bos_and_current_token[mul-expected0]":
        PRETRAINED.format(m="solu-2l (detect_head scores)"),
    "test_integration_head_detector.py::test_detect_head_exclude_current_token[abs-expected1]":
        PRETRAINED.format(m="solu-2l (detect_head scores)"),
    "test_integration_head_detector.py::test_detect_head_exclude_current_token[mul-expected0]":
        PRETRAINED.format(m="solu-2l (detect_head scores)"),
    "test_integration_head_detector.py::test_detect_head_with_cache[abs-expected1]":
        PRETRAINED.format(m="solu-2l (detect_head scores)"),
    "test_integration_head_detector.py::test_detect_head_with_cache[mul-expected0]":
        PRETRAINED.format(m="solu-2l (detect_head scores)"),
    "test_integration_head_detector.py::test_detect_head_with_invalid_head_name":
        TYPECHECK,
    "test_unit_svd_interpreter.py::test_svd_interpreter":
        PRETRAINED.format(m="solu-2l and solu-3l (singular values)"),
    "test_unit_svd_interpreter.py::test_svd_interpreter_fails_on_invalid_vector_type":
        TYPECHECK,
    "test_unit_svd_interpreter.py::test_w_in_when_fold_ln_is_false":
        PRETRAINED.format(m="solu-2l and solu-3l (singular values)"),
}


# What Forma's HookedTransformer does not do, which TransformerLens's does: "ported file::test id" -> what. Expected
# failures on Forma only, each named in docs/ecosystem.md.
FORMA_GAPS: dict[str, str] = {
}
