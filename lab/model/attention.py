"""Attention: rotary positions, and multi-head (grouped-query, causal, windowed, cross-) attention with its two
paths, the explicit softmax(QKᵀ/√d_head + M)·V that fires hook_attn_scores and hook_pattern, and the fused
`scaled_dot_product_attention` that runs when nothing asks for them (tests hold the two equal)."""

import math

import einops
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn

from lab.model.config import ModelConfig
from lab.model.kv_cache import KVCacheEntry
from lab.model.padding import Padding, padding_of
from lab.model.primitives import (
    CheckedHookPoint,
    Derived,
    Reads,
    empty_parameter,
    init_normal_,
    linear,
    reset_biases,
    zero_parameter,
)


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

    def forward(
        self, x: Float[Tensor, "batch pos head d_head"], offset: int, padding: Padding | None = None
    ) -> Float[Tensor, "batch pos head d_head"]:
        """Rotate x at positions offset, offset + 1, ...; in a padded batch at each token's own position within
        its text (`padding.positions`)."""
        if padding is None:
            n = x.shape[1]
            cos = self.cos[offset : offset + n, None, :].to(x.dtype)
            sin = self.sin[offset : offset + n, None, :].to(x.dtype)
        else:
            cos = self.cos[padding.positions][:, :, None, :].to(x.dtype)
            sin = self.sin[padding.positions][:, :, None, :].to(x.dtype)
        x_rot, x_pass = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        x_rot = x_rot * cos + rotate_half(x_rot) * sin
        return torch.cat((x_rot, x_pass), dim=-1) if x_pass.shape[-1] else x_rot


# Under autograd, below this many tokens in a batch (batch × pos), q, k and v come from per-head products instead
# of one product with the weights laid side by side, which autograd lays anew on every call (measured on CPU: at
# 1 token 46 µs against 90 µs per layer, at 16 tokens 95 µs against 161 µs; from 128 tokens on the single product
# wins). Outside autograd the side-by-side weights are kept, and every batch takes the single product.
FEW_TOKENS = 32


def side_by_side(
    W_Q: Tensor, W_K: Tensor, W_V: Tensor, b_Q: Tensor | None, b_K: Tensor | None, b_V: Tensor | None
) -> tuple[Float[Tensor, "d_model qkv"], Float[Tensor, " qkv"] | None]:
    """[W_Q | W_K | W_V] as one [d_model, (h + 2·kv)·d_head] matrix, heads in order, and the biases likewise."""
    W = torch.cat([W.permute(1, 0, 2) for W in (W_Q, W_K, W_V)], dim=1).flatten(1)
    return W, None if b_Q is None else torch.cat((b_Q, b_K, b_V)).flatten()


class Attention(nn.Module):
    """Multi-head attention, causal by default, with grouped key/value heads when n_kv_heads < n_heads.

        q = x_q W_Q + b_Q,  k = x_k W_K + b_K,  v = x_v W_V + b_V          (per head; self-attention: x_q = x_k = x_v)
        A = softmax(q kᵀ / √d_head + M),  M_ij = −∞ for j > i, else 0      (the causal mask)
        z = A v,   attn_out = Σ_h z^h W_O^h + b_O

    Query head h reads key/value head ⌊h · n_kv_heads / n_heads⌋. With a KV cache the new keys and
    values are appended, and query i sits at absolute position offset + i.

    A sliding window of w (Mistral; `cfg.sliding_window`) also hides the keys j ≤ i − w: each query sees
    itself and the w − 1 keys before it, M_ij = −∞ unless i − w < j ≤ i. The cache keeps every key; the
    mask, written in absolute positions, hides the old ones. Without a window, w is n_ctx, which hides
    nothing a sequence can reach.

    `causal=False` drops the mask (M = 0): an encoder's self-attention, or cross-attention, where the
    encoder's output gives the keys and values (x_k = x_v) and the decoder's stream the queries (Vaswani et al.
    2017, §3.2.3; the encoder-decoder has no rotary positions, a self-attention position code).

    `forward` takes TransformerLens's attention signature (query_input, key_input, value_input, ...), each input
    also as one copy per head (TransformerLens's use_split_qkv_input / use_attn_in), so that one head's query, key
    or value input can be patched alone.

    In a padded batch (`padding`, lab.model.padding) a query also never sees a padding key, and a query that
    sees no key at all has pattern 0 and z 0, as in TransformerLens.
    """

    RESULT_HOOKS = ("hook_result",)  # [batch, pos, head, d_model]: made real by use_attn_result

    def __init__(self, cfg: ModelConfig, causal: bool = True):
        super().__init__()
        self.causal = causal
        h, kv, d, dh = cfg.n_heads, cfg.n_kv_heads, cfg.d_model, cfg.d_head
        self.n_heads, self.n_kv_heads, self.d_head = h, kv, dh
        self._runtime = cfg.runtime
        # GPT-2's residual-projection scaling for W_O: keeps the residual stream's variance flat in depth.
        self.init_std, self.out_std = cfg.init_std, cfg.init_std / math.sqrt(2 * cfg.n_layers)
        self.W_Q, self.W_K, self.W_V, self.W_O = (
            empty_parameter(h, d, dh),
            empty_parameter(kv, d, dh),
            empty_parameter(kv, d, dh),
            empty_parameter(h, dh, d),
        )
        if cfg.has_qkv_bias:  # every bias, or (Qwen2) those of Q, K and V only
            self.b_Q, self.b_K, self.b_V = zero_parameter((h, dh)), zero_parameter((kv, dh)), zero_parameter((kv, dh))
        else:
            for name in ("b_Q", "b_K", "b_V"):
                self.register_parameter(name, None)
        if cfg.bias:
            self.b_O = zero_parameter((d,))
        else:
            self.register_parameter("b_O", None)
        self.window = cfg.sliding_window or cfg.n_ctx  # keys i − window < j ≤ i are visible
        self.reset_parameters()
        self._fused_qkv = Derived(side_by_side)  # [W_Q | W_K | W_V] for inference, formed once per weights' version
        self.hook_q = CheckedHookPoint()  # [batch, pos, head_index, d_head]
        self.hook_k = CheckedHookPoint()  # [batch, pos, kv_head_index, d_head]  (pos: key_input's in cross-attention)
        self.hook_v = CheckedHookPoint()  # [batch, pos, kv_head_index, d_head]
        self.rotates = cfg.positions == "rotary"
        if self.rotates:  # a hook point exists only where its activation does
            self.rotary = Rotary(cfg)
            self.hook_rot_q = CheckedHookPoint()  # [batch, pos, head_index, d_head]
            self.hook_rot_k = CheckedHookPoint()  # [batch, pos, kv_head_index, d_head]
        self.hook_attn_scores = CheckedHookPoint()  # [batch, head_index, query_pos, key_pos]
        self.hook_pattern = CheckedHookPoint()  # [batch, head_index, query_pos, key_pos]
        self.hook_z = CheckedHookPoint()  # [batch, pos, head_index, d_head]

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

        Laying them side by side copies the weights. Outside autograd the copy is made once and kept until a
        weight changes (`Derived`). Under autograd it is made on every call, in the graph; for a few tokens that
        copy costs more than the product, so there each head's product reads its weights in place."""
        weights = (self.W_Q, self.W_K, self.W_V, self.b_Q, self.b_K, self.b_V)
        if not torch.is_grad_enabled():
            W, b = self._fused_qkv(*weights)
        elif x.shape[0] * x.shape[1] < FEW_TOKENS:
            return tuple(
                self._project_per_head(x, W, b)
                for W, b in ((self.W_Q, self.b_Q), (self.W_K, self.b_K), (self.W_V, self.b_V))
            )
        else:
            W, b = side_by_side(*weights)
        qkv = linear(x, W, b).unflatten(-1, (-1, self.d_head))
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

    @property
    def kv_heads(self) -> int:
        """The key/value heads as hook_k, hook_v (and hook_k_input, hook_v_input) carry them: n_kv_heads, or one per
        query head under the model's set_ungroup_grouped_query_attention(True)."""
        return self.n_heads if self._runtime.ungroup_grouped_query_attention else self.n_kv_heads

    def _ungrouped(self, t: Tensor, dim: int) -> Tensor:
        """Key/value heads (or their weights) along `dim`, each repeated for the query heads that read it when
        ungrouped; unchanged otherwise."""
        group = self.kv_heads // self.n_kv_heads
        return t if group == 1 or t is None else t.repeat_interleave(group, dim=dim)

    def wants_pattern(self) -> bool:
        """True when a hook asks for the scores or the pattern, or the model's explicit paths are on: then the
        explicit path runs."""
        return self._runtime.explicit_paths or self.hook_attn_scores.has_hooks() or self.hook_pattern.has_hooks()

    def forward(
        self,
        query_input: Float[Tensor, "batch pos d_model"] | Float[Tensor, "batch pos head d_model"],
        key_input: Tensor | None = None,
        value_input: Tensor | None = None,
        past_kv_cache_entry: KVCacheEntry | None = None,
        attention_mask: Int[Tensor, "batch offset_pos"] | None = None,
        padding: Padding | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        """attn_out, called as TransformerLens calls its attention: queries from query_input, keys from key_input,
        values from value_input (each defaults to the one before it: self-attention; the encoder's output as keys
        and values is cross-attention). Each is [batch, pos, d_model], or one copy per head [batch, pos, head,
        d_model] (kv_heads for keys and values), as the blocks pass under use_split_qkv_input / use_attn_in:
        q^h = x_q^h W_Q^h + b_Q^h, and k^j, v^j likewise. attention_mask [batch, offset_pos] (1 real, 0 padding) is
        TransformerLens's; the blocks pass their pass's `padding` instead."""
        key_input = query_input if key_input is None else key_input
        value_input = key_input if value_input is None else value_input
        if padding is None and attention_mask is not None:
            offset = 0 if past_kv_cache_entry is None else past_kv_cache_entry.length
            padding = padding_of(attention_mask, None, offset, tuple(query_input.shape[:2]), query_input.device)
        if query_input.ndim == 4:  # one copy of the input per head
            W_K, b_K, W_V, b_V = (self._ungrouped(t, 0) for t in (self.W_K, self.b_K, self.W_V, self.b_V))
            q, k, v = (
                self._project_copies(x, W, b)
                for x, W, b in ((query_input, self.W_Q, self.b_Q), (key_input, W_K, b_K), (value_input, W_V, b_V))
            )
        else:
            if key_input is query_input and value_input is query_input:
                q, k, v = self._project_qkv(query_input)
            else:
                q, k, v = (
                    self._project(x, W, b)
                    for x, W, b in (
                        (query_input, self.W_Q, self.b_Q),
                        (key_input, self.W_K, self.b_K),
                        (value_input, self.W_V, self.b_V),
                    )
                )
            k, v = self._ungrouped(k, 2), self._ungrouped(v, 2)
        return self._attend(q, k, v, past_kv_cache_entry, self.rotates, padding)

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, cache: KVCacheEntry | None, rotate: bool, padding: Padding | None
    ) -> Float[Tensor, "batch pos d_model"]:
        """From q, k, v [batch, pos, head, d_head] to attn_out: rotary, the KV cache, A v, and W_O."""
        offset = 0 if cache is None else cache.length
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        if rotate:
            q = self.hook_rot_q(self.rotary(q, offset, padding))
            k = self.hook_rot_k(self.rotary(k, offset, padding))
        if cache is not None:
            k, v = cache.append(k, v)
        if padding is not None:
            z = self._padded(q, k, v, offset, padding)
        elif self.wants_pattern():
            z = self._explicit(q, k, v, offset)
        else:
            z = self._fused(q, k, v, offset)
        z = self.hook_z(z)
        if self._runtime.use_attn_result:
            result = self.hook_result(
                einops.einsum(z, self.W_O, "batch pos head d_head, head d_head d_model -> batch pos head d_model")
            )
            out = result.sum(dim=2)
            return out if self.b_O is None else out + self.b_O
        # Σ_h z^h W_O^h as one product: [batch, pos, head·d_head] × [head·d_head, d_model], bias fused in.
        return linear(z.flatten(2), self.W_O.flatten(0, 1), self.b_O)

    def _causal_mask(self, q_len: int, k_len: int, offset: int, device: torch.device) -> Tensor:
        """Boolean [q_len, k_len]: True where query i (at offset + i) may attend to key j (j ≤ offset + i, and
        j > offset + i − window); True everywhere when the attention is not causal."""
        if not self.causal:
            return torch.ones(q_len, k_len, dtype=torch.bool, device=device)
        i = torch.arange(q_len, device=device)[:, None] + offset
        j = torch.arange(k_len, device=device)[None, :]
        return (j <= i) & (j > i - self.window)

    def _mask_bias(self, q_len: int, k_len: int, offset: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """M as an additive [q_len, k_len] bias: 0 where the key is visible, −∞ where it is hidden. Always read
        from `_causal_mask`, the one statement of which keys a query sees (a subclass that states another mask,
        as the equations experiment's reversed one does, changes every path with it)."""
        visible = self._causal_mask(q_len, k_len, offset, device)
        return torch.zeros(q_len, k_len, device=device, dtype=dtype).masked_fill_(~visible, float("-inf"))

    def _scores(
        self, q: Tensor, k: Tensor, offset: int, group: int
    ) -> Float[Tensor, "batch·kv_head group·q_pos k_pos"]:
        """q kᵀ / √d_head + M, from q [batch·kv_head, group·q_pos, d_head] (the `group` query heads that read one
        key/value head, one after the other) and k [batch·kv_head, k_pos, d_head].

        Causal, as one product M + (1/√d_head)·q kᵀ (baddbmm): the scale and the mask ride on the matmul
        instead of two more passes over the scores, the largest tensor of the explicit path. The same
        scores to float round-off (exactly the same where √d_head is a power of two)."""
        if not self.causal:
            return torch.bmm(q, k.transpose(1, 2)).div_(math.sqrt(self.d_head))
        q_len, k_len = q.shape[1] // group, k.shape[1]
        mask = self._mask_bias(q_len, k_len, offset, q.device, q.dtype)
        return torch.baddbmm(
            mask.repeat(group, 1) if group > 1 else mask, q, k.transpose(1, 2), alpha=1 / math.sqrt(self.d_head)
        )

    def _explicit(self, q: Tensor, k: Tensor, v: Tensor, offset: int) -> Tensor:
        """softmax(q kᵀ / √d_head + M) v, firing hook_attn_scores and hook_pattern [batch, head, q_pos, k_pos].

        Query head h = j·group + g reads key/value head j (group = n_heads / n_kv_heads), so the query heads are
        laid out as [batch·kv_head, group·q_pos, d_head]: one product per key/value head serves its whole group,
        and the keys and values are read where they are instead of being repeated for every query head. The
        scores of that product are [batch, head, q_pos, k_pos] as they stand (a view, no copy).

        When no hook changed the scores or the pattern (a hook that only reads them, as run_with_cache's), z is
        the fused path's: reading an activation never changes a number."""
        batch, q_len, heads, d_head = q.shape
        kv, k_len = k.shape[2], k.shape[1]
        group = heads // kv
        qg, kg, vg = (t.transpose(1, 2).reshape(batch * kv, -1, d_head) for t in (q, k, v))
        scores = self._scores(qg, kg, offset, group).view(batch, heads, q_len, k_len)
        read = Reads()
        pattern = read(self.hook_pattern, read(self.hook_attn_scores, scores).softmax(dim=-1))
        if read.unchanged:
            return self._fused(q, k, v, offset)
        z = torch.bmm(pattern.reshape(batch * kv, group * q_len, k_len), vg)  # [batch·kv_head, group·q_pos, d_head]
        return z.view(batch, heads, q_len, d_head).transpose(1, 2)

    def _padded(self, q: Tensor, k: Tensor, v: Tensor, offset: int, padding: Padding) -> Tensor:
        """Attention in a padded batch: softmax(q kᵀ / √d_head + M) v with M also hiding padding keys, explicit
        (firing hook_attn_scores and hook_pattern) or fused; a query that sees no key gets z = 0."""
        q_len, k_len = q.shape[1], k.shape[1]
        visible = padding.visible(self._causal_mask(q_len, k_len, offset, q.device))  # [batch, 1, q_pos, k_pos]
        group = q.shape[2] // k.shape[2]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [batch, head, pos, d_head]
        if self.wants_pattern():
            kr, vr = (k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)) if group > 1 else (k, v)
            scores = (q @ kr.transpose(-1, -2) / math.sqrt(self.d_head)).masked_fill(~visible, float("-inf"))
            read = Reads()
            pattern = read(self.hook_attn_scores, scores).softmax(dim=-1)
            pattern = read(self.hook_pattern, torch.where(pattern.isnan(), torch.zeros_like(pattern), pattern))
            if not read.unchanged:
                return (pattern @ vr).transpose(1, 2)
        z = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, enable_gqa=group > 1)
        return z.masked_fill(~visible.any(dim=-1, keepdim=True), 0.0).transpose(1, 2)

    def _fused(self, q: Tensor, k: Tensor, v: Tensor, offset: int) -> Tensor:
        q_len, k_len = q.shape[1], k.shape[1]
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [batch, head, pos, d_head]
        gqa = k.shape[1] != q.shape[1]
        windowed = k_len > self.window  # the window hides some keys: only an explicit mask says which
        # a subclass that states another mask (the equations experiment's reversed one): only that mask says which
        restated = type(self)._causal_mask is not Attention._causal_mask
        if not self.causal or (q_len == 1 and not windowed and not restated):  # no mask, or a new token sees every key
            z = F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
        elif q_len == k_len and not windowed and not restated:  # no cached prefix: the plain causal mask
            z = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:
            mask = self._causal_mask(q_len, k_len, offset, q.device)
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        return z.transpose(1, 2)
