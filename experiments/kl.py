"""The KL decomposition, measured exactly on a world with known truth (issue 4; SCIENCE.md §1).

For data drawn from p, a model's expected loss splits exactly as

    E_{x~p}[−log P_θ(x_{t+1} | x_≤t)] = H(p(·|x_≤t)) + KL(p(·|x_≤t) ‖ P_θ(·|x_≤t)),

and training can only shrink the KL term. On a source whose conditionals p(·|prefix) are computable
both terms are measured, over held-out prefixes x_≤t ~ p, in two ways:

* exact, per prefix: H_t, KL_t and CE_t = −Σ_x p(x|x_≤t) log P_θ(x|x_≤t) from the source's conditionals
  and the model's softmax, in float64 (lab.metrics.information);
* sampled: CE = mean −log P_θ(x_{t+1}|x_≤t) from the model's own log-softmax at the token that came,
  Ĥ = mean −log p(x_{t+1}|x_≤t), KL̂ = CE − Ĥ, with standard errors from the per-sequence means (tokens of
  one sequence are correlated, sequences are independent). E_{x_{t+1}~p}[−log P_θ] = CE_t and
  E[log p/P_θ] = KL_t, so the sampled CE must meet H + KL and KL̂ must meet KL within their errors: checks
  that share only the held-out tokens, and fail when the conditionals are not the sampler's. (CE − H − KL
  from the same xlogy terms is 0 by algebra, and is not reported as a check.)

Averages are over like prefixes. For an order-k chain a prefix of length ≥ k is a complete context, drawn
from the stationary law π, so E[H_t] there is the entropy rate Σ_c π(c)·H(p(·|c)): CE over complete
contexts is what the rate belongs beside, and the closed-form rate is checked against the mean H over
those prefixes (within 3 standard errors). The first positions (prefix length < k) condition through π's
marginals and have a larger entropy; they are reported apart ("first"), and the mix of both as "all".
The hidden-Markov source has no finite order: its rows are over every position, and its entropy rate (a
limit) is not set beside them.

The run:
1. trains the world's model and measures both at ≥ 10 log-spaced checkpoints;
2. at the last one, the ground-truth lens KL(p ‖ P^(l)) with P^(l) = softmax(LN_final(x^(l)) W_U + b_U)
   for every layer's accumulated residual stream x^(l) (the final norm recomputed on each; the last row is
   the model itself), and KL by position;
3. KL(p ‖ softmax(z/T)) over a grid of temperatures, and the minimising T (golden section: the KL is
   convex in β = 1/T, since −log softmax(βz)_x = logsumexp(βz) − βz_x);
4. models of several widths trained on the same tokens, and the fit L(N) = E + A·N^(−α) (Kaplan et al.
   2020; Hoffmann et al. 2022 eq. 2 at a fixed token budget) with E ≥ 0 its only constraint and a 95%
   profile interval for E, beside the true entropy rate and the held-out entropy (an E below the latter
   extrapolates to a loss no model reaches, and is reported so): E is the loss no model size removes;
5. step 1 again on a hidden-Markov source (exact conditionals by forward filtering).

The world of steps 1–3 is the `markov` recipe as it is: an order-2 chain over 32 symbols with
Dirichlet(0.5) rows (entropy rate 2.775 nats), whose next token is a lookup over 1,024 random laws with
almost no signal in either token alone (the best bigram model is 0.662 nats from p). Its KL curve shows
the plateau at that bigram level and the escape from it, once the model has found the previous token;
the lens shows at which layer the second token's information arrives. Profiles change only the number
of steps (and, quick, the width); the quick scaling sweep trains the default's seven widths for a third of
the steps, so its fit still has an interval that can place E. `headlines(results)` says what a run shows,
and why not where it cannot (results.json "headlines").

The scaling sweep (step 4) needs a chain that every width from 4 to 64 learns at one fixed budget:
on the order-2 chain widths ≤ 16 never leave the plateau, so the curve is a step, and the seven
widths at the recipe's 3,000 steps alone take longer than the whole 10-minute budget (measured). It
runs on the same 32 symbols at order 1 (`SCALING_WORLD`, entropy rate 2.750 nats) with a small fixed
model and schedule (`SCALING_MODEL`, `SCALING_TRAIN`); results.json names that world beside its fit.
The hidden-Markov source (8 states, 32 symbols, concentration 0.1) is chosen so that history
matters: its stationary marginal has entropy 2.716 nats against a rate of ≈ 2.29, and H_t falls from
2.40 at the first position.

Training data are fresh draws, one sequence per batch row (steps × batch_size sequences, never
repeated), so the KL falls with tokens seen rather than with memorisation, and the held-out prefixes
are a separate draw. Artefacts in `out`: results.json (the runner), figures kl_decomposition, lens,
kl_by_position, temperature, scaling and hmm (plotly .json + offline .html), models/markov and
models/hmm (the final weights) and train/<name>/metrics.jsonl.
"""

import dataclasses
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from lab.analysis.lens import ground_truth_lens as lens_against_truth
from lab.configs import check_fields
from lab.data.sources import HiddenMarkovSource, MarkovSource
from lab.metrics.information import (T_BRACKET, T_GRID, cross_entropy, entropy, kl, temperature_kl,  # noqa: F401
                                    temperature_scan, to_bits, truncated_context_kl_of)
from lab.metrics.scaling import ALPHA_RANGE, fit_power_law  # noqa: F401 (experiments.kl.fit_power_law still works)
from lab.metrics.statistics import sign, t_quantile_975  # noqa: F401
from lab.model import HookedTransformer, ModelConfig
from lab.parallel import run_tasks
from lab.runs import headline, save_figure
from lab.train import SequenceBatches, TrainConfig, train
from lab.zoo import load_recipe, make_source

Source = MarkovSource | HiddenMarkovSource
RECIPE = "markov"
FIGURES = ("kl_decomposition", "lens", "kl_by_position", "temperature", "scaling", "hmm")
# The limit on |z| for a family of sampled-against-exact comparisons (one per checkpoint, region and
# check, ≈ 70 in the default run): at 4 standard errors the chance that any one of 70 fair comparisons
# exceeds it is ≈ 0.4% (2·Φ(−4) ≈ 6.3e-5 each); at 3 it would be ≈ 17%.
FAMILY_Z = 4.0


# ============================================================================================
# Configuration
# ============================================================================================
# The scaling sweep's chain and setting (see the module docstring): the `markov` recipe's symbols and
# Dirichlet rows at order 1, a 2-layer model with learned positions, 32 × 64 tokens a step.
SCALING_WORLD = {"kind": "markov", "vocab_size": 32, "order": 1, "concentration": 0.5, "seed": 0}
SCALING_MODEL = {"n_layers": 2, "n_heads": 4, "n_ctx": 64, "positions": "learned", "mlp": "gelu",
                 "norm": "layernorm"}
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
    n_checkpoints=12, eval_sequences=1024,
    scaling_d_models=(4, 8, 12, 16, 24, 32, 64), scaling_steps=600,
    hmm_world={"kind": "hmm", "n_states": 8, "vocab_size": 32, "concentration": 0.1, "seed": 0},
    hmm_steps=500,
)
# Quick is the default at a smaller size: every width of the scaling sweep (seven points, so the fit has
# four degrees of freedom and an interval that can place E), a third of its steps.
QUICK = Profile(
    world={},
    model={"d_model": 32},
    train={"steps": 300, "warmup_steps": 20},
    n_checkpoints=10, eval_sequences=256,
    scaling_d_models=(4, 8, 12, 16, 24, 32, 64), scaling_steps=200,
    hmm_world={"kind": "hmm", "n_states": 8, "vocab_size": 32, "concentration": 0.1, "seed": 0},
    hmm_steps=150,
)


@dataclass
class Config:
    """The kl experiment: `seed` seeds the models, the batch order and every sample drawn from the worlds
    (the worlds themselves are the recipe's); `quick` is the small profile for tests and the demo."""

    seed: int = 0
    quick: bool = False
    workers: int = 2  # processes for the independent trainings (lab.parallel); results do not depend on it

    def __post_init__(self) -> None:
        check_fields(self)
        if self.seed < 0:
            raise ValueError(f"Config.seed must be a non-negative integer, got {self.seed!r}")
        if self.workers < 1:
            raise ValueError(f"Config.workers must be a positive integer, got {self.workers!r}")

    @property
    def profile(self) -> Profile:
        return QUICK if self.quick else DEFAULT


def _sample_seed(seed: int, purpose: str) -> int:
    """A seed for one named stream of draws, decorrelated from the others by SeedSequence hashing."""
    purposes = ("markov-train", "markov-val", "markov-eval", "hmm-train", "hmm-val", "hmm-eval", "hmm-rate",
                "scaling-train", "scaling-val", "scaling-eval")
    return int(np.random.SeedSequence([seed, purposes.index(purpose)]).generate_state(1)[0])


# ============================================================================================
# Measurements
# ============================================================================================
@dataclass
class HeldOut:
    """Held-out sequences and their exact next-token laws: what every measurement is compared with."""

    tokens: Int[Tensor, "seq pos"]
    p: Float[Tensor, "seq pos-1 vocab"]  # p(x_{t+1} = · | x_≤t) for t = 0 … pos − 2, float64
    # First t whose prefix x_≤t is a complete context (prefix length ≥ the chain's order: t = order − 1).
    # From there on the context is π-distributed, so E[H_t] is the entropy rate; earlier positions condition
    # through π's marginals and have a larger entropy. None for a source of no finite order (hidden Markov).
    complete_from: int | None

    @classmethod
    def draw(cls, source: Source, n: int, length: int, seed: int) -> "HeldOut":
        tokens = source.sample(n, length, seed=seed)
        p = torch.from_numpy(source.conditionals(tokens)[:, :-1])
        order = getattr(source, "order", None)
        return cls(torch.from_numpy(tokens), p, None if order is None else order - 1)

    @property
    def n_prefixes(self) -> int:
        return self.p.shape[0] * self.p.shape[1]

    def regions(self) -> dict[str, slice]:
        """The prefix positions each reported average runs over: "all", and for a Markov chain "complete"
        (prefix length ≥ order) and "first" (the shorter prefixes before it)."""
        if self.complete_from is None:
            return {"all": slice(None)}
        return {"all": slice(None), "complete": slice(self.complete_from, None), "first": slice(0, self.complete_from)}


@torch.inference_mode()
def model_logits(model: HookedTransformer, tokens: Int[Tensor, "seq pos"],
                 batch: int = 256) -> Float[Tensor, "seq pos-1 vocab"]:
    """The model's logits at every prefix that has a next token, in float64."""
    model.eval()
    return torch.cat([model(tokens[i:i + batch])[:, :-1].double() for i in range(0, len(tokens), batch)])


@dataclass
class Decomposition:
    """Per-prefix exact terms and per-token sampled terms, in nats."""

    entropy: Float[Tensor, "seq pos"]  # H_t = H(p(·|x_≤t))
    kl: Float[Tensor, "seq pos"]  # KL_t = KL(p(·|x_≤t) ‖ P_θ(·|x_≤t))
    cross_entropy: Float[Tensor, "seq pos"]  # CE_t = −Σ p log P_θ
    nll_model: Float[Tensor, "seq pos"]  # −log P_θ(x_{t+1} | x_≤t) at the token that came
    nll_true: Float[Tensor, "seq pos"]  # −log p(x_{t+1} | x_≤t) at the token that came


def decompose(logits: Float[Tensor, "seq pos vocab"], held_out: HeldOut) -> Decomposition:
    """Both measurements of CE = H + KL at every held-out prefix."""
    q = torch.softmax(logits, dim=-1)
    target = held_out.tokens[:, 1:, None]
    return Decomposition(
        entropy=entropy(held_out.p), kl=kl(held_out.p, q), cross_entropy=cross_entropy(held_out.p, q),
        nll_model=-torch.log_softmax(logits, dim=-1).gather(-1, target)[..., 0],
        nll_true=-held_out.p.gather(-1, target)[..., 0].log())


def _paired(values: Float[Tensor, "seq pos"]) -> tuple[float, float]:
    """Mean over prefixes, and its standard error from the per-sequence means (tokens of one sequence are
    correlated, sequences are independent)."""
    per_sequence = values.mean(dim=1)
    n = per_sequence.shape[0]
    se = float(per_sequence.std(correction=1) / math.sqrt(n)) if n > 1 else math.nan
    return float(values.mean()), se


def _z(difference: float, se: float) -> float:
    return difference / se if se > 0 else (0.0 if difference == 0 else math.copysign(math.inf, difference))


def summarise(d: Decomposition, region: slice = slice(None)) -> dict[str, float]:
    """Means over the prefixes of `region` (positions t), exact and sampled, with two checks that could fail:

    * the sampled CE, −log P_θ at the token that came from the model's own log-softmax, against the exact
      CE_t = H_t + KL_t from the source's conditionals and the model's softmax: E[−log P_θ(x_{t+1})|x_≤t] = CE_t,
      so their paired difference has mean 0 (`sampled_ce_minus_exact_in_se`);
    * the sampled KL̂ = mean(−log P_θ + log p) against the exact KL (`sampled_minus_exact_in_se`).
    Both paths share only the held-out tokens: a model read at the wrong position, conditionals that are not
    the sampler's, or a wrong log-softmax moves them apart.
    """
    entropy, kl_t, ce = d.entropy[:, region], d.kl[:, region], d.cross_entropy[:, region]
    nll_model, nll_true = d.nll_model[:, region], d.nll_true[:, region]
    exact_kl, exact_ce = float(kl_t.mean()), float(ce.mean())
    sampled_kl, se = _paired(nll_model - nll_true)
    ce_gap, ce_se = _paired(nll_model - (entropy + kl_t))
    return {
        "prefixes": int(entropy.numel()),
        "cross_entropy_nats": exact_ce, "entropy_nats": float(entropy.mean()), "kl_nats": exact_kl,
        "sampled_cross_entropy_nats": float(nll_model.mean()), "sampled_entropy_nats": float(nll_true.mean()),
        "sampled_kl_nats": sampled_kl, "sampled_kl_se": se, "sampled_minus_exact_in_se": _z(sampled_kl - exact_kl, se),
        "sampled_ce_minus_exact_nats": ce_gap, "sampled_ce_se": ce_se,
        "sampled_ce_minus_exact_in_se": _z(ce_gap, ce_se),
    }


def summarise_regions(d: Decomposition, held_out: HeldOut) -> dict[str, Any]:
    """`summarise` over every region of the held-out prefixes ("all", "complete", "first"), each with the
    prefix lengths it covers."""
    length = d.entropy.shape[1]
    out = {}
    for name, region in held_out.regions().items():
        start, stop, _ = region.indices(length)
        if stop > start:
            out[name] = summarise(d, region) | {"prefix_lengths": [start + 1, stop]}
    return out


def entropy_rate_check(entropy: Float[Tensor, "seq pos"], rate: float, complete_from: int) -> dict[str, Any]:
    """The closed-form entropy rate Σ_c π(c)·H(p(·|c)) against the mean of H_t over the held-out prefixes with
    a complete context, which start π-distributed: E[H_t] = rate exactly there. Two computations that share
    nothing but the chain (π by power iteration and the transition rows, against the sampler and
    `conditionals`); the check passes when they agree within 3 standard errors of the sample mean."""
    mean, se = _paired(entropy[:, complete_from:])
    z = _z(mean - rate, se)
    return {"entropy_rate_nats": rate, "mean_complete_context_entropy_nats": mean, "se": se, "z": z,
            "within_3se": bool(abs(z) <= 3)}


def measure(model: HookedTransformer, held_out: HeldOut) -> dict[str, Any]:
    return summarise_regions(decompose(model_logits(model, held_out.tokens), held_out), held_out)


@torch.inference_mode()
def ground_truth_lens(model: HookedTransformer, held_out: HeldOut, batch: int = 256) -> list[dict[str, Any]]:
    """Mean KL(p ‖ P^(l)) over the held-out prefixes of every region for the logit lens at every layer's input
    and after the last layer (lab.analysis.lens.ground_truth_lens: P^(l) = softmax(LN_final(x^(l)) W_U + b_U),
    the final norm recomputed on x^(l)). `kl_nats` is over complete contexts where the source has them (else
    every position)."""
    model.eval()
    n_layers = model.cfg.n_layers
    total = torch.zeros(n_layers + 1, held_out.p.shape[1], dtype=torch.float64)  # [layer, position]
    for i in range(0, len(held_out.tokens), batch):
        # p covers the prefixes that end before the last token: the lens of those prefixes, the last one dropped.
        lens = lens_against_truth(model, held_out.tokens[i:i + batch, :-1], held_out.p[i:i + batch])
        total += lens.kl_nats.sum(dim=1)
    per_position = total / len(held_out.tokens)
    regions = held_out.regions()
    headline = "complete" if "complete" in regions else "all"
    labels = [f"{layer}_pre" for layer in range(n_layers)] + ["final_post"]
    return [{"layer": layer, "label": labels[layer], "kl_nats": float(per_position[layer, regions[headline]].mean()),
             **{f"kl_{name}_nats": float(per_position[layer, region].mean()) for name, region in regions.items()
                if per_position[layer, region].numel()}}
            for layer in range(n_layers + 1)]


def kl_by_position(d: Decomposition, held_out: HeldOut) -> list[dict[str, Any]]:
    """Mean KL_t and H_t over sequences for each prefix length t + 1, and whether that prefix is a complete
    context (prefix length ≥ the chain's order)."""
    kls, hs = d.kl.mean(dim=0), d.entropy.mean(dim=0)
    start = held_out.complete_from
    return [{"prefix_length": t + 1, "kl_nats": float(kls[t]), "entropy_nats": float(hs[t]),
             "complete_context": None if start is None else t >= start} for t in range(len(kls))]


# ============================================================================================
# Training with checkpoints
# ============================================================================================
def log_spaced_steps(steps: int, n: int) -> list[int]:
    """n distinct steps, geometrically spaced from ≈ steps/200 to steps (fewer only if steps < n)."""
    first = max(1, steps // 200)
    points = np.unique(np.round(np.geomspace(first, steps, n)).astype(int))
    while len(points) < min(n, steps):  # rounding merged some: fill in from the start
        points = np.unique(np.r_[points, np.setdiff1d(np.arange(1, steps + 1), points)[0]])
    return [int(s) for s in points]


def train_with_checkpoints(model: HookedTransformer, cfg: TrainConfig, data: SequenceBatches, held_out: HeldOut,
                           n_checkpoints: int, workdir: Path) -> list[dict[str, Any]]:
    """Train on cfg's schedule, stopping at log-spaced steps to measure (resuming from the checkpoint)."""
    rows = []
    for i, step in enumerate(log_spaced_steps(cfg.steps, n_checkpoints)):
        train(model, cfg, data, out_dir=workdir, resume=i > 0, progress=False, stop_after=step)
        rows.append({"step": step, "tokens_seen": step * cfg.batch_size * cfg.seq_len, **measure(model, held_out)})
    shutil.rmtree(workdir / "checkpoint", ignore_errors=True)  # optimizer state: the weights are saved apart
    return rows


def sequences(source: Source, cfg: TrainConfig, seed: int, purpose: str) -> SequenceBatches:
    """Fresh training sequences, one per batch row of the whole schedule, and a small validation draw."""
    train_tokens = source.sample(cfg.steps * cfg.batch_size, cfg.seq_len, seed=_sample_seed(seed, f"{purpose}-train"))
    val_tokens = source.sample(64, cfg.seq_len, seed=_sample_seed(seed, f"{purpose}-val"))
    return SequenceBatches(torch.from_numpy(train_tokens), torch.from_numpy(val_tokens))


# ============================================================================================
# The run
# ============================================================================================
def run(cfg: Config, out: Path) -> dict[str, Any]:
    """Run the experiment into `out` and return what becomes results.json. The Markov model (steps 1–3), the
    hidden-Markov model (5) and each width of the scaling sweep (4) train independently: `cfg.workers`
    processes share them out (lab.parallel), and the results do not depend on how many."""
    out = Path(out)
    clock = time.perf_counter()
    profile = cfg.profile
    widths = sorted(set(profile.scaling_d_models), reverse=True)  # the widest first: the longest tasks lead
    tasks = [(markov_part, cfg, out), (hmm_part, cfg, out)] + [(scaling_point, profile, cfg.seed, d) for d in widths]
    # Every tensor here is tiny: on shared cores one intra-op thread is several times faster than two
    # (measured), so each task runs on one, here as in a worker, and the caller's setting comes back.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        markov, hmm, *points = run_tasks(tasks, workers=cfg.workers, threads=1)
    finally:
        torch.set_num_threads(threads)
    scaling = scaling_fit(sorted(points, key=lambda p: p["d_model"]), profile, cfg.seed)
    seconds = markov.pop("seconds") | hmm.pop("seconds") | {"scaling": sum(p.pop("seconds") for p in points)}

    results: dict[str, Any] = markov | {"scaling": scaling} | hmm
    results["acceptance"] = acceptance(results)
    results["headlines"] = headlines(results)
    began = time.perf_counter()
    results["figures"] = write_figures(out, results)
    seconds["figures"] = time.perf_counter() - began
    # Each part's own time (in its worker), and the run's wall time: with workers > 1 the parts overlap.
    results["seconds"] = seconds | {"total": time.perf_counter() - clock}
    results["profile"] = dataclasses.asdict(profile)
    return results


def _markov_setting(cfg: Config) -> tuple[MarkovSource, TrainConfig, ModelConfig]:
    """The recipe's world, training schedule and architecture with the profile's changes, for steps 1–3 and
    (the same schedule and architecture) step 5."""
    profile = cfg.profile
    recipe = load_recipe(RECIPE)
    world = recipe["world"] | profile.world
    steps = profile.train.get("steps", recipe["train"]["steps"])
    # One evaluation of train's own (small) validation loss per stage; the measurements here are ours.
    train_cfg = TrainConfig.from_dict(recipe["train"] | profile.train | {
        "seed": cfg.seed, "eval_interval": steps, "eval_batches": 2, "checkpoint_interval": 0})
    architecture = recipe["model"] | profile.model | {"d_vocab": world["vocab_size"],
                                                      "tokenizer": f"{RECIPE}-{world['vocab_size']}"}
    return make_source(world), train_cfg, ModelConfig.from_dict(architecture)


def markov_part(cfg: Config, out: Path) -> dict[str, Any]:
    """Steps 1–3 on the Markov source: checkpoints, then lens, KL by position and temperature at the last."""
    profile = cfg.profile
    seconds: dict[str, float] = {}
    clock = time.perf_counter()
    source, train_cfg, model_cfg = _markov_setting(cfg)
    held_out = HeldOut.draw(source, profile.eval_sequences, train_cfg.seq_len, _sample_seed(cfg.seed, "markov-eval"))
    data = sequences(source, train_cfg, cfg.seed, "markov")
    seconds["data"] = time.perf_counter() - clock

    # 1. Checkpoints on the Markov source.
    clock = time.perf_counter()
    model = HookedTransformer(model_cfg, seed=cfg.seed)
    checkpoints = train_with_checkpoints(model, train_cfg, data, held_out, profile.n_checkpoints, out / "train" / "markov")
    model.save(out / "models" / "markov")
    seconds["markov_checkpoints"] = time.perf_counter() - clock

    # 2–3. Lens, position, temperature at the final checkpoint.
    clock = time.perf_counter()
    logits = model_logits(model, held_out.tokens)
    final = decompose(logits, held_out)
    lens = ground_truth_lens(model, held_out)
    by_position = kl_by_position(final, held_out)
    complete = slice(held_out.complete_from, None)
    temperature, temperature_min = temperature_scan(logits[:, complete], held_out.p[:, complete])
    rate = source.entropy_rate()
    rate_check = entropy_rate_check(final.entropy, rate, held_out.complete_from)
    seconds["lens_position_temperature"] = time.perf_counter() - clock

    order = source.order
    return {
        "source": {**source.to_dict(), "entropy_rate_nats": rate, "entropy_rate_bits": to_bits(rate),
                   **{f"best_{name}_kl_nats": truncated_context_kl(source, width)
                      for name, width in (("unigram", 0), ("bigram", 1)) if width < order},
                   "recipe": RECIPE, "changed_from_recipe": profile.world},
        "regions": {
            "complete": f"prefix lengths ≥ {order}, the chain's order: a complete, π-distributed context, where "
                        f"E[H_t] is the entropy rate; CE over these prefixes is what the rate belongs beside",
            "first": f"{_lengths(1, order - 1)}: shorter than the chain's order, conditioned through π's "
                     f"marginals, so H_t there exceeds the rate (reported apart, never mixed in)",
            "all": "every held-out prefix, complete or not",
        },
        "model": {"n_params": model_cfg.n_params(), **model_cfg.to_dict()},
        "train": train_cfg.to_dict() | {"train_sequences": len(data.sequences["train"])},
        "eval": {"sequences": profile.eval_sequences, "prefixes": held_out.n_prefixes,
                 "complete_prefixes": held_out.p[:, complete].shape[0] * held_out.p[:, complete].shape[1]},
        "checkpoints": checkpoints,
        "entropy_rate_check": rate_check,
        "lens": lens,
        "kl_by_position": by_position,
        "temperature": temperature,
        "temperature_min": temperature_min,
        "seconds": seconds,
    }


def hmm_part(cfg: Config, out: Path) -> dict[str, Any]:
    """Step 5: the checkpoints of step 1 on the hidden-Markov source, and its entropy rate's estimate."""
    profile = cfg.profile
    clock = time.perf_counter()
    _, train_cfg, model_cfg = _markov_setting(cfg)
    hmm_source = make_source(profile.hmm_world)
    hmm_train = train_cfg.replace(steps=profile.hmm_steps, eval_interval=profile.hmm_steps,
                                  warmup_steps=min(train_cfg.warmup_steps, profile.hmm_steps))
    hmm_held_out = HeldOut.draw(hmm_source, profile.eval_sequences, hmm_train.seq_len, _sample_seed(cfg.seed, "hmm-eval"))
    hmm_model = HookedTransformer(dataclasses.replace(model_cfg, d_vocab=hmm_source.vocab_size,
                                                      tokenizer=f"hmm-{hmm_source.vocab_size}"), seed=cfg.seed)
    hmm = train_with_checkpoints(hmm_model, hmm_train, sequences(hmm_source, hmm_train, cfg.seed, "hmm"), hmm_held_out,
                                 profile.n_checkpoints, out / "train" / "hmm")
    hmm_model.save(out / "models" / "hmm")
    hmm_rate = hmm_source.entropy_rate_estimate(512, 256, seed=_sample_seed(cfg.seed, "hmm-rate"))
    return {
        "hmm": hmm,
        "hmm_source": {**hmm_source.to_dict(), "entropy_rate_estimate_nats": hmm_rate.value,
                       "entropy_rate_estimate_se": hmm_rate.standard_error,
                       "entropy_rate_estimate_note": "Monte Carlo over positions ≥ 128 of 512 sequences of 256 "
                                                     "tokens; biased upward by at most H_128 − rate. A limit no "
                                                     f"held-out prefix (lengths 1 … {hmm_train.seq_len - 1}) reaches: "
                                                     "not comparable with their CE"},
        "seconds": {"hmm": time.perf_counter() - clock},
    }


def truncated_context_kl(source: MarkovSource, width: int) -> float:
    """KL(p ‖ best predictor that sees only the last `width` tokens) over π-distributed complete contexts:
    H(X_{t+1} | last width tokens) − rate, exactly, from the joint π(c)·p(x|c)."""
    joint = source.stationary()[:, None] * source.transition  # [context, next]
    return float(truncated_context_kl_of(joint, source.vocab_size, width))


def _scaling_setting(profile: Profile, seed: int) -> tuple[MarkovSource, TrainConfig, HeldOut]:
    source = make_source(SCALING_WORLD)
    train_cfg = TrainConfig.from_dict(SCALING_TRAIN | {
        "steps": profile.scaling_steps, "seed": seed, "eval_interval": profile.scaling_steps, "eval_batches": 2})
    held_out = HeldOut.draw(source, profile.eval_sequences, train_cfg.seq_len, _sample_seed(seed, "scaling-eval"))
    return source, train_cfg, held_out


def scaling_point(profile: Profile, seed: int, d_model: int) -> dict[str, Any]:
    """One width of the sweep trained on the sweep's tokens: its exact held-out loss over complete contexts
    (for an order-k chain, prefix length ≥ k), whose entropy term has the entropy rate as its expectation."""
    clock = time.perf_counter()
    source, train_cfg, held_out = _scaling_setting(profile, seed)
    data = sequences(source, train_cfg, seed, "scaling")
    architecture = SCALING_MODEL | {"d_vocab": SCALING_WORLD["vocab_size"], "tokenizer": f"markov-{SCALING_WORLD['vocab_size']}"}
    full = slice(held_out.complete_from, None)
    model = HookedTransformer(ModelConfig.from_dict(architecture | {
        "d_model": d_model, "n_heads": _heads_for(d_model, architecture["n_heads"])}), seed=seed)
    train(model, train_cfg, data, progress=False)
    d = decompose(model_logits(model, held_out.tokens), held_out)
    return {"d_model": d_model, "n_params": model.cfg.n_params(),
            "loss_nats": float(d.cross_entropy[:, full].mean()),
            "kl_nats": float(d.kl[:, full].mean()), "eval_entropy_nats": float(d.entropy[:, full].mean()),
            "seconds": time.perf_counter() - clock}


def scaling_fit(points: list[dict[str, Any]], profile: Profile, seed: int) -> dict[str, Any]:
    """The fit L(N) = E + A·N^(−α) over the widths' points, beside the true rate and the held-out entropy."""
    source, train_cfg, held_out = _scaling_setting(profile, seed)
    full = slice(held_out.complete_from, None)
    eval_entropy, eval_entropy_se = _paired(entropy(held_out.p[:, full]))
    fit = fit_power_law([p["n_params"] for p in points], [p["loss_nats"] for p in points])
    low, high = fit["E_ci95"]
    return {"points": points, **fit, "tokens": train_cfg.steps * train_cfg.batch_size * train_cfg.seq_len,
            "source": source.to_dict(), "true_entropy_nats": source.entropy_rate(),
            # No model's expected loss is below the held-out entropy: an E under it extrapolates past the truth.
            "heldout_entropy_nats": eval_entropy, "heldout_entropy_se": eval_entropy_se,
            "E_minus_heldout_entropy_nats": fit["E_nats"] - eval_entropy,
            "E_ci95_below_heldout_entropy": bool(high < eval_entropy) if math.isfinite(high) else None,
            "model": SCALING_MODEL, "train": train_cfg.to_dict()}


def _heads_for(d_model: int, most: int) -> int:
    """The most heads (≤ `most`) that split d_model into heads of an even width (ModelConfig checks the
    rotary width, d_head by default, to be even even where positions are learned)."""
    return max(h for h in range(1, most + 1) if d_model % h == 0 and (d_model // h) % 2 == 0)


def acceptance(results: dict[str, Any]) -> dict[str, Any]:
    """The issue's acceptance numbers, computed from the results: the Markov quantities over complete
    contexts (where the entropy rate is E[H_t]), the hidden-Markov ones over every position."""
    rate = results["source"]["entropy_rate_nats"]
    final_kl = results["checkpoints"][-1]["complete"]["kl_nats"]
    scaling, T = results["scaling"], results["temperature_min"]["T"]
    low, high = scaling["E_ci95"]
    scaling_rate = scaling["true_entropy_nats"]  # the sweep's own chain
    rows = [r[region] for r in results["checkpoints"] for region in ("complete", "first")] + \
        [r["all"] for r in results["hmm"]]
    return {
        "final_kl_over_entropy_rate": final_kl / rate, "final_kl_below_5pct": final_kl < 0.05 * rate,
        "min_T": T, "min_T_in_0.8_1.25": 0.8 <= T <= 1.25,
        "E_nats": scaling["E_nats"], "E_ci95": scaling["E_ci95"], "E_ci95_open": scaling.get("E_ci95_open"),
        "true_entropy_nats": scaling_rate,
        "true_entropy_in_E_ci95": bool(low <= scaling_rate <= high), "E_minus_true_nats": scaling["E_nats"] - scaling_rate,
        "entropy_rate_within_3se": results["entropy_rate_check"]["within_3se"],
        "sampled_within_3se": all(abs(r["sampled_minus_exact_in_se"]) <= 3 for r in rows),
        "max_abs_sampled_minus_exact_in_se": max(abs(r["sampled_minus_exact_in_se"]) for r in rows),
        "sampled_ce_within_3se": all(abs(r["sampled_ce_minus_exact_in_se"]) <= 3 for r in rows),
        "max_abs_sampled_ce_minus_exact_in_se": max(abs(r["sampled_ce_minus_exact_in_se"]) for r in rows),
        "kl_last_below_first": final_kl < results["checkpoints"][0]["complete"]["kl_nats"],
        "hmm_kl_last_below_first": results["hmm"][-1]["all"]["kl_nats"] < results["hmm"][0]["all"]["kl_nats"],
    }


def _lengths(first: int, last: int) -> str:
    return f"prefix length {first}" if first == last else f"prefix lengths {first} … {last}"


def headlines(results: dict[str, Any]) -> list[dict[str, Any]]:
    """What the run shows, one sentence each, computed from the rest of results: {name, sentence, value,
    interval, direction (must agree between the quick and default profiles), supported, why_not}. A headline
    the run cannot support is kept, unsupported, with the reason in words."""
    rate = results["source"]["entropy_rate_nats"]
    first, last = results["checkpoints"][0]["complete"], results["checkpoints"][-1]["complete"]
    early = results["checkpoints"][-1].get("first")
    check = results["entropy_rate_check"]
    scaling, best = results["scaling"], results["temperature_min"]
    lens = results["lens"]
    hmm_first, hmm_last = results["hmm"][0]["all"], results["hmm"][-1]["all"]
    rows = [r[region] for r in results["checkpoints"] for region in ("complete", "first") if region in r] + \
        [r["all"] for r in results["hmm"]]
    worst_kl = max(abs(r["sampled_minus_exact_in_se"]) for r in rows)
    worst_ce = max(abs(r["sampled_ce_minus_exact_in_se"]) for r in rows)
    se = last["sampled_kl_se"]
    out = [
        headline("kl_falls", f"Training shrinks KL(p ‖ P_θ) over complete contexts from {first['kl_nats']:.3f} to "
                              f"{last['kl_nats']:.3f} nats/token ({last['kl_nats'] / rate:.1%} of the entropy rate "
                              f"{rate:.4f}), while CE {last['cross_entropy_nats']:.4f} stays above H "
                              f"{last['entropy_nats']:.4f}.",
                  last["kl_nats"], [last["sampled_kl_nats"] - 1.96 * se, last["sampled_kl_nats"] + 1.96 * se],
                  sign(last["kl_nats"] - first["kl_nats"])),
        headline("sampled_matches_exact",
                  f"The sampled paths agree with the exact ones at every checkpoint and region: the model's own "
                  f"−log P_θ at the sampled tokens against H + KL from the exact distributions (worst "
                  f"|z| = {worst_ce:.2f}), and KL̂ against KL (worst |z| = {worst_kl:.2f}); over these "
                  f"{2 * len(rows)} comparisons the limit is |z| ≤ {FAMILY_Z}.",
                  max(worst_ce, worst_kl), None, bool(worst_ce <= FAMILY_Z and worst_kl <= FAMILY_Z)),
        headline("entropy_rate_check",
                  f"The closed-form entropy rate {rate:.4f} nats matches the mean H over complete-context held-out "
                  f"prefixes, {check['mean_complete_context_entropy_nats']:.4f} ± {check['se']:.4f} (z = "
                  f"{check['z']:.2f}).", check["mean_complete_context_entropy_nats"],
                  [check["mean_complete_context_entropy_nats"] - 1.96 * check["se"],
                   check["mean_complete_context_entropy_nats"] + 1.96 * check["se"]], check["within_3se"]),
        headline("lens", f"Through the ground-truth lens, KL to p falls from {lens[0]['kl_nats']:.3f} nats at "
                          f"{lens[0]['label']} to {lens[-1]['kl_nats']:.3f} after the last layer (complete contexts).",
                  lens[-1]["kl_nats"], None, sign(lens[-1]["kl_nats"] - lens[0]["kl_nats"])),
        headline("temperature", f"KL to the truth is smallest at T = {best['T']:.3f} ({best['kl_nats']:.4f} nats; "
                                 f"{best['kl_at_T1_nats']:.4f} at T = 1).", best["T"], None,
                  bool(0.8 <= best["T"] <= 1.25), not best["at_bracket_edge"],
                  "the minimising temperature is at the edge of the searched bracket"),
        headline("hmm_kl_falls", f"On the hidden-Markov source KL over every position falls from "
                                  f"{hmm_first['kl_nats']:.3f} to {hmm_last['kl_nats']:.3f} nats/token.",
                  hmm_last["kl_nats"], None, sign(hmm_last["kl_nats"] - hmm_first["kl_nats"])),
    ]
    if early is not None:
        out.insert(1, headline(
            "first_positions", f"The first positions ({_lengths(*early['prefix_lengths'])}, shorter than the "
                               f"chain's order) are reported apart: "
                               f"H {early['entropy_nats']:.4f}, KL {early['kl_nats']:.3f} nats/token.",
            early["kl_nats"], None, sign(early["entropy_nats"] - rate)))
    low, high = scaling["E_ci95"]
    closed = math.isfinite(low) and scaling.get("E_ci95_open") is None and scaling["dof"] >= 2
    why = (f"the fit has {len(scaling['points'])} widths ({scaling['dof']} degree(s) of freedom) and its 95% "
           f"interval [{low:.2f}, {high:.2f}] is {'open ' + scaling['E_ci95_open'] if scaling.get('E_ci95_open') else 'too loose'}: "
           f"it cannot place E") if not closed else None
    true_rate = scaling["true_entropy_nats"]
    out.append(headline(
        "scaling_E", f"The scaling fit's irreducible term E = {scaling['E_nats']:.4f} [{low:.4f}, {high:.4f}] "
                     f"{'contains' if low <= true_rate <= high else 'misses'} the true entropy rate {true_rate:.4f} "
                     f"of its chain (α = {scaling['alpha']:.3f}, {len(scaling['points'])} widths).",
        scaling["E_nats"], [low, high], bool(low <= true_rate <= high), closed, why))
    held = scaling["heldout_entropy_nats"]
    out.append(headline(
        "scaling_E_vs_heldout_entropy",
        f"E is {scaling['E_minus_heldout_entropy_nats']:+.4f} nats from the held-out entropy {held:.4f}: "
        + ("its whole interval lies below it, so the fit extrapolates to a loss no model can reach."
           if scaling["E_ci95_below_heldout_entropy"] else "the interval does not lie below it."),
        scaling["E_minus_heldout_entropy_nats"], [low - held, high - held], scaling["E_ci95_below_heldout_entropy"],
        closed, why))
    return out


# ============================================================================================
# Figures
# ============================================================================================
def _decomposition_figure(checkpoints: list[dict[str, Any]], region: str, title: str, rate: float | None = None) -> Any:
    """CE, H and KL over training, exact and sampled, averaged over one region's prefixes; the entropy rate
    as a line where it is E[H_t] of that region (complete contexts)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rows = [r[region] for r in checkpoints]
    tokens = [r["tokens_seen"] for r in checkpoints]
    figure = make_subplots(rows=1, cols=2, subplot_titles=("CE = H + KL (nats/token)", "KL(p ‖ P_θ) (nats/token)"))
    for key, name, dash in (("cross_entropy_nats", "CE exact", None), ("entropy_nats", "H exact", "dot")):
        figure.add_trace(go.Scatter(x=tokens, y=[r[key] for r in rows], name=name, mode="lines+markers",
                                    line={"dash": dash}), row=1, col=1)
    figure.add_trace(go.Scatter(x=tokens, y=[r["sampled_cross_entropy_nats"] for r in rows], name="CE sampled",
                                mode="markers", marker={"symbol": "x"}), row=1, col=1)
    figure.add_trace(go.Scatter(x=tokens, y=[r["kl_nats"] for r in rows], name="KL exact", mode="lines+markers"),
                     row=1, col=2)
    figure.add_trace(go.Scatter(x=tokens, y=[r["sampled_kl_nats"] for r in rows], name="KL sampled ± 1.96 SE",
                                mode="markers", marker={"symbol": "x"},
                                error_y={"type": "data", "array": [1.96 * r["sampled_kl_se"] for r in rows]}),
                     row=1, col=2)
    if rate is not None:
        figure.add_hline(y=rate, line_dash="dash", row=1, col=1, annotation_text=f"entropy rate {rate:.4f}")
    figure.update_xaxes(type="log", title_text="tokens seen")
    figure.update_yaxes(type="log", row=1, col=2)
    figure.update_layout(title=title)
    return figure


def write_figures(out: Path, results: dict[str, Any]) -> list[str]:
    import plotly.graph_objects as go

    rate = results["source"]["entropy_rate_nats"]
    order = results["source"]["order"]
    figures = {"kl_decomposition": _decomposition_figure(
        results["checkpoints"], "complete", f"Markov source, complete contexts (prefix length ≥ {order}): exact and "
                                            f"sampled, over training", rate)}

    lens = results["lens"]
    figures["lens"] = go.Figure(go.Scatter(x=[r["label"] for r in lens], y=[r["kl_nats"] for r in lens],
                                           mode="lines+markers", name="KL(p ‖ P^(l))"))
    figures["lens"].update_layout(title="Ground-truth lens: KL of each layer's logit-lens distribution to p "
                                        "(complete contexts)",
                                  xaxis_title="residual stream", yaxis_title="KL (nats/token)", yaxis_type="log")

    position = results["kl_by_position"]
    figures["kl_by_position"] = go.Figure([
        go.Scatter(x=[r["prefix_length"] for r in position], y=[r["kl_nats"] for r in position], name="KL_t"),
        go.Scatter(x=[r["prefix_length"] for r in position], y=[r["entropy_nats"] for r in position], name="H_t",
                   yaxis="y2", line={"dash": "dot"})])
    figures["kl_by_position"].update_layout(
        title="KL and entropy by prefix length (final checkpoint)", xaxis_title="prefix length",
        yaxis={"title": "KL (nats/token)"}, yaxis2={"title": "H (nats/token)", "overlaying": "y", "side": "right"})

    temperature, best = results["temperature"], results["temperature_min"]
    figures["temperature"] = go.Figure([
        go.Scatter(x=[r["T"] for r in temperature], y=[r["kl_nats"] for r in temperature], mode="lines+markers",
                   name="KL(p ‖ P_θ,T)"),
        go.Scatter(x=[best["T"]], y=[best["kl_nats"]], mode="markers", marker={"size": 12, "symbol": "star"},
                   name=f"minimum: T = {best['T']:.3f}, KL = {best['kl_nats']:.4f}")])
    figures["temperature"].update_layout(title="KL to the truth against sampling temperature (complete contexts)",
                                         xaxis_type="log",
                                         xaxis_title="T", yaxis_title="KL (nats/token)")

    scaling = results["scaling"]
    n = [p["n_params"] for p in scaling["points"]]
    curve_n = np.geomspace(min(n) / 2, max(n) * 4, 100)
    low, high = scaling["E_ci95"]
    figures["scaling"] = go.Figure([
        go.Scatter(x=n, y=[p["loss_nats"] for p in scaling["points"]], mode="markers", name="held-out CE (exact)"),
        go.Scatter(x=curve_n, y=scaling["E_nats"] + scaling["A"] * curve_n ** (-scaling["alpha"]), name=(
            f"E + A·N^(−α): E = {scaling['E_nats']:.4f} [{low:.4f}, {high:.4f}], α = {scaling['alpha']:.3f}"))])
    figures["scaling"].add_hrect(y0=low, y1=high, opacity=0.15, line_width=0, fillcolor="blue")
    figures["scaling"].add_hline(y=scaling["true_entropy_nats"], line_dash="dot",
                                 annotation_text=f"true entropy rate {scaling['true_entropy_nats']:.4f}")
    figures["scaling"].add_hline(y=scaling["heldout_entropy_nats"], line_dash="dash", annotation_position="bottom right",
                                 annotation_text=f"held-out entropy {scaling['heldout_entropy_nats']:.4f}")
    figures["scaling"].update_layout(title=f"Loss against parameters at {scaling['tokens']:,} tokens", xaxis_type="log",
                                     xaxis_title="parameters N", yaxis_title="nats/token")

    hmm_rate = results["hmm_source"]["entropy_rate_estimate_nats"]
    figures["hmm"] = _decomposition_figure(
        results["hmm"], "all", f"Hidden-Markov source, every position (its entropy rate ≈ {hmm_rate:.3f} nats is a "
                               f"limit the short prefixes do not reach): exact and sampled")
    for name in FIGURES:
        save_figure(figures[name], out, name)
    return list(FIGURES)
