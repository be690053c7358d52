"""Tokenizers built here, never downloaded: word-level ones for synthetic worlds, BPE for English.

`word_level(words)` is exact for worlds whose vocabulary is known (every word one id); the BPE for
real text is trained locally with `tokenizers` (see `lab.data.text.train_bpe`).
"""

from pathlib import Path

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
    specials = {name: token for name, token in
                zip(("pad_token", "unk_token", "bos_token", "eos_token"), SPECIALS) if token in vocab}
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, **specials)
    fast.save_pretrained(directory)
    return AutoTokenizer.from_pretrained(directory, local_files_only=True, trust_remote_code=False)
