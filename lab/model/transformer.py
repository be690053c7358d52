"""HookedTransformer: the decoder-only transformer, top to bottom, with a HookPoint at every activation.

    x⁰ = W_E[tokens] (+ W_pos[positions])                          embed, positions
    xˡ⁺¹ = block_l(xˡ)                                              l = 0 … n_layers − 1
    logits = LN_final(x^L) W_U + b_U                                unembed
    P_θ(x_{t+1} | x_≤t) = softmax(logits_t)

It subclasses TransformerLens's HookedRootModule, so `run_with_hooks`, `hooks()` and
`run_with_cache` (returning a `transformer_lens.ActivationCache`) work as they do in TransformerLens,
and the cache's methods (accumulated_resid, decompose_resid, logit_attrs, ...) read our model. It also
takes TransformerLens's call conventions (`forward(input, return_type, stop_at_layer=, start_at_layer=,
...)`, `to_tokens(prepend_bos=)`) and switches (`set_use_attn_result`, `set_use_split_qkv_input`,
`set_use_attn_in`, `set_use_hook_mlp_in`), and answers what TransformerLens's analysis code reads
(`accumulated_bias`, `OV`, `QK`, `tl_parameters`), so that code runs on it unchanged.

This module holds the forward pass, the hooks and the switches; the weights under TransformerLens's names are
`lab.model.tl_weights`, text in and out `lab.model.text`, the cache's selection `lab.model.activation_cache`,
the loss `lab.model.loss` and the memory check `lab.model.memory` (all importable from here as before).
"""

import difflib
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor
from torch import nn
from transformer_lens import ActivationCache, HookedRootModule
from transformer_lens.hook_points import HookPoint

from lab.folders import load_pretrained
from lab.model.activation_cache import (Cache, cached_by_default, default_names_filter,  # noqa: F401
                                        resolve_names_filter)
from lab.model.checkpoint import (CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE, load_weights, read_checkpoint,  # noqa: F401
                                  read_tokenizer, read_tokenizers, write_checkpoint)
from lab.model.components import (BLOCKS, NORMS, POSITIONS, Attention, CheckedHookPoint, Embed, NoNorm, TiedUnembed,
                                  Unembed, set_hook_points)
from lab.model.config import ModelConfig
from lab.model.decoding import generate
from lab.model.kv_cache import KVCache
from lab.model.loss import next_token_loss, per_token_loss
from lab.model.memory import available_memory, check_fits_in_memory  # noqa: F401
from lab.model.text import TextMethods, is_text
from lab.model.tl_weights import TLWeights

HookFn = Callable[[Tensor, HookPoint], Tensor | None]
RETURN_TYPES = ("logits", "loss", "both", None)
ALL, LAST = slice(None), slice(-1, None)  # the positions the final norm and the unembedding run at


class HookedTransformer(TLWeights, TextMethods, HookedRootModule):
    """A decoder-only transformer whose every activation is a TransformerLens HookPoint.

    Hook names (TransformerLens's): hook_embed, hook_pos_embed, blocks.{l}.hook_resid_pre|mid|post,
    blocks.{l}.ln1|ln2.hook_scale|hook_normalized, blocks.{l}.attn.hook_q|k|v|attn_scores|pattern|z|result,
    blocks.{l}.hook_attn_out, blocks.{l}.mlp.hook_pre|hook_post, blocks.{l}.hook_mlp_out,
    ln_final.hook_scale|hook_normalized, hook_logits; and, while their switch is on,
    blocks.{l}.attn.hook_q_input|k_input|v_input, blocks.{l}.attn.hook_attn_in, blocks.{l}.hook_mlp_in.

    `self.cfg` is the model's own copy of the config it was built from (equal to it), holding the model's
    `RuntimeSettings`: TransformerLens's switches and the explicit paths, which the setters change.
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
            if cfg.positions in ("learned", "sinusoidal"):  # positions added to the residual stream
                self.hook_pos_embed = CheckedHookPoint()  # [batch, pos, d_model]
            self.pos_embed = POSITIONS[cfg.positions](cfg, getattr(self, "hook_pos_embed", None))
            self.blocks = nn.ModuleList([BLOCKS[cfg.block](cfg) for _ in range(cfg.n_layers)])
            # A post-LN stack already ends in a norm; a pre-LN or parallel stack needs the final one.
            self.ln_final = NoNorm() if cfg.block == "post_ln" else NORMS[cfg.norm](cfg)
            self.unembed = TiedUnembed(cfg, self.embed) if cfg.tied_embeddings else Unembed(cfg)
        self.hook_logits = CheckedHookPoint()  # [batch, pos, d_vocab]
        self.setup()  # HookedRootModule: name every HookPoint

    # --- the forward pass ----------------------------------------------------------------------
    def forward(
        self, input: Int[Tensor, "batch pos"] | Float[Tensor, "batch pos d_model"] | str | list[str],
        return_type: str | None = "logits", *, loss_per_token: bool = False, prepend_bos: bool | None = None,
        start_at_layer: int | None = None, stop_at_layer: int | None = None, tokens: Tensor | None = None,
        kv_cache: KVCache | None = None,
    ) -> Any:
        """The model on token ids (or text, through `to_tokens`), with TransformerLens's call conventions.

        return_type: "logits" [batch, pos, d_vocab]; "loss", the mean next-token cross-entropy in nats
        (per token [batch, pos − 1] with loss_per_token=True); "both", (logits, loss); None, nothing (the
        pass still runs, for its hooks). prepend_bos applies to text only, as in TransformerLens.
        stop_at_layer=L runs blocks 0 … L − 1 only and returns the residual stream entering block L
        ([batch, pos, d_model]; negative L counts from the end); the later blocks, the final norm and the
        unembedding never run. start_at_layer=L takes `input` as that residual stream (blocks.L.hook_resid_pre)
        and runs from block L on; a loss then needs `tokens=` (the ids whose next tokens it scores).
        With a KV cache, `input` continues the cached prefix; a pass that raises (a hook, an interrupt)
        leaves the cache as it was before it.
        """
        if return_type not in RETURN_TYPES:
            raise ValueError(f"return_type must be one of {RETURN_TYPES}, got {return_type!r}")
        start, stop = self._layer_range(start_at_layer, stop_at_layer, kv_cache)
        x = None
        if start_at_layer is None:
            if is_text(input):
                input = self.to_tokens(input, prepend_bos=prepend_bos)
            tokens = self.check_tokens(input, 0 if kv_cache is None else kv_cache.length)
        else:
            x = self._check_residual(input, start_at_layer)
            if tokens is not None:
                tokens = self.check_tokens(tokens)
            elif return_type in ("loss", "both") and stop_at_layer is None:
                raise ValueError(f"return_type={return_type!r} with start_at_layer needs tokens= (the ids whose next "
                                 "tokens the loss scores): the residual stream alone does not say them")
        if stop_at_layer is not None:  # the residual stream entering block `stop`: nothing after it ran
            return self._run(tokens, x, kv_cache, start, stop, None)
        return self._outputs(self._run(tokens, x, kv_cache, start, stop, ALL), tokens, return_type, loss_per_token)

    def next_token_logits(self, tokens: Int[Tensor, "batch pos"], kv_cache: KVCache | None = None
                          ) -> Float[Tensor, "batch d_vocab"]:
        """The logits of each row's next token, `forward(tokens, kv_cache=kv_cache)[:, -1]`: what a decoding step
        reads. The final norm and the unembedding run at the last position only — the other positions' logits
        would be thrown away, and at GPT-2's vocabulary the unembedding is about a third of a prompt's forward
        pass — unless something may read them at every position (a hook on the final norm or on hook_logits, or
        the explicit paths) or something hooks the model's own call (steering reads each pass's KV cache there):
        then the step is the model's call, `self(tokens, kv_cache=kv_cache)`, hooks seeing what they always see."""
        if self._forward_hooks or self._forward_pre_hooks or self._reads_every_position():
            return self(tokens, kv_cache=kv_cache)[:, -1]
        tokens = self.check_tokens(tokens, 0 if kv_cache is None else kv_cache.length)
        return self._run(tokens, None, kv_cache, 0, self.cfg.n_layers, LAST)[:, -1]

    def _reads_every_position(self) -> bool:
        """True when the final norm's or the logits' activations may be read: a hook (TransformerLens's or torch's
        own) on one of their modules, or the explicit paths, for wrappers that intercept modules."""
        modules = (*self.ln_final.modules(), self.hook_logits)
        return self.cfg.runtime.explicit_paths or any(
            m._forward_hooks or m._forward_pre_hooks or m._backward_hooks for m in modules)

    def _run(self, tokens: Tensor | None, x: Tensor | None, kv_cache: KVCache | None, start: int, stop: int,
             unembed: slice | None) -> Tensor:
        """Embed the tokens (unless the residual stream x is given), run blocks start … stop − 1, then the final
        norm and the unembedding at the positions `unembed` selects (None: neither runs). With a KV cache the
        tokens continue its prefix, and a pass that raises truncates every layer back to where it started."""
        offset = 0 if kv_cache is None else kv_cache.check(self.cfg.n_layers, tokens.shape[0])
        try:
            if x is None:
                x = self.pos_embed(self.hook_embed(self.embed(tokens)), offset)
            for layer in range(start, stop):
                x = self.blocks[layer](x, None if kv_cache is None else kv_cache.entries[layer])
            if unembed is None:
                return x
            return self.hook_logits(self.unembed(self.ln_final(x if unembed == ALL else x[:, unembed])))
        except BaseException:
            if kv_cache is not None:
                kv_cache.truncate(offset)  # layers before the failure appended this step's keys: take them back
            raise

    def _layer_range(self, start_at_layer: Any, stop_at_layer: Any, kv_cache: KVCache | None) -> tuple[int, int]:
        """(first block, one past the last block) to run; negative layers count from the end, as in TransformerLens."""
        n_layers = self.cfg.n_layers
        if start_at_layer is None and stop_at_layer is None:
            return 0, n_layers
        if kv_cache is not None:
            raise ValueError("a KV cache needs every layer's keys for every step: it cannot be combined with "
                             "start_at_layer or stop_at_layer")
        bounds = []
        for name, value, default in (("start_at_layer", start_at_layer, 0), ("stop_at_layer", stop_at_layer, n_layers)):
            if value is None:
                bounds.append(default)
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not -n_layers <= value <= n_layers:
                raise ValueError(f"{name} must be an integer layer in [-{n_layers}, {n_layers}] for a model of "
                                 f"{n_layers} layers, got {value!r}")
            bounds.append(value + n_layers if value < 0 else value)
        start, stop = bounds
        if start > stop:
            raise ValueError(f"start_at_layer={start_at_layer} comes after stop_at_layer={stop_at_layer}: no block "
                             "would run")
        return start, stop

    def _check_residual(self, x: Any, start_at_layer: int) -> Float[Tensor, "batch pos d_model"]:
        """The residual stream that start_at_layer resumes from: a float [batch, pos, d_model] tensor."""
        shape = tuple(x.shape) if isinstance(x, Tensor) else None
        if shape is None or not x.dtype.is_floating_point or x.ndim != 3 or shape[-1] != self.cfg.d_model:
            got = f"a {x.dtype} tensor of shape {shape}" if shape is not None else type(x).__name__
            raise ValueError(f"with start_at_layer={start_at_layer} the input is the residual stream entering that "
                             f"block, a float tensor [batch, pos, d_model = {self.cfg.d_model}]; got {got}")
        if shape[1] > self.cfg.n_ctx:
            raise ValueError(f"residual stream of {shape[1]} positions is longer than the model's context n_ctx = "
                             f"{self.cfg.n_ctx}")
        return x

    def _outputs(self, logits: Tensor, tokens: Tensor | None, return_type: str | None, loss_per_token: bool) -> Any:
        if return_type == "logits":
            return logits
        if return_type is None:
            return None
        loss = per_token_loss(logits, tokens) if loss_per_token else next_token_loss(logits, tokens)
        return loss if return_type == "loss" else (logits, loss)

    def check_tokens(self, tokens: Any, offset: int = 0) -> Int[Tensor, "batch pos"]:
        """Validate a batch of token ids at the boundary; a 1-D sequence becomes a batch of one."""
        if not isinstance(tokens, Tensor):
            raise ValueError(f"tokens must be a torch.Tensor of integer ids, got {type(tokens).__name__}")
        if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
            raise ValueError(f"tokens must have an integer dtype (torch.long), got {tokens.dtype}")
        if tokens.ndim == 1:
            tokens = tokens[None, :]
        if tokens.ndim != 2:
            raise ValueError(f"tokens must have shape [batch, pos] or [pos], got {tuple(tokens.shape)}")
        if tokens.numel() == 0:
            raise ValueError(f"tokens is empty (shape {tuple(tokens.shape)}): need at least one token")
        if tokens.device.type == "meta" and self.embed.W_E.device.type != "meta":
            raise ValueError("tokens are on the meta device (a shape without values): put the ids on "
                             f"{self.embed.W_E.device}, where the model is")
        if offset + tokens.shape[1] > self.cfg.n_ctx:
            raise ValueError(
                f"sequence of {offset + tokens.shape[1]} tokens"
                + (f" ({offset} cached + {tokens.shape[1]} new)" if offset else "")
                + f" is longer than the model's context n_ctx = {self.cfg.n_ctx}")
        if tokens.device.type == "meta":  # a meta model on meta ids: shapes only, no values to check
            return tokens.to(dtype=torch.long)
        low, high = (int(v) for v in torch.stack(torch.aminmax(tokens)).tolist())  # one device sync
        if low < 0 or high >= self.cfg.d_vocab:
            bad = low if low < 0 else high
            raise ValueError(f"token id {bad} is out of range: ids must lie in [0, d_vocab) = [0, {self.cfg.d_vocab})")
        return tokens.to(device=self.embed.W_E.device, dtype=torch.long)

    def loss(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, ""]:
        """Mean next-token cross-entropy in nats: −(1/N) Σ log P_θ(x_{t+1} | x_≤t)."""
        return self(tokens, return_type="loss")

    def generate(self, tokens: Int[Tensor, "batch pos"], max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                 use_kv_cache: bool = True, eos_token_id: int | None = None) -> Int[Tensor, "batch pos"]:
        """Sample a continuation (see `lab.model.decoding`): the prompt followed by the new tokens."""
        return generate(self, tokens, max_new_tokens, temperature, top_k, top_p, seed, use_kv_cache, eos_token_id)

    # --- hooks: TransformerLens's API, with hook names checked first ----------------------------
    def check_hook_names(self, names: Iterable[Any]) -> None:
        """Raise KeyError for a hook name the model does not have, naming the closest ones; ValueError for one
        that is neither a name nor a predicate on names."""
        for name in names:
            if not isinstance(name, str) and not callable(name):
                raise ValueError(f"{name!r} ({type(name).__name__}) is not a hook name or a predicate on names")
            if isinstance(name, str) and name not in self.hook_dict:
                close = difflib.get_close_matches(name, list(self.hook_dict), n=5, cutoff=0.5)
                hint = f"; did you mean {close}?" if close else "; see model.hook_dict for every name"
                raise KeyError(f"unknown hook name {name!r}{hint}")

    @contextmanager
    def hooks(self, fwd_hooks=(), bwd_hooks=(), reset_hooks_end: bool = True, clear_contexts: bool = False):
        """Attach hooks for the duration of a `with` block; they are removed even if the block raises."""
        self.check_hook_names(name for name, _ in [*fwd_hooks, *bwd_hooks])
        with super().hooks(list(fwd_hooks), list(bwd_hooks), reset_hooks_end, clear_contexts) as model:
            yield model

    def run_with_hooks(self, *model_args: Any, fwd_hooks=(), bwd_hooks=(), reset_hooks_end: bool = True,
                       clear_contexts: bool = False, **model_kwargs: Any) -> Tensor:
        """One forward pass with (name, hook_fn) pairs attached; a hook may return a replacement."""
        with self.hooks(fwd_hooks, bwd_hooks, reset_hooks_end, clear_contexts):
            return self(*model_args, **model_kwargs)

    def run_with_cache(self, *model_args: Any, names_filter: Any = None, **kwargs: Any) -> tuple[Tensor, ActivationCache]:
        """(logits, ActivationCache) — the cache holds the activations that `names_filter` selects.

        names_filter: None (every hook but the per-head `attn.hook_result`, unless `set_use_attn_result(True)`),
        a hook name, a list of names, or a predicate on names. The per-head result is n_heads times the size
        of attn_out and follows from hook_z and W_O: name it to cache it, or let `cache.stack_head_results()`
        compute it (TransformerLens does the same unless `use_attn_result` is set). Asking for
        `hook_pattern`/`hook_attn_scores` switches attention to its explicit path; any other
        selection keeps the fused path.
        """
        names_filter = resolve_names_filter(self, names_filter)
        logits, cache = super().run_with_cache(*model_args, names_filter=names_filter, **kwargs)
        return logits, Cache(cache, self, has_batch_dim=not kwargs.get("remove_batch_dim", False))

    # --- TransformerLens's switches, and the explicit paths -------------------------------------
    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """Form every head's result z^h W_O^h (attn.hook_result [batch, pos, head, d_model]) on every forward and
        cache it by default. Off, it is formed only when a hook asks for it by name."""
        self._switch("use_attn_result", use_attn_result, ())

    def set_use_split_qkv_input(self, use_split_qkv_input: bool) -> None:
        """Give each query, key and value head its own copy of the attention's input (attn.hook_q_input,
        hook_k_input, hook_v_input [batch, pos, head or kv_head, d_model], before ln1), so one head's
        query, key or value input can be patched alone. Excludes use_attn_in."""
        if use_split_qkv_input is True and self.cfg.use_attn_in:
            raise ValueError("use_split_qkv_input and use_attn_in are mutually exclusive: call set_use_attn_in(False) "
                             "first")
        self._switch("use_split_qkv_input", use_split_qkv_input,
                     [(block.attn, Attention.SPLIT_INPUT_HOOKS) for block in self.blocks])

    def set_use_attn_in(self, use_attn_in: bool) -> None:
        """Give each query head its own copy of the attention's input, shared by its key and value (attn.hook_attn_in
        [batch, pos, head, d_model], before ln1). Excludes use_split_qkv_input."""
        if use_attn_in is True and self.cfg.use_split_qkv_input:
            raise ValueError("use_attn_in and use_split_qkv_input are mutually exclusive: call "
                             "set_use_split_qkv_input(False) first")
        self._switch("use_attn_in", use_attn_in, [(block.attn, Attention.SHARED_INPUT_HOOKS) for block in self.blocks])

    def set_use_hook_mlp_in(self, use_hook_mlp_in: bool) -> None:
        """Route each MLP branch's input through its own hook point, blocks.{l}.hook_mlp_in [batch, pos, d_model]
        (resid_mid, before ln2)."""
        self._switch("use_hook_mlp_in", use_hook_mlp_in, [(block, block.MLP_INPUT_HOOKS) for block in self.blocks])

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

    # --- checkpoints ---------------------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        """Write model.safetensors and config.json (and tokenizer.json when one is attached), atomically."""
        return write_checkpoint(self, directory, {TOKENIZER_FILE: self.tokenizer})

    @classmethod
    def load(cls, directory: str | Path, device: str | torch.device = "cpu") -> "HookedTransformer":
        """Load a folder written by `save`; every malformed part is an error that says which."""
        directory = Path(directory)
        cfg, state = read_checkpoint(directory, ModelConfig)
        model = cls(cfg, tokenizer=read_tokenizers(directory, (TOKENIZER_FILE,))[0])
        model.load_weights(state, source=str(directory / WEIGHTS_FILE))
        return model.to(device).eval()

    def load_weights(self, state: dict[str, Tensor], source: str = "state dict") -> None:
        """Copy weights in, after checking that names and shapes match this config exactly."""
        load_weights(self, state, source)

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, device: str | torch.device = "cpu") -> "HookedTransformer":
        """A zoo model by name, a folder written by `save`, or a local Hugging Face folder (`lab.load.load_model`,
        reached through `lab.folders.load_pretrained`: loading by name is above the model package)."""
        return load_pretrained(cls, name_or_path, device)

