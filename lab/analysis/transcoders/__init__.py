"""Transcoders on any Forma model: per-layer and cross-layer, ReLU, top-k and JumpReLU (`model`), trained out of core
from a harvest's shards with bitwise resumption (`train`), and measured: FVU, L0, dead features, the replacement's
loss, each feature's top contexts (`measures`); one feature's card: its activation histogram, top and quantile-binned
contexts on held-out windows, logits and virtual weights to other layers' features (`features`). The attribution graphs
of `lab.analysis.graphs` are built on them."""
