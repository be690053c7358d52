"""The hallucination experiment's Config, its quick profile, and the constants every part shares."""

from dataclasses import dataclass

from experiments import ModelTraining
from lab.configs import apply_quick, check_fields, need

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
# The quick profile is the default experiment at a smaller size: a tenth of the name grid, the default's
# draws per person (n_train / n_persons = 1.25, where MF rises with γ: fewer persons than draws would put
# the sweep where MF falls with γ), three γ in that regime, and most of the default's optimizer steps of
# upweighting (16 epochs of 15 steps against 8 of 50: with 1 epoch, as before, no condition moved g(H)
# below its control), from the held-out optimum at the same γ.
QUICK = dict(
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
class Config(ModelTraining):
    """The hallucination experiment; `quick` swaps in a smaller world and fewer γ values and epochs
    (QUICK) for every field left at its default."""

    seed: int = 0
    quick: bool = False
    # --model: the real-model track (experiments.hallucination.real) on this pretrained model instead of the toy world
    model: str | None = None
    # world: ≥ 100 × 200 names, |H| ≫ 300·|F|, n = 5,000
    n_first_names: int = 100
    n_last_names: int = 200
    n_persons: int = 4000
    n_train: int = 5000
    attribute: str = "code"  # generic: n_values one-token values; "birthday": "Month day" (12 × 28, two tokens)
    n_values: int = 336  # value-space size of a generic attribute (FactWorldConfig.n_values)
    gammas: tuple[float, ...] = (1.0, 1.5, 2.0, 3.0, 4.0)
    n_heldout: int = 1000  # independent draws from p (not unseen facts): the held-out NLL picks the optimum
    # model and training: one small layer (the rest of ModelTraining's fields at their defaults)
    d_model: int = 64
    n_layers: int = 1
    n_heads: int = 2
    batch_size: int = 100
    lr: float = 5e-3
    min_lr: float = 5e-4
    epochs: tuple[int, ...] = (2, 4, 8, 16, 40)
    # measurement
    n_samples: int = 5000  # documents drawn at T = 1 to check the enumeration
    # selective upweighting
    upweight_gamma: float = 1.5
    upweight_epochs: int = 8  # every condition gets the optimizer steps of this many epochs of the full data
    upweight_factor: int = 10
    upweight_shares: tuple[float, ...] = (0.05, 0.15)
    upweight_lr: float = 1e-3
    upweight_draws: int = (
        4  # draws of each condition (its blocks and batch order), the control's too; figures: the mean
    )
    threads: int = 1  # torch intra-op threads (tiny tensors: more threads cost more than they gain)
    workers: int = 2  # processes for the independent trainings (lab.parallel); results do not depend on it

    @property
    def real_track(self) -> bool:
        """The run measures a pretrained model on the biography corpus (runs/hallucination_real/)."""
        return self.model is not None

    def __post_init__(self) -> None:
        check_fields(self)
        if self.quick:
            apply_quick(self, QUICK)

        need(self, self.model is None or self.model.strip() != "", "model must name a pretrained model")
        need(self, self.seed >= 0, f"seed must be a non-negative integer, got {self.seed!r}")
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
