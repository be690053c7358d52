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
}
PORTED = tuple(UPSTREAM)

# "ported file::test id" -> why it cannot pass on a tiny checkpoint, on either implementation
PRETRAINED = "asserts numbers of TransformerLens's pretrained {m}, which a tiny random stand-in does not have"
TYPECHECK = ("expects jaxtyping's import-time type checker, which upstream's pytest configuration installs over "
             "transformer_lens (with it, each TransformerLens function annotated to take its HookedTransformer would "
             "refuse any other model)")
BOTH: dict[str, str] = {
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
