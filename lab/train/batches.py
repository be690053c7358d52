"""The data a training run reads: a `Batch` (tokens, the targets they predict, and an encoder–decoder's source)
and the `Batches` protocol, whose `get_batch` is a pure function of (seed, split, index) — what makes resumption
exact and lets every DDP rank cut its rows from the same global batch. Three sources: `TokenStream` (windows of
one long stream), `SequenceBatches` (whole documents, padded) and `PairBatches` ((source, target) pairs)."""

import functools
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

SPLITS = ("train", "val")
IGNORE = -100  # target id that the loss skips (PyTorch's cross_entropy ignore_index convention)


class Batch(NamedTuple):
    """Token windows and what each position must predict: targets[:, t] is tokens[:, t + 1], or
    IGNORE where that prediction is not scored. For an encoder–decoder, `tokens` is the target
    sequence the decoder reads under teacher forcing and `source` what the encoder reads."""

    tokens: Int[Tensor, "batch pos"]
    targets: Int[Tensor, "batch pos-1"]
    source: Int[Tensor, "batch src_pos"] | None = None

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        """The model's arguments: model(tokens) for a decoder-only model, model(source, tokens) for an
        encoder–decoder; either way the logits at position t predict tokens[:, t + 1]."""
        return (self.tokens,) if self.source is None else (self.source, self.tokens)


@runtime_checkable
class Batches(Protocol):
    """A data source for `train`. `get_batch` returns the whole *global* batch number `index` of
    `split` — `batch_size` rows of at most `seq_len` tokens — and must be a pure function of its
    arguments: that is what makes resumption exact and lets every DDP rank cut its own rows from
    the same batch."""

    def get_batch(self, split: str, index: int, batch_size: int, seq_len: int, seed: int) -> Batch: ...


def pad_documents(
    rows: list[list[int]], pad_id: int, length: int, scored: list[list[bool]] | None = None
) -> tuple[Int[Tensor, "doc pos"], Tensor]:
    """Token documents as one [n_docs, length] tensor, padded with `pad_id` at the end, and the mask of the
    positions a loss reads: each document's own tokens, or the positions `scored` marks. A document longer than
    `length` is a ValueError that says so."""
    longest = max((len(r) for r in rows), default=0)
    if longest > length:
        raise ValueError(f"a document is {longest} tokens, longer than the training seq_len = {length}")
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = True if scored is None else torch.tensor(scored[i], dtype=torch.bool)
    return ids, mask


def batch_seed(seed: int, split: str, index: int) -> int:
    """A 64-bit seed for batch `index` of `split`, decorrelated from every other (seed, split, index)
    by NumPy's SeedSequence hashing (nearby integer seeds would give correlated streams)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    state = np.random.SeedSequence([seed, SPLITS.index(split), index]).generate_state(1, np.uint64)
    return int(state[0])


class TokenStream:
    """Random windows of `seq_len` tokens. A 1-D tensor is one long stream; a 2-D tensor is a set of
    independent sequences (e.g. samples of a Markov source) and windows never cross a row."""

    def __init__(self, train_tokens: Any, val_tokens: Any) -> None:
        self.tokens = {
            "train": _token_tensor(train_tokens, "train_tokens"),
            "val": _token_tensor(val_tokens, "val_tokens"),
        }
        for split, tokens in self.tokens.items():
            if tokens.ndim == 1:
                self.tokens[split] = tokens[None, :]
            elif tokens.ndim != 2:
                raise ValueError(f"TokenStream: {split}_tokens must be 1-D or 2-D, got shape {tuple(tokens.shape)}")

    def get_batch(self, split: str, index: int, batch_size: int, seq_len: int, seed: int) -> Batch:
        generator = torch.Generator().manual_seed(batch_seed(seed, split, index))
        tokens = self.tokens[split]
        rows, length = tokens.shape
        starts_per_row = length - seq_len + 1
        if starts_per_row < 1:
            raise ValueError(f"TokenStream: {split} sequences have {length} tokens, fewer than seq_len = {seq_len}")
        flat = torch.randint(rows * starts_per_row, (batch_size,), generator=generator)
        row, start = flat // starts_per_row, flat % starts_per_row
        window = tokens[row[:, None], start[:, None] + torch.arange(seq_len)]
        return Batch(window, window[:, 1:])


class SequenceBatches:
    """Whole fixed-length documents, each seen once per epoch in an order shuffled per (seed, epoch).
    `mask[i, t]` (optional, bool) says whether predicting token t of document i counts in the loss —
    False for e.g. a prompt the model should condition on but not be trained to produce."""

    def __init__(self, sequences: Any, val_sequences: Any, mask: Any = None, val_mask: Any = None) -> None:
        self.sequences = {
            "train": _token_tensor(sequences, "sequences"),
            "val": _token_tensor(val_sequences, "val_sequences"),
        }
        self.masks = {"train": mask, "val": val_mask}
        for split, seqs in self.sequences.items():
            if seqs.ndim != 2:
                raise ValueError(
                    f"SequenceBatches: {split} sequences must be 2-D [n, length], got shape {tuple(seqs.shape)}"
                )
            if self.masks[split] is not None:
                m = torch.as_tensor(self.masks[split])
                if m.dtype != torch.bool or m.shape != seqs.shape:
                    raise ValueError(
                        f"SequenceBatches: {split} mask must be a bool tensor of shape "
                        f"{tuple(seqs.shape)}, got {m.dtype} {tuple(m.shape)}"
                    )
                self.masks[split] = m

    def get_batch(self, split: str, index: int, batch_size: int, seq_len: int, seed: int) -> Batch:
        seqs = self.sequences[split]
        n, length = seqs.shape
        if seq_len != length:
            raise ValueError(
                f"SequenceBatches: {split} documents have length {length}, "
                f"but TrainConfig.seq_len is {seq_len}; they must match"
            )
        rows = []
        first = index * batch_size  # position of this batch's first document in the endless stream
        for k in range(first, first + batch_size):
            epoch, position = divmod(k, n)
            rows.append(int(_permutation(n, batch_seed(seed, split, epoch))[position]))
        tokens = seqs[rows]
        targets = tokens[:, 1:].clone()
        if self.masks[split] is not None:
            targets[~self.masks[split][rows, 1:]] = IGNORE
        return Batch(tokens, targets)


@functools.lru_cache(maxsize=4)
def _permutation(n: int, seed: int) -> Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


def _token_tensor(tokens: Any, name: str) -> Tensor:
    tokens = torch.as_tensor(tokens)
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer token ids, got dtype {tokens.dtype}")
    if tokens.numel() == 0:
        raise ValueError(f"{name} is empty")
    return tokens.long()


class PairBatches:
    """(source, target) id pairs for an encoder–decoder model, grouped by (source length, target length)
    so that no batch needs padding or a padding mask. Batch `index` of a split draws one group with
    probability ∝ its size, then `batch_size` of its pairs with replacement, from a generator seeded by
    (seed, split, index): a pure function of its arguments, like every `Batches`. The batch's tokens
    are the targets (what the decoder reads under teacher forcing), its source the sources; `seq_len`
    bounds both lengths."""

    def __init__(self, train_pairs: list[tuple[list[int], list[int]]], val_pairs: list[tuple[list[int], list[int]]]):
        self.groups: dict[str, list[tuple[Tensor, Tensor]]] = {}
        for split, pairs in (("train", train_pairs), ("val", val_pairs)):
            if not pairs:
                raise ValueError(f"PairBatches: no {split} pairs")
            by_shape: dict[tuple[int, int], list[tuple[list[int], list[int]]]] = {}
            for src, tgt in pairs:
                if len(src) < 1 or len(tgt) < 2:
                    raise ValueError(
                        f"PairBatches: a {split} pair has a source of {len(src)} and a target of "
                        f"{len(tgt)} tokens; it needs ≥ 1 and ≥ 2 (one to read, one to predict)"
                    )
                by_shape.setdefault((len(src), len(tgt)), []).append((src, tgt))
            self.groups[split] = [
                (torch.tensor([s for s, _ in group]), torch.tensor([t for _, t in group]))
                for _, group in sorted(by_shape.items())
            ]

    def get_batch(self, split: str, index: int, batch_size: int, seq_len: int, seed: int) -> Batch:
        generator = torch.Generator().manual_seed(batch_seed(seed, split, index))
        groups = self.groups[split]
        sizes = torch.tensor([len(src) for src, _ in groups], dtype=torch.float)
        src, tgt = groups[int(torch.multinomial(sizes, 1, generator=generator))]
        if max(src.shape[1], tgt.shape[1]) > seq_len:
            raise ValueError(
                f"PairBatches: {split} pairs of {src.shape[1]} source and {tgt.shape[1]} target tokens "
                f"are longer than seq_len = {seq_len}"
            )
        rows = torch.randint(len(src), (batch_size,), generator=generator)
        return Batch(tgt[rows], tgt[rows, 1:], source=src[rows])
