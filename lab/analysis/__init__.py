"""Analysis on top of the hooks: stream activations over a dataset, fit probes, patch, steer.

    activations   chosen hook activations at chosen positions, over many batches, to memory or to
                  safetensors shards, holding only the selected positions (bounded memory)
    probes        ridge, logistic and small MLP probes with cross-validated regularisation,
                  group-aware splits, bootstrap intervals, controls; probe direction → steering vector
    patching      activation patching clean ↔ corrupted over (layer × position), (layer × head) and
                  (layer × head × position); on a HookedTransformer each patched run starts at its own layer
    attribution   attribution patching: every one of those patches to first order, one backward pass
    counterfactual  one-token corruptions of a prompt that change the model's prediction (patching pairs)
    heads         previous-token, duplicate-token and induction scores of every head
    lens          logit lens, the ground-truth lens (KL to a world's true law per layer), direct logit attribution
    steering      add a vector at a hook while generating, with or without the KV cache

Each works on a HookedTransformer; `activations`, `patching`, `attribution`, `counterfactual` and `heads` also
accept a TransformerLens TransformerBridge (anything with `hooks()`, `hook_dict` and a forward on token ids).
"""
