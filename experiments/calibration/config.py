"""The calibration experiment's Config, its two profiles (and the real-model track's two), and the constants every
part shares."""

from dataclasses import dataclass

from experiments import ModelTraining, ProfileConfig
from lab.configs import need
from lab.folders import PRETRAINED, zoo_names

N_OPTIONS = 4  # Kadavath et al. §3: lettered multiple choice with (A)–(D); chance = 1/4
EXPOSURE_BINS = ((0, 0, "0"), (1, 1, "1"), (2, 5, "2-5"), (6, None, "6+"))  # how often a fact was seen in training


@dataclass(frozen=True)
class Profile:
    """What the default and quick runs differ in, each entry a field of Config of the same name."""

    n_first_names: int
    n_last_names: int
    n_persons: int
    n_train: int
    d_model: int
    n_layers: int
    steps: int
    warmup_steps: int
    n_stages: int  # equal training stages, each followed by the held-out NLL and the recall of seen persons
    n_heldout: int  # independent i.i.d. statements from p (not unseen facts) for the held-out NLL
    mlp_steps: int
    mlp_decays: tuple[float, ...]  # the MLP probes' weight-decay grid (cross-validated)
    n_boot: int
    token_windows: int  # held-out pydoc windows of n_ctx tokens for token-level calibration
    p_true_samples: int  # sampled answers per person judged True/False


# The world: Pareto(2) popularity and 2,000 draws leave ≈30% of 1,000 persons unseen, ≈34% seen once.
DEFAULT = Profile(
    n_first_names=100,
    n_last_names=200,
    n_persons=1000,
    n_train=2000,
    d_model=128,
    n_layers=4,
    steps=720,
    warmup_steps=50,
    n_stages=12,
    n_heldout=1000,
    mlp_steps=200,
    mlp_decays=(1e-3, 1e-1),
    n_boot=500,
    token_windows=32,
    p_true_samples=2,
)
QUICK = Profile(
    n_first_names=40,
    n_last_names=60,
    n_persons=400,
    n_train=800,
    d_model=64,
    n_layers=2,
    steps=240,
    warmup_steps=20,
    n_stages=6,
    n_heldout=400,
    mlp_steps=100,
    mlp_decays=(1e-2,),
    n_boot=200,
    token_windows=8,
    p_true_samples=1,
)


@dataclass(frozen=True)
class RealProfile:
    """What the real-model track's default and quick runs differ in (experiments.calibration.real): how many facts
    are asked as multiple choice and as short answer, the samples per short answer, the bootstrap's resamples."""

    n_mc: int
    n_short: int
    n_samples: int
    n_boot: int


REAL_DEFAULT = RealProfile(n_mc=300, n_short=240, n_samples=5, n_boot=500)
REAL_QUICK = RealProfile(n_mc=40, n_short=48, n_samples=3, n_boot=200)


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------
@dataclass
class Config(ProfileConfig, ModelTraining):
    """The calibration experiment; `quick` swaps in the QUICK profile (a smaller world, model and training) for every
    field of it left at its default, and the real-model track's REAL_QUICK sizes. `model` + `mmlu`: lettered
    multiple choice on a local HF model instead."""

    PROFILES = (DEFAULT, QUICK)
    REAL_PROFILES = (REAL_DEFAULT, REAL_QUICK)
    FIELDS = (True, False)  # the profile's entries are fields below; the real track reads cfg.real_profile

    model: str | None = None  # a local HF folder (with its tokenizer), a zoo name or a Forma folder
    mmlu: str | None = None  # an MMLU-layout CSV: question, A, B, C, D, answer
    # the world
    n_first_names: int = DEFAULT.n_first_names
    n_last_names: int = DEFAULT.n_last_names
    n_persons: int = DEFAULT.n_persons
    n_train: int = DEFAULT.n_train
    pareto_gamma: float = 2.0
    format_share: float = 0.3  # share of seen persons whose quizzes and True/False claims are trained
    quiz_copies: int = 2  # quizzes per format person (fresh options and order each)
    # the model and its training
    d_model: int = DEFAULT.d_model
    n_layers: int = DEFAULT.n_layers
    warmup_steps: int = DEFAULT.warmup_steps
    steps: int = DEFAULT.steps
    n_stages: int = DEFAULT.n_stages
    partial_recall: float = 0.6  # the partial checkpoint: the stage whose recall of the format persons is nearest this
    n_heldout: int = DEFAULT.n_heldout
    # measurement
    calibration_share: float = 0.5  # evaluation persons whose items fit T (the rest are the test split)
    p_true_samples: int = DEFAULT.p_true_samples
    probe_test_fraction: float = 0.3  # persons (items) whose rows report every readout: the test split
    probe_validation_fraction: float = 0.3  # persons (items) on which readouts are chosen; the rest fit the probes
    mlp_steps: int = DEFAULT.mlp_steps
    mlp_decays: tuple[float, ...] = DEFAULT.mlp_decays
    probe_folds: int = 3
    n_boot: int = DEFAULT.n_boot
    token_windows: int = DEFAULT.token_windows
    threads: int = 1  # torch intra-op threads (tiny tensors: more threads cost more than they gain)
    hf_loader: str = (
        "auto"  # --model: "auto" converts the families Forma supports (load_hf), bridges the rest; "bridge" always
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_model_training()
        for name in (
            "n_first_names",
            "n_last_names",
            "n_persons",
            "n_train",
            "quiz_copies",
            "steps",
            "n_stages",
            "n_heldout",
            "p_true_samples",
            "mlp_steps",
            "n_boot",
            "token_windows",
            "threads",
        ):
            need(self, getattr(self, name) > 0, f"{name} must be a positive integer, got {getattr(self, name)!r}")
        need(
            self,
            0 <= self.warmup_steps <= self.steps,
            f"warmup_steps must lie in [0, steps], got {self.warmup_steps!r}",
        )
        need(self, self.n_stages >= 2 and self.steps >= self.n_stages, "need n_stages ≥ 2 and steps ≥ n_stages")
        need(self, len(self.mlp_decays) > 0 and all(d > 0 for d in self.mlp_decays), "mlp_decays must be positive")
        need(self, self.probe_folds >= 2, "probe_folds must be an integer ≥ 2")
        for name in (
            "format_share",
            "calibration_share",
            "probe_test_fraction",
            "probe_validation_fraction",
            "partial_recall",
        ):
            need(self, 0 < getattr(self, name) < 1, f"{name} must lie in (0, 1), got {getattr(self, name)!r}")
        need(
            self,
            self.probe_test_fraction + self.probe_validation_fraction < 1,
            "probe_test_fraction + probe_validation_fraction must leave a training split (sum < 1)",
        )
        need(self, self.pareto_gamma > 0, "pareto_gamma must be > 0")
        self._check_model_options()

    def _check_model_options(self) -> None:
        """--model and what goes with it: the loader, --mmlu only with a model, a model alone a pretrained zoo
        model (the real-model track)."""
        need(
            self, self.hf_loader in ("auto", "bridge"), f"hf_loader must be 'auto' or 'bridge', got {self.hf_loader!r}"
        )
        need(
            self,
            self.mmlu is None or self.model is not None,
            "--mmlu needs --model: lettered multiple choice of a local Hugging Face model on an MMLU-layout CSV "
            "(the synthetic experiment trains its own model)",
        )
        if self.real_track:
            pretrained = zoo_names(PRETRAINED)
            need(
                self,
                self.model in pretrained,
                f"--model alone runs the real-model track on a pretrained zoo model "
                f"({', '.join(pretrained) or 'none'}), got {self.model!r}; a local Hugging Face folder goes with "
                "--mmlu FILE.csv",
            )

    @property
    def real_track(self) -> bool:
        """`--model NAME` alone: the real-model track (Kadavath et al. on the real question set, `real`), whose runs
        go to runs/calibration_real/; with --mmlu, the model is measured on that file instead."""
        return self.model is not None and self.mmlu is None
