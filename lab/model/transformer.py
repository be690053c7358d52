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
"""

import difflib
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from torch import nn
from transformer_lens import ActivationCache, FactoredMatrix, HookedRootModule
from transformer_lens.hook_points import HookPoint

from lab.folders import load_pretrained
from lab.model.checkpoint import (CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE, load_weights, read_checkpoint,  # noqa: F401
                                  read_tokenizer, read_tokenizers, write_checkpoint)
from lab.model.components import (BLOCKS, NORMS, POSITIONS, Attention, CheckedHookPoint, Embed, NoNorm, TiedUnembed,
                                  Unembed, set_hook_points)
from lab.model.config import ModelConfig
from lab.model.decoding import generate
from lab.model.kv_cache import KVCache
from lab.model.offload import read_weight

HookFn = Callable[[Tensor, HookPoint], Tensor | None]
RETURN_TYPES = ("logits", "loss", "both", None)


class HookedTransformer(HookedRootModule):
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
        unembed = stop_at_layer is None
        if kv_cache is None:
            out = self._run(tokens, x, None, 0, start, stop, unembed)
        else:
            offset = kv_cache.check(self.cfg.n_layers, tokens.shape[0])
            try:
                out = self._run(tokens, None, kv_cache, offset, start, stop, unembed)
            except BaseException:
                kv_cache.truncate(offset)  # layers before the failure appended this step's keys: take them back
                raise
        if not unembed:
            return out  # the residual stream entering block `stop`: nothing after it ran
        return self._outputs(out, tokens, return_type, loss_per_token)

    def _run(self, tokens: Tensor | None, x: Tensor | None, kv_cache: KVCache | None, offset: int, start: int,
             stop: int, unembed: bool) -> Tensor:
        """Embed the tokens (unless the residual stream x is given), run blocks start … stop − 1, then the final
        norm and the unembedding if asked."""
        if x is None:
            x = self.pos_embed(self.hook_embed(self.embed(tokens)), offset)
        for layer in range(start, stop):
            x = self.blocks[layer](x, None if kv_cache is None else kv_cache.entries[layer])
        return self.hook_logits(self.unembed(self.ln_final(x))) if unembed else x

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

    # --- weights under TransformerLens's names -------------------------------------------------
    # Read through `read_weight`, so that on a model spread over devices by accelerate (lab.hf.load_hf with a
    # device_map) an offloaded block's weights come from its offload store instead of the meta device.
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

    def _stack(self, name: str, module: str = "attn") -> Tensor:
        """blocks.{l}.{module}.{name} for every layer l, stacked on the first layer's device."""
        layers = [read_weight(self, f"blocks.{layer}.{module}.{name}") for layer in range(self.cfg.n_layers)]
        return torch.stack([w.to(layers[0].device) for w in layers])

    @property
    def W_Q(self) -> Tensor:  # [layer, head, d_model, d_head]
        return self._stack("W_Q")

    @property
    def W_K(self) -> Tensor:  # [layer, kv_head, d_model, d_head]
        return self._stack("W_K")

    @property
    def W_V(self) -> Tensor:  # [layer, kv_head, d_model, d_head]
        return self._stack("W_V")

    @property
    def W_O(self) -> Tensor:  # [layer, head, d_head, d_model]
        return self._stack("W_O")

    @property
    def W_in(self) -> Tensor:  # [layer, d_model, d_mlp]
        return self._stack("W_in", "mlp")

    @property
    def W_out(self) -> Tensor:  # [layer, d_mlp, d_model]
        return self._stack("W_out", "mlp")

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

    def accumulated_bias(self, layer: int, mlp_input: bool = False, include_mlp_biases: bool = True
                         ) -> Float[Tensor, "d_model"]:
        """Σ of the biases written into the residual stream before `layer`: b_O of every attention and (with
        include_mlp_biases) b_out of every MLP in blocks 0 … layer − 1, plus block `layer`'s b_O when
        mlp_input (the stream entering its MLP; a parallel block's MLP reads the block's input, before its
        attention). TransformerLens's `get_full_resid_decomposition` reads it."""
        n_layers = self.cfg.n_layers
        if not 0 <= layer <= n_layers or (mlp_input and layer == n_layers):
            raise ValueError(f"layer must lie in [0, {n_layers}] ([0, {n_layers - 1}] with mlp_input), got {layer}")
        total = torch.zeros(self.cfg.d_model, device=self.W_E.device, dtype=self.W_E.dtype)
        after_attention = mlp_input and self.cfg.block != "parallel"
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

    # --- tokenizer -----------------------------------------------------------------------------
    def _require_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer attached: pass token ids, or set model.tokenizer")
        return self.tokenizer

    def to_tokens(self, text: str | list[str], prepend_bos: bool | None = None) -> Int[Tensor, "batch pos"]:
        """Encode text (a string or a list of equally long strings) into a [batch, pos] tensor.

        prepend_bos: True puts the tokenizer's BOS token first (once); False encodes the text alone, with no
        special tokens; None (cfg.default_prepend_bos is False: Forma adds nothing) encodes as the tokenizer
        does by default."""
        tokenizer = self._require_tokenizer()
        texts = [text] if isinstance(text, str) else list(text)
        ids = [self._encode_text(tokenizer, t, prepend_bos) for t in texts]
        if len({len(i) for i in ids}) != 1:
            raise ValueError(f"texts encode to different lengths {[len(i) for i in ids]}: encode them one at a time")
        return torch.tensor(ids, dtype=torch.long, device=self.W_E.device)

    @staticmethod
    def _encode_text(tokenizer: Any, text: Any, prepend_bos: bool | None) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"to_tokens encodes strings, got {type(text).__name__}")
        if prepend_bos is None:
            return _encode(tokenizer, text)
        ids = _encode(tokenizer, text, special_tokens=False)
        return [_bos_id(tokenizer), *ids] if prepend_bos else ids

    def to_string(self, tokens: int | Tensor | list[int]) -> str | list[str]:
        """Decode one id (an int or a 0-d tensor) or [pos] ids to a string, or [batch, pos] ids to a list of strings."""
        tokenizer = self._require_tokenizer()
        tokens = torch.as_tensor(tokens)
        if tokens.ndim == 2:
            return [tokenizer.decode(row.tolist()) for row in tokens]
        return tokenizer.decode(tokens.reshape(-1).tolist())

    def to_str_tokens(self, text: str | Tensor, prepend_bos: bool | None = None) -> list[str]:
        """Each token of `text` (encoded as `to_tokens` does) or of an id tensor ([pos], or [1, pos]) as its own
        string."""
        tokenizer = self._require_tokenizer()
        if isinstance(text, str):
            ids = self._encode_text(tokenizer, text, prepend_bos)
        else:
            ids = torch.as_tensor(text).flatten().tolist()
        return [tokenizer.decode([i]) for i in ids]

    def to_single_token(self, text: str) -> int:
        ids = _encode(self._require_tokenizer(), text)
        if len(ids) != 1:
            raise ValueError(f"{text!r} is {len(ids)} tokens, not one")
        return ids[0]

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


class Cache(ActivationCache):
    """TransformerLens's ActivationCache, whose KeyError says why an entry is missing: an unknown hook
    name (with the closest ones), or a hook the names_filter — or the default, for attn.hook_result —
    left out."""

    def __getitem__(self, key: Any) -> Tensor:
        try:
            return super().__getitem__(key)
        except KeyError as err:  # TransformerLens raises it with the full name the key resolved to
            name = err.args[0] if err.args and isinstance(err.args[0], str) else key
        self.model.check_hook_names([name])  # an unknown name: the model's KeyError, naming the closest ones
        why = ("left out by default (n_heads × attn_out; name it in names_filter, or use cache.stack_head_results())"
               if not default_names_filter(self.model)(name) else "left out by the names_filter")
        raise KeyError(f"{name!r} is a hook of the model but was not cached: {why}")


def cached_by_default(name: str) -> bool:
    """run_with_cache's selection when none is given: every hook except the per-head result (cached too once
    use_attn_result is on: see `default_names_filter`)."""
    return not name.endswith("attn.hook_result")


def default_names_filter(model: HookedRootModule) -> Callable[[str], bool]:
    """What run_with_cache caches when asked for nothing in particular."""
    if getattr(model.cfg, "use_attn_result", False):
        return lambda name: True
    return cached_by_default


def resolve_names_filter(model: HookedRootModule, names_filter: Any) -> Callable[[str], bool] | list[str]:
    """A run_with_cache selection as a list of checked names or a predicate (see `run_with_cache`)."""
    if names_filter is None:
        return default_names_filter(model)
    if isinstance(names_filter, str):
        names_filter = [names_filter]
    if isinstance(names_filter, (list, tuple)):
        odd = [name for name in names_filter if not isinstance(name, str)]
        if odd:  # TransformerLens would match no hook against them and cache nothing
            raise ValueError(f"names_filter holds {odd[0]!r} ({type(odd[0]).__name__}): hook names are strings "
                             "(or pass one predicate on names)")
        model.check_hook_names(names_filter)
        return list(names_filter)
    return names_filter


def check_fits_in_memory(what: str, n_params: int, n_buffer_elements: int = 0) -> None:
    """Refuse, before allocating, a model whose weights cannot fit where they would be allocated (torch's
    default device and dtype): a clear error at once instead of minutes of building or an allocator's
    failure. Shapes on the meta device cost nothing and are always allowed."""
    device, dtype = torch.get_default_device(), torch.get_default_dtype()
    if device.type == "meta":
        return
    needed = (n_params + n_buffer_elements) * dtype.itemsize
    available = available_memory(device)
    if available is not None and needed > available:
        raise ValueError(f"{what} of {n_params:,} parameters needs {needed / 2**30:,.1f} GiB ({dtype}) but "
                         f"{device} has {available / 2**30:,.1f} GiB available: make the model smaller (or build it "
                         "under `with torch.device('meta')` to count its parameters)")


def available_memory(device: torch.device) -> int | None:
    """Bytes free for new tensors on `device`: a GPU's free memory, or on CPU what Linux reports available
    (MemAvailable), capped by the cgroup's limit when the process runs in one; None when unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    free: list[int] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free.append(int(line.split()[1]) * 1024)
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            free.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return min(free) if free else None


def next_token_loss(logits: Float[Tensor, "batch pos d_vocab"], tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, ""]:
    """Mean next-token cross-entropy in nats: the logits at t predict the token at t + 1."""
    if tokens.shape[-1] < 2:  # no prediction to average over: the mean of nothing is NaN
        raise ValueError(f"a next-token loss needs at least 2 tokens per sequence (one to predict from, one to "
                         f"predict), got {tokens.shape[-1]}")
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))


def per_token_loss(logits: Float[Tensor, "batch pos d_vocab"], tokens: Int[Tensor, "batch pos"]
                   ) -> Float[Tensor, "batch pos_minus_1"]:
    """−log P_θ(x_{t+1} | x_≤t) in nats at every position but the last (TransformerLens's loss_per_token)."""
    if tokens.shape[-1] < 2:
        raise ValueError(f"a next-token loss needs at least 2 tokens per sequence, got {tokens.shape[-1]}")
    return F.cross_entropy(logits[:, :-1].transpose(1, 2).float(), tokens[:, 1:], reduction="none")


def is_text(input: Any) -> bool:
    """A string or a non-empty list of strings: what forward tokenizes before running."""
    return isinstance(input, str) or (isinstance(input, list) and bool(input) and all(isinstance(t, str) for t in input))


def _encode(tokenizer: Any, text: str, special_tokens: bool | None = None) -> list[int]:
    """The ids of `text`: with the special tokens the tokenizer adds by default (None), or forced on or off.
    Both a `tokenizers.Tokenizer` and a transformers tokenizer take the flag (`add_special_tokens`)."""
    options = {} if special_tokens is None else {"add_special_tokens": special_tokens}
    encoded = tokenizer.encode(text, **options)
    return list(encoded.ids) if hasattr(encoded, "ids") else list(encoded)


def _bos_id(tokenizer: Any) -> int:
    """The tokenizer's beginning-of-sequence id: a transformers tokenizer's bos_token_id, or Forma's `<bos>`."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None and hasattr(tokenizer, "token_to_id"):  # a tokenizers.Tokenizer (Forma's own: lab.tokenize)
        bos = tokenizer.token_to_id("<bos>")
    if bos is None:
        raise ValueError("prepend_bos=True, but the tokenizer has no beginning-of-sequence token")
    return int(bos)
