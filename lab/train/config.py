"""How to train: `TrainConfig`, saved with every checkpoint and checked on resumption."""

from dataclasses import dataclass

import torch

from lab.configs import Record, check_fields, need


@dataclass(frozen=True)
class TrainConfig(Record):
    """How to train. Defaults follow GPT-3's recipe (Brown et al. 2020, App. B): AdamW with
    β = (0.9, 0.95), weight decay 0.1, gradient-norm clip 1.0, linear warmup then cosine decay to
    10% of the peak learning rate."""

    steps: int = 1000  # optimizer updates; the cosine schedule spans exactly these
    batch_size: int = 32  # global batch in sequences, split across DDP ranks
    seq_len: int = 64  # tokens per sequence (≤ the model's n_ctx); seq_len − 1 predictions each
    lr: float = 1e-3  # peak learning rate, reached at the end of warmup
    min_lr: float = 1e-4  # cosine floor
    warmup_steps: int = 100
    weight_decay: float = 0.1  # on ≥2-D weights only (not biases, norm gains)
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # max global gradient norm; 0 = no clipping
    eval_interval: int = 100  # steps between held-out evaluations (and log lines)
    eval_batches: int = 10  # held-out batches per evaluation
    checkpoint_interval: int = 0  # steps between checkpoints; 0 = none by count
    checkpoint_every_s: float = 30.0  # seconds of training between checkpoints; 0 = none by time
    seed: int = 0  # seeds the batch stream and torch's global RNG
    device: str = "cpu"

    def __post_init__(self) -> None:
        check_fields(self)  # types from the annotations; an int in a float field is stored as a float
        for name in ("steps", "batch_size", "seq_len", "eval_interval", "eval_batches"):
            need(self, getattr(self, name) > 0, "must be a positive integer", field=name)
        for name in ("warmup_steps", "checkpoint_interval", "seed"):
            need(self, getattr(self, name) >= 0, "must be a non-negative integer", field=name)
        need(self, self.seq_len >= 2, "must be at least 2 (one token to predict from, one to predict)", field="seq_len")
        need(self, self.lr > 0, "must be positive", field="lr")
        need(self, 0 <= self.min_lr <= self.lr, f"must lie in [0, lr = {self.lr}]", field="min_lr")
        need(self, self.warmup_steps <= self.steps, f"must be at most steps = {self.steps}", field="warmup_steps")
        need(self, self.weight_decay >= 0, "must be non-negative", field="weight_decay")
        need(self, 0 <= self.beta1 < 1, "must lie in [0, 1)", field="beta1")
        need(self, 0 <= self.beta2 < 1, "must lie in [0, 1)", field="beta2")
        need(self, self.grad_clip >= 0, "must be non-negative (0 = no clipping)", field="grad_clip")
        need(self, self.checkpoint_every_s >= 0, "must be non-negative (0 = none by time)", field="checkpoint_every_s")
        try:
            torch.device(self.device)
        except RuntimeError as err:
            raise ValueError(f"TrainConfig.device: not a torch device, got {self.device!r} ({err})") from err
