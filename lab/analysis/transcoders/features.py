"""A transcoder feature's card: what one feature of one layer does, over windows the transcoders never trained on
(a zoo model's world's held-out windows, a pretrained model's held-out corpus documents: `model_windows(...,
split="val")` in lab.zoo.transcoders), in the shape of Neuronpedia's and SAELens' feature dashboards.

    activation   a(w, p) = σ(x(w, p) W_enc[l] + b_enc[l])[i]        x: the transcoder's input at window w, position p
    histogram    counts of a(w, p) over every position of every window, in equal bins from min(0, min a) to max a
    top          the n largest a(w, p) > 0, with the tokens around them
    quantiles    the nonzero a(w, p) cut at their k-quantiles; a few positions drawn (with a seed) from each bin
    logits       its decoder direction through the final norm's gain and W_U (`feature_logits`)
    reads from   v(l', j → l, i) = Σ_{t = l'}^{l − 1} W_dec[l' → t][j] · W_enc[l][:, i]      for every l' < l
    writes to    v(l, i → l', j) = Σ_{t = l}^{l' − 1} W_dec[l → t][i] · W_enc[l'][:, j]      for every l' > l

The virtual weights are the direct path through the residual stream from a decoder's write to an encoder's read,
attention and the norm's per-position scale (and a LayerNorm's centring) left aside: how much a unit of one
feature's activation adds to another's pre-activation along that path alone. A per-layer transcoder writes only its
own layer's output (t = l'); a cross-layer one writes every later layer's too, and a reader at layer l reads the
writes into layers before it.
"""

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from lab.analysis.transcoders.measures import feature_logits
from lab.analysis.transcoders.model import Transcoders
from lab.analysis.transcoders.stream import layer_rows


@dataclass(frozen=True)
class Context:
    """One position of one window: the feature's activation there, and the tokens from `start` to a few after."""

    activation: float
    window: int  # the window's index in the windows the card was made from
    pos: int  # the position in that window
    start: int  # the position of tokens[0] in the window: the feature's token is tokens[pos - start]
    tokens: list[int]


@dataclass(frozen=True)
class QuantileBin:
    """The nonzero activations in [low, high) (the last bin: [low, high]), how many there are, and a few of them."""

    low: float
    high: float
    count: int
    contexts: list[Context]


@dataclass(frozen=True)
class Connection:
    """Feature `feature` of transcoder `layer`, and the virtual weight between it and the card's feature."""

    layer: int
    feature: int
    weight: float


@dataclass(frozen=True)
class FeatureCard:
    """What `feature_card` measures of feature `feature` of transcoder `layer` (see the module's docstring)."""

    layer: int
    feature: int
    positions: int  # every position of every window
    firing_share: float  # the share of those positions where its activation is above 0
    counts: list[int]  # the histogram of its activation over every position (summing to `positions`)
    edges: list[float]  # the histogram's bin edges, len(counts) + 1
    top: list[Context]  # the n largest activations above 0, largest first
    quantiles: list[QuantileBin]  # the nonzero activations' k quantile bins, lowest first
    promoted: list[tuple[int, float]]  # (token, logit) the decoder direction raises most, largest first
    suppressed: list[tuple[int, float]]  # (token, logit) it lowers most, lowest first
    reads_from: list[Connection]  # earlier layers' features by |virtual weight| into this one, largest first
    writes_to: list[Connection]  # later layers' features by |virtual weight| out of this one, largest first


@torch.no_grad()
def feature_activations(
    model, transcoders: Transcoders, layer: int, feature: int, windows: Tensor, chunk: int = 16
) -> Tensor:
    """a(w, p) for every window and position: [n windows, length], the model run `chunk` windows at a time as far
    as transcoder `layer`'s model layer, its input encoded and activated (over all the layer's features: top-k
    needs them) and feature `feature` kept."""
    cfg = transcoders.cfg
    hook = cfg.hook("input", layer)
    parts = []
    for start in range(0, len(windows), chunk):
        rows = layer_rows(model, windows[start : start + chunk], cfg, [layer])
        x = rows[hook].to(transcoders.W_enc.dtype)
        parts.append(
            transcoders.activate(transcoders.encode(x, layer), layer)[:, feature].reshape(-1, windows.shape[1])
        )
    return torch.cat(parts).cpu()


def activation_histogram(acts: Tensor, bins: int = 40) -> tuple[list[int], list[float]]:
    """Counts of every value of `acts` in `bins` equal bins from min(0, min) to max (1 where nothing is above 0), and
    the bins' edges: the counts sum to acts.numel()."""
    flat = acts.flatten().double()
    low, high = min(0.0, float(flat.min())), float(flat.max())
    counts, edges = torch.histogram(flat, bins=bins, range=(low, high if high > low else low + 1.0))
    return [int(c) for c in counts.tolist()], edges.tolist()


def context(windows: Tensor, acts: Tensor, window: int, pos: int, before: int = 12, after: int = 4) -> Context:
    """Position `pos` of window `window`, with up to `before` tokens before it and `after` after."""
    start = max(0, pos - before)
    tokens = windows[window, start : pos + after + 1].tolist()
    return Context(float(acts[window, pos]), int(window), int(pos), start, [int(t) for t in tokens])


def top_positions(acts: Tensor, n: int) -> list[tuple[int, int]]:
    """(window, position) of the n largest activations above 0 (fewer where fewer are), largest first."""
    flat = acts.flatten()
    values, index = flat.topk(min(n, int((flat > 0).sum())))
    length = acts.shape[1]
    return [(int(i) // length, int(i) % length) for i in index.tolist()]


def quantile_bins(acts: Tensor, windows: Tensor, k: int = 5, per_bin: int = 4, seed: int = 0) -> list[QuantileBin]:
    """The nonzero activations cut at their k-quantiles (numpy's linear quantiles of those values): bin b holds the
    values in [q_b, q_{b+1}), the last [q_{k−1}, q_k]; from each, `per_bin` positions drawn without replacement by a
    generator seeded `seed` (fewer where the bin holds fewer), largest first. No bins where nothing is above 0."""
    flat = acts.flatten()
    nonzero = torch.nonzero(flat > 0).flatten()
    if not len(nonzero):
        return []
    values = flat[nonzero]
    edges = np.quantile(values.double().numpy(), np.linspace(0, 1, k + 1)).tolist()
    generator = torch.Generator().manual_seed(seed)
    length, out = acts.shape[1], []
    for b in range(k):
        low, high = edges[b], edges[b + 1]
        inside = (values >= low) & ((values <= high) if b == k - 1 else (values < high))
        members = nonzero[inside]
        chosen = members[torch.randperm(len(members), generator=generator)[:per_bin]]
        chosen = chosen[flat[chosen].argsort(descending=True)]
        contexts = [context(windows, acts, int(i) // length, int(i) % length) for i in chosen.tolist()]
        out.append(QuantileBin(float(low), float(high), int(inside.sum()), contexts))
    return out


@torch.no_grad()
def virtual_weights(transcoders: Transcoders, layer: int, feature: int) -> tuple[Tensor, Tensor]:
    """(reads, writes), each [n_layers, d_features]: reads[l', j] = v(l', j → layer, feature) for l' < layer,
    writes[l', j] = v(layer, feature → l', j) for l' > layer (see the module's docstring); 0 elsewhere."""
    cfg = transcoders.cfg
    L, f = cfg.n_layers, cfg.d_features
    every = torch.arange(f)
    reads = torch.zeros(L, f, dtype=transcoders.W_enc.dtype)
    writes = torch.zeros(L, f, dtype=transcoders.W_enc.dtype)
    encoder = transcoders.W_enc[layer][:, feature]  # [d_model]
    for source in range(layer):
        written = sum(transcoders.decoder(source, every, t) for t in range(source, layer))  # [f, d_model]
        reads[source] = (written @ encoder).cpu()
    for target in range(layer + 1, L):
        written = sum(transcoders.decoder(layer, every[feature : feature + 1], t)[0] for t in range(layer, target))
        writes[target] = (written @ transcoders.W_enc[target]).cpu()
    return reads, writes


def strongest(weights: Tensor, layers: range, n: int) -> list[Connection]:
    """The n entries of weights[layers] largest in magnitude (with their sign), largest first."""
    if not len(layers):
        return []
    block = weights[layers.start : layers.stop]
    values, index = block.flatten().abs().topk(min(n, block.numel()))
    f = weights.shape[1]
    return [Connection(layers.start + int(i) // f, int(i) % f, float(block.flatten()[i])) for i in index.tolist()]


def feature_card(
    model,
    transcoders: Transcoders,
    layer: int,
    feature: int,
    windows: Tensor,
    *,
    n_top: int = 10,
    n_quantiles: int = 5,
    per_bin: int = 4,
    n_logits: int = 10,
    n_connections: int = 10,
    bins: int = 40,
    seed: int = 0,
) -> FeatureCard:
    """Feature `feature` of transcoder `layer` (an index into the set's layers) over `windows` [n, length]: its
    activation histogram and firing share over every position, its n_top strongest contexts, its contexts by
    quantile bin (per_bin drawn with `seed` from each of n_quantiles), the n_logits tokens its decoder direction
    promotes and suppresses most (through the final norm's gain: `feature_logits(..., final_norm=True)`), and the
    n_connections features of earlier layers it reads from and of later layers it writes to, by |virtual weight|."""
    cfg = transcoders.cfg
    if not 0 <= layer < cfg.n_layers or not 0 <= feature < cfg.d_features:
        raise ValueError(
            f"no feature {feature} of layer {layer}: the set has layers 0 … {cfg.n_layers - 1} of "
            f"{cfg.d_features} features"
        )
    acts = feature_activations(model, transcoders, layer, feature, windows)
    counts, edges = activation_histogram(acts, bins)
    promoted, suppressed = feature_logits(model, transcoders, layer, feature, n_logits, final_norm=True)
    reads, writes = virtual_weights(transcoders, layer, feature)
    return FeatureCard(
        layer=layer,
        feature=feature,
        positions=acts.numel(),
        firing_share=float((acts > 0).double().mean()),
        counts=counts,
        edges=edges,
        top=[context(windows, acts, w, p) for w, p in top_positions(acts, n_top)],
        quantiles=quantile_bins(acts, windows, n_quantiles, per_bin, seed),
        promoted=promoted,
        suppressed=suppressed,
        reads_from=strongest(reads, range(0, layer), n_connections),
        writes_to=strongest(writes, range(layer + 1, cfg.n_layers), n_connections),
    )
