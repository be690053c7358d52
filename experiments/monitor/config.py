"""The monitor experiment's Config, its two profiles (and the real-model track's two), and the constants every part
shares."""

from dataclasses import dataclass

from experiments import ModelTraining, ProfileConfig
from lab.configs import need

KINDS = ("seen", "unseen", "invented")
ERROR_KINDS = {
    "seen": "wrong value for a seen person",
    "unseen": "value for an unseen person",
    "invented": "value for an invented person",
}
SPLITS = ("fit", "calibration", "test")
SUBJECT = [1, 2]  # "<bos> First Last birthday": the name's two tokens
ATTRIBUTE = "birthday"
READOUT_FILE = "readouts.safetensors"
TRAINED = ("probe", "p_ik")
ABSTENTION_SIGNAL = "max_prob"  # the model's own confidence: the abstention rules' signal in the headlines
# `--model NAME` without --qa: the real-model track on Forma's real question set (lab.data.questions), for these
# pretrained zoo models
REAL_MODELS = {"smollm2": "SmolLM2-135M-Instruct, 4-bit GGUF dequantized"}


@dataclass(frozen=True)
class Profile:
    """What the default and quick runs differ in, each entry a field of Config of the same name; the real-model track
    samples, bootstraps and re-splits by the same k_samples, n_boot and n_resplits."""

    n_first_names: int
    n_last_names: int
    n_persons: int
    n_train: int
    n_invented: int  # name pairs that are no person
    d_model: int
    steps: int
    k_samples: int  # answers sampled at T = 1 for self-consistency and semantic entropy
    n_boot: int
    n_resplits: int  # random re-draws of the calibration / test subjects for the abstention rules' averages


# The world: Pareto(2) popularity and 2 draws per person leave ≈30% of the persons unseen; the model's training is
# short enough that persons seen once are only partly recalled.
DEFAULT = Profile(
    n_first_names=100,
    n_last_names=200,
    n_persons=1000,
    n_train=2000,
    n_invented=500,
    d_model=128,
    steps=300,
    k_samples=10,
    n_boot=1000,
    n_resplits=200,
)
QUICK = Profile(
    n_first_names=40,
    n_last_names=80,
    n_persons=600,
    n_train=1200,
    n_invented=300,
    d_model=64,
    steps=350,
    k_samples=6,
    n_boot=200,
    n_resplits=100,
)


@dataclass(frozen=True)
class RealProfile:
    """What the real-model track's default and quick runs differ in (experiments.monitor.real) beyond the Profile's
    k_samples, n_boot and n_resplits, each entry a field of Config of the same name."""

    n_questions: int  # short-answer questions drawn from the real question set


REAL_DEFAULT = RealProfile(n_questions=300)
REAL_QUICK = RealProfile(n_questions=120)


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------
@dataclass
class Config(ProfileConfig, ModelTraining):
    """The monitor experiment; `quick` swaps in the QUICK profile (a smaller world, model and bootstrap) and REAL_QUICK
    for every field of them left at its default. `model` + `qa`: the signals of a local model on a question–answer
    CSV instead; `model` alone (one of REAL_MODELS): the real-model track, on `n_questions` of Forma's real
    short-answer questions."""

    PROFILES = (DEFAULT, QUICK)
    REAL_PROFILES = (REAL_DEFAULT, REAL_QUICK)
    FIELDS = (True, True)  # the profile's entries are fields below, the real profile's too

    # a local HF folder (with its tokenizer), a zoo name or a Forma folder with `qa`; alone, a pretrained zoo model of
    # REAL_MODELS: the real-model track on the real question set
    model: str | None = None
    qa: str | None = None  # a question–answer CSV
    n_questions: int = REAL_DEFAULT.n_questions
    # the world
    n_first_names: int = DEFAULT.n_first_names
    n_last_names: int = DEFAULT.n_last_names
    n_persons: int = DEFAULT.n_persons
    n_train: int = DEFAULT.n_train
    pareto_gamma: float = 2.0
    n_invented: int = DEFAULT.n_invented
    # the model and its training
    d_model: int = DEFAULT.d_model
    steps: int = DEFAULT.steps
    # measurement
    split_fractions: tuple[float, float, float] = (0.4, 0.3, 0.3)  # fit, calibration, test (subjects)
    k_samples: int = DEFAULT.k_samples
    alphas: tuple[float, ...] = (0.05, 0.1, 0.2)
    ltt_delta: float = 0.1
    n_boot: int = DEFAULT.n_boot
    n_resplits: int = DEFAULT.n_resplits
    qa_max_new_tokens: int = 16
    qa_folds: int = 5  # --qa: the probe and P(IK) are cross-fitted over this many folds of questions
    threads: int = 1  # torch intra-op threads (tiny tensors: more threads cost more than they gain)
    hf_loader: str = "auto"  # --model: "auto" converts GPT-2/LLaMA (load_hf), bridges the rest; "bridge" always

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_model_training()
        for name in (
            "n_first_names",
            "n_last_names",
            "n_persons",
            "n_train",
            "n_invented",
            "steps",
            "k_samples",
            "n_boot",
            "qa_max_new_tokens",
            "threads",
            "n_resplits",
            "qa_folds",
            "n_questions",
        ):
            need(self, getattr(self, name) > 0, f"{name} must be a positive integer, got {getattr(self, name)!r}")
        need(self, self.qa_folds >= 2, f"qa_folds must be at least 2 (cross-fitting), got {self.qa_folds}")
        need(
            self,
            self.n_layers >= 2,
            f"n_layers must be at least 2 (a middle layer before the last), got {self.n_layers}",
        )
        need(
            self,
            self.n_persons + self.n_invented <= self.n_first_names * self.n_last_names,
            "n_persons + n_invented must fit in the first × last name grid",
        )
        need(
            self,
            0 <= self.warmup_steps <= self.steps,
            f"warmup_steps must lie in [0, steps], got {self.warmup_steps!r}",
        )
        need(self, self.pareto_gamma > 0, "pareto_gamma must be > 0")
        need(
            self,
            all(f > 0 for f in self.split_fractions) and abs(sum(self.split_fractions) - 1) < 1e-9,
            f"split_fractions (fit, calibration, test) must be positive and sum to 1, got {self.split_fractions}",
        )
        need(
            self,
            len(self.alphas) > 0 and all(0 < a < 1 for a in self.alphas),
            f"alphas must lie in (0, 1), got {self.alphas}",
        )
        need(self, 0 < self.ltt_delta < 1, f"ltt_delta must lie in (0, 1), got {self.ltt_delta!r}")
        self._check_model_options()

    def _check_model_options(self) -> None:
        """--model and what goes with it: the loader, --qa only with a model, a model without --qa one of
        REAL_MODELS."""
        need(
            self, self.hf_loader in ("auto", "bridge"), f"hf_loader must be 'auto' or 'bridge', got {self.hf_loader!r}"
        )
        need(
            self,
            self.qa is None or self.model is not None,
            "--qa needs --model: the monitor's signals on a local model with a question–answer CSV "
            "(the synthetic experiment trains its own model)",
        )
        need(
            self,
            self.model is None or self.qa is not None or self.model in REAL_MODELS,
            f"--model {self.model} needs --qa (a question–answer CSV); without it, --model is the real-model track "
            f"on Forma's real question set, for {', '.join(REAL_MODELS)}",
        )

    @property
    def real_track(self) -> bool:
        """The real-model track: a pretrained model of REAL_MODELS on the real question set (no --qa file)."""
        return self.model is not None and self.qa is None
