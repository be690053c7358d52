"""The calibration experiment's Config, its quick profile, and the constants every part shares."""

from dataclasses import dataclass

from experiments import ModelTraining
from lab.configs import apply_quick, check_fields, need
from lab.folders import PRETRAINED, zoo_names

N_OPTIONS = 4  # Kadavath et al. §3: lettered multiple choice with (A)–(D); chance = 1/4
EXPOSURE_BINS = ((0, 0, "0"), (1, 1, "1"), (2, 5, "2-5"), (6, None, "6+"))  # how often a fact was seen in training
QUICK = dict(
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


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------
@dataclass
class Config(ModelTraining):
    """The calibration experiment; `quick` swaps in a smaller world, model and training (QUICK) for every
    field left at its default. `model` + `mmlu`: lettered multiple choice on a local HF model instead."""

    seed: int = 0
    quick: bool = False
    model: str | None = None  # a local HF folder (with its tokenizer), a zoo name or a Forma folder
    mmlu: str | None = None  # an MMLU-layout CSV: question, A, B, C, D, answer
    # the world: Pareto(2) popularity and 2,000 draws leave ≈30% of 1,000 persons unseen, ≈34% seen once
    n_first_names: int = 100
    n_last_names: int = 200
    n_persons: int = 1000
    n_train: int = 2000
    pareto_gamma: float = 2.0
    format_share: float = 0.3  # share of seen persons whose quizzes and True/False claims are trained
    quiz_copies: int = 2  # quizzes per format person (fresh options and order each)
    # the model and its training
    steps: int = 720
    n_stages: int = 12  # equal training stages, each followed by the held-out NLL and the recall of seen persons
    partial_recall: float = 0.6  # the partial checkpoint: the stage whose recall of the format persons is nearest this
    n_heldout: int = 1000  # independent i.i.d. statements from p (not unseen facts) for the held-out NLL
    # measurement
    calibration_share: float = 0.5  # evaluation persons whose items fit T (the rest are the test split)
    p_true_samples: int = 2  # sampled answers per person judged True/False
    probe_test_fraction: float = 0.3  # persons (items) whose rows report every readout: the test split
    probe_validation_fraction: float = 0.3  # persons (items) on which readouts are chosen; the rest fit the probes
    mlp_steps: int = 200
    mlp_decays: tuple[float, ...] = (1e-3, 1e-1)  # the MLP probes' weight-decay grid (cross-validated)
    probe_folds: int = 3
    n_boot: int = 500
    token_windows: int = 32  # held-out pydoc windows of n_ctx tokens for token-level calibration
    threads: int = 1  # torch intra-op threads (tiny tensors: more threads cost more than they gain)
    hf_loader: str = (
        "auto"  # --model: "auto" converts the families Forma supports (load_hf), bridges the rest; "bridge" always
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if self.quick:
            apply_quick(self, QUICK)

        need(self, self.seed >= 0, f"seed must be a non-negative integer, got {self.seed!r}")
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
