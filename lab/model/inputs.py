"""What HookedTransformer's forward pass reads and checks at its boundary: text or token ids and the padding of
the pass (TransformerLens's input_to_embed), the residual stream that start_at_layer resumes from, and which
blocks start_at_layer / stop_at_layer select."""

from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lab.model.kv_cache import KVCache, TransformerLensCache
from lab.model.padding import padding_of
from lab.model.tokenization import is_text


class InputChecks:
    """The inputs of a model with `cfg`, `embed`, a tokenizer (its text API: `lab.model.tokenization`), `_embed`
    and `_run`."""

    def _prepare(
        self, input: Any, prepend_bos: bool | None, padding_side: str | None, mask: Tensor | None, kv_cache: Any
    ) -> tuple[Tensor, Any, Tensor | None]:
        """(token ids, the pass's Padding or None, the mask of the text's own padding or None) of text or ids."""
        offset, loss_mask = 0 if kv_cache is None else kv_cache.length, None
        if is_text(input):
            input, loss_mask = self.tokenize(input, prepend_bos, padding_side)
            if mask is None and (self.padding_side(padding_side) == "left" or kv_cache is not None):
                mask = loss_mask
        elif (
            mask is None
            and self.tokenizer is not None
            and (self.padding_side(padding_side) == "left" or isinstance(kv_cache, TransformerLensCache))
        ):
            mask = self.inferred_padding(self.check_tokens(input, offset), prepend_bos, padding_side)
        tokens = self.check_tokens(input, offset)
        if mask is not None and kv_cache is None and bool(mask.all()):
            mask = None  # nothing is padding: the unpadded paths
        cached = None if kv_cache is None else kv_cache.mask
        return tokens, padding_of(mask, cached, offset, tuple(tokens.shape), tokens.device), loss_mask

    def input_to_embed(
        self,
        input: Any,
        prepend_bos: bool | None = None,
        padding_side: str | None = None,
        attention_mask: Tensor | None = None,
        past_kv_cache: Any = None,
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """TransformerLens's first step: (residual stream entering block 0, token ids, the shortformer positions or
        None, the pass's attention mask: given, with a KV cache or on the left padding side, as TransformerLens
        has one; None otherwise)."""
        cache = None if past_kv_cache is None else TransformerLensCache(past_kv_cache)
        tokens, padding, _ = self._prepare(input, prepend_bos, padding_side, attention_mask, cache)
        offset = 0 if cache is None else cache.check(self.cfg.n_layers, tokens.shape[0])
        x, shortformer_pos_embed = self._embed(tokens, offset, padding)
        mask = None if padding is None else padding.keys.long()
        has_mask = attention_mask is not None or cache is not None or self.padding_side(padding_side) == "left"
        if mask is None and has_mask:
            mask = torch.ones_like(tokens)  # TransformerLens's mask of a pass that has one, where nothing is padding
        return x, tokens, shortformer_pos_embed, mask

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
            raise ValueError(
                "tokens are on the meta device (a shape without values): put the ids on "
                f"{self.embed.W_E.device}, where the model is"
            )
        if offset + tokens.shape[1] > self.cfg.n_ctx:
            raise ValueError(
                f"sequence of {offset + tokens.shape[1]} tokens"
                + (f" ({offset} cached + {tokens.shape[1]} new)" if offset else "")
                + f" is longer than the model's context n_ctx = {self.cfg.n_ctx}"
            )
        if tokens.device.type == "meta":  # a meta model on meta ids: shapes only, no values to check
            return tokens.to(dtype=torch.long)
        low, high = (int(v) for v in torch.stack(torch.aminmax(tokens)).tolist())  # one device sync
        if low < 0 or high >= self.cfg.d_vocab:
            bad = low if low < 0 else high
            raise ValueError(f"token id {bad} is out of range: ids must lie in [0, d_vocab) = [0, {self.cfg.d_vocab})")
        return tokens.to(device=self.embed.W_E.device, dtype=torch.long)

    def _layer_range(self, start_at_layer: Any, stop_at_layer: Any, kv_cache: KVCache | None) -> tuple[int, int]:
        """(first block, one past the last block) to run; negative layers count from the end, as in TransformerLens."""
        n_layers = self.cfg.n_layers
        if start_at_layer is None and stop_at_layer is None:
            return 0, n_layers
        if kv_cache is not None and not isinstance(kv_cache, TransformerLensCache):  # a TransformerLens cache may be
            raise ValueError(
                "a KV cache needs every layer's keys for every step: it cannot be combined with "  # frozen
                "start_at_layer or stop_at_layer"
            )
        bounds = []
        for name, value, default in (("start_at_layer", start_at_layer, 0), ("stop_at_layer", stop_at_layer, n_layers)):
            if value is None:
                bounds.append(default)
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not -n_layers <= value <= n_layers:
                raise ValueError(
                    f"{name} must be an integer layer in [-{n_layers}, {n_layers}] for a model of "
                    f"{n_layers} layers, got {value!r}"
                )
            bounds.append(value + n_layers if value < 0 else value)
        start, stop = bounds
        if start > stop:
            raise ValueError(
                f"start_at_layer={start_at_layer} comes after stop_at_layer={stop_at_layer}: no block would run"
            )
        return start, stop

    def _check_residual(self, x: Any, start_at_layer: int) -> Float[Tensor, "batch pos d_model"]:
        """The residual stream that start_at_layer resumes from: a float [batch, pos, d_model] tensor."""
        shape = tuple(x.shape) if isinstance(x, Tensor) else None
        if shape is None or not x.dtype.is_floating_point or x.ndim != 3 or shape[-1] != self.cfg.d_model:
            got = f"a {x.dtype} tensor of shape {shape}" if shape is not None else type(x).__name__
            raise ValueError(
                f"with start_at_layer={start_at_layer} the input is the residual stream entering that "
                f"block, a float tensor [batch, pos, d_model = {self.cfg.d_model}]; got {got}"
            )
        if shape[1] > self.cfg.n_ctx:
            raise ValueError(
                f"residual stream of {shape[1]} positions is longer than the model's context n_ctx = {self.cfg.n_ctx}"
            )
        return x
