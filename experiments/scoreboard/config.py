"""The scoreboard's Config, its two profiles and the worlds every part trains a model on."""

from dataclasses import dataclass
from typing import Any

import numpy as np

from experiments import ProfileConfig
from lab.configs import need

# The worlds (lab.data): each gives its exact law and the ground truth of its mechanism.
MARKOV_WORLD = {"kind": "markov", "vocab_size": 8, "order": 2, "concentration": 0.3, "seed": 0}
# Mess3 with a long memory: the hidden state persists (it switches with probability 2x = 0.02 per token) and a token
# tells little about it (α = 0.6), so the belief integrates the whole prefix. At Shai et al. 2024's x = 0.05,
# α = 0.85 the last few tokens fix it: a lookup of the last 3 / 4 / 6 tokens reaches R² 0.988 / 0.997 / 1.000 there
# (measured on 20,000 sequences of 16), and no probe can tell belief geometry from a short memory. Here the lookup's
# R² for k = 1 … 6 is 0.302 0.499 0.645 0.749 0.824 0.878 on 20,000 sequences, and on the quick profile's own split
# 0.298 0.492 0.642 0.737 0.777 0.770 against the all-layer probe's 0.951 [0.941, 0.959] (seed 1: 0.807 best against
# 0.943 [0.932, 0.950]); on the default profile's, 0.305 0.503 0.654 0.752 0.818 0.853 against 0.992 [0.990, 0.993].
MESS3_WORLD = {"kind": "mess3", "x": 0.01, "alpha": 0.6, "seed": 0}
# 16 symbols, spans of 3 … 7 before the repeat: a 2-layer model forms induction heads within the quick profile's
# training (measured: on 24 symbols and spans of 5 … 9 it copies by other means first).
INDUCTION_WORLD = {"kind": "induction", "vocab_size": 16, "min_period": 3, "max_period": 7, "seed": 0}
# Arbitrary facts (Kalai & Vempala's world) with one attribute of 8 single-word values, in two sentence forms;
# every fact is in training many times (popularity ≥ 1, 6,000 draws over 120 facts): the model knows them all.
# The heads' world: the induction world with more symbols, spans of 4 … 12 and sequences of 32 tokens, on which a
# 2-layer model of width 32 forms induction heads in its second layer (induction scores 0.93–0.97 on the prompts
# graded, its first layer's at most 0.16) apart from the previous-token heads of its first: measured on three
# seeds at 800 and at 3,000 steps. Width 64 (the default profile's) did not form them in 3,000 steps (two seeds:
# loss 1.6–1.7 nats against 0.9–1.0, the first layer scoring higher on the induction pattern than the second),
# nor did the induction world above at width 64 (its first layer copies by other means), so the heads' model
# keeps width 32 in both profiles.
LONG_INDUCTION_WORLD = {"kind": "induction", "vocab_size": 32, "min_period": 4, "max_period": 12, "seed": 0}
LONG_INDUCTION_LENGTH = 32
LONG_INDUCTION_D_MODEL = 32
FACTS_WORLD = {
    "n_first_names": 20,
    "n_last_names": 20,
    "n_persons": 120,
    "attributes": ["team"],
    "n_values": 8,
    "n_train": 6000,
    "pareto_gamma": 1.5,
    "seed": 0,
}
# The attribution controls' other worlds: for each world whose attribution is graded, a world with another mechanism
# and the same vocabulary, whose model (the same shape, trained here) runs the same methods on this world's prompts.
# The fact world's vocabulary size is its tokenizer's, filled in by the part that builds it.
CONTROL_WORLDS = {
    "markov": {"kind": "induction", "vocab_size": 8, "min_period": 3, "max_period": 7, "seed": 0},
    "induction": {"kind": "markov", "vocab_size": 16, "order": 2, "concentration": 0.3, "seed": 0},
    "facts": {"kind": "markov", "order": 2, "concentration": 0.3, "seed": 0},
}
FIGURES = ("lenses", "attribution", "belief_simplex", "probes", "heads", "attribution_patching")
# The lenses every layer is read through: the Jacobian lens as the reference estimator sums it (over later positions)
# and its same-position variant (lab.analysis.jacobian_lens).
LENSES = ("logit", "tuned", "jacobian", "same-position jacobian")
LOOKUP = "last-tokens lookup"  # the belief probe's finite-memory baseline (lab.metrics.memory), a method of the table


def lookup_readout(k: int) -> str:
    """The table's readout of the lookup of the last k tokens: "last 1 token", "last 3 tokens"."""
    return f"last {k} token" + ("s" if k > 1 else "")


@dataclass(frozen=True)
class Profile:
    """What the default and quick runs differ in: the models' width and training, how many held-out prompts each
    grade averages over and how many training seeds (every interval covers both the prompts and the seeds)."""

    d_model: int
    steps: dict[str, int]  # training steps per world
    eval_prompts: int  # held-out sequences for the lenses, probes and head detectors
    fit_prompts: int  # sequences the tuned and Jacobian lenses are fitted on (a separate draw)
    attribution_prompts: int  # prompts whose last prediction each attribution method explains
    patching_prompts: int  # prompts of the attribution-patching comparison (one exhaustive sweep each)
    n_boot: int
    transcoder_features: int  # per layer: the top-k transcoders behind each world's attribution graphs
    transcoder_steps: int
    control_steps: int  # training steps of each attribution control's model (trained on another world)
    seeds: int = 3  # models trained per world, from seeds seed, seed + 1, …; each grade combines them
    seq_len: int = 16
    batch_size: int = 32
    n_layers: int = 2
    n_heads: int = 4
    lr: float = 3e-3
    ig_steps: int = 32


DEFAULT = Profile(
    d_model=64,
    steps={"markov": 3000, "mess3": 3000, "induction": 3000, "facts": 4000, "long_induction": 3000},
    eval_prompts=1024,
    fit_prompts=512,
    attribution_prompts=256,
    patching_prompts=64,
    n_boot=1000,
    transcoder_features=512,
    transcoder_steps=800,
    control_steps=1000,
)
# Quick is the default at a smaller size: narrower models, a sixth to a quarter of the training, fewer prompts.
QUICK = Profile(
    d_model=32,
    steps={"markov": 500, "mess3": 500, "induction": 800, "facts": 1000, "long_induction": 800},
    eval_prompts=192,
    fit_prompts=96,
    attribution_prompts=48,
    patching_prompts=12,
    n_boot=400,
    transcoder_features=128,
    transcoder_steps=200,
    control_steps=300,
)


# The real-model track's tasks (experiments.scoreboard.real), each a world of the table and the truth it grades
# against (the rows' readout): induction on repeated random tokens, indirect-object identification, capitals.
REAL_TASKS = {
    "induction": ("repeated_tokens", "copy source"),
    "ioi": ("ioi", "indirect object"),
    "capitals": ("capitals", "subject"),
}


@dataclass(frozen=True)
class RealSizes:
    """What the quick and default profiles of the real track's lenses and head detectors differ in
    (experiments.scoreboard.real_lenses)."""

    layers: tuple[int, ...]  # the layers read (blocks.l.hook_resid_pre); the output row is always read
    eval_windows: int  # held-out windows the lenses are graded on
    fit_windows: int  # training windows the tuned lens is fitted on
    length: int  # tokens per window
    tuned_iterations: int  # L-BFGS iterations of the tuned lens's fit
    jacobian_windows: int  # training windows of jacobian_length the Jacobian lens is fitted on (0: not fitted)
    jacobian_length: int
    head_sequences: int  # repeated random sequences the heads are scored and ablated on
    head_span: int  # random tokens per copy
    n_boot: int
    windows_per_pass: int = 4  # windows read at once (each reading holds [windows, length, 49,152] floats)
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.layers or self.eval_windows < 2 or self.windows_per_pass < 2:
            raise ValueError("the real lenses need layers, ≥ 2 held-out windows and ≥ 2 windows per pass")


REAL_LENSES_QUICK = RealSizes(
    layers=(0, 10, 20, 25, 29),
    eval_windows=8,
    fit_windows=2,
    length=32,
    tuned_iterations=10,
    jacobian_windows=0,
    jacobian_length=8,
    head_sequences=2,
    head_span=8,
    n_boot=400,
)
# The default sizes are the quick ones scaled where the quick run is weakest: a tuned lens fitted on 2 windows reads
# held-out windows worse than the logit lens at the last layers (it fits its 332k parameters per layer to 64
# positions), and 2 sequences give the heads' bootstrap nothing to resample; the Jacobian lens's one window of 8 tokens
# costs 576 × 8 token-passes forward and back.
REAL_LENSES_DEFAULT = RealSizes(
    layers=(0, 5, 10, 15, 20, 25, 28, 29),
    eval_windows=32,
    fit_windows=4,
    length=64,
    tuned_iterations=20,
    jacobian_windows=1,
    jacobian_length=8,
    head_sequences=4,
    head_span=12,
    n_boot=1000,
)


@dataclass(frozen=True)
class RealProfile:
    """What the real-model track's default and quick runs differ in: how many prompts each task's grades average over
    (of those the model answers), the integrated gradients' steps, the random replacement tokens each position's
    causal effect averages over, and how many of each task's prompts get an attribution graph, within a feature
    budget (a graph of smollm2 takes half a minute on two cores, and its control as long again)."""

    prompts: int  # per task, of those the model answers (its top token is the answer)
    induction_span: int  # random tokens before the repeat
    ig_steps: int
    effect_tokens: int  # replacement tokens of the causal effects (the same draw for every position)
    graph_prompts: int  # the first of each task's prompts that get a graph (0: no graph)
    graph_features: int  # feature nodes per graph, the rest folded into the error nodes
    capital_candidates: int  # capital questions tried (of the commonest prompt length), for `prompts` answered
    n_boot: int
    tasks: tuple[str, ...] = tuple(REAL_TASKS)
    lenses: RealSizes | None = None  # the lenses and head detectors (None: not graded)


REAL_DEFAULT = RealProfile(
    prompts=12,
    induction_span=10,
    ig_steps=16,
    effect_tokens=4,
    graph_prompts=3,
    graph_features=64,
    capital_candidates=64,
    n_boot=1000,
    lenses=REAL_LENSES_DEFAULT,
)
# Quick is sized for a few minutes on two idle cores: a forward pass of smollm2 over 15 tokens takes about 0.2 s on
# two shared ones (measured at a load average of 5–7), and each method runs on the model and on its untrained copy.
# smollm2 copies a span of 5 random word pieces in 2 prompts of 6 (measured): the spans are 8 and 10.
REAL_QUICK = RealProfile(
    prompts=6,
    induction_span=8,
    ig_steps=4,
    effect_tokens=2,
    graph_prompts=2,
    graph_features=32,
    capital_candidates=24,
    n_boot=400,
    lenses=REAL_LENSES_QUICK,
)


@dataclass
class Config(ProfileConfig):
    """The scoreboard: `seed` seeds the first of the profile's training seeds (the models, the batch order and
    every draw from the worlds; the worlds themselves are fixed above); `quick` is the small profile for tests and
    the demo. `model` (a pretrained model: a zoo name such as smollm2, or its folder) runs the real-model track
    instead (experiments.scoreboard.real, runs/scoreboard_real/); `corpus` (the folder `forma corpus real` wrote)
    is the text its lenses are fitted and graded on (without it they are left out, and the results say so)."""

    PROFILES = (DEFAULT, QUICK)
    REAL_PROFILES = (REAL_DEFAULT, REAL_QUICK)

    workers: int = 2  # processes for the independent parts (lab.parallel); results do not depend on it
    model: str | None = None
    corpus: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        need(self, self.workers >= 1, f"workers must be a positive integer, got {self.workers!r}")
        need(self, self.model is None or self.model.strip() != "", "model must name a model, got an empty string")
        need(self, self.corpus is None or self.model is not None, "corpus is for the real-model track: give a model")

    @property
    def real_track(self) -> bool:
        """True when the run grades a pretrained model (runs/scoreboard_real/), not the toy worlds' own models."""
        return self.model is not None


PURPOSES = ("train", "val", "eval", "fit", "attribution", "patching", "probe", "control", "unique source")


def sample_seed(seed: int, world: str, purpose: str) -> int:
    """A seed for one named stream of draws from one world, decorrelated from the others by SeedSequence hashing."""
    worlds = ("markov", "mess3", "induction", "facts", "long_induction")
    return int(np.random.SeedSequence([seed, worlds.index(world), PURPOSES.index(purpose)]).generate_state(1)[0])


def world_spec(name: str) -> dict[str, Any]:
    return {
        "markov": MARKOV_WORLD,
        "mess3": MESS3_WORLD,
        "induction": INDUCTION_WORLD,
        "facts": FACTS_WORLD,
        "long_induction": LONG_INDUCTION_WORLD,
    }[name]
