"""HookedTransformer: the decoder-only transformer, top to bottom, with a HookPoint at every activation.

    x⁰ = W_E[tokens] (+ W_pos[positions])                          embed, positions (shortformer: W_pos is added to
                                                                    each attention's query and key inputs instead)
    xˡ⁺¹ = block_l(xˡ)                                              l = 0 … n_layers − 1
    logits = LN_final(x^L) W_U + b_U                                unembed
    P_θ(x_{t+1} | x_≤t) = softmax(logits_t)

It subclasses TransformerLens's HookedRootModule, so `run_with_hooks`, `hooks()` and
`run_with_cache` (returning a `transformer_lens.ActivationCache`) work as they do in TransformerLens,
and the cache's methods (accumulated_resid, decompose_resid, logit_attrs, ...) read our model. It also
takes TransformerLens's call conventions (`forward(input, return_type, stop_at_layer=, start_at_layer=,
attention_mask=, ...)`, text with `prepend_bos` and `padding_side`, `generate`) and switches
(`set_use_attn_result`, `set_use_split_qkv_input`, `set_use_attn_in`, `set_use_hook_mlp_in`), processes its
weights as TransformerLens does (`process_weights_`, `from_pretrained`), and answers what TransformerLens's
analysis code reads (`accumulated_bias`, `OV`, `QK`, `tl_parameters`), so that code runs on it unchanged.

This module holds the model: the forward pass, the hooks and the switches, its text API (through
`lab.model.tokenization`) and its weights under TransformerLens's names; padded batches are `lab.model.padding`,
the checks at the boundary `lab.model.inputs`, TransformerLens's generate `lab.model.generation`, weight
processing `lab.model.processing`, the cache's selection `lab.model.activation_cache`, the loss `lab.model.loss`
and the memory check `lab.model.memory_check`.
"""

import difflib
import re
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn
from transformer_lens import ActivationCache, FactoredMatrix, HookedRootModule
from transformer_lens.hook_points import HookPoint

from lab.model import generation, tokenization
from lab.model.activation_cache import Cache, resolve_names_filter
from lab.model.attention import Attention
from lab.model.checkpoint import (
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    load_weights,
    read_checkpoint,
    read_tokenizers,
    write_checkpoint,
)
from lab.model.components import BLOCKS
from lab.model.config import ModelConfig
from lab.model.embeddings import POSITIONS, Embed, TiedUnembed, Unembed
from lab.model.errors import HookSwitchedOff, Misuse
from lab.model.inputs import InputChecks
from lab.model.kv_cache import KVCache, TransformerLensCache
from lab.model.loss import next_token_loss, per_token_loss
from lab.model.memory_check import check_fits_in_memory
from lab.model.norms import NORMS, NoNorm
from lab.model.offload import read_weight
from lab.model.padding import padding_mask, padding_of
from lab.model.pretrained import load_pretrained
from lab.model.primitives import CheckedHookPoint, set_hook_points
from lab.model.processing import process_weights

HookFn = Callable[[Tensor, HookPoint], Tensor | None]
RETURN_TYPES = ("logits", "loss", "both", None)
ALL, LAST = slice(None), slice(-1, None)  # the positions the final norm and the unembedding run at
# The hook points a switch makes real (blocks.{l}.<name>): (its flag, its setter).
SWITCHED = {
    "attn.hook_result": ("use_attn_result", "set_use_attn_result"),
    **{
        f"{where}hook_{x}_input": ("use_split_qkv_input", "set_use_split_qkv_input")
        for x in "qkv"
        for where in ("", "attn.")
    },
    **{f"{where}hook_attn_in": ("use_attn_in", "set_use_attn_in") for where in ("", "attn.")},
    "hook_mlp_in": ("use_hook_mlp_in", "set_use_hook_mlp_in"),
}
SWITCHED_NAME = re.compile(r"blocks\.\d+\.(" + "|".join(re.escape(name) for name in SWITCHED) + ")")
PROCESSING = (
    "fold_ln",
    "center_writing_weights",
    "center_unembed",
    "fold_value_biases",
    "refactor_factored_attn_matrices",
)


class HookedTransformer(InputChecks, HookedRootModule):
    """A decoder-only transformer whose every activation is a TransformerLens HookPoint.

    Hook names (TransformerLens's): hook_embed, hook_pos_embed, blocks.{l}.hook_resid_pre|mid|post,
    blocks.{l}.ln1|ln2.hook_scale|hook_normalized, blocks.{l}.attn.hook_q|k|v|attn_scores|pattern|z,
    blocks.{l}.hook_attn_out, blocks.{l}.mlp.hook_pre|hook_post, blocks.{l}.hook_mlp_out,
    ln_final.hook_scale|hook_normalized, unembed.hook_in|hook_out (the logits); and, while their switch is on,
    blocks.{l}.attn.hook_result, blocks.{l}.hook_q_input|k_input|v_input, blocks.{l}.hook_attn_in (each
    followed by TransformerBridge's blocks.{l}.attn.hook_q_input, ...), blocks.{l}.hook_mlp_in.

    `self.cfg` is the model's own copy of the config it was built from (equal to it), holding the model's
    `RuntimeSettings`: TransformerLens's switches, the explicit paths and default_prepend_bos.
    """

    def __init__(self, cfg: ModelConfig, seed: int = 0, tokenizer: Any = None):
        super().__init__()
        if not isinstance(cfg, ModelConfig):
            raise TypeError(f"HookedTransformer needs a ModelConfig, got {type(cfg).__name__}")
        check_fits_in_memory("HookedTransformer", cfg.n_params(), cfg.n_buffer_elements())
        self.cfg = cfg = cfg.replace()  # its own copy: its RuntimeSettings are this model's alone
        self.tokenizer = tokenizer
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.embed = Embed(cfg)
            cfg.runtime.weights = (self.embed,)  # cfg.device and cfg.dtype: where the weights are
            self.hook_embed = CheckedHookPoint()  # [batch, pos, d_model]
            if cfg.positions in ("learned", "sinusoidal", "shortformer"):  # a table of absolute positions
                self.hook_pos_embed = CheckedHookPoint()  # [batch, pos, d_model]
            self.pos_embed = POSITIONS[cfg.positions](cfg)
            self.blocks = nn.ModuleList([BLOCKS[cfg.block](cfg) for _ in range(cfg.n_layers)])
            # A post-LN stack already ends in a norm; a pre-LN or parallel stack needs the final one.
            self.ln_final = NoNorm() if cfg.block == "post_ln" else NORMS[cfg.norm](cfg)
            self.unembed = TiedUnembed(cfg, self.embed) if cfg.tied_embeddings else Unembed(cfg)
        self.setup()  # HookedRootModule: name every HookPoint

    # --- the forward pass ----------------------------------------------------------------------
    def forward(
        self,
        input: Int[Tensor, "batch pos"] | Float[Tensor, "batch pos d_model"] | str | list[str],
        return_type: str | None = "logits",
        *,
        loss_per_token: bool = False,
        prepend_bos: bool | None = None,
        padding_side: str | None = None,
        start_at_layer: int | None = None,
        stop_at_layer: int | None = None,
        tokens: Tensor | None = None,
        attention_mask: Tensor | None = None,
        kv_cache: KVCache | None = None,
        past_kv_cache: Any = None,
        shortformer_pos_embed: Tensor | None = None,
    ) -> Any:
        """The model on token ids, or on text through `tokenize`, with TransformerLens's call conventions.

        return_type: "logits" [batch, pos, d_vocab]; "loss", the mean next-token cross-entropy in nats
        (per token [batch, pos − 1] with loss_per_token=True); "both", (logits, loss); None, nothing (the
        pass still runs, for its hooks). prepend_bos and padding_side apply to text, as in TransformerLens.
        stop_at_layer=L runs blocks 0 … L − 1 only and returns the residual stream entering block L
        ([batch, pos, d_model]; negative L counts from the end); the later blocks, the final norm and the
        unembedding never run. start_at_layer=L takes `input` as that residual stream (blocks.L.hook_resid_pre)
        and runs from block L on; a loss then needs `tokens=` (the ids whose next tokens it scores), and shortformer
        positions `shortformer_pos_embed=` (input_to_embed's third output).
        attention_mask [batch, pos] (1 real, 0 padding; lab.model.padding): padding changes no real token's
        result. Texts of different lengths are padded, and masked as TransformerLens masks them (on the left
        side, or with a KV cache); ids are read for padding as TransformerLens reads them when the tokenizer pads
        on the left or a TransformerLens cache is given. The loss never counts padding. With a KV cache
        (Forma's kv_cache, or TransformerLens's past_kv_cache), `input` continues the cached prefix; a pass that
        raises (a hook, an interrupt) leaves Forma's cache as it was before it.
        """
        if return_type not in RETURN_TYPES:
            raise ValueError(f"return_type must be one of {RETURN_TYPES}, got {return_type!r}")
        if past_kv_cache is not None:
            if kv_cache is not None:
                raise ValueError("give a KV cache as kv_cache (Forma's) or past_kv_cache (TransformerLens's), not both")
            kv_cache = TransformerLensCache(past_kv_cache)
        start, stop = self._layer_range(start_at_layer, stop_at_layer, kv_cache)
        x, loss_mask = None, None
        if start_at_layer is None:
            tokens, padding, loss_mask = self._prepare(input, prepend_bos, padding_side, attention_mask, kv_cache)
        else:
            x = self._check_residual(input, start_at_layer)
            if tokens is not None:
                tokens = self.check_tokens(tokens)
            elif return_type in ("loss", "both") and stop_at_layer is None:
                raise ValueError(
                    f"return_type={return_type!r} with start_at_layer needs tokens= (the ids whose next "
                    "tokens the loss scores): the residual stream alone does not say them"
                )
            offset = 0 if kv_cache is None else kv_cache.length
            cached = None if kv_cache is None else kv_cache.mask
            padding = padding_of(attention_mask, cached, offset, tuple(x.shape[:2]), x.device)
        if stop_at_layer is not None:  # the residual stream entering block `stop`: nothing after it ran
            return self._run(tokens, x, kv_cache, start, stop, None, padding, shortformer_pos_embed)
        logits = self._run(tokens, x, kv_cache, start, stop, ALL, padding, shortformer_pos_embed)
        return self._outputs(logits, tokens, return_type, loss_per_token, loss_mask if padding is None else padding.new)

    def next_token_logits(
        self, tokens: Int[Tensor, "batch pos"], kv_cache: KVCache | None = None, attention_mask: Tensor | None = None
    ) -> Float[Tensor, "batch d_vocab"]:
        """The logits of each row's next token, `forward(tokens, kv_cache=kv_cache)[:, -1]`: what a decoding step
        reads. The final norm and the unembedding run at the last position only — the other positions' logits
        would be thrown away, and at GPT-2's vocabulary the unembedding is about a third of a prompt's forward
        pass — unless something may read them at every position (a hook on the final norm or the unembedding, or
        the explicit paths) or something hooks the model's own call (steering reads each pass's KV cache there):
        then the step is the model's call, hooks seeing what they always see. attention_mask: the padding of a
        prompt (a KV cache keeps it for the steps after)."""
        if self._forward_hooks or self._forward_pre_hooks or self._reads_every_position():
            return self(tokens, kv_cache=kv_cache, attention_mask=attention_mask)[:, -1]
        offset = 0 if kv_cache is None else kv_cache.length
        tokens = self.check_tokens(tokens, offset)
        padding = padding_of(
            attention_mask, None if kv_cache is None else kv_cache.mask, offset, tuple(tokens.shape), tokens.device
        )
        return self._run(tokens, None, kv_cache, 0, self.cfg.n_layers, LAST, padding)[:, -1]

    def _reads_every_position(self) -> bool:
        """True when the final norm's or the unembedding's activations may be read: a hook (TransformerLens's or
        torch's own) on one of their modules, or the explicit paths, for wrappers that intercept modules."""
        modules = (*self.ln_final.modules(), *self.unembed.modules())
        return self.cfg.runtime.explicit_paths or any(
            m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in modules
        )

    def _run(
        self,
        tokens: Tensor | None,
        x: Tensor | None,
        kv_cache: KVCache | None,
        start: int,
        stop: int,
        unembed: slice | None,
        padding: Any = None,
        shortformer_pos_embed: Tensor | None = None,
    ) -> Tensor:
        """Embed the tokens (unless the residual stream x, and its shortformer positions, are given), run blocks start
        … stop − 1, then the final
        norm and the unembedding at the positions `unembed` selects (None: neither runs). With a KV cache the
        tokens continue its prefix (its mask too, in a padded batch), and a pass that raises truncates every layer
        back to where it started."""
        offset = 0 if kv_cache is None else kv_cache.check(self.cfg.n_layers, (tokens if x is None else x).shape[0])
        try:
            if x is None:
                x, shortformer_pos_embed = self._embed(tokens, offset, padding)
            for layer in range(start, stop):
                x = self.blocks[layer](
                    x, None if kv_cache is None else kv_cache.entries[layer], padding, shortformer_pos_embed
                )
            if kv_cache is not None and padding is not None:
                kv_cache.mask = padding.keys
            if unembed is None:
                return x
            return self.unembed(self.ln_final(x if unembed == ALL else x[:, unembed]))
        except BaseException:
            if kv_cache is not None:
                kv_cache.truncate(offset)  # layers before the failure appended this step's keys: take them back
            raise

    def _embed(self, tokens: Tensor, offset: int, padding: Any) -> tuple[Tensor, Tensor | None]:
        """(the residual stream entering block 0, the shortformer positions or None): W_E[tokens] + W_pos[positions],
        or W_E[tokens] and W_pos[positions] apart when the positions go into the attention (shortformer)."""
        if self.cfg.runtime.use_hook_tokens:
            tokens = self.hook_tokens(tokens)
        x = self.hook_embed(self.embed(tokens))
        positions = self.pos_embed(tokens, offset, padding=padding)
        if positions is None:
            return x, None
        positions = self.hook_pos_embed(positions)  # a copy (positions_table): an edit in place never reaches W_pos
        return (x, positions) if self.pos_embed.into_attention else (x + positions, None)

    def _outputs(
        self, logits: Tensor, tokens: Tensor | None, return_type: str | None, loss_per_token: bool, mask: Tensor | None
    ) -> Any:
        if return_type == "logits":
            return logits
        if return_type is None:
            return None
        loss = per_token_loss(logits, tokens, mask) if loss_per_token else next_token_loss(logits, tokens, mask)
        return loss if return_type == "loss" else (logits, loss)

    def loss(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, ""]:
        """Mean next-token cross-entropy in nats: −(1/N) Σ log P_θ(x_{t+1} | x_≤t)."""
        return self(tokens, return_type="loss")

    # TransformerLens's generate (lab.model.generation): text or ids in, the continuation out.
    generate = generation.generate

    # --- hooks: TransformerLens's API, with hook names checked first ----------------------------
    def check_hook_names(self, names: Iterable[Any]) -> None:
        """Raise KeyError for a hook name the model does not have, naming the closest ones (HookSwitchedOff, also an
        AssertionError as in TransformerLens, for one whose switch is off); ValueError for one that is neither a name
        nor a predicate on names."""
        for name in names:
            if not isinstance(name, str) and not callable(name):
                raise ValueError(f"{name!r} ({type(name).__name__}) is not a hook name or a predicate on names")
            if isinstance(name, str) and name not in self.hook_dict:
                switch = SWITCHED_NAME.fullmatch(name)
                if switch is not None:
                    switch = SWITCHED[switch.group(1)]
                    raise HookSwitchedOff(
                        f"Cannot add hook {name} if {switch[0]} is False: it exists only while the "
                        f"switch is on (model.{switch[1]}(True))"
                    )
                close = difflib.get_close_matches(name, list(self.hook_dict), n=5, cutoff=0.5)
                hint = f"; did you mean {close}?" if close else "; see model.hook_dict for every name"
                raise KeyError(f"unknown hook name {name!r}{hint}")

    def add_hook(
        self,
        name: Any,
        hook: HookFn,
        dir: str = "fwd",
        is_permanent: bool = False,
        level: Any = None,
        prepend: bool = False,
    ) -> None:
        """TransformerLens's add_hook, after checking the name."""
        self.check_hook_names([name])
        super().add_hook(name, hook, dir=dir, is_permanent=is_permanent, level=level, prepend=prepend)

    @contextmanager
    def hooks(self, fwd_hooks=(), bwd_hooks=(), reset_hooks_end: bool = True, clear_contexts: bool = False):
        """Attach hooks for the duration of a `with` block; they are removed even if the block raises."""
        self.check_hook_names(name for name, _ in [*fwd_hooks, *bwd_hooks])
        with super().hooks(list(fwd_hooks), list(bwd_hooks), reset_hooks_end, clear_contexts) as model:
            yield model

    def run_with_hooks(
        self,
        *model_args: Any,
        fwd_hooks=(),
        bwd_hooks=(),
        reset_hooks_end: bool = True,
        clear_contexts: bool = False,
        **model_kwargs: Any,
    ) -> Tensor:
        """One forward pass with (name, hook_fn) pairs attached; a hook may return a replacement."""
        with self.hooks(fwd_hooks, bwd_hooks, reset_hooks_end, clear_contexts):
            return self(*model_args, **model_kwargs)

    def run_with_cache(
        self, *model_args: Any, names_filter: Any = None, **kwargs: Any
    ) -> tuple[Tensor, ActivationCache]:
        """(logits, ActivationCache) — the cache holds the activations that `names_filter` selects.

        names_filter: None (every hook), a hook name, a list of names, or a predicate on names. Asking for
        `hook_pattern`/`hook_attn_scores` switches attention to its explicit path; any other selection keeps the
        fused path.
        """
        names_filter = resolve_names_filter(self, names_filter)
        logits, cache = super().run_with_cache(*model_args, names_filter=names_filter, **kwargs)
        return logits, Cache(cache, self, has_batch_dim=not kwargs.get("remove_batch_dim", False))

    # --- TransformerLens's switches, and the explicit paths -------------------------------------
    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """Form every head's result z^h W_O^h (attn.hook_result [batch, pos, head, d_model]) on every forward and
        cache it by default. The hook point exists only while this is on, as in TransformerLens (off, a cache's
        stack_head_results computes the same from hook_z and W_O)."""
        self._switch(
            "use_attn_result", use_attn_result, [(block.attn, Attention.RESULT_HOOKS) for block in self.blocks]
        )

    def set_use_split_qkv_input(self, use_split_qkv_input: bool) -> None:
        """Give each query, key and value head its own copy of the attention's input (blocks.{l}.hook_q_input,
        hook_k_input, hook_v_input [batch, pos, head or kv_head, d_model], before ln1, each followed by its
        TransformerBridge name blocks.{l}.attn.hook_q_input, ...), so one head's query, key or value input can be
        patched alone. Excludes use_attn_in."""
        if use_split_qkv_input is True and self.cfg.use_attn_in:
            raise ValueError("use_split_qkv_input and use_attn_in are mutually exclusive: set_use_attn_in(False) first")
        self._switch(
            "use_split_qkv_input",
            use_split_qkv_input,
            [(m, block.SPLIT_INPUT_HOOKS) for block in self.blocks for m in (block, block.attn)],
        )

    def set_use_attn_in(self, use_attn_in: bool) -> None:
        """Give each query head its own copy of the attention's input, shared by its key and value (blocks.{l}.
        hook_attn_in, then blocks.{l}.attn.hook_attn_in [batch, pos, head, d_model], before ln1). Excludes the split."""
        if use_attn_in is True and self.cfg.use_split_qkv_input:
            raise ValueError(
                "use_attn_in and use_split_qkv_input are mutually exclusive: call set_use_split_qkv_input(False) first"
            )
        self._switch(
            "use_attn_in",
            use_attn_in,
            [(m, block.SHARED_INPUT_HOOKS) for block in self.blocks for m in (block, block.attn)],
        )

    def set_use_hook_mlp_in(self, use_hook_mlp_in: bool) -> None:
        """Route each MLP branch's input through its own hook point, blocks.{l}.hook_mlp_in [batch, pos, d_model]
        (resid_mid, before ln2)."""
        if use_hook_mlp_in is True and self.cfg.block == "attn_only":
            raise Misuse("Can't use hook_mlp_in with attn_only model: it has no MLP")
        self._switch("use_hook_mlp_in", use_hook_mlp_in, [(block, block.MLP_INPUT_HOOKS) for block in self.blocks])

    def set_use_hook_tokens(self, use_hook_tokens: bool) -> None:
        """Route the token ids through hook_tokens [batch, pos] before the embedding: a hook can replace a token."""
        self._switch("use_hook_tokens", use_hook_tokens, [(self, ("hook_tokens",))])

    def set_ungroup_grouped_query_attention(self, ungroup: bool) -> None:
        """hook_k, hook_v (hook_k_input, hook_v_input) [batch, pos, head, ...]: a K/V head copy per query head."""
        self._switch("ungroup_grouped_query_attention", ungroup, ())

    def set_explicit_paths(self, explicit_paths: bool) -> None:
        """Run the explicit attention softmax(QKᵀ/√d_head + M)·V and the explicit norms on every forward pass,
        hooked or not, so that a wrapper that intercepts modules rather than registering TransformerLens hooks
        (nnsight) reaches hook_attn_scores, hook_pattern, hook_scale and hook_normalized. The result is the
        fused paths' to float round-off. With set_use_attn_result(True) every hook point fires on every pass."""
        self._switch("explicit_paths", explicit_paths, ())

    def _switch(self, flag: str, value: Any, hook_points: Iterable[tuple[nn.Module, tuple[str, ...]]]) -> None:
        if not isinstance(value, bool):
            raise ValueError(f"{flag} must be True or False, got {value!r}")
        setattr(self.cfg.runtime, flag, value)
        for module, names in hook_points:
            set_hook_points(module, names, value)
        self.setup()  # name the hook points that came, forget those that went

    # --- text in and out: TransformerLens's tokenizer API (lab.model.tokenization) ----------------
    def set_tokenizer(self, tokenizer: Any, default_padding_side: str | None = None) -> None:
        """Attach a tokenizer as TransformerLens does: a transformers tokenizer without a pad token pads with its
        EOS, and pads on default_padding_side (else its own side, else the right)."""
        self.tokenizer = tokenizer
        tokenization.prepare(tokenizer, default_padding_side)

    def to_tokens(
        self,
        input: str | list[str],
        prepend_bos: bool | None = None,
        padding_side: str | None = None,
        move_to_device: bool = True,
        truncate: bool = True,
    ) -> Int[Tensor, "batch pos"]:
        """Encode a string or a list of strings into [batch, pos] ids, padding shorter texts (lab.model.tokenization);
        truncate: cut each text to the model's context n_ctx."""
        return self.tokenize(input, prepend_bos, padding_side, truncate, move_to_device)[0]

    def tokenize(
        self,
        input: str | list[str],
        prepend_bos: bool | None = None,
        padding_side: str | None = None,
        truncate: bool = True,
        move_to_device: bool = True,
    ) -> tuple[Int[Tensor, "batch pos"], Bool[Tensor, "batch pos"] | None]:
        """(ids [batch, pos], mask) where the mask marks the real tokens (True) and the padding (False); None when
        every text has the same length and nothing was padded."""
        device = self.W_E.device if move_to_device else torch.device("cpu")
        n_ctx = self.cfg.n_ctx if truncate else None
        default = self.cfg.default_prepend_bos
        return tokenization.tokenize(self.tokenizer, input, prepend_bos, default, n_ctx, padding_side, device)

    def prepends_bos(self, prepend_bos: bool | None = None) -> bool:
        """prepend_bos, or the model's default when it is None."""
        return tokenization.prepends_bos(prepend_bos, self.cfg.default_prepend_bos)

    def padding_side(self, padding_side: str | None = None) -> str:
        """padding_side, else the tokenizer's, else "right"."""
        return tokenization.padding_side(self.tokenizer, padding_side)

    def pad_token_id(self) -> int:
        """The id texts are padded with: the tokenizer's pad token, else its EOS (as TransformerLens pads)."""
        return tokenization.pad_token_id(self.tokenizer)

    def inferred_padding(
        self, tokens: Tensor, prepend_bos: bool | None, padding_side: str | None
    ) -> Bool[Tensor, "batch pos"]:
        """Which of these ids are padding, read from the ids as TransformerLens reads them (utils.get_attention_mask):
        the run of pad ids at the padding side."""
        side, bos = self.padding_side(padding_side), self.prepends_bos(prepend_bos)
        return padding_mask(tokens, self.pad_token_id(), side, getattr(self.tokenizer, "bos_token_id", None), bos)

    def to_string(self, tokens: int | Tensor | list[int]) -> str | list[str]:
        """Decode one id (an int or a 0-d tensor) or [pos] ids to a string, or [batch, pos] ids to a list of strings."""
        return tokenization.to_string(self.tokenizer, tokens)

    def to_str_tokens(
        self, input: Any, prepend_bos: bool | None = None, padding_side: str | None = None
    ) -> list[str] | list[list[str]]:
        """Each token as its own string: of a text (encoded as `to_tokens` does), of each text of a list, or of ids
        ([pos], [1, pos], a numpy array or a list of ids)."""
        tokenization.require(self.tokenizer)
        if isinstance(input, list) and input and all(isinstance(t, str) for t in input):
            return [self.to_str_tokens(text, prepend_bos, padding_side) for text in input]
        if isinstance(input, str):
            input = self.to_tokens(input, prepend_bos, padding_side)[0]
        return tokenization.str_tokens(self.tokenizer, input)

    def to_single_token(self, string: str) -> int:
        """The id of a string that is exactly one token of the vocabulary."""
        return tokenization.single_token(self.tokenizer, string)

    def to_single_str_token(self, int_token: int) -> str:
        """The string of one token id."""
        if isinstance(int_token, bool) or not isinstance(int_token, int):
            raise Misuse(f"to_single_str_token takes one token id (an int), got {int_token!r}")
        return self.to_str_tokens(torch.tensor([int_token]))[0]

    def get_token_position(
        self,
        single_token: str | int | Tensor,
        input: str | Tensor,
        mode: str = "first",
        prepend_bos: bool | None = None,
        padding_side: str | None = None,
    ) -> int:
        """Where a token (an id, or a string of one token) first (mode "first") or last ("last") occurs in a text or
        in ids ([pos] or [1, pos])."""
        tokens = self.to_tokens(input, prepend_bos, padding_side) if isinstance(input, str) else torch.as_tensor(input)
        if tokens.ndim == 2 and tokens.shape[0] != 1:
            raise Misuse(f"ids of rank two must have shape [1, pos], not {tuple(tokens.shape)}")
        if isinstance(single_token, str):
            single_token = self.to_single_token(single_token)
        elif isinstance(single_token, Tensor):
            single_token = int(single_token.item())
        return tokenization.token_position(tokens, single_token, mode)

    # --- the weights under TransformerLens's names, and what its analysis code reads of them -----
    @property
    def W_E(self) -> Tensor:
        return read_weight(self, "embed.W_E")

    @property
    def W_pos(self) -> Tensor:
        if not hasattr(self.pos_embed, "W_pos"):
            raise AttributeError(f"a model with positions = {self.cfg.positions!r} has no W_pos")
        return read_weight(self, "pos_embed.W_pos")

    @property
    def W_U(self) -> Tensor:
        return read_weight(self, "unembed.W_U")

    @property
    def b_U(self) -> Tensor:
        return read_weight(self, "unembed.b_U")

    def _stack_layers(self, name: str, module: str = "attn") -> Tensor:
        """blocks.{l}.{module}.{name} for every layer l, stacked on the first layer's device."""
        layers = [read_weight(self, f"blocks.{layer}.{module}.{name}") for layer in range(self.cfg.n_layers)]
        return torch.stack([w.to(layers[0].device) for w in layers])

    @property
    def W_Q(self) -> Tensor:  # [layer, head, d_model, d_head]
        return self._stack_layers("W_Q")

    @property
    def W_K(self) -> Tensor:  # [layer, kv_head, d_model, d_head]
        return self._stack_layers("W_K")

    @property
    def W_V(self) -> Tensor:  # [layer, kv_head, d_model, d_head]
        return self._stack_layers("W_V")

    @property
    def W_O(self) -> Tensor:  # [layer, head, d_head, d_model]
        return self._stack_layers("W_O")

    @property
    def W_in(self) -> Tensor:  # [layer, d_model, d_mlp]
        return self._stack_layers("W_in", "mlp")

    @property
    def W_out(self) -> Tensor:  # [layer, d_mlp, d_model]
        return self._stack_layers("W_out", "mlp")

    def _per_query_head(self, W: Tensor, head_axis: int = -3) -> Tensor:
        """Key/value weights (head axis −3) or biases (−2) repeated to one per query head: query head h reads
        key/value head ⌊h · n_kv_heads / n_heads⌋."""
        group = self.cfg.n_heads // self.cfg.n_kv_heads
        return W.repeat_interleave(group, dim=head_axis) if group > 1 else W

    @property
    def QK(self) -> FactoredMatrix:  # [layer, head, d_model, d_model]: W_Q^h (W_K^h)ᵀ
        """Every head's QK circuit W_Q^h W_K^hᵀ, factored; grouped key/value heads repeated per query head."""
        return FactoredMatrix(self.W_Q, self._per_query_head(self.W_K).transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:  # [layer, head, d_model, d_model]: W_V^h W_O^h
        """Every head's OV circuit W_V^h W_O^h, factored; grouped key/value heads repeated per query head."""
        return FactoredMatrix(self._per_query_head(self.W_V), self.W_O)

    def accumulated_bias(
        self, layer: int, mlp_input: bool = False, include_mlp_biases: bool = True
    ) -> Float[Tensor, " d_model"]:
        """Σ of the biases written into the residual stream before `layer`: b_O of every attention and (with
        include_mlp_biases) b_out of every MLP in blocks 0 … layer − 1, plus block `layer`'s b_O when
        mlp_input (the stream entering its MLP; a parallel block's MLP reads the block's input, before its
        attention). TransformerLens's `get_full_resid_decomposition` reads it."""
        n_layers = self.cfg.n_layers
        if not 0 <= layer <= n_layers or (mlp_input and layer == n_layers):
            raise ValueError(f"layer must lie in [0, {n_layers}] ([0, {n_layers - 1}] with mlp_input), got {layer}")
        total = torch.zeros(self.cfg.d_model, device=self.W_E.device, dtype=self.W_E.dtype)
        after_attention = mlp_input and self.cfg.block != "parallel"
        include_mlp_biases = include_mlp_biases and self.cfg.block != "attn_only"
        for index in range(layer + after_attention):  # read_weight: a block's biases may be offloaded
            b_O = read_weight(self, f"blocks.{index}.attn.b_O")
            b_out = read_weight(self, f"blocks.{index}.mlp.b_out") if include_mlp_biases and index < layer else None
            for bias in (b_O, b_out):
                if bias is not None:
                    total = total + bias.to(total.device)
        return total

    def tl_parameters(self) -> dict[str, Tensor]:
        """Every weight under its TransformerLens name, as TransformerLens's SVDInterpreter reads them: key/value
        weights and biases repeated per query head, and unembed.W_U present when it is tied to W_E."""
        params = dict(self.named_parameters())
        for layer, block in enumerate(self.blocks):
            for name, head_axis in (("W_K", -3), ("W_V", -3), ("b_K", -2), ("b_V", -2)):
                value = getattr(block.attn, name)
                if value is not None:
                    params[f"blocks.{layer}.attn.{name}"] = self._per_query_head(value, head_axis)
        params["unembed.W_U"] = self.W_U
        return params

    def tokens_to_residual_directions(self, tokens: Any) -> Tensor:
        """The direction(s) the final-normed residual stream is read along for token id(s) or a string:
        w ⊙ W_U[:, t], with w the final norm's gain (TransformerLens's API).

        logit_t = (x̂ ⊙ w + b) · W_U[:, t] + b_U[t] for the normed stream x̂, so w ⊙ W_U[:, t] is the part that
        depends on x̂, and b · W_U[:, t] + b_U[t] is a constant no component writes. TransformerLens folds w into
        W_U when it loads a model; Forma keeps its weights as they are, and puts w here instead, so that
        `cache.logit_attrs` and TransformerLens's direct logit attribution decompose the real logit."""
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        if isinstance(tokens, Tensor) and tokens.numel() == 1 and tokens.ndim <= 1:
            tokens = int(tokens.item())
        # a post-LN stack has no final norm: W_U reads the stream (read_weight: the gain may be offloaded)
        gain = read_weight(self, "ln_final.w") if hasattr(self.ln_final, "w") else None
        W_U = self.W_U if gain is None else gain[:, None].to(self.W_U.device) * self.W_U
        if isinstance(tokens, int):
            return W_U[:, tokens]
        tokens = torch.as_tensor(tokens, device=W_U.device)
        return W_U[:, tokens].movedim(0, -1)

    # --- checkpoints ---------------------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        """Write model.safetensors and config.json (and tokenizer.json when one is attached), atomically."""
        return write_checkpoint(self, directory, {TOKENIZER_FILE: self.tokenizer})

    @classmethod
    def load(cls, directory: str | Path, device: str | torch.device = "cpu") -> "HookedTransformer":
        """Load a folder written by `save`, its weights as saved; every malformed part is an error that says which."""
        directory = Path(directory)
        cfg, state = read_checkpoint(directory, ModelConfig)
        model = cls(cfg, tokenizer=read_tokenizers(directory, (TOKENIZER_FILE,))[0])
        model.load_weights(state, source=str(directory / WEIGHTS_FILE))
        return model.to(device).eval()

    def load_weights(self, state: dict[str, Tensor], source: str = "state dict") -> None:
        """Copy weights in, after checking that names and shapes match this config exactly."""
        load_weights(self, state, source)

    def process_weights_(
        self,
        fold_ln: bool = True,
        center_writing_weights: bool = True,
        center_unembed: bool = True,
        refactor_factored_attn_matrices: bool = False,
        fold_value_biases: bool = True,
    ) -> None:
        """TransformerLens's weight processing, in place (lab.model.processing): the same logits up to a constant
        per position, in weights that are easier to read."""
        process_weights(
            self, fold_ln, center_writing_weights, center_unembed, fold_value_biases, refactor_factored_attn_matrices
        )

    @classmethod
    def from_pretrained(
        cls,
        model_name: str | Path,
        *,
        fold_ln: bool | None = None,
        center_writing_weights: bool | None = None,
        center_unembed: bool | None = None,
        refactor_factored_attn_matrices: bool = False,
        fold_value_biases: bool | None = None,
        device: str | torch.device = "cpu",
        default_prepend_bos: bool | None = None,
        default_padding_side: str | None = None,
        dtype: Any = None,
    ) -> "HookedTransformer":
        """A local Hugging Face folder, a zoo model by name or a folder written by `save` (`lab.load.from_pretrained`,
        reached through `lab.model.pretrained`: loading by name is above the model package).

        The processing flags default as TransformerLens's do for what it loads, a Hugging Face checkpoint: all on
        (refactor off). A Forma folder or zoo model is a checkpoint of the model itself, as `load` reads it: its
        flags default off. default_prepend_bos: None keeps the model's (a Hugging Face model's, as TransformerLens
        sets it; False for Forma's own); default_padding_side sets the tokenizer's."""
        options = dict(
            fold_ln=fold_ln,
            center_writing_weights=center_writing_weights,
            center_unembed=center_unembed,
            refactor_factored_attn_matrices=refactor_factored_attn_matrices,
            fold_value_biases=fold_value_biases,
            default_prepend_bos=default_prepend_bos,
            default_padding_side=default_padding_side,
            dtype=dtype,
        )
        return load_pretrained(cls, model_name, device, **options)

    @classmethod
    def from_pretrained_no_processing(cls, model_name: str | Path, **options: Any) -> "HookedTransformer":
        """from_pretrained with every processing flag off: the weights as trained."""
        flags = dict.fromkeys(PROCESSING, False)
        return cls.from_pretrained(model_name, **(flags | options))
