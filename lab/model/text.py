"""HookedTransformer's text in and out, with TransformerLens's names: `to_tokens` (with `prepend_bos`),
`to_string`, `to_str_tokens`, `to_single_token`, through the attached tokenizer (a `tokenizers.Tokenizer` or a
transformers tokenizer)."""

from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor


class TextMethods:
    """The tokenizer methods of a model that holds `self.tokenizer` and `self.W_E` (where token ids go)."""

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
