"""Forma's transcoder trainer against SAELens' trainer at equal L0 (benchmarks/transcoders_saelens.py, the comparison
whose figures docs/attribution-graphs.md shows): a sparse autoencoder of one hook of a tiny trained Forma model, the
same activations, features, training tokens and batch size. Top-k: the same k. ReLU: SAELens' L1 coefficient sets
its L0, and Forma's sparsity λ is searched until Forma's L0 is within the stated tolerance of it; then the fractions
of variance unexplained on held-out activations are compared (for ReLU with SAELens' schedule: on a run this short
Forma's own λ warm-up and rate decay cost it FVU at the same L0, a figure the benchmark reports beside).

Runs in the SAE environment only (`make test-sae`)."""

import pytest

from benchmarks.transcoders_saelens import TOLERANCE, compare

pytestmark = pytest.mark.usefixtures("one_thread_per_module")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["topk", "relu"])
def test_forma_matches_saelens_fvu_at_equal_l0(kind):
    result = compare(kind)
    saelens = result["saelens"]
    assert 1 <= saelens["l0"] < 0.5 * result["d_sae"], result  # a sparse code, neither empty nor dense
    assert saelens["fvu"] < 0.5, result  # SAELens learned a reconstruction, so the comparison means something
    # top-k: the same k and Forma's own schedule; ReLU: λ searched, with SAELens' schedule (Forma's own is reported)
    forma = result["forma"] if kind == "topk" else result["forma_saelens_schedule"]
    assert abs(forma["l0"] - saelens["l0"]) <= TOLERANCE * saelens["l0"], result  # equal L0
    assert forma["fvu"] < 1.2 * saelens["fvu"], result  # Forma's no worse than SAELens' at the same sparsity
    if kind == "relu":
        assert len(forma["search"]) > 1  # λ was searched, not given
        assert abs(result["forma"]["l0"] - saelens["l0"]) <= TOLERANCE * saelens["l0"], result
