"""The transformer's components, one class per equation, each wrapping its activations in HookPoints.

Notation (the seeds' and TransformerLens's): x ∈ R^{pos × d_model} is the residual stream; a head h
has W_Q^h, W_K^h, W_V^h ∈ R^{d_model × d_head} and W_O^h ∈ R^{d_head × d_model}; the MLP has
W_in ∈ R^{d_model × d_mlp} and W_out ∈ R^{d_mlp × d_model}.

This module holds the blocks, which put the parts together. Each part is imported from its own module:
`primitives` (CheckedHookPoint, parameter initialisers), `embeddings` (token embedding, positions,
unembedding), `norms`, `mlp`, `attention` (rotary and attention's two paths).

Variants are separate classes chosen from tables (POSITIONS, NORMS, MLPS, BLOCKS); no `forward`
branches on the config. The only runtime choices are made on what the caller asks for: attention takes
the explicit softmax path when a hook wants the scores or the pattern (or the model's explicit paths are
switched on), and the fused `scaled_dot_product_attention` path otherwise; TransformerLens's switches (the
model's `RuntimeSettings`) add the per-head result and the per-head copies of the attention's input.

Every component with parameters has `reset_parameters()`, which draws them afresh exactly as the
constructor does (so a model built with seed s and one reset under seed s are the same).
"""

from collections.abc import Callable

from jaxtyping import Float
from torch import Tensor, nn

from lab.model.attention import Attention
from lab.model.config import ModelConfig
from lab.model.kv_cache import KVCacheEntry
from lab.model.mlp import MLPS
from lab.model.norms import NORMS
from lab.model.padding import Padding
from lab.model.primitives import CheckedHookPoint


def head_copies(x: Float[Tensor, "batch pos d_model"], n: int) -> Float[Tensor, "batch pos head d_model"]:
    """n independent copies of x, one per head (real copies: a hook that edits one in place edits only it)."""
    return x.unsqueeze(2).repeat(1, 1, n, 1)


def unchanged(x: Tensor) -> Tensor:
    """The attention branch's 'norm' in a post-LN block, which attends to the residual stream itself."""
    return x


Attend = Callable[[Callable[[Tensor], Tensor]], Tensor]  # a block's attention branch, given its norm


class _Block(nn.Module):
    # TransformerLens's logit lens asks: hook_resid_post is the one residual stream the next block (or the
    # unembedding) reads, not a stack of streams.
    hook_out_is_single_residual_stream = True
    # The residual copies TransformerLens's switches make real, before ln1 / ln2: blocks.{l}.hook_q_input, ... as
    # HookedTransformer names them, each followed by blocks.{l}.attn.hook_q_input, ... as TransformerBridge does.
    SPLIT_INPUT_HOOKS = ("hook_q_input", "hook_k_input", "hook_v_input")  # [batch, pos, head or kv_head, d_model]
    SHARED_INPUT_HOOKS = ("hook_attn_in",)  # [batch, pos, head, d_model]
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

    def forward(
        self,
        x: Float[Tensor, "batch pos d_model"],
        cache: KVCacheEntry | None = None,
        padding: Padding | None = None,
        shortformer_pos_embed: Tensor | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        """hook_resid_pre, the block's own equation (`update`, whose attention reads this call's cache, padding
        and shortformer positions), hook_resid_post."""
        resid_pre = self.hook_resid_pre(x)

        def attend(norm: Callable[[Tensor], Tensor]) -> Float[Tensor, "batch pos d_model"]:
            return self.attention(resid_pre, norm, cache, padding, shortformer_pos_embed)

        return self.hook_resid_post(self.update(resid_pre, attend))

    def update(
        self, resid_pre: Float[Tensor, "batch pos d_model"], attend: Attend
    ) -> Float[Tensor, "batch pos d_model"]:
        """The residual stream after the block (before hook_resid_post), from resid_pre; `attend(norm)` is the
        attention branch's output on norm(resid_pre)."""
        raise NotImplementedError

    def attention(
        self,
        resid: Float[Tensor, "batch pos d_model"],
        norm: Callable[[Tensor], Tensor],
        cache: KVCacheEntry | None,
        padding: Padding | None,
        shortformer_pos_embed: Tensor | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        """attn(norm(resid)); with shortformer positions p, attn(query_input=norm(resid) + p,
        key_input=norm(resid) + p, value_input=norm(resid)), as TransformerLens adds them. Under use_split_qkv_input
        each query, key and value head reads its own copy of resid (hook_q_input, hook_k_input, hook_v_input, then
        attn.hook_q_input, ...), normed on its own; under use_attn_in each query head reads its own copy
        (hook_attn_in, then attn.hook_attn_in) and key/value head j reads copy j. Unedited copies give the same
        attention to float round-off."""
        runtime, attn, p = self._runtime, self.attn, shortformer_pos_embed
        if not (runtime.use_split_qkv_input or runtime.use_attn_in):
            x = norm(resid)
            qk = x if p is None else x + p
            return attn(qk, qk, x, cache, padding=padding)
        if runtime.use_split_qkv_input:
            q_input = norm(attn.hook_q_input(self.hook_q_input(head_copies(resid, attn.n_heads))))
            k_input = norm(attn.hook_k_input(self.hook_k_input(head_copies(resid, attn.kv_heads))))
            v_input = norm(attn.hook_v_input(self.hook_v_input(head_copies(resid, attn.kv_heads))))
        else:
            q_input = norm(attn.hook_attn_in(self.hook_attn_in(head_copies(resid, attn.n_heads))))
            k_input = v_input = q_input[:, :, : attn.kv_heads]
        if p is not None:
            q_input, k_input = q_input + p[:, :, None], k_input + p[:, :, None]
        return attn(q_input, k_input, v_input, cache, padding=padding)

    def mlp_input(self, resid_mid: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        """The MLP branch's input (resid_mid; resid_pre in a parallel block), through its own copy (hook_mlp_in)
        under use_hook_mlp_in, so that patching it leaves the residual stream alone."""
        return self.hook_mlp_in(resid_mid.clone()) if self._runtime.use_hook_mlp_in else resid_mid


class PreLNBlock(_Block):
    """Pre-LN (GPT-2, LLaMA):  x ← x + attn(LN₁(x));  x ← x + mlp(LN₂(x))."""

    def update(
        self, resid_pre: Float[Tensor, "batch pos d_model"], attend: Attend
    ) -> Float[Tensor, "batch pos d_model"]:
        attn_out = self.hook_attn_out(attend(self.ln1))
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2(self.mlp_input(resid_mid))))
        return resid_mid + mlp_out


class PostLNBlock(_Block):
    """Post-LN (Vaswani et al. 2017, "Add & Norm"):  x ← LN₁(x + attn(x));  x ← LN₂(x + mlp(x))."""

    def update(
        self, resid_pre: Float[Tensor, "batch pos d_model"], attend: Attend
    ) -> Float[Tensor, "batch pos d_model"]:
        attn_out = self.hook_attn_out(attend(unchanged))
        resid_mid = self.hook_resid_mid(self.ln1(resid_pre + attn_out))
        mlp_out = self.hook_mlp_out(self.mlp(self.mlp_input(resid_mid)))
        return self.ln2(resid_mid + mlp_out)


class AttnOnlyBlock(_Block):
    """Attention only (TransformerLens's attn_only models):  x ← x + attn(LN₁(x)). No MLP, no resid_mid."""

    def __init__(self, cfg: ModelConfig, causal: bool = True):
        super().__init__(cfg, causal)
        # a hook point exists only where its activation does
        del self.ln2, self.mlp, self.hook_resid_mid, self.hook_mlp_out

    def update(
        self, resid_pre: Float[Tensor, "batch pos d_model"], attend: Attend
    ) -> Float[Tensor, "batch pos d_model"]:
        return resid_pre + self.hook_attn_out(attend(self.ln1))


class ParallelBlock(_Block):
    """Parallel attention and MLP (GPT-J, GPT-NeoX / Pythia):  x ← x + attn(LN₁(x)) + mlp(LN₂(x)).

    Both branches read the block's input, so there is no resid_mid (TransformerLens never fires it in such a
    block either); the attention's and the MLP's outputs add to the stream side by side."""

    def __init__(self, cfg: ModelConfig, causal: bool = True):
        super().__init__(cfg, causal)
        del self.hook_resid_mid  # a hook point exists only where its activation does

    def update(
        self, resid_pre: Float[Tensor, "batch pos d_model"], attend: Attend
    ) -> Float[Tensor, "batch pos d_model"]:
        attn_out = self.hook_attn_out(attend(self.ln1))
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2(self.mlp_input(resid_pre))))
        return resid_pre + attn_out + mlp_out


BLOCKS: dict[str, type[nn.Module]] = {
    "pre_ln": PreLNBlock,
    "post_ln": PostLNBlock,
    "parallel": ParallelBlock,
    "attn_only": AttnOnlyBlock,
}
