"""Analysis on top of the hooks: stream activations over a dataset, fit probes, patch, steer.

    activations   chosen hook activations at chosen positions, over many batches, to memory or to
                  safetensors shards, holding only the selected positions (bounded memory)
    probes        ridge, logistic and small MLP probes with cross-validated regularisation,
                  group-aware splits, bootstrap intervals, controls; probe direction → steering vector
    patching      activation patching clean ↔ corrupted over (layer × position), (layer × head) and
                  (layer × head × position); on a HookedTransformer each patched run starts at its own layer
    attribution   attribution patching: every one of those patches to first order, one backward pass
    steering      add a vector at a hook while generating, with or without the KV cache

Each works on a HookedTransformer; `activations`, `patching` and `attribution` also accept a TransformerLens
TransformerBridge (anything with `hooks()`, `hook_dict` and a forward on token ids).
"""
