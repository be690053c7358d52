"""The field's measures of transcoders: per layer, the fraction of variance unexplained (FVU), the mean number of
active features (L0) and the share of dead features, out of core over a harvest; and the replacement's loss, the
model's cross-entropy with every MLP replaced by its transcoder, as a share of the gap between the model's own loss
and the loss with every MLP zero-ablated (1: as good as the MLPs, 0: as bad as none). `top_contexts` finds each
feature's strongest activations in a harvest, for the dashboard.

    FVU_l  = Σ_rows ‖y_l − ŷ_l‖² / Σ_rows ‖y_l − ȳ_l‖²
    L0_l   = mean over rows of #{i : a_l,i > 0}
    dead_l = share of layer l's features never active on any row
    recovered = (CE_zero − CE_replaced) / (CE_zero − CE_model)
"""

from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lab.analysis.activations.collect import Activations
from lab.analysis.activations.store import ActivationStore
from lab.analysis.transcoders.model import Transcoders
from lab.analysis.transcoders.stream import WindowActivations
from lab.analysis.transcoders.train import stacked
from lab.model.norms import LayerNorm, LayerNormPre


@torch.no_grad()
def reconstruction_measures(
    transcoders: Transcoders, store: ActivationStore | WindowActivations, max_rows: int | None = None
) -> dict[str, list[float]]:
    """Per layer FVU, L0 and dead share over the store's rows (the first `max_rows`), one shard at a time (or one
    part of windows run through the model at a time)."""
    cfg = transcoders.cfg
    L, d, f = cfg.n_layers, cfg.d_model, cfg.d_features
    n, sum_y, sum_y2 = 0, torch.zeros(L, d, dtype=torch.float64), torch.zeros(L, d, dtype=torch.float64)
    sse, active = torch.zeros(L, dtype=torch.float64), torch.zeros(L, dtype=torch.float64)
    fired = torch.zeros(L, f, dtype=torch.bool)
    for x, y in _shards(store, transcoders, max_rows):
        acts = transcoders.activate(transcoders.encode(x))
        sse += (transcoders.decode(acts) - y).double().pow(2).sum(dim=(0, 2))
        n += len(y)
        sum_y += y.double().sum(0)
        sum_y2 += y.double().pow(2).sum(0)
        on = acts > 0
        active += on.sum(dim=(0, 2)).double()
        fired |= on.any(0)
    total_variance = (sum_y2 - sum_y.pow(2) / n).sum(-1)
    return {
        "fvu": (sse / total_variance).tolist(),
        "l0": (active / n).tolist(),
        "dead": (1 - fired.double().mean(-1)).tolist(),
        "rows": [n] * L,
    }


def parts(source: ActivationStore | WindowActivations, hooks: list[str]) -> Iterator[Activations]:
    """A harvest's shards (of `hooks`), or the parts of windows run through the model on the fly (every hook)."""
    if isinstance(source, ActivationStore):
        for shard in range(len(source.index["shards"])):
            yield source.shard(shard, hooks)
    else:
        yield from source.parts()


def _shards(
    store: ActivationStore | WindowActivations, transcoders: Transcoders, max_rows: int | None
) -> Iterator[tuple[Tensor, Tensor]]:
    seen = 0
    cfg = transcoders.cfg
    for part in parts(store, cfg.hooks()):
        x, y = stacked(part, cfg, range(cfg.n_layers))
        if max_rows is not None:
            x, y = x[: max_rows - seen], y[: max_rows - seen]
        seen += len(x)
        if len(x):
            yield x, y
        if max_rows is not None and seen >= max_rows:
            return


def replacement_hooks(transcoders: Transcoders) -> list[tuple[str, Any]]:
    """Forward hooks that replace every MLP's output by its transcoder's reconstruction, each transcoder reading its
    input as the replaced model computes it (a cross-layer transcoder's layer l' output sums the features of every
    layer l ≤ l' of the same forward pass)."""
    cfg = transcoders.cfg
    acts: dict[int, Tensor] = {}

    def read(x: Tensor, hook: Any, layer: int) -> None:
        acts[layer] = transcoders.activate(transcoders.encode(x, layer), layer)

    def write(out: Tensor, hook: Any, layer: int) -> Tensor:
        total = transcoders.b_dec[layer].expand_as(out).clone()
        for source in range(layer + 1) if cfg.cross_layer else (layer,):
            features = torch.arange(cfg.d_features)
            total = total + acts[source] @ transcoders.decoder(source, features, layer)
        return total.to(out.dtype)

    hooks = []
    for layer in range(cfg.n_layers):
        hooks.append((cfg.hook("input", layer), lambda x, hook, layer=layer: read(x, hook, layer)))
        hooks.append((cfg.hook("output", layer), lambda out, hook, layer=layer: write(out, hook, layer)))
    return hooks


@torch.no_grad()
def replacement_loss(model: Any, transcoders: Transcoders, tokens: Tensor, batch_size: int = 16) -> dict[str, float]:
    """Mean next-token cross-entropy (nats) of the model, of the model with every MLP replaced by its transcoder,
    and with every MLP output zero-ablated, over `tokens` [n, pos]; and `recovered`, the replacement's share of the
    gap between the zero-ablated loss and the model's."""
    cfg = transcoders.cfg
    zero = [(cfg.hook("output", layer), lambda out, hook: torch.zeros_like(out)) for layer in range(cfg.n_layers)]
    losses = {"model": 0.0, "replaced": 0.0, "zero_ablated": 0.0}
    count = 0
    for start in range(0, len(tokens), batch_size):
        batch = tokens[start : start + batch_size]
        for name, hooks in (("model", []), ("replaced", replacement_hooks(transcoders)), ("zero_ablated", zero)):
            with model.hooks(fwd_hooks=hooks):
                logits = model(batch)
            losses[name] += float(
                F.cross_entropy(
                    logits[:, :-1].reshape(-1, logits.shape[-1]).float(), batch[:, 1:].reshape(-1), reduction="sum"
                )
            )
        count += batch[:, 1:].numel()
    out = {f"ce_{name}": value / count for name, value in losses.items()}
    gap = out["ce_zero_ablated"] - out["ce_model"]
    out["recovered"] = (out["ce_zero_ablated"] - out["ce_replaced"]) / gap if gap > 0 else float("nan")
    return out


@torch.no_grad()
def top_contexts(transcoders: Transcoders, store: ActivationStore | WindowActivations, n: int = 8) -> dict[str, Tensor]:
    """Each feature's n strongest activations in the store (or in windows run through the model): values, seq and
    pos, each [L, features, n] (value 0 and seq −1 where a feature fired fewer than n times)."""
    cfg = transcoders.cfg
    L, f = cfg.n_layers, cfg.d_features
    best = torch.zeros(L, f, n)
    seq = torch.full((L, f, n), -1, dtype=torch.long)
    pos = torch.full((L, f, n), -1, dtype=torch.long)
    for part in parts(store, [cfg.hook("input", layer) for layer in range(L)]):
        x = torch.stack([part[cfg.hook("input", layer)].float() for layer in range(L)], dim=1)
        acts = transcoders.activate(transcoders.encode(x)).permute(1, 2, 0)  # [L, f, rows]
        values = torch.cat([best, acts], dim=-1)
        order = values.topk(n, dim=-1).indices
        seqs = torch.cat([seq, part.seq.expand(L, f, -1)], dim=-1)
        poss = torch.cat([pos, part.pos.expand(L, f, -1)], dim=-1)
        best, seq, pos = values.gather(-1, order), seqs.gather(-1, order), poss.gather(-1, order)
    seq[best <= 0] = -1
    pos[best <= 0] = -1
    return {"values": best, "seq": seq, "pos": pos}


@torch.no_grad()
def feature_logits(
    model: Any, transcoders: Transcoders, layer: int, feature: int, k: int = 10, final_norm: bool = False
) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """The tokens a feature's output most promotes and most suppresses directly: its decoder vectors (summed over the
    layers a cross-layer feature writes) through the unembedding, W_dec · W_U, the final norm's scale left aside;
    with final_norm, through the final norm's gain too, (W_dec − mean W_dec) ⊙ w · W_U for a LayerNorm and
    W_dec ⊙ w · W_U for an RMSNorm (what a unit of the direction adds to the logits at a position of scale 1) —
    the logits less their mean over the vocabulary: ([(token, value)] top k, [(token, value)] bottom k)."""
    cfg = transcoders.cfg
    index = torch.tensor([feature])
    vector = sum(transcoders.decoder(layer, index, target)[0] for target in range(layer, cfg.n_layers))
    if final_norm:
        vector = through_final_norm(model, vector)
    logits = (vector @ model.W_U).float()
    logits = logits - logits.mean()
    top, bottom = logits.topk(k), (-logits).topk(k)
    return (
        [(int(i), float(v)) for v, i in zip(top.values, top.indices)],
        [(int(i), float(-v)) for v, i in zip(bottom.values, bottom.indices)],
    )


def through_final_norm(model: Any, vector: Tensor) -> Tensor:
    """A residual-stream direction as the final norm passes it on at a position of scale 1: centred where the norm
    centres (LayerNorm, LayerNormPre), times its gain w where it has one."""
    norm = model.ln_final
    if isinstance(norm, (LayerNorm, LayerNormPre)):
        vector = vector - vector.mean()
    return vector * norm.w if hasattr(norm, "w") else vector
