"""Attribution graphs over transcoder features (Ameisen et al. 2025, "Circuit Tracing"): the local replacement
model of one prompt (`replacement`), the graph of its direct edges (`attribute`, `graph`), influence and pruning
(`influence`), checks against the full model and the attention's QK side (`checks`, `qk`)."""
