"""The norms: LayerNorm and RMSNorm, each with torch's fused kernel and the explicit path that fires hook_scale and
hook_normalized, and the identity for a stack that needs none; `NORMS` maps `cfg.norm` to its class."""

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from lab.model.config import ModelConfig
from lab.model.primitives import CheckedHookPoint, Reads


def wants_norm_internals(norm: nn.Module) -> bool:
    """True when a hook asks for a norm's scale or normalized input, or the model's explicit paths are on:
    then the explicit path runs and fires them (its result used only if a hook changed one); otherwise torch's
    fused layer_norm / rms_norm computes the same function."""
    return norm._runtime.explicit_paths or norm.hook_scale.has_hooks() or norm.hook_normalized.has_hooks()


class LayerNorm(nn.Module):
    """LN(x) = (x − μ(x)) / sqrt(σ²(x) + ε) ⊙ w + b, statistics over d_model."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.eps = cfg.norm_eps
        self._runtime = cfg.runtime
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        self.b = nn.Parameter(torch.zeros(cfg.d_model))
        self.hook_scale = CheckedHookPoint()  # [batch, pos, 1]
        self.hook_normalized = CheckedHookPoint()  # [batch, pos, d_model]

    def reset_parameters(self) -> None:
        """w = 1, b = 0: the identity affine map."""
        with torch.no_grad():
            self.w.fill_(1.0)
            self.b.zero_()

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        if torch.is_grad_enabled() and (self.w.requires_grad or self.b.requires_grad):
            # The gain and bias outside the fused kernel, whose backward on the CPU sums their gradients in one
            # partial sum per thread: the sums over rows here come out the same at any thread count.
            fused = torch.addcmul(self.b, F.layer_norm(x, (x.shape[-1],), None, None, self.eps), self.w)
        else:
            fused = F.layer_norm(x, (x.shape[-1],), self.w, self.b, self.eps)  # one fused kernel, the same bits
        if not wants_norm_internals(self):
            return fused
        # mean, then the mean square of the centred input: on CPU several times faster than var_mean
        centered, read = x - x.mean(dim=-1, keepdim=True), Reads()
        scale = read(self.hook_scale, (centered.square().mean(dim=-1, keepdim=True) + self.eps).sqrt())
        normalized = read(self.hook_normalized, centered / scale)
        return fused if read.unchanged else torch.addcmul(self.b, normalized, self.w)


class RMSNorm(nn.Module):
    """RMSNorm(x) = x / sqrt(mean(x²) + ε) ⊙ w (Zhang & Sennrich 2019)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.eps = cfg.norm_eps
        self._runtime = cfg.runtime
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        self.hook_scale = CheckedHookPoint()  # [batch, pos, 1]
        self.hook_normalized = CheckedHookPoint()  # [batch, pos, d_model]

    def reset_parameters(self) -> None:
        """w = 1."""
        with torch.no_grad():
            self.w.fill_(1.0)

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        fused = F.rms_norm(x, (x.shape[-1],), self.w, self.eps)  # the same result to float round-off
        if not wants_norm_internals(self):
            return fused
        read = Reads()
        scale = read(self.hook_scale, (x.square().mean(dim=-1, keepdim=True) + self.eps).sqrt())
        normalized = read(self.hook_normalized, x / scale)
        return fused if read.unchanged else normalized * self.w


class LayerNormPre(nn.Module):
    """LN(x) = (x − μ(x)) / sqrt(σ²(x) + ε): LayerNorm without its gain and bias, which weight processing folds
    into the maps that read it (TransformerLens's LayerNormPre, normalization_type "LNPre")."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.eps = cfg.norm_eps
        self._runtime = cfg.runtime
        self.hook_scale = CheckedHookPoint()  # [batch, pos, 1]
        self.hook_normalized = CheckedHookPoint()  # [batch, pos, d_model]

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        fused = F.layer_norm(x, (x.shape[-1],), None, None, self.eps)
        if not wants_norm_internals(self):
            return fused
        centered, read = x - x.mean(dim=-1, keepdim=True), Reads()
        scale = read(self.hook_scale, (centered.square().mean(dim=-1, keepdim=True) + self.eps).sqrt())
        normalized = read(self.hook_normalized, centered / scale)
        return fused if read.unchanged else normalized


class RMSNormPre(nn.Module):
    """RMSNorm(x) = x / sqrt(mean(x²) + ε): RMSNorm without its gain, folded into the maps that read it
    (TransformerLens's RMSNormPre, normalization_type "RMSPre")."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.eps = cfg.norm_eps
        self._runtime = cfg.runtime
        self.hook_scale = CheckedHookPoint()  # [batch, pos, 1]
        self.hook_normalized = CheckedHookPoint()  # [batch, pos, d_model]

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        fused = F.rms_norm(x, (x.shape[-1],), None, self.eps)
        if not wants_norm_internals(self):
            return fused
        read = Reads()
        scale = read(self.hook_scale, (x.square().mean(dim=-1, keepdim=True) + self.eps).sqrt())
        normalized = read(self.hook_normalized, x / scale)
        return fused if read.unchanged else normalized


class NoNorm(nn.Module):
    """The identity: the final 'norm' of a post-LN stack, whose blocks already end in a norm."""

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        return x


NORMS: dict[str, type[nn.Module]] = {
    "layernorm": LayerNorm,
    "rmsnorm": RMSNorm,
    "layernorm_pre": LayerNormPre,
    "rmsnorm_pre": RMSNormPre,
}
