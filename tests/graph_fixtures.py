"""Tiny models and transcoders shared by the transcoder and attribution-graph tests: built from configs and seeds, in
seconds, nothing fetched."""

import torch

from lab import HookedTransformer, ModelConfig
from lab.analysis.transcoders.model import TranscoderConfig, Transcoders

ARCHITECTURES = {
    "gpt2": dict(),
    "llama": dict(positions="rotary", norm="rmsnorm", mlp="swiglu", bias=False, tied_embeddings=True, n_kv_heads=2),
    "parallel": dict(block="parallel", positions="rotary"),
}


def tiny_model(architecture: str = "gpt2", **changes) -> HookedTransformer:
    cfg = dict(d_vocab=50, d_model=32, n_layers=3, n_heads=4, n_ctx=32) | ARCHITECTURES[architecture] | changes
    model = HookedTransformer(ModelConfig(**cfg), seed=0).eval()
    with torch.no_grad():  # larger weights than the initialisation's, so that every path carries signal
        for name, p in model.named_parameters():
            if name.endswith(("W_Q", "W_K", "W_O", "W_out", "W_in", "W_gate")):
                p.mul_(4.0)
    return model


def random_transcoders(
    model: HookedTransformer, cross_layer: bool = False, activation: str = "relu", d_features: int = 64
) -> Transcoders:
    cfg = model.cfg
    tc = Transcoders(
        TranscoderConfig(
            d_model=cfg.d_model,
            n_layers=cfg.n_layers,
            d_features=d_features,
            activation=activation,
            k=8 if activation == "topk" else 0,
            cross_layer=cross_layer,
            threshold=0.05,
        )
    )
    with torch.no_grad():
        tc.b_enc.fill_(-0.05)
    return tc.eval()


def exact_transcoders(model: HookedTransformer) -> Transcoders:
    """The transcoders equal to a ReLU model's MLPs: each neuron a feature. With LayerNorm's gain w and bias b,
    the MLP reads n·w + b of the normalised input n, so W_enc = diag(w) W_in, b_enc = b W_in + b_in, W_dec = W_out,
    b_dec = b_out."""
    cfg = model.cfg
    assert cfg.mlp == "relu" and cfg.norm == "layernorm" and cfg.block == "pre_ln"
    tc = Transcoders(TranscoderConfig(d_model=cfg.d_model, n_layers=cfg.n_layers, d_features=cfg.d_mlp))
    with torch.no_grad():
        for layer, block in enumerate(model.blocks):
            w, b = block.ln2.w, block.ln2.b
            tc.W_enc[layer] = w[:, None] * block.mlp.W_in
            tc.b_enc[layer] = b @ block.mlp.W_in + block.mlp.b_in
            tc.W_dec[layer][:, 0] = block.mlp.W_out
            tc.b_dec[layer] = block.mlp.b_out
    return tc.eval()
