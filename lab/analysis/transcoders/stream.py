"""Transcoders' rows made on the fly, where a harvest would not fit on disk: each batch's MLP inputs and outputs come
from running the model on windows drawn for that batch alone, so that no activation is ever written.

    ActivationStream   the training rows: batch `step` is every position of ⌈batch_size / window⌉ windows of the
                       token source, drawn with the generator seeded (seed, step), in order, cut to batch_size rows.
                       A function of (seed, step) alone, as a harvest's DataOrder is: a run resumed from a
                       checkpoint's step reads the same bits as the run that never stopped. A data-parallel rank
                       runs only the windows its slice of the batch lies in; the model runs only up to the last
                       layer the transcoders read (stop_at_layer).
    WindowActivations  fixed windows (the held-out ones), run through the model a chunk at a time: the parts the
                       measures and top contexts read in place of a harvest's shards.

The token source is one stream of ids (a corpus split: windows at any start) or rows of ids (a world's sequences:
each window a row's first tokens).
"""

import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lab.analysis.activations.collect import Activations
from lab.analysis.transcoders.model import TranscoderConfig
from lab.analysis.transcoders.train import layer_hooks, stacked

STREAM_FORMAT = "forma-transcoder-stream/1"


def draw_windows(tokens: Any, n: int, length: int, rng: np.random.Generator) -> Tensor:
    """n windows [n, length] of `tokens` (one stream: at starts drawn uniformly; rows: rows drawn uniformly, each
    cut to its first `length` tokens), as int64."""
    if tokens.ndim == 1:
        starts = rng.integers(0, len(tokens) - length + 1, size=n)
        windows = np.stack([np.asarray(tokens[s : s + length]) for s in starts.tolist()])
    else:
        windows = np.asarray(tokens[np.sort(rng.integers(0, len(tokens), size=n))][:, :length])
    return torch.from_numpy(windows.astype(np.int64))


@torch.no_grad()
def layer_rows(model: Any, windows: Tensor, cfg: TranscoderConfig, layers: Sequence[int]) -> Activations:
    """Every position of `windows` [n, length] as rows (window-major), with the hooks of transcoders `layers`
    (indices into cfg's layers): the model run only as far as the last of their model layers."""
    hooks = layer_hooks(cfg, layers)
    last = max(cfg.model_layers()[layer] for layer in layers)
    stop = last + 1 if last + 1 < model.cfg.n_layers else None
    _, cache = model.run_with_cache(windows, names_filter=hooks, stop_at_layer=stop)
    n, length = windows.shape
    acts = {name: cache[name].reshape(n * length, -1) for name in hooks}
    seq = torch.arange(n).repeat_interleave(length)
    return Activations(acts, seq, torch.arange(length).repeat(n))


class ActivationStream:
    """The training rows of transcoders of config `cfg`, made by `model` from windows of `length` tokens of
    `tokens` (see the module's docstring); `describe`: what the tokens are, for the checkpoint's record."""

    def __init__(self, model: Any, tokens: Any, length: int, describe: str = ""):
        if tokens.ndim not in (1, 2) or (tokens.shape[-1] if tokens.ndim == 2 else len(tokens)) < length:
            raise ValueError(f"a token source of shape {tuple(tokens.shape)} holds no window of {length} tokens")
        self.model, self.tokens, self.length, self.describe = model.eval(), tokens, length, describe
        digest = hashlib.sha256(np.ascontiguousarray(np.asarray(tokens)).tobytes()).hexdigest()
        self._fingerprint = {
            "format": STREAM_FORMAT,
            "tokens": describe,
            "shape": list(tokens.shape),
            "sha256": digest,
            "window": length,
        }

    def fingerprint(self) -> dict[str, Any]:
        """What a checkpoint records of the rows it was trained on (a resume from another source is refused)."""
        return dict(self._fingerprint)

    def verify_shared(self) -> None:
        """(A harvest's shards are checked before training; a stream has none.)"""

    def windows(self, step: int, batch_size: int, seed: int) -> Tensor:
        """The windows of batch `step`: ⌈batch_size / length⌉ of them, drawn with (seed, step)."""
        n = -(-batch_size // self.length)
        return draw_windows(self.tokens, n, self.length, np.random.default_rng([seed, step]))

    def batch(
        self, step: int, cfg: TranscoderConfig, batch_size: int, seed: int, layers: Sequence[int], part: slice
    ) -> tuple[Tensor, Tensor]:
        """Rows `part` of batch `step` (of `layers`), running only the windows they lie in."""
        first, stop, _ = part.indices(batch_size)
        windows = self.windows(step, batch_size, seed)
        begin, end = first // self.length, -(-stop // self.length)
        rows = layer_rows(self.model, windows[begin:end], cfg, layers)
        x, y = stacked(rows, cfg, layers)
        offset = first - begin * self.length
        return x[offset : offset + stop - first], y[offset : offset + stop - first]

    def order(
        self, cfg: TranscoderConfig, batch_size: int, seed: int, layers: Sequence[int], part: slice
    ) -> "StreamOrder":
        return StreamOrder(self, cfg, batch_size, seed, layers, part)

    def output_scale(self, cfg: TranscoderConfig, batch_size: int, seed: int) -> Tensor:
        """Σ_d Var(y_d) of each layer's output over batch 0's rows (every rank computes the same): the loss's
        per-layer denominator, as a harvest's first shard gives it."""
        layers = list(range(cfg.n_layers))
        _, y = self.batch(0, cfg, batch_size, seed, layers, slice(None))
        return y.var(dim=0).sum(-1).clamp_min(1e-12)


class StreamOrder:
    """DataOrder's reader for a stream: (step, x, y) from batch `start` on, forever, rows `part` of each batch."""

    def __init__(
        self,
        stream: ActivationStream,
        cfg: TranscoderConfig,
        batch_size: int,
        seed: int,
        layers: Sequence[int],
        part: slice,
    ):
        self.stream, self.cfg, self.batch_size, self.seed = stream, cfg, batch_size, seed
        self.layers, self.part = list(layers), part

    def batches(self, start: int = 0) -> Iterator[tuple[int, Tensor, Tensor]]:
        step = start
        while True:
            x, y = self.stream.batch(step, self.cfg, self.batch_size, self.seed, self.layers, self.part)
            yield step, x, y
            step += 1


class WindowActivations:
    """`windows` [n, length] run through `model` `chunk` windows at a time, as the parts of a harvest of every hook
    of transcoders of config `cfg` (seq: the window's index in `windows`)."""

    def __init__(self, model: Any, windows: Tensor, cfg: TranscoderConfig, chunk: int = 16):
        self.model, self.windows, self.cfg, self.chunk = model.eval(), windows, cfg, chunk

    def __len__(self) -> int:
        return self.windows.numel()

    def parts(self) -> Iterator[Activations]:
        layers = list(range(self.cfg.n_layers))
        for start in range(0, len(self.windows), self.chunk):
            part = layer_rows(self.model, self.windows[start : start + self.chunk], self.cfg, layers)
            yield Activations(part.acts, part.seq + start, part.pos)
