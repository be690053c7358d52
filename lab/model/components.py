"""The transformer's components, one class per equation, each wrapping its activations in HookPoints.

Notation (the seeds' and TransformerLens's): x ∈ R^{pos × d_model} is the residual stream; a head h
has W_Q^h, W_K^h, W_V^h ∈ R^{d_model × d_head} and W_O^h ∈ R^{d_head × d_model}; the MLP has
W_in ∈ R^{d_model × d_mlp} and W_out ∈ R^{d_mlp × d_model}.

Variants are separate classes chosen from the tables at the bottom (POSITIONS, NORMS, MLPS,
BLOCKS); no `forward` here branches on the config. The only runtime choices are made on what the
caller asks for: attention takes the explicit softmax path when a hook wants the scores or the pattern
(or the model's explicit paths are switched on), and the fused `scaled_dot_product_attention` path
otherwise; TransformerLens's switches (the model's `RuntimeSettings`) add the per-head result and the
per-head copies of the attention's input.

Every component with parameters has `reset_parameters()`, which draws them afresh exactly as the
constructor does (so a model built with seed s and one reset under seed s are the same).
"""

import functools
import math
from collections.abc import Callable
from typing import Any, Literal

import einops
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from lab.model.config import ModelConfig
from lab.model.kv_cache import KVCacheEntry


# --------------------------------------------------------------------------------------------
# Hook points
# --------------------------------------------------------------------------------------------
class CheckedHookPoint(HookPoint):
    """TransformerLens's HookPoint, whose hooks may return only a stand-in for the activation: a tensor of
    its shape, dtype and device, or None (keep it). Anything else is a ValueError naming the hook.

    Every way of attaching a hook — run_with_hooks, `with model.hooks(...)`, run_with_cache, add_hook —
    ends in `HookPoint.add_hook`, so the check lives here once. It wraps the hook function; a hook point
    with no hook attached runs exactly as before (the identity, no check).
    """

    def add_hook(self, hook: Callable[..., Any], dir: Literal["fwd", "bwd"] = "fwd", *args: Any, **kwargs: Any) -> Any:
        if not callable(hook):
            raise ValueError(f"a hook on {self.name} must be a function (activation, hook) -> tensor or None, "
                             f"got {type(hook).__name__}")
        user_hook, what = hook, "activation" if dir == "fwd" else "gradient"

        def checked(tensor: Tensor, *, hook: Any) -> Any:  # TransformerLens passes the hook point as `hook=`
            result = user_hook(tensor, hook=hook)
            if result is not None:
                check_replacement(result, tensor, hook.name, what)
            return result

        checked.__name__ = checked.__qualname__ = getattr(hook, "__name__", type(hook).__name__)
        handle = super().add_hook(checked, dir, *args, **kwargs)
        if handle is None:  # TransformerLens 3 returns nothing: its handle is the one just listed, first or last
            listed = self.fwd_hooks if dir == "fwd" else self.bwd_hooks
            handle = listed[0] if kwargs.get("prepend") or (len(args) > 2 and args[2]) else listed[-1]
        handle.user_hook = user_hook  # what list_hooks() shows: the caller's function, not the wrapper
        return handle


def check_replacement(result: Any, tensor: Any, name: str | None, what: str = "activation") -> None:
    """A hook's return value must stand in for the tensor it was given: same shape, dtype and device."""
    if not isinstance(result, Tensor):
        raise ValueError(f"the hook on {name} returned a value of type {type(result).__name__}, not a tensor: a hook "
                         f"returns None (keep the {what}) or a tensor of the {what}'s shape {tuple(tensor.shape)}")
    if result.shape != tensor.shape:
        raise ValueError(f"the hook on {name} returned shape {tuple(result.shape)} for the {what} of shape "
                         f"{tuple(tensor.shape)}: a replacement must have the same shape (no broadcasting)")
    if result.dtype != tensor.dtype or result.device != tensor.device:
        raise ValueError(f"the hook on {name} returned a {result.dtype} tensor on {result.device} for the "
                         f"{tensor.dtype} {what} on {tensor.device}: a replacement must keep the dtype and device")


def _empty(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape))


def _zeros(shape: tuple[int, ...]) -> nn.Parameter:
    return nn.Parameter(torch.zeros(shape))


def init_normal_(weight: Tensor, std: float) -> None:
    """weight ← N(0, std²) in place. Drawn as a unit normal scaled by std: bit for bit what
    `torch.randn(shape) * std` draws, so every seed builds the weights it always built."""
    with torch.no_grad():
        weight.normal_(0.0, 1.0).mul_(std)


def reset_biases(*biases: Tensor | None) -> None:
    with torch.no_grad():
        for bias in biases:
            if bias is not None:
                bias.zero_()


def set_hook_points(module: nn.Module, names: tuple[str, ...], present: bool) -> None:
    """Add (or remove) the named hook points of `module`: a switch makes its hook points exist only while the
    activation they carry does. The model's `setup()` must run afterwards to name them."""
    for name in names:
        if present and name not in module._modules:
            module.add_module(name, CheckedHookPoint().train(module.training))
        elif not present and name in module._modules:
            delattr(module, name)


# --------------------------------------------------------------------------------------------
# Embeddings
# --------------------------------------------------------------------------------------------
class Embed(nn.Module):
    """Token embedding: e_t = W_E[x_t], W_E ∈ R^{d_vocab × d_model}."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.init_std = cfg.init_std
        self.W_E = _empty(cfg.d_vocab, cfg.d_model)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """W_E ~ N(0, init_std²)."""
        init_normal_(self.W_E, self.init_std)

    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        return self.W_E[tokens]


class LearnedPositions(nn.Module):
    """Learned absolute positions: x_t = e_t + W_pos[t], W_pos ∈ R^{n_ctx × d_model}."""

    def __init__(self, cfg: ModelConfig, hook: HookPoint):
        super().__init__()
        self.init_std = cfg.init_std
        self.W_pos = _empty(cfg.n_ctx, cfg.d_model)
        self.reset_parameters()
        self._hook = (hook,)  # the model's `hook_pos_embed`, held outside this module's tree

    def reset_parameters(self) -> None:
        """W_pos ~ N(0, init_std²)."""
        init_normal_(self.W_pos, self.init_std)

    def forward(self, embed: Float[Tensor, "batch pos d_model"], offset: int) -> Float[Tensor, "batch pos d_model"]:
        pos = self.W_pos[offset : offset + embed.shape[1]]
        return embed + self._hook[0](pos.expand_as(embed))


def sinusoidal_table(n_ctx: int, d_model: int, base: float = 10000.0) -> Float[Tensor, "n_ctx d_model"]:
    """PE[t, 2i] = sin(t / base^(2i/d_model)), PE[t, 2i+1] = cos(t / base^(2i/d_model))."""
    position = torch.arange(n_ctx, dtype=torch.float64)[:, None]
    frequency = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    table = torch.zeros(n_ctx, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency)
    return table.float()


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal positions (Vaswani et al. 2017, §3.5): x_t = e_t + PE[t]."""

    def __init__(self, cfg: ModelConfig, hook: HookPoint):
        super().__init__()
        self.register_buffer("W_pos", sinusoidal_table(cfg.n_ctx, cfg.d_model), persistent=False)
        self._hook = (hook,)  # the model's `hook_pos_embed`, held outside this module's tree

    def forward(self, embed: Float[Tensor, "batch pos d_model"], offset: int) -> Float[Tensor, "batch pos d_model"]:
        pos = self.W_pos[offset : offset + embed.shape[1]]
        return embed + self._hook[0](pos.expand_as(embed))


class NoAbsolutePositions(nn.Module):
    """No absolute position added to the residual stream (rotary models, or no positions at all)."""

    def __init__(self, cfg: ModelConfig, hook: HookPoint | None = None):
        super().__init__()

    def forward(self, embed: Float[Tensor, "batch pos d_model"], offset: int) -> Float[Tensor, "batch pos d_model"]:
        return embed


# --------------------------------------------------------------------------------------------
# Normalisation
# --------------------------------------------------------------------------------------------
def wants_norm_internals(norm: nn.Module) -> bool:
    """True when a hook asks for a norm's scale or normalized input, or the model's explicit paths are on:
    then the explicit path runs and fires them; otherwise torch's fused layer_norm / rms_norm computes the
    same function."""
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
        if not wants_norm_internals(self):  # one fused kernel; the same result to float round-off
            return F.layer_norm(x, (x.shape[-1],), self.w, self.b, self.eps)
        # mean, then the mean square of the centred input: on CPU several times faster than var_mean
        centered = x - x.mean(dim=-1, keepdim=True)
        scale = self.hook_scale((centered.square().mean(dim=-1, keepdim=True) + self.eps).sqrt())
        return torch.addcmul(self.b, self.hook_normalized(centered / scale), self.w)


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
        if not wants_norm_internals(self):  # one fused kernel; the same result to float round-off
            return F.rms_norm(x, (x.shape[-1],), self.w, self.eps)
        scale = self.hook_scale((x.square().mean(dim=-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale) * self.w


class NoNorm(nn.Module):
    """The identity: the final 'norm' of a post-LN stack, whose blocks already end in a norm."""

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        return x


# --------------------------------------------------------------------------------------------
# Attention
# --------------------------------------------------------------------------------------------
def rotate_half(x: Tensor) -> Tensor:
    """(x₁, x₂) ↦ (−x₂, x₁) on the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Rotary(nn.Module):
    """Rotary positions (Su et al. 2021): q_t ↦ R_t q_t, k_s ↦ R_s k_s with R_t a block rotation by
    angles t·θ_i, θ_i = base^(−2i/rotary_dim), so ⟨R_m q, R_n k⟩ depends on n − m only.

    Pairs are (i, i + rotary_dim/2), the GPT-NeoX / LLaMA layout; the first `rotary_dim` dimensions
    of each head rotate, the rest pass through.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.rotary_dim = cfg.rotary_dim
        inv_freq = cfg.rotary_base ** (-torch.arange(0, cfg.rotary_dim, 2, dtype=torch.float64) / cfg.rotary_dim)
        angles = torch.arange(cfg.n_ctx, dtype=torch.float64)[:, None] * inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)  # [n_ctx, rotary_dim]
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: Float[Tensor, "batch pos head d_head"], offset: int) -> Float[Tensor, "batch pos head d_head"]:
        n = x.shape[1]
        cos = self.cos[offset : offset + n, None, :].to(x.dtype)
        sin = self.sin[offset : offset + n, None, :].to(x.dtype)
        x_rot, x_pass = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        x_rot = x_rot * cos + rotate_half(x_rot) * sin
        return torch.cat((x_rot, x_pass), dim=-1) if x_pass.shape[-1] else x_rot


# Below this many tokens in a batch (batch × pos), q, k and v come from per-head products instead of one
# product with the weights laid side by side (measured on CPU: at 1 token 46 µs against 90 µs per layer,
# at 16 tokens 95 µs against 161 µs; from 128 tokens on the single product wins).
FEW_TOKENS = 32


class Attention(nn.Module):
    """Multi-head attention, causal by default, with grouped key/value heads when n_kv_heads < n_heads.

        q = x W_Q + b_Q,  k = y W_K + b_K,  v = y W_V + b_V                 (per head; y = x or kv_input)
        A = softmax(q kᵀ / √d_head + M),  M_ij = −∞ for j > i, else 0      (the causal mask)
        z = A v,   attn_out = Σ_h z^h W_O^h + b_O

    Query head h reads key/value head ⌊h · n_kv_heads / n_heads⌋. With a KV cache the new keys and
    values are appended, and query i sits at absolute position offset + i.

    A sliding window of w (Mistral; `cfg.sliding_window`) also hides the keys j ≤ i − w: each query sees
    itself and the w − 1 keys before it, M_ij = −∞ unless i − w < j ≤ i. The cache keeps every key; the
    mask, written in absolute positions, hides the old ones. Without a window, w is n_ctx, which hides
    nothing a sequence can reach.

    `causal=False` drops the mask (M = 0): an encoder's self-attention, or cross-attention, where
    `kv_input` (the encoder's output) gives the keys and values and x only the queries (Vaswani et al.
    2017, §3.2.3). Rotary is a self-attention position code, so it is not applied across sequences.

    `forward_per_head` is the same attention on one copy of its input per head (TransformerLens's
    use_split_qkv_input / use_attn_in), so that one head's query, key or value input can be patched alone.
    """

    # The per-head input copies that TransformerLens's switches make real (see `_Block.attention`).
    SPLIT_INPUT_HOOKS = ("hook_q_input", "hook_k_input", "hook_v_input")  # [batch, pos, head or kv_head, d_model]
    SHARED_INPUT_HOOKS = ("hook_attn_in",)  # [batch, pos, head, d_model]

    def __init__(self, cfg: ModelConfig, causal: bool = True):
        super().__init__()
        self.causal = causal
        h, kv, d, dh = cfg.n_heads, cfg.n_kv_heads, cfg.d_model, cfg.d_head
        self.n_heads, self.n_kv_heads, self.d_head = h, kv, dh
        self._runtime = cfg.runtime
        # GPT-2's residual-projection scaling for W_O: keeps the residual stream's variance flat in depth.
        self.init_std, self.out_std = cfg.init_std, cfg.init_std / math.sqrt(2 * cfg.n_layers)
        self.W_Q, self.W_K, self.W_V, self.W_O = _empty(h, d, dh), _empty(kv, d, dh), _empty(kv, d, dh), _empty(h, dh, d)
        if cfg.has_qkv_bias:  # every bias, or (Qwen2) those of Q, K and V only
            self.b_Q, self.b_K, self.b_V = _zeros((h, dh)), _zeros((kv, dh)), _zeros((kv, dh))
        else:
            for name in ("b_Q", "b_K", "b_V"):
                self.register_parameter(name, None)
        if cfg.bias:
            self.b_O = _zeros((d,))
        else:
            self.register_parameter("b_O", None)
        self.window = cfg.sliding_window or cfg.n_ctx  # keys i − window < j ≤ i are visible
        self.reset_parameters()
        self.hook_q = CheckedHookPoint()  # [batch, pos, head_index, d_head]
        self.hook_k = CheckedHookPoint()  # [batch, pos, kv_head_index, d_head]  (pos: kv_input's in cross-attention)
        self.hook_v = CheckedHookPoint()  # [batch, pos, kv_head_index, d_head]
        self.rotates = cfg.positions == "rotary"
        if self.rotates:  # a hook point exists only where its activation does
            self.rotary = Rotary(cfg)
            self.hook_rot_q = CheckedHookPoint()  # [batch, pos, head_index, d_head]
            self.hook_rot_k = CheckedHookPoint()  # [batch, pos, kv_head_index, d_head]
        self.hook_attn_scores = CheckedHookPoint()  # [batch, head_index, query_pos, key_pos]
        self.hook_pattern = CheckedHookPoint()  # [batch, head_index, query_pos, key_pos]
        self.hook_z = CheckedHookPoint()  # [batch, pos, head_index, d_head]
        self.hook_result = CheckedHookPoint()  # [batch, pos, head_index, d_model]

    def reset_parameters(self) -> None:
        """W_Q, W_K, W_V ~ N(0, init_std²), W_O ~ N(0, init_std² / (2 n_layers)); biases 0."""
        for W in (self.W_Q, self.W_K, self.W_V):
            init_normal_(W, self.init_std)
        init_normal_(self.W_O, self.out_std)
        reset_biases(self.b_Q, self.b_K, self.b_V, self.b_O)

    def _project(self, x: Tensor, W: Tensor, b: Tensor | None) -> Tensor:
        out = einops.einsum(x, W, "batch pos d_model, head d_model d_head -> batch pos head d_head")
        return out if b is None else out.add_(b)  # in place: the einsum's output is a fresh tensor

    def _project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v in one matrix product: [W_Q | W_K | W_V] laid side by side as [d_model, (h + 2·kv)·d_head].

        Laying them side by side copies the weights; for a few tokens (a decoding step) that copy costs
        more than the product, so there each head's product reads its weights in place."""
        if x.shape[0] * x.shape[1] < FEW_TOKENS:
            return tuple(self._project_per_head(x, W, b) for W, b in ((self.W_Q, self.b_Q), (self.W_K, self.b_K),
                                                                      (self.W_V, self.b_V)))
        W = torch.cat([W.permute(1, 0, 2) for W in (self.W_Q, self.W_K, self.W_V)], dim=1).flatten(1)
        b = None if self.b_Q is None else torch.cat((self.b_Q, self.b_K, self.b_V)).flatten()
        qkv = F.linear(x, W.T, b).unflatten(-1, (-1, self.d_head))
        return qkv.split((self.n_heads, self.n_kv_heads, self.n_kv_heads), dim=2)

    @staticmethod
    def _project_per_head(x: Tensor, W: Tensor, b: Tensor | None) -> Tensor:
        """x W^h (+ b^h) for every head h as one batched product over heads, W [head, d_model, d_head] as stored."""
        out = torch.matmul(x.unsqueeze(1), W)  # [batch, head, pos, d_head]
        return (out if b is None else out.add_(b[:, None, :])).transpose(1, 2)

    @staticmethod
    def _project_copies(x: Tensor, W: Tensor, b: Tensor | None) -> Tensor:
        """x^h W^h (+ b^h) with head h reading its own copy x^h of the input: x [batch, pos, head, d_model]."""
        out = einops.einsum(x, W, "batch pos head d_model, head d_model d_head -> batch pos head d_head")
        return out if b is None else out.add_(b)

    def wants_pattern(self) -> bool:
        """True when a hook asks for the scores or the pattern, or the model's explicit paths are on: then the
        explicit path runs."""
        return self._runtime.explicit_paths or self.hook_attn_scores.has_hooks() or self.hook_pattern.has_hooks()

    def forward(
        self, x: Float[Tensor, "batch pos d_model"], cache: KVCacheEntry | None = None,
        kv_input: Float[Tensor, "batch kv_pos d_model"] | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        if kv_input is None:
            q, k, v = self._project_qkv(x)
        else:  # cross-attention: queries from x, keys and values from the encoder's output
            q = self._project(x, self.W_Q, self.b_Q)
            k, v = self._project(kv_input, self.W_K, self.b_K), self._project(kv_input, self.W_V, self.b_V)
        return self._attend(q, k, v, cache, self.rotates and kv_input is None)

    def forward_per_head(
        self, q_input: Float[Tensor, "batch pos head d_model"], k_input: Float[Tensor, "batch pos kv_head d_model"],
        v_input: Float[Tensor, "batch pos kv_head d_model"], cache: KVCacheEntry | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        """Self-attention whose every head reads its own copy of the input: q^h = x_q^h W_Q^h + b_Q^h, and
        k^j, v^j likewise from x_k^j, x_v^j for key/value head j. Equal to `forward` when every copy is x."""
        q = self._project_copies(q_input, self.W_Q, self.b_Q)
        k = self._project_copies(k_input, self.W_K, self.b_K)
        v = self._project_copies(v_input, self.W_V, self.b_V)
        return self._attend(q, k, v, cache, self.rotates)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, cache: KVCacheEntry | None, rotate: bool
                ) -> Float[Tensor, "batch pos d_model"]:
        """From q, k, v [batch, pos, head, d_head] to attn_out: rotary, the KV cache, A v, and W_O."""
        offset = 0 if cache is None else cache.length
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        if rotate:
            q = self.hook_rot_q(self.rotary(q, offset))
            k = self.hook_rot_k(self.rotary(k, offset))
        if cache is not None:
            k, v = cache.append(k, v)
        if self.wants_pattern():
            z = self._explicit(q, k, v, offset)
        else:
            z = self._fused(q, k, v, offset)
        z = self.hook_z(z)
        if self._runtime.use_attn_result or self.hook_result.has_hooks():
            result = self.hook_result(
                einops.einsum(z, self.W_O, "batch pos head d_head, head d_head d_model -> batch pos head d_model"))
            out = result.sum(dim=2)
            return out if self.b_O is None else out + self.b_O
        # Σ_h z^h W_O^h as one product: [batch, pos, head·d_head] × [head·d_head, d_model], bias fused in.
        return F.linear(z.flatten(2), self.W_O.flatten(0, 1).T, self.b_O)

    def _causal_mask(self, q_len: int, k_len: int, offset: int, device: torch.device) -> Tensor:
        """Boolean [q_len, k_len]: True where query i (at offset + i) may attend to key j (j ≤ offset + i, and
        j > offset + i − window); True everywhere when the attention is not causal."""
        if not self.causal:
            return torch.ones(q_len, k_len, dtype=torch.bool, device=device)
        i = torch.arange(q_len, device=device)[:, None] + offset
        j = torch.arange(k_len, device=device)[None, :]
        return (j <= i) & (j > i - self.window)

    def _mask_bias(self, q_len: int, k_len: int, offset: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """M as an additive [q_len, k_len] bias: 0 where the key is visible, −∞ where it is hidden."""
        visible = self._causal_mask(q_len, k_len, offset, device)
        return torch.zeros(q_len, k_len, device=device, dtype=dtype).masked_fill_(~visible, float("-inf"))

    def _scores(self, q: Tensor, k: Tensor, offset: int) -> Float[Tensor, "batch head q_pos k_pos"]:
        """q kᵀ / √d_head + M, from q [batch, head, q_pos, d_head] and k [batch, head, k_pos, d_head].

        Causal, as one product M + (1/√d_head)·q kᵀ (baddbmm): the scale and the mask ride on the matmul
        instead of two more passes over the scores, the largest tensor of the explicit path. The same
        scores to float round-off (exactly the same where √d_head is a power of two)."""
        if not self.causal:
            scores = einops.einsum(q, k, "batch head q_pos d_head, batch head k_pos d_head -> batch head q_pos k_pos")
            return scores.div_(math.sqrt(self.d_head))
        batch, heads, q_len, d_head = q.shape
        k_len = k.shape[2]
        mask = self._mask_bias(q_len, k_len, offset, q.device, q.dtype)
        scores = torch.baddbmm(mask, q.reshape(batch * heads, q_len, d_head),
                               k.reshape(batch * heads, k_len, d_head).transpose(1, 2), alpha=1 / math.sqrt(d_head))
        return scores.view(batch, heads, q_len, k_len)

    def _explicit(self, q: Tensor, k: Tensor, v: Tensor, offset: int) -> Tensor:
        group = self.n_heads // self.n_kv_heads
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [batch, head, pos, d_head]: one bmm per head
        if group > 1:
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = self.hook_attn_scores(self._scores(q, k, offset))
        pattern = self.hook_pattern(scores.softmax(dim=-1))
        z = einops.einsum(pattern, v, "batch head q_pos k_pos, batch head k_pos d_head -> batch head q_pos d_head")
        return z.transpose(1, 2)

    def _fused(self, q: Tensor, k: Tensor, v: Tensor, offset: int) -> Tensor:
        q_len, k_len = q.shape[1], k.shape[1]
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [batch, head, pos, d_head]
        gqa = self.n_kv_heads != self.n_heads
        windowed = k_len > self.window  # the window hides some keys: only an explicit mask says which
        if not self.causal or (q_len == 1 and not windowed):  # no mask, or one new token that sees every key
            z = F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
        elif q_len == k_len and not windowed:  # no cached prefix: the plain causal mask
            z = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:
            mask = self._causal_mask(q_len, k_len, offset, q.device)
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        return z.transpose(1, 2)


# --------------------------------------------------------------------------------------------
# MLPs
# --------------------------------------------------------------------------------------------
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
        self.W_in, self.W_out = _empty(cfg.d_model, cfg.d_mlp), _empty(cfg.d_mlp, cfg.d_model)
        self.b_in = _zeros((cfg.d_mlp,)) if cfg.bias else None
        self.b_out = _zeros((cfg.d_model,)) if cfg.bias else None
        self.reset_parameters()
        self.hook_pre = CheckedHookPoint()  # [batch, pos, d_mlp]
        self.hook_post = CheckedHookPoint()  # [batch, pos, d_mlp]

    def reset_parameters(self) -> None:
        """W_in ~ N(0, init_std²), W_out ~ N(0, init_std² / (2 n_layers)); biases 0."""
        init_normal_(self.W_in, self.init_std)
        init_normal_(self.W_out, self.out_std)
        reset_biases(self.b_in, self.b_out)

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        pre = self.hook_pre(F.linear(x, self.W_in.T, self.b_in))
        post = self.hook_post(self.act(pre))
        return F.linear(post, self.W_out.T, self.b_out)


class GatedMLP(nn.Module):
    """SwiGLU (Shazeer 2020): mlp(x) = (SiLU(x W_gate) ⊙ x W_in) W_out.

    Hooks follow TransformerLens: hook_pre is x W_gate, hook_pre_linear is x W_in, hook_post the product.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.init_std, self.out_std = cfg.init_std, cfg.init_std / math.sqrt(2 * cfg.n_layers)
        self.W_gate, self.W_in = _empty(cfg.d_model, cfg.d_mlp), _empty(cfg.d_model, cfg.d_mlp)
        self.W_out = _empty(cfg.d_mlp, cfg.d_model)
        self.b_in = _zeros((cfg.d_mlp,)) if cfg.bias else None
        self.b_out = _zeros((cfg.d_model,)) if cfg.bias else None
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
        gate = self.hook_pre(x @ self.W_gate)
        linear = self.hook_pre_linear(F.linear(x, self.W_in.T, self.b_in))
        post = self.hook_post(F.silu(gate) * linear)
        return F.linear(post, self.W_out.T, self.b_out)


# --------------------------------------------------------------------------------------------
# Blocks
# --------------------------------------------------------------------------------------------
def head_copies(x: Float[Tensor, "batch pos d_model"], n: int) -> Float[Tensor, "batch pos head d_model"]:
    """n independent copies of x, one per head (real copies: a hook that edits one in place edits only it)."""
    return x.unsqueeze(2).repeat(1, 1, n, 1)


def unchanged(x: Tensor) -> Tensor:
    """The attention branch's 'norm' in a post-LN block, which attends to the residual stream itself."""
    return x


class _Block(nn.Module):
    # TransformerLens's logit lens asks: hook_resid_post is the one residual stream the next block (or the
    # unembedding) reads, not a stack of streams.
    hook_out_is_single_residual_stream = True
    MLP_INPUT_HOOKS = ("hook_mlp_in",)  # [batch, pos, d_model], made real by use_hook_mlp_in

    def __init__(self, cfg: ModelConfig, causal: bool = True):  # causal=False: an encoder block
        super().__init__()
        self._runtime = cfg.runtime
        self.ln1 = NORMS[cfg.norm](cfg)
        self.attn = Attention(cfg, causal)
        self.ln2 = NORMS[cfg.norm](cfg)
        self.mlp = MLPS[cfg.mlp](cfg)
        self.hook_resid_pre = CheckedHookPoint()  # [batch, pos, d_model]
        self.hook_attn_out = CheckedHookPoint()  # [batch, pos, d_model]
        self.hook_resid_mid = CheckedHookPoint()  # [batch, pos, d_model]
        self.hook_mlp_out = CheckedHookPoint()  # [batch, pos, d_model]
        self.hook_resid_post = CheckedHookPoint()  # [batch, pos, d_model]

    def attention(self, resid: Float[Tensor, "batch pos d_model"], norm: Callable[[Tensor], Tensor],
                  cache: KVCacheEntry | None) -> Float[Tensor, "batch pos d_model"]:
        """attn(norm(resid)). Under use_split_qkv_input each query, key and value head reads its own copy of
        resid (attn.hook_q_input, hook_k_input, hook_v_input), normed on its own; under use_attn_in each
        query head reads its own copy (attn.hook_attn_in) and key/value head j reads copy j, as
        TransformerLens's TransformerBridge does. Unedited copies give the same attention to float round-off."""
        runtime, attn = self._runtime, self.attn
        if not (runtime.use_split_qkv_input or runtime.use_attn_in):
            return attn(norm(resid), cache)
        if runtime.use_split_qkv_input:
            q_input = norm(attn.hook_q_input(head_copies(resid, attn.n_heads)))
            k_input = norm(attn.hook_k_input(head_copies(resid, attn.n_kv_heads)))
            v_input = norm(attn.hook_v_input(head_copies(resid, attn.n_kv_heads)))
        else:
            q_input = norm(attn.hook_attn_in(head_copies(resid, attn.n_heads)))
            k_input = v_input = q_input[:, :, : attn.n_kv_heads]
        return attn.forward_per_head(q_input, k_input, v_input, cache)

    def mlp_input(self, resid_mid: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        """The MLP branch's input (resid_mid; resid_pre in a parallel block), through its own copy (hook_mlp_in)
        under use_hook_mlp_in, so that patching it leaves the residual stream alone."""
        return self.hook_mlp_in(resid_mid.clone()) if self._runtime.use_hook_mlp_in else resid_mid


class PreLNBlock(_Block):
    """Pre-LN (GPT-2, LLaMA):  x ← x + attn(LN₁(x));  x ← x + mlp(LN₂(x))."""

    def forward(self, x: Float[Tensor, "batch pos d_model"], cache: KVCacheEntry | None = None) -> Float[Tensor, "batch pos d_model"]:
        resid_pre = self.hook_resid_pre(x)
        attn_out = self.hook_attn_out(self.attention(resid_pre, self.ln1, cache))
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2(self.mlp_input(resid_mid))))
        return self.hook_resid_post(resid_mid + mlp_out)


class PostLNBlock(_Block):
    """Post-LN (Vaswani et al. 2017, "Add & Norm"):  x ← LN₁(x + attn(x));  x ← LN₂(x + mlp(x))."""

    def forward(self, x: Float[Tensor, "batch pos d_model"], cache: KVCacheEntry | None = None) -> Float[Tensor, "batch pos d_model"]:
        resid_pre = self.hook_resid_pre(x)
        attn_out = self.hook_attn_out(self.attention(resid_pre, unchanged, cache))
        resid_mid = self.hook_resid_mid(self.ln1(resid_pre + attn_out))
        mlp_out = self.hook_mlp_out(self.mlp(self.mlp_input(resid_mid)))
        return self.hook_resid_post(self.ln2(resid_mid + mlp_out))


class ParallelBlock(_Block):
    """Parallel attention and MLP (GPT-J, GPT-NeoX / Pythia):  x ← x + attn(LN₁(x)) + mlp(LN₂(x)).

    Both branches read the block's input, so there is no resid_mid (TransformerLens never fires it in such a
    block either); the attention's and the MLP's outputs add to the stream side by side."""

    def __init__(self, cfg: ModelConfig, causal: bool = True):
        super().__init__(cfg, causal)
        del self.hook_resid_mid  # a hook point exists only where its activation does

    def forward(self, x: Float[Tensor, "batch pos d_model"], cache: KVCacheEntry | None = None) -> Float[Tensor, "batch pos d_model"]:
        resid_pre = self.hook_resid_pre(x)
        attn_out = self.hook_attn_out(self.attention(resid_pre, self.ln1, cache))
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2(self.mlp_input(resid_pre))))
        return self.hook_resid_post(resid_pre + attn_out + mlp_out)


# --------------------------------------------------------------------------------------------
# Unembedding
# --------------------------------------------------------------------------------------------
class Unembed(nn.Module):
    """logits = x W_U + b_U, W_U ∈ R^{d_model × d_vocab}."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.init_std = cfg.init_std
        self.W_U = _empty(cfg.d_model, cfg.d_vocab)
        self.b_U = _zeros((cfg.d_vocab,))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """W_U ~ N(0, init_std²), b_U = 0."""
        init_normal_(self.W_U, self.init_std)
        reset_biases(self.b_U)

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_vocab"]:
        return F.linear(x, self.W_U.T, self.b_U)


class TiedUnembed(nn.Module):
    """logits = x W_Eᵀ + b_U: the unembedding shares the token embedding's weights.

    The embedding is held outside the module tree (a tuple) so that its weight is stored once.
    """

    def __init__(self, cfg: ModelConfig, embed: Embed):
        super().__init__()
        self._embed = (embed,)
        self.b_U = _zeros((cfg.d_vocab,))

    def reset_parameters(self) -> None:
        """b_U = 0 (W_E is the embedding's, reset there)."""
        reset_biases(self.b_U)

    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab"]:
        return self._embed[0].W_E.T

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_vocab"]:
        return F.linear(x, self._embed[0].W_E, self.b_U)


POSITIONS: dict[str, type[nn.Module]] = {
    "learned": LearnedPositions,
    "sinusoidal": SinusoidalPositions,
    "rotary": NoAbsolutePositions,  # rotary acts inside attention, on q and k
    "none": NoAbsolutePositions,
}
NORMS: dict[str, type[nn.Module]] = {"layernorm": LayerNorm, "rmsnorm": RMSNorm}
MLPS: dict[str, type[nn.Module]] = {
    "relu": MLP, "gelu": MLP, "gelu_tanh": MLP, "silu": MLP, "swiglu": GatedMLP}
BLOCKS: dict[str, type[nn.Module]] = {"pre_ln": PreLNBlock, "post_ln": PostLNBlock, "parallel": ParallelBlock}
