"""`attribute(model, transcoders, prompt)`: the attribution graph of one prompt — every active feature, error node,
token embedding and the most probable next tokens as nodes, every direct edge of the local replacement model
(`lab.analysis.graphs.replacement`) between them, each target's input and bias — in a `Graph`."""

import time
from typing import Any

import torch
from torch import Tensor

from lab.analysis.graphs.graph import Graph
from lab.analysis.graphs.replacement import LocalReplacement, Target
from lab.analysis.transcoders.model import Transcoders


def prompt_tokens(model: Any, prompt: str | Tensor | list[int]) -> Tensor:
    """A 1-D tensor of token ids from text (the model's tokenizer, as `model.to_tokens` reads it, never cut to the
    context: a longer prompt is refused where the model checks it) or ids."""
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("the prompt is empty")
        if getattr(model, "tokenizer", None) is None:
            raise ValueError("this model has no tokenizer: give the prompt as token ids")
        return model.to_tokens(prompt, truncate=False)[0]
    tokens = torch.as_tensor(prompt).reshape(-1)
    if tokens.dtype.is_floating_point or tokens.numel() == 0:
        raise ValueError(f"a prompt is text or a non-empty list of token ids, got {tokens.dtype} {tuple(tokens.shape)}")
    return tokens.long()


def logit_targets(logits: Tensor, max_logits: int, probability: float) -> tuple[Tensor, Tensor]:
    """The most probable next tokens until they hold `probability` of the mass, at most `max_logits` (the paper's
    and circuit-tracer's choice): (token ids, probabilities)."""
    probs = logits.float().softmax(-1)
    top, index = probs.sort(descending=True)
    count = min(max_logits, int(torch.searchsorted(top.cumsum(0), torch.tensor(probability))) + 1)
    return index[:count], top[:count]


def feature_targets(replacement: LocalReplacement) -> list[Target]:
    tc = replacement.transcoders
    return [
        Target(tc.cfg.hook("input", int(layer)), int(pos), tc.W_enc[int(layer)][:, int(i)].detach())
        for layer, pos, i in replacement.features
    ]


def logit_target_vectors(replacement: LocalReplacement, tokens: Tensor) -> list[Target]:
    """A logit node reads the logit less the mean logit, ⟨e_t − 1/V, logits⟩ at the last position (circuit-tracer's
    demeaned unembedding, taken after the unembedding so that a tied or biased unembedding needs no special case)."""
    vocab = replacement.logits.shape[-1]
    last = replacement.n_pos - 1
    targets = []
    for token in tokens.tolist():
        vector = torch.full((vocab,), -1.0 / vocab)
        vector[token] += 1.0
        targets.append(Target("unembed.hook_out", last, vector))
    return targets


def attribute(
    model: Any,
    transcoders: Transcoders,
    prompt: str | Tensor | list[int],
    *,
    max_logits: int = 10,
    logit_probability: float = 0.95,
    batch_size: int = 128,
    max_feature_nodes: int | None = None,
) -> Graph:
    """The attribution graph of `prompt`: batch_size targets per backward pass (one chunk of positions).
    max_feature_nodes: keep at most this many features, those of largest activation × decoder norm, the rest folded
    into the error nodes (`LocalReplacement`); None keeps every active feature."""
    start = time.perf_counter()
    tokens = prompt_tokens(model, prompt)
    if tokens.numel() > model.cfg.n_ctx:
        raise ValueError(f"the prompt has {tokens.numel()} tokens, more than the model's n_ctx = {model.cfg.n_ctx}")
    replacement = LocalReplacement(model, transcoders, tokens, batch_size=batch_size, max_features=max_feature_nodes)
    logit_tokens, logit_probs = logit_targets(replacement.logits[0, -1], max_logits, logit_probability)
    targets = feature_targets(replacement) + logit_target_vectors(replacement, logit_tokens)
    n_features, n_sources = replacement.n_features, replacement.n_sources
    n_nodes = n_sources + len(logit_tokens)
    adjacency = torch.zeros(n_nodes, n_nodes)
    rows = replacement.rows(targets)
    adjacency[:n_features, :n_sources] = rows[:n_features]
    adjacency[n_sources:, :n_sources] = rows[n_features:]
    inputs, bias = torch.zeros(n_nodes), torch.zeros(n_nodes)
    target_rows = torch.cat([torch.arange(n_features), torch.arange(n_sources, n_nodes)])
    inputs[target_rows] = replacement.values(targets)
    bias[target_rows] = replacement.values(targets, sources=False)
    encoder_bias = transcoders.b_enc.detach()[replacement.features[:, 0], replacement.features[:, 2]]
    inputs[:n_features] += encoder_bias
    bias[:n_features] += encoder_bias
    strings = token_strings(model, tokens)
    meta = {
        "prompt": "".join(strings),
        "token_strings": strings,
        "logit_strings": token_strings(model, logit_tokens),
        "transcoders": transcoders.cfg.to_dict(),
        "seconds": time.perf_counter() - start,
        "batch_size": batch_size,
        "max_feature_nodes": max_feature_nodes,
        "n_active_features": replacement.n_active,
    }
    return Graph(
        tokens=tokens,
        features=replacement.features,
        activations=replacement.activations.float(),
        logit_tokens=logit_tokens,
        logit_probs=logit_probs,
        adjacency=adjacency,
        inputs=inputs,
        bias=bias,
        n_layers=replacement.n_layers,
        meta=meta,
    )


def token_strings(model: Any, tokens: Tensor) -> list[str]:
    """Each token id as text through the model's tokenizer, or as its number when the model has none."""
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        return [str(int(t)) for t in tokens]
    return [tokenizer.decode([int(t)]) for t in tokens]
