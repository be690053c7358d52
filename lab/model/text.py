"""HookedTransformer's text in and out, with TransformerLens's names and conventions: `to_tokens` (BOS, padding,
truncation), `to_string`, `to_str_tokens`, `to_single_token`, `to_single_str_token`, `get_token_position`,
through the attached tokenizer (a `tokenizers.Tokenizer` or a transformers tokenizer).

BOS: `prepend_bos` None means the model's default, `cfg.default_prepend_bos` (False for Forma's own models, which
encode text as written; True for a Hugging Face model whose tokenizer has a BOS, as TransformerLens sets it).
True puts the tokenizer's BOS first, once; False encodes the text alone; the tokenizer's own special tokens are
never added besides. Padding: texts of different lengths are padded with the tokenizer's pad token (its EOS when
it has none, as TransformerLens does) on `padding_side` — the argument, else the tokenizer's `padding_side`, else
the right — and `tokenize` says which positions are padding (lab.model.padding).
"""

from typing import Any

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from lab.model.errors import Misuse
from lab.model.padding import padding_mask

PADDING_SIDES = ("left", "right")


class TextMethods:
    """The tokenizer methods of a model that holds `self.tokenizer`, `self.cfg` and `self.W_E` (where ids go)."""

    def _require_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise Misuse("this model has no tokenizer attached: pass token ids, or set model.tokenizer")
        return self.tokenizer

    def set_tokenizer(self, tokenizer: Any, default_padding_side: str | None = None) -> None:
        """Attach a tokenizer as TransformerLens does: a transformers tokenizer without a pad token pads with its
        EOS, and pads on default_padding_side (else its own side, else the right)."""
        self.tokenizer = tokenizer
        if hasattr(tokenizer, "pad_token") and tokenizer.pad_token is None and tokenizer.eos_token is not None:
            tokenizer.pad_token = tokenizer.eos_token
        if default_padding_side is not None or getattr(tokenizer, "padding_side", "right") is None:
            tokenizer.padding_side = self.padding_side(default_padding_side)

    def to_tokens(
        self,
        input: str | list[str],
        prepend_bos: bool | None = None,
        padding_side: str | None = None,
        move_to_device: bool = True,
        truncate: bool = True,
    ) -> Int[Tensor, "batch pos"]:
        """Encode a string or a list of strings into [batch, pos] ids, padding shorter texts (see the module's
        docstring); truncate: cut each text to the model's context n_ctx."""
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
        tokenizer = self._require_tokenizer()
        texts = [input] if isinstance(input, str) else list(input)
        if not texts or not all(isinstance(t, str) for t in texts):
            raise ValueError(f"to_tokens encodes a string or a list of strings, got {input!r:.80}")
        bos = self.prepends_bos(prepend_bos)
        ids = [_encode(tokenizer, text, bos) for text in texts]
        if truncate:
            ids = [row[: self.cfg.n_ctx] for row in ids]
        device = self.W_E.device if move_to_device else torch.device("cpu")
        longest = max(len(row) for row in ids)
        if all(len(row) == longest for row in ids):
            return torch.tensor(ids, dtype=torch.long, device=device), None
        pad, side = self.pad_token_id(), self.padding_side(padding_side)
        mask = [[True] * len(row) + [False] * (longest - len(row)) for row in ids]
        ids = [row + [pad] * (longest - len(row)) for row in ids]
        tokens, mask = torch.tensor(ids, dtype=torch.long), torch.tensor(mask)
        if side == "left":  # each row turned: its padding first
            lengths = mask.sum(1, keepdim=True)
            index = (torch.arange(longest)[None, :] - (longest - lengths)) % longest
            tokens, mask = tokens.gather(1, index), mask.gather(1, index)
        return tokens.to(device), mask.to(device)

    def prepends_bos(self, prepend_bos: bool | None = None) -> bool:
        """prepend_bos, or the model's default when it is None."""
        if prepend_bos is None:
            return self.cfg.default_prepend_bos
        if not isinstance(prepend_bos, bool):
            raise ValueError(f"prepend_bos must be True, False or None (the model's default), got {prepend_bos!r}")
        return prepend_bos

    def padding_side(self, padding_side: str | None = None) -> str:
        """padding_side, else the tokenizer's, else "right"."""
        side = padding_side or getattr(self.tokenizer, "padding_side", None) or "right"
        if side not in PADDING_SIDES:
            raise ValueError(f"padding_side must be 'left' or 'right', got {side!r}")
        return side

    def pad_token_id(self) -> int:
        """The id texts are padded with: the tokenizer's pad token, else its EOS (as TransformerLens pads)."""
        tokenizer = self._require_tokenizer()
        for name in ("pad_token_id", "eos_token_id"):
            if getattr(tokenizer, name, None) is not None:
                return int(getattr(tokenizer, name))
        for token in ("<pad>", "<eos>"):  # a tokenizers.Tokenizer (Forma's own: lab.data.tokenizers)
            found = tokenizer.token_to_id(token) if hasattr(tokenizer, "token_to_id") else None
            if found is not None:
                return int(found)
        raise ValueError(
            "texts of different lengths need padding, but the tokenizer has no pad or EOS token: "
            "encode them one at a time"
        )

    def inferred_padding(
        self, tokens: Tensor, prepend_bos: bool | None, padding_side: str | None
    ) -> Bool[Tensor, "batch pos"]:
        """Which of these ids are padding, read from the ids as TransformerLens reads them (utils.get_attention_mask):
        the run of pad ids at the padding side."""
        side, bos = self.padding_side(padding_side), self.prepends_bos(prepend_bos)
        return padding_mask(tokens, self.pad_token_id(), side, getattr(self.tokenizer, "bos_token_id", None), bos)

    def to_string(self, tokens: int | Tensor | list[int]) -> str | list[str]:
        """Decode one id (an int or a 0-d tensor) or [pos] ids to a string, or [batch, pos] ids to a list of strings."""
        tokens = torch.as_tensor(tokens)
        if tokens.ndim == 2:
            return [_decode(self._require_tokenizer(), row.tolist()) for row in tokens]
        if tokens.ndim > 2:
            raise ValueError(f"to_string decodes ids of shape [], [pos] or [batch, pos], got {tuple(tokens.shape)}")
        return _decode(self._require_tokenizer(), tokens.reshape(-1).tolist())

    def to_str_tokens(
        self, input: Any, prepend_bos: bool | None = None, padding_side: str | None = None
    ) -> list[str] | list[list[str]]:
        """Each token as its own string: of a text (encoded as `to_tokens` does), of each text of a list, or of ids
        ([pos], [1, pos], a numpy array or a list of ids)."""
        tokenizer = self._require_tokenizer()
        if isinstance(input, list) and input and all(isinstance(t, str) for t in input):
            return [self.to_str_tokens(text, prepend_bos, padding_side) for text in input]
        if isinstance(input, str):
            ids = self.to_tokens(input, prepend_bos, padding_side)[0].tolist()
        else:
            ids = torch.as_tensor(input).squeeze()
            if ids.ndim > 1:
                raise ValueError(f"to_str_tokens reads ids of shape [pos] or [1, pos], got {tuple(ids.shape)}")
            ids = ids.reshape(-1).tolist()
        return [_decode(tokenizer, [int(i)]) for i in ids]

    def to_single_token(self, string: str) -> int:
        """The id of a string that is exactly one token of the vocabulary."""
        tokenizer = self._require_tokenizer()
        ids = _encode(tokenizer, string, False)
        if len(ids) != 1:
            raise Misuse(f"{string!r} is {len(ids)} tokens, not one")
        unknown_id, unknown = _unknown(tokenizer)
        if ids[0] == unknown_id and string != unknown:
            raise Misuse(f"{string!r} is not in the tokenizer's vocabulary (it encodes to the unknown token)")
        return ids[0]

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
        if tokens.ndim == 2:
            if tokens.shape[0] != 1:
                raise Misuse(f"ids of rank two must have shape [1, pos], not {tuple(tokens.shape)}")
            tokens = tokens[0]
        if isinstance(single_token, str):
            single_token = self.to_single_token(single_token)
        elif isinstance(single_token, Tensor):
            single_token = int(single_token.item())
        found = (tokens == single_token).nonzero().flatten()
        if len(found) == 0:
            raise Misuse("The token does not occur in the prompt")
        if mode not in ("first", "last"):
            raise ValueError(f"mode must be 'first' or 'last', not {mode}")
        return int(found[0] if mode == "first" else found[-1])


def is_text(input: Any) -> bool:
    """A string or a non-empty list of strings: what forward tokenizes before running."""
    return isinstance(input, str) or (
        isinstance(input, list) and bool(input) and all(isinstance(t, str) for t in input)
    )


def _encode(tokenizer: Any, text: str, bos: bool) -> list[int]:
    """The ids of `text` alone (none of the tokenizer's special tokens), after its BOS when `bos`. Both a
    `tokenizers.Tokenizer` and a transformers tokenizer take the flag (`add_special_tokens`)."""
    encoded = tokenizer.encode(text, add_special_tokens=False)
    ids = list(encoded.ids) if hasattr(encoded, "ids") else list(encoded)
    return [_bos_id(tokenizer), *ids] if bos else ids


def _decode(tokenizer: Any, ids: list[int]) -> str:
    if hasattr(tokenizer, "token_to_id"):  # a tokenizers.Tokenizer
        return tokenizer.decode(ids)
    return tokenizer.decode(ids, clean_up_tokenization_spaces=False)  # as TransformerLens decodes


def _bos_id(tokenizer: Any) -> int:
    """The tokenizer's beginning-of-sequence id: a transformers tokenizer's bos_token_id, or Forma's `<bos>`."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None and hasattr(tokenizer, "token_to_id"):  # a tokenizers.Tokenizer (Forma's own: lab.data.tokenizers)
        bos = tokenizer.token_to_id("<bos>")
    if bos is None:
        raise ValueError("prepend_bos=True, but the tokenizer has no beginning-of-sequence token")
    return int(bos)


def has_bos(tokenizer: Any) -> bool:
    """Whether the tokenizer has a beginning-of-sequence token."""
    try:
        _bos_id(tokenizer)
    except ValueError:
        return False
    return True


def _unknown(tokenizer: Any) -> tuple[int | None, str | None]:
    """(id, string) of the tokenizer's unknown token, (None, None) when it has none."""
    if hasattr(tokenizer, "token_to_id"):  # a tokenizers.Tokenizer (Forma's own: lab.data.tokenizers)
        return tokenizer.token_to_id("<unk>"), "<unk>"
    return getattr(tokenizer, "unk_token_id", None), getattr(tokenizer, "unk_token", None)
