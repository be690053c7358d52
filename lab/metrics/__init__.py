"""Pure metric functions over arrays: information (entropy, cross-entropy, KL, perplexity), calibration and
the hallucination bound (docs/definitions.md §1–§3). No models, no I/O: each is tested against hand-computed cases."""
