"""The kl experiment's Config, its two profiles, the scaling sweep's fixed setting, and the constants every
part shares (the recipe, the figures, the family-wise limit on |z|, the named seed streams)."""

from dataclasses import dataclass
from typing import Any

import numpy as np

from experiments import ProfileConfig
from lab.configs import need

RECIPE = "markov"
FIGURES = ("kl_decomposition", "lens", "kl_by_position", "temperature", "scaling", "hmm")
# The limit on |z| for a family of sampled-against-exact comparisons (one per checkpoint, region and
# check, ≈ 70 in the default run): at 4 standard errors the chance that any one of 70 fair comparisons
# exceeds it is ≈ 0.4% (2·Φ(−4) ≈ 6.3e-5 each); at 3 it would be ≈ 17%.
FAMILY_Z = 4.0

# The scaling sweep's chain and setting (see the package docstring): the `markov` recipe's symbols and
# Dirichlet rows at order 1, a 2-layer model with learned positions, 32 × 64 tokens a step.
SCALING_WORLD = {"kind": "markov", "vocab_size": 32, "order": 1, "concentration": 0.5, "seed": 0}
SCALING_MODEL = {"n_layers": 2, "n_heads": 4, "n_ctx": 64, "positions": "learned", "mlp": "gelu", "norm": "layernorm"}
SCALING_TRAIN = {"batch_size": 32, "seq_len": 64, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 50}


@dataclass(frozen=True)
class Profile:
    """What the default and quick runs differ in; everything not named comes from the recipe."""

    world: dict[str, Any]  # overrides of the recipe's [world]
    model: dict[str, Any]  # overrides of the recipe's [model]
    train: dict[str, Any]  # overrides of the recipe's [train]
    n_checkpoints: int  # log-spaced measurement points over training
    eval_sequences: int  # held-out sequences; prefixes = eval_sequences × (seq_len − 1)
    scaling_d_models: tuple[int, ...]  # widths trained on the same tokens of SCALING_WORLD
    scaling_steps: int
    hmm_world: dict[str, Any]
    hmm_steps: int


DEFAULT = Profile(
    world={},
    model={},
    train={},
    n_checkpoints=12,
    eval_sequences=1024,
    scaling_d_models=(4, 8, 12, 16, 24, 32, 64),
    scaling_steps=600,
    hmm_world={"kind": "hmm", "n_states": 8, "vocab_size": 32, "concentration": 0.1, "seed": 0},
    hmm_steps=500,
)
# Quick is the default at a smaller size: every width of the scaling sweep (seven points, so the fit has
# four degrees of freedom and an interval that can place E), a third of its steps.
QUICK = Profile(
    world={},
    model={"d_model": 32},
    train={"steps": 300, "warmup_steps": 20},
    n_checkpoints=10,
    eval_sequences=256,
    scaling_d_models=(4, 8, 12, 16, 24, 32, 64),
    scaling_steps=200,
    hmm_world={"kind": "hmm", "n_states": 8, "vocab_size": 32, "concentration": 0.1, "seed": 0},
    hmm_steps=150,
)


# The real-model track's world (experiments.kl.real): a first-order chain over eight colour words, each one token
# of smollm2's vocabulary after a space, with Dirichlet(0.5) rows (entropy rate 1.500 nats).
REAL_WORDS = (" red", " blue", " green", " black", " white", " brown", " pink", " gray")
REAL_WORLD = {"kind": "markov", "vocab_size": len(REAL_WORDS), "order": 1, "concentration": 0.5, "seed": 0}


@dataclass(frozen=True)
class RealProfile:
    """What the real-model track's default and quick runs differ in (experiments.kl.real)."""

    words_per_sequence: int  # words after the start token; each sequence predicts all of them
    eval_sequences: int  # held-out sequences, an independent draw
    steps: int  # fine-tuning steps of `batch_size` fresh sequences each
    batch_size: int
    n_checkpoints: int  # log-spaced measurement points over fine-tuning, after the one before it
    trained_blocks: int  # the last blocks trained, with the final norm and the unembedding; the rest frozen
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 4


REAL_DEFAULT = RealProfile(
    words_per_sequence=32, eval_sequences=32, steps=32, batch_size=8, n_checkpoints=5, trained_blocks=2
)
# Quick is sized for 5 minutes on two shared cores: the forward pass through 30 frozen blocks is most of a step's
# time, so it is cut in tokens — 12 steps of 4 sequences of 24 words, one block and the unembedding trained.
REAL_QUICK = RealProfile(
    words_per_sequence=24, eval_sequences=12, steps=12, batch_size=4, n_checkpoints=3, trained_blocks=1, warmup_steps=2
)


@dataclass
class Config(ProfileConfig):
    """The kl experiment: `seed` seeds the models, the batch order and every sample drawn from the worlds
    (the worlds themselves are the recipe's); `quick` is the small profile for tests and the demo. `model` (a
    pretrained model: a zoo name such as smollm2, or its folder) runs the real-model track instead
    (experiments.kl.real, runs/kl_real/)."""

    PROFILES = (DEFAULT, QUICK)
    REAL_PROFILES = (REAL_DEFAULT, REAL_QUICK)

    workers: int = 2  # processes for the independent parts (lab.parallel); results do not depend on it
    model: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        need(self, self.workers >= 1, f"workers must be a positive integer, got {self.workers!r}")
        need(self, self.model is None or self.model.strip() != "", "model must name a model, got an empty string")

    @property
    def real_track(self) -> bool:
        """True when the run measures a pretrained model (runs/kl_real/), not the toy worlds' own models."""
        return self.model is not None


def sample_seed(seed: int, purpose: str) -> int:
    """A seed for one named stream of draws, decorrelated from the others by SeedSequence hashing."""
    purposes = (
        "markov-train",
        "markov-val",
        "markov-eval",
        "hmm-train",
        "hmm-val",
        "hmm-eval",
        "hmm-rate",
        "scaling-train",
        "scaling-val",
        "scaling-eval",
        "real-train",
        "real-val",
        "real-eval",
    )
    return int(np.random.SeedSequence([seed, purposes.index(purpose)]).generate_state(1)[0])
