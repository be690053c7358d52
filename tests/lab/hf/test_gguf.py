"""GGUF's blocks as ggml defines them: Forma's dequantization against transformers' and the gguf package's on
random blocks, bit for bit; what a quantizer wrote read back within its step; llama.cpp's row permutation of W_Q and
W_K undone."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quantize
from gguf import dequantize as gguf_dequantize
from transformers.integrations.gguf.dequant import dequantize as transformers_dequantize

from lab.hf.gguf import BLOCKS, dequantize, unpermute

TYPES = {"Q8_0": GGMLQuantizationType.Q8_0, "Q4_1": GGMLQuantizationType.Q4_1}


def random_blocks(kind: str, rows: int, blocks_per_row: int, seed: int = 0) -> np.ndarray:
    """Raw rows of random blocks with finite fp16 scales (and minima)."""
    rng = np.random.default_rng(seed)
    _, size = BLOCKS[kind]
    raw = rng.integers(0, 256, (rows * blocks_per_row, size), dtype=np.uint8)
    raw[:, 0:2] = np.float16(rng.uniform(-0.1, 0.1, (rows * blocks_per_row, 1))).view(np.uint8)
    if kind == "Q4_1":
        raw[:, 2:4] = np.float16(rng.uniform(-1, 1, (rows * blocks_per_row, 1))).view(np.uint8)
    return raw.reshape(rows, blocks_per_row * size)


@pytest.mark.parametrize("kind", sorted(BLOCKS))
def test_dequantization_equals_transformers_and_the_gguf_package_bit_for_bit(kind):
    raw = random_blocks(kind, rows=16, blocks_per_row=6)
    ours = dequantize(raw, kind)
    assert ours.shape == (16, 6 * 32) and ours.dtype == np.float32
    theirs = transformers_dequantize(torch.from_numpy(raw.reshape(-1)), TYPES[kind].value).reshape(16, -1)
    assert np.array_equal(ours, theirs.numpy())
    assert np.array_equal(ours, gguf_dequantize(raw, TYPES[kind]))


@pytest.mark.parametrize("kind", sorted(BLOCKS))
def test_what_the_quantizer_wrote_reads_back_within_half_a_step(kind):
    """Each block's weights come back within half its step d (Q8_0: max|w| / 127; Q4_1: (max − min) / 15), plus
    the fp16 rounding of the block's scale and minimum."""
    weights = np.random.default_rng(1).normal(0, 0.05, (8, 256)).astype(np.float32)
    back = dequantize(quantize(weights, TYPES[kind]), kind)
    blocks, back_blocks = weights.reshape(-1, 32), back.reshape(-1, 32)
    if kind == "Q8_0":
        step = np.abs(blocks).max(axis=1, keepdims=True) / 127
    else:
        step = (blocks.max(axis=1, keepdims=True) - blocks.min(axis=1, keepdims=True)) / 15
    assert np.all(np.abs(back_blocks - blocks) <= step / 2 + 2e-3 * np.abs(blocks).max(axis=1, keepdims=True))


def test_unpermute_undoes_llama_cpp_rotary_permutation():
    """convert_hf_to_gguf.py's permute: w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2)."""
    n_heads, d_head, d_model = 3, 8, 5
    hf = np.arange(n_heads * d_head * d_model, dtype=np.float32).reshape(n_heads * d_head, d_model)
    permuted = hf.reshape(n_heads, 2, d_head // 2, d_model).swapaxes(1, 2).reshape(hf.shape)
    assert not np.array_equal(permuted, hf)
    assert np.array_equal(unpermute(permuted, n_heads), hf)


def test_a_type_forma_does_not_read_is_named():
    with pytest.raises(ValueError, match="Q5_K"):
        dequantize(np.zeros((1, 176), np.uint8), "Q5_K")
