"""Text to token ids and back through a model's attached tokenizer (a `tokenizers.Tokenizer` or a transformers
tokenizer), with TransformerLens's conventions: the functions HookedTransformer's text API (`to_tokens`,
`tokenize`, `to_string`, `to_str_tokens`, `to_single_token`, `get_token_position`, ...) delegates to.

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

PADDING_SIDES = ("left", "right")


def is_text(input: Any) -> bool:
    """A string or a non-empty list of strings: what forward tokenizes before running."""
    return isinstance(input, str) or (
        isinstance(input, list) and bool(input) and all(isinstance(t, str) for t in input)
    )


def require(tokenizer: Any) -> Any:
    """The attached tokenizer; a model without one is told to pass token ids."""
    if tokenizer is None:
        raise Misuse("this model has no tokenizer attached: pass token ids, or set model.tokenizer")
    return tokenizer


def prepare(tokenizer: Any, default_padding_side: str | None) -> None:
    """Make a tokenizer ready to attach as TransformerLens does: a transformers tokenizer without a pad token pads
    with its EOS, and pads on default_padding_side (else its own side, else the right)."""
    if hasattr(tokenizer, "pad_token") and tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    if default_padding_side is not None or getattr(tokenizer, "padding_side", "right") is None:
        tokenizer.padding_side = padding_side(tokenizer, default_padding_side)


def prepends_bos(prepend_bos: bool | None, default: bool) -> bool:
    """prepend_bos, or the model's default when it is None."""
    if prepend_bos is None:
        return default
    if not isinstance(prepend_bos, bool):
        raise ValueError(f"prepend_bos must be True, False or None (the model's default), got {prepend_bos!r}")
    return prepend_bos


def padding_side(tokenizer: Any, side: str | None = None) -> str:
    """side, else the tokenizer's, else "right"."""
    side = side or getattr(tokenizer, "padding_side", None) or "right"
    if side not in PADDING_SIDES:
        raise ValueError(f"padding_side must be 'left' or 'right', got {side!r}")
    return side


def pad_token_id(tokenizer: Any) -> int:
    """The id texts are padded with: the tokenizer's pad token, else its EOS (as TransformerLens pads)."""
    tokenizer = require(tokenizer)
    for name in ("pad_token_id", "eos_token_id"):
        if getattr(tokenizer, name, None) is not None:
            return int(getattr(tokenizer, name))
    for token in ("<pad>", "<eos>"):  # a tokenizers.Tokenizer (Forma's own: lab.data.tokenizers)
        found = tokenizer.token_to_id(token) if hasattr(tokenizer, "token_to_id") else None
        if found is not None:
            return int(found)
    raise ValueError(
        "texts of different lengths need padding, but the tokenizer has no pad or EOS token: encode them one at a time"
    )


def tokenize(
    tokenizer: Any,
    input: str | list[str],
    prepend_bos: bool | None,
    default_bos: bool,
    n_ctx: int | None,
    side: str | None,
    device: torch.device,
) -> tuple[Int[Tensor, "batch pos"], Bool[Tensor, "batch pos"] | None]:
    """(ids [batch, pos], mask) of a string or a list of strings, each cut to n_ctx (None: not cut), where the
    mask marks the real tokens (True) and the padding (False); None when every text has the same length and
    nothing was padded."""
    tokenizer = require(tokenizer)
    texts = [input] if isinstance(input, str) else list(input)
    if not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError(f"to_tokens encodes a string or a list of strings, got {input!r:.80}")
    bos = prepends_bos(prepend_bos, default_bos)
    ids = [encode(tokenizer, text, bos) for text in texts]
    if n_ctx is not None:
        ids = [row[:n_ctx] for row in ids]
    longest = max(len(row) for row in ids)
    if all(len(row) == longest for row in ids):
        return torch.tensor(ids, dtype=torch.long, device=device), None
    pad, side = pad_token_id(tokenizer), padding_side(tokenizer, side)
    mask = [[True] * len(row) + [False] * (longest - len(row)) for row in ids]
    ids = [row + [pad] * (longest - len(row)) for row in ids]
    tokens, mask = torch.tensor(ids, dtype=torch.long), torch.tensor(mask)
    if side == "left":  # each row turned: its padding first
        lengths = mask.sum(1, keepdim=True)
        index = (torch.arange(longest)[None, :] - (longest - lengths)) % longest
        tokens, mask = tokens.gather(1, index), mask.gather(1, index)
    return tokens.to(device), mask.to(device)


def to_string(tokenizer: Any, tokens: int | Tensor | list[int]) -> str | list[str]:
    """One id (an int or a 0-d tensor) or [pos] ids decoded to a string, or [batch, pos] ids to a list of strings."""
    tokenizer, tokens = require(tokenizer), torch.as_tensor(tokens)
    if tokens.ndim == 2:
        return [decode(tokenizer, row.tolist()) for row in tokens]
    if tokens.ndim > 2:
        raise ValueError(f"to_string decodes ids of shape [], [pos] or [batch, pos], got {tuple(tokens.shape)}")
    return decode(tokenizer, tokens.reshape(-1).tolist())


def str_tokens(tokenizer: Any, ids: Any) -> list[str]:
    """Each id of [pos] or [1, pos] ids (a tensor, a numpy array or a list) as its own string."""
    tokenizer, ids = require(tokenizer), torch.as_tensor(ids).squeeze()
    if ids.ndim > 1:
        raise ValueError(f"to_str_tokens reads ids of shape [pos] or [1, pos], got {tuple(ids.shape)}")
    return [decode(tokenizer, [int(i)]) for i in ids.reshape(-1).tolist()]


def single_token(tokenizer: Any, string: str) -> int:
    """The id of a string that is exactly one token of the vocabulary."""
    tokenizer = require(tokenizer)
    ids = encode(tokenizer, string, False)
    if len(ids) != 1:
        raise Misuse(f"{string!r} is {len(ids)} tokens, not one")
    unknown_id, unknown = _unknown(tokenizer)
    if ids[0] == unknown_id and string != unknown:
        raise Misuse(f"{string!r} is not in the tokenizer's vocabulary (it encodes to the unknown token)")
    return ids[0]


def token_position(tokens: Tensor, token: int, mode: str) -> int:
    """Where the id `token` first (mode "first") or last ("last") occurs in ids ([pos] or [1, pos])."""
    if tokens.ndim == 2:
        if tokens.shape[0] != 1:
            raise Misuse(f"ids of rank two must have shape [1, pos], not {tuple(tokens.shape)}")
        tokens = tokens[0]
    found = (tokens == token).nonzero().flatten()
    if len(found) == 0:
        raise Misuse("The token does not occur in the prompt")
    if mode not in ("first", "last"):
        raise ValueError(f"mode must be 'first' or 'last', not {mode}")
    return int(found[0] if mode == "first" else found[-1])


def encode(tokenizer: Any, text: str, bos: bool) -> list[int]:
    """The ids of `text` alone (none of the tokenizer's special tokens), after its BOS when `bos`. Both a
    `tokenizers.Tokenizer` and a transformers tokenizer take the flag (`add_special_tokens`)."""
    encoded = tokenizer.encode(text, add_special_tokens=False)
    ids = list(encoded.ids) if hasattr(encoded, "ids") else list(encoded)
    return [_bos_id(tokenizer), *ids] if bos else ids


def decode(tokenizer: Any, ids: list[int]) -> str:
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
