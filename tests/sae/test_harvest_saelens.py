"""Forma's harvest and SAELens' ActivationsStore collect the same activations (benchmarks/harvest_saelens.py, the
comparison the benchmark times, here at a tiny GPT-2 shape): every row of SAELens' store, over a TransformerLens
HookedTransformer holding the same weights and over Forma's model itself, equals Forma's harvested row for the
same sequence and position. Runs in the SAE environment only (`make test-sae`)."""

import pytest

from benchmarks.harvest_saelens import CONTENDERS, compare

pytestmark = pytest.mark.usefixtures("one_thread_per_module")
TOLERANCE = 1e-5  # float32 rounding between two implementations of the same blocks


@pytest.mark.parametrize("hook", ["blocks.1.hook_resid_post", "blocks.2.hook_mlp_out", "blocks.0.hook_resid_pre"])
def test_saelens_store_rows_equal_formas_harvest_on_the_same_weights(hook):
    result = compare("tiny", hook, batch=2, batches=3, rounds=1)
    tokens = 2 * 3 * result["seq_len"]
    assert result["rows"] == {name: tokens for name in CONTENDERS}  # every position of every sequence, once
    assert result["rms_activation"] > 100 * TOLERANCE  # activations well above the tolerance, not zeros on both sides
    for name in ("saelens_store_tl", "saelens_store_forma"):
        assert result["max_abs_diff_vs_forma"][name] <= TOLERANCE, (name, result["max_abs_diff_vs_forma"])
