"""The MLPs: φ(x W_in + b_in) W_out + b_out for the pointwise activations, and the gated SwiGLU; `MLPS` maps
`cfg.mlp` to its class."""

import functools
import math

import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from lab.model.config import ModelConfig
from lab.model.primitives import CheckedHookPoint, empty_parameter, init_normal_, linear, reset_biases, zero_parameter

ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,  # exact: x Φ(x)
    "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),  # GPT-2's "gelu_new"
    "silu": F.silu,  # x σ(x)
}


class MLP(nn.Module):
    """mlp(x) = φ(x W_in + b_in) W_out + b_out, φ one of ReLU, GELU (exact or tanh), SiLU."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.act = ACTIVATIONS[cfg.mlp]
        self.init_std, self.out_std = cfg.init_std, cfg.init_std / math.sqrt(2 * cfg.n_layers)
        self.W_in, self.W_out = empty_parameter(cfg.d_model, cfg.d_mlp), empty_parameter(cfg.d_mlp, cfg.d_model)
        self.b_in = zero_parameter((cfg.d_mlp,)) if cfg.bias else None
        self.b_out = zero_parameter((cfg.d_model,)) if cfg.bias else None
        self.reset_parameters()
        self.hook_pre = CheckedHookPoint()  # [batch, pos, d_mlp]
        self.hook_post = CheckedHookPoint()  # [batch, pos, d_mlp]

    def reset_parameters(self) -> None:
        """W_in ~ N(0, init_std²), W_out ~ N(0, init_std² / (2 n_layers)); biases 0."""
        init_normal_(self.W_in, self.init_std)
        init_normal_(self.W_out, self.out_std)
        reset_biases(self.b_in, self.b_out)

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        pre = self.hook_pre(linear(x, self.W_in, self.b_in))
        post = self.hook_post(self.act(pre))
        return linear(post, self.W_out, self.b_out)


class GatedMLP(nn.Module):
    """SwiGLU (Shazeer 2020): mlp(x) = (SiLU(x W_gate) ⊙ x W_in) W_out.

    Hooks follow TransformerLens: hook_pre is x W_gate, hook_pre_linear is x W_in, hook_post the product.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.init_std, self.out_std = cfg.init_std, cfg.init_std / math.sqrt(2 * cfg.n_layers)
        self.W_gate, self.W_in = empty_parameter(cfg.d_model, cfg.d_mlp), empty_parameter(cfg.d_model, cfg.d_mlp)
        self.W_out = empty_parameter(cfg.d_mlp, cfg.d_model)
        self.b_in = zero_parameter((cfg.d_mlp,)) if cfg.bias else None
        self.b_out = zero_parameter((cfg.d_model,)) if cfg.bias else None
        self.reset_parameters()
        self.hook_pre = CheckedHookPoint()  # [batch, pos, d_mlp]
        self.hook_pre_linear = CheckedHookPoint()  # [batch, pos, d_mlp]
        self.hook_post = CheckedHookPoint()  # [batch, pos, d_mlp]

    def reset_parameters(self) -> None:
        """W_gate, W_in ~ N(0, init_std²), W_out ~ N(0, init_std² / (2 n_layers)); biases 0."""
        init_normal_(self.W_gate, self.init_std)
        init_normal_(self.W_in, self.init_std)
        init_normal_(self.W_out, self.out_std)
        reset_biases(self.b_in, self.b_out)

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        gate = self.hook_pre(linear(x, self.W_gate))
        up = self.hook_pre_linear(linear(x, self.W_in, self.b_in))
        post = self.hook_post(F.silu(gate) * up)
        return linear(post, self.W_out, self.b_out)


MLPS: dict[str, type[nn.Module]] = {"relu": MLP, "gelu": MLP, "gelu_tanh": MLP, "silu": MLP, "swiglu": GatedMLP}
