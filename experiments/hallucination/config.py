"""The hallucination experiment's Config, its two profiles (and the real-model track's two), and the constants
every part shares."""

from dataclasses import dataclass

from experiments import ModelTraining, ProfileConfig
from lab.configs import need

DELTAS = (0.1, 0.01)  # the bound's confidence levels
# Kalai & Vempala's bound is proved for worlds whose largest fact probability is bounded (their abstract: "if
# the maximum probability of any fact is bounded"); the theorem gives no number. Forma flags a γ whose world
# puts at least this share of p on one fact: most of its training draws then repeat that fact, and the
# monofact rate describes the rest of a world that is mostly one fact.
MAX_FACT_PROBABILITY_FLAG = 0.1
# The limit on |z| for the family of enumeration-against-sampling comparisons (one per γ and checkpoint, 30
# in the default run): 4 standard errors keep the chance that a fair one exceeds it near 0.2% (2·Φ(−4) each).
FAMILY_Z = 4.0
EPS = 0.1  # ε-log bins ((1−ε)^(i+1), (1−ε)^i] (Kalai & Vempala's ε-log binning)
ADAPTIVE_BINS = 20  # b adaptive bins, each ≈ 1/b of g's mass


@dataclass(frozen=True)
class Profile:
    """What the default and quick runs differ in, each entry a field of Config of the same name."""

    n_first_names: int
    n_last_names: int
    n_persons: int
    n_train: int
    gammas: tuple[float, ...]
    epochs: tuple[int, ...]  # the checkpoints, in epochs of the training data
    n_heldout: int  # independent draws from p (not unseen facts): the held-out NLL picks the optimum
    upweight_epochs: int  # every upweighting condition gets the optimizer steps of this many epochs of the full data
    upweight_draws: int  # draws of each condition (its blocks and batch order), the control's too; figures: the mean


# The world: ≥ 100 × 200 names, |H| ≫ 300·|F|, n = 5,000.
DEFAULT = Profile(
    n_first_names=100,
    n_last_names=200,
    n_persons=4000,
    n_train=5000,
    gammas=(1.0, 1.5, 2.0, 3.0, 4.0),
    epochs=(2, 4, 8, 16, 40),
    n_heldout=1000,
    upweight_epochs=8,
    upweight_draws=4,
)
# The quick profile is the default experiment at a smaller size: a tenth of the name grid, the default's
# draws per person (n_train / n_persons = 1.25, where MF rises with γ: fewer persons than draws would put
# the sweep where MF falls with γ), three γ in that regime, and most of the default's optimizer steps of
# upweighting (16 epochs of 15 steps against 8 of 50: with 1 epoch, as before, no condition moved g(H)
# below its control), from the held-out optimum at the same γ.
QUICK = Profile(
    n_first_names=30,
    n_last_names=60,
    n_persons=1200,
    n_train=1500,
    gammas=(1.5, 2.0, 4.0),
    epochs=(4, 8, 16, 32),
    n_heldout=500,
    upweight_epochs=16,
    upweight_draws=3,
)


@dataclass(frozen=True)
class RealProfile:
    """What the real-model track's default and quick runs differ in (experiments.hallucination.real): the corpus
    (n training sentences, repeats of a repeated fact, held-out persons), the monofact rates, and the fine-tuning
    (steps of batch_size sentences, lr, trained blocks)."""

    n_train: int
    repeats: int
    n_heldout: int
    rates: tuple[float, ...]
    steps: int
    batch_size: int
    lr: float
    trained_blocks: int
    n_boot: int
    n_chat: int  # invented persons asked in the chat form before fine-tuning


REAL_DEFAULT = RealProfile(160, 4, 64, (0.2, 0.4, 0.6, 0.8), 80, 8, 1e-3, 4, 500, 16)
REAL_QUICK = RealProfile(32, 4, 16, (0.25, 0.5, 0.75), 8, 4, 1e-3, 4, 200, 4)
# The level of the permutation tests behind the headlines (one-sided, in the direction the papers predict). Their
# smallest p-value is 1/n! for a rank correlation over n γ values and 1/C(2k, k) for k draws against k: 3 γ values
# (1/6) or 2 draws against 2 (1/6) can never reach it, which is why the quick profile draws 3 (1/20) and the
# default 4 (1/70).
PERMUTATION_LEVEL = 0.05


def delta_key(delta: float) -> str:
    """δ as it stands in results.json's keys: 0.01 → "0_01" (bound_rhs_delta_0_01)."""
    return str(delta).replace(".", "_")


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------
@dataclass
class Config(ProfileConfig, ModelTraining):
    """The hallucination experiment; `quick` swaps in the QUICK profile (a smaller world, fewer γ values and epochs)
    for every field of it left at its default, and the real-model track's REAL_QUICK sizes."""

    PROFILES = (DEFAULT, QUICK)
    REAL_PROFILES = (REAL_DEFAULT, REAL_QUICK)
    FIELDS = (True, False)  # the profile's entries are fields below; the real track reads cfg.real_profile

    # --model: the real-model track (experiments.hallucination.real) on this pretrained model instead of the toy world
    model: str | None = None
    # the world
    n_first_names: int = DEFAULT.n_first_names
    n_last_names: int = DEFAULT.n_last_names
    n_persons: int = DEFAULT.n_persons
    n_train: int = DEFAULT.n_train
    attribute: str = "code"  # generic: n_values one-token values; "birthday": "Month day" (12 × 28, two tokens)
    n_values: int = 336  # value-space size of a generic attribute (FactWorldConfig.n_values)
    gammas: tuple[float, ...] = DEFAULT.gammas
    n_heldout: int = DEFAULT.n_heldout
    # model and training: one small layer (the rest of ModelTraining's fields at their defaults)
    d_model: int = 64
    n_layers: int = 1
    n_heads: int = 2
    batch_size: int = 100
    lr: float = 5e-3
    min_lr: float = 5e-4
    epochs: tuple[int, ...] = DEFAULT.epochs
    # measurement
    n_samples: int = 5000  # documents drawn at T = 1 to check the enumeration
    # selective upweighting
    upweight_gamma: float = 1.5
    upweight_epochs: int = DEFAULT.upweight_epochs
    upweight_factor: int = 10
    upweight_shares: tuple[float, ...] = (0.05, 0.15)
    upweight_lr: float = 1e-3
    upweight_draws: int = DEFAULT.upweight_draws
    threads: int = 1  # torch intra-op threads (tiny tensors: more threads cost more than they gain)
    workers: int = 2  # processes for the independent trainings (lab.parallel); results do not depend on it

    @property
    def real_track(self) -> bool:
        """The run measures a pretrained model on the biography corpus (runs/hallucination_real/)."""
        return self.model is not None

    def __post_init__(self) -> None:
        super().__post_init__()
        need(self, self.model is None or self.model.strip() != "", "model must name a pretrained model")
        self.check_model_training()
        need(
            self,
            self.attribute.isidentifier() and self.attribute.islower(),
            f"attribute must be a lower-case word, got {self.attribute!r}",
        )
        for name in (
            "n_first_names",
            "n_last_names",
            "n_persons",
            "n_train",
            "n_values",
            "n_heldout",
            "n_samples",
            "upweight_epochs",
            "upweight_factor",
            "upweight_draws",
            "threads",
            "workers",
        ):
            value = getattr(self, name)
            need(self, value > 0, f"{name} must be a positive integer, got {value!r}")
        need(
            self,
            self.n_train % self.batch_size == 0,
            f"n_train ({self.n_train}) must be a multiple of batch_size ({self.batch_size}) so epochs end on steps",
        )
        need(
            self,
            len(self.gammas) >= 2 and all(g > 0 for g in self.gammas),
            f"gammas must hold at least two finite values > 0, got {self.gammas}",
        )
        need(
            self,
            len(self.epochs) > 0 and list(self.epochs) == sorted(set(self.epochs)) and self.epochs[0] >= 1,
            f"epochs must be increasing positive integers, got {self.epochs}",
        )
        need(self, self.upweight_gamma > 0, "upweight_gamma must be > 0")
        need(
            self,
            all(0 < s < 1 for s in self.upweight_shares) and len(self.upweight_shares) >= 1,
            f"upweight_shares must lie in (0, 1), got {self.upweight_shares}",
        )
        need(self, self.upweight_lr > 0, "upweight_lr must be > 0")
        need(self, self.n_samples >= 5000, "n_samples must be ≥ 5,000")
