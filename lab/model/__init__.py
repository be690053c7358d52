"""The hooked transformers: config, components, the decoder-only model, its KV cache, and the encoder–decoder."""
