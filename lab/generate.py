"""Autoregressive sampling (temperature, top-k, nucleus, KV cache): `lab.model.decoding`, where the one decoding
loop both model classes run lives, beside the model that calls it. This module keeps the names importable
from `lab.generate`."""

from lab.model.decoding import (
    Generation,
    check_max_new_tokens,
    check_sampling,
    check_token_id,
    decode,
    filter_logits,
    generate,
    sample_next,
    sample_tokens,
)

__all__ = [
    "Generation",
    "check_max_new_tokens",
    "check_sampling",
    "check_token_id",
    "decode",
    "filter_logits",
    "generate",
    "sample_next",
    "sample_tokens",
]
