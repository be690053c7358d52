"""Tokenizers built here, never downloaded: word-level ones for synthetic worlds, BPE for English.

`word_level(words)` is exact for worlds whose vocabulary is known (every word one id); the BPE for
real text is trained locally with `tokenizers` (see `lab.data.stdlib_corpus.train_bpe`).
"""

from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, models, pre_tokenizers

SPECIALS = ("<pad>", "<unk>", "<bos>", "<eos>")


def word_level(words: list[str]) -> Tokenizer:
    """A whitespace-split, one-id-per-word tokenizer; the special tokens come first, in SPECIALS order."""
    vocab = list(SPECIALS) + [w for w in dict.fromkeys(words) if w not in SPECIALS]
    for word in vocab:
        if not word or any(ch.isspace() for ch in word):
            raise ValueError(f"word-level vocabulary entries must be non-empty and contain no spaces: {word!r}")
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer


def to_hf_tokenizer(tokenizer: Tokenizer, directory: str | Path):
    """Wrap as a Hugging Face fast tokenizer, save it into `directory`, and reload it from disk.

    TransformerBridge needs a tokenizer that was loaded from a folder (it reads `name_or_path`).
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    vocab = tokenizer.get_vocab()
    specials = {
        name: token
        for name, token in zip(("pad_token", "unk_token", "bos_token", "eos_token"), SPECIALS)
        if token in vocab
    }
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, **specials)
    fast.save_pretrained(directory)
    return AutoTokenizer.from_pretrained(directory, local_files_only=True, trust_remote_code=False)


def _byte_level_table() -> dict[str, int]:
    """GPT-2's byte-level alphabet (the `tokenizers` ByteLevel pre-tokenizer's): the character that stands for
    each byte in a token's string, mapped back to the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = dict(zip(printable, printable)), 0
    for byte in range(256):
        if byte not in chars:
            chars[byte] = 256 + extra
            extra += 1
    return {chr(char): byte for byte, char in chars.items()}


BYTE_LEVEL = _byte_level_table()


def readable_bytes(data: bytes) -> str:
    """Bytes as text, each byte that is not part of a whole UTF-8 character written ⟨0xE2⟩."""
    out, i = [], 0
    while i < len(data):
        for width in (1, 2, 3, 4):
            try:
                out.append(data[i : i + width].decode("utf-8"))
                i += width
                break
            except UnicodeDecodeError:
                continue
        else:
            out.append(f"⟨0x{data[i]:02X}⟩")
            i += 1
    return "".join(out)


def readable_text(tokenizer: Any, ids: list[int]) -> str:
    """Tokens `ids` decoded as one text, as a reader can read it: where the decoding would show '�' (a window that
    cuts a UTF-8 character, a token that is one byte of one), each token by itself as `readable_token` writes it."""
    text = tokenizer.decode(ids)
    if "\ufffd" not in text:
        return text
    piece = tokenizer.id_to_token if hasattr(tokenizer, "id_to_token") else tokenizer.convert_ids_to_tokens
    return "".join(readable_token(tokenizer.decode([i]), piece(i)) for i in ids)


def readable_token(text: str, piece: str | None) -> str:
    """A token as a reader can read it: its decoded `text`, unless that holds the replacement glyph '�' (a
    byte-level token that is part of a UTF-8 character), when its bytes are written out from its vocabulary
    string `piece` — a ByteLevel BPE piece ('â' for 0xE2) or a byte-fallback piece ('<0xE2>') — as ⟨0xE2⟩."""
    if "\ufffd" not in text or not piece:
        return text
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        return f"⟨{piece[1:5].upper().replace('0X', '0x')}⟩"
    if all(ch in BYTE_LEVEL for ch in piece):
        return readable_bytes(bytes(BYTE_LEVEL[ch] for ch in piece))
    return text
