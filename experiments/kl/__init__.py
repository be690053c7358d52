"""The KL decomposition, measured exactly on a world with known truth (docs/definitions.md §1).

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

Where each part lives: `config` (Config, the profiles, the scaling sweep's setting, the seed streams),
`measure` (HeldOut, the decomposition and its summaries, the lens, KL by position), `training` (sequences and
training with log-spaced checkpoints), `sources` (the Markov and hidden-Markov parts that lab.parallel shares out:
markov_part, hmm_part), `scaling` (the sweep's scaling_point, shared out too, and scaling_fit), `summary`
(acceptance and headlines) and `figures`; `real` is the real-model track (`forma run kl --model smollm2`: the same
split on a pretrained model reading text from a Markov chain of words, before and along fine-tuning, into
runs/kl_real/); `run` is here, and every name is imported from `experiments.kl` itself.
"""

import dataclasses
import time
from pathlib import Path
from typing import Any

import torch

# Every name the experiment had as one module, where it lives now: tests and docs import them from here.
from experiments.kl.config import Config
from experiments.kl.figures import write_figures
from experiments.kl.real import load_real, real_headlines, run_real
from experiments.kl.scaling import scaling_fit, scaling_point
from experiments.kl.sources import hmm_part, markov_part
from experiments.kl.summary import acceptance
from experiments.kl.summary import headlines as toy_headlines
from lab.model.transformer import HookedTransformer
from lab.parallel import run_tasks


def read_inputs(cfg: Config) -> HookedTransformer | None:
    """The pretrained model of the real-model track, loaded and its tokenizer checked before `forma run` makes the
    run folder (a ValueError names what is wrong); None for the toy worlds."""
    return load_real(cfg.model) if cfg.real_track else None


def headlines(results: dict[str, Any]) -> list[dict[str, Any]]:
    """What a run shows: the toy worlds' claims (experiments.kl.summary), or the real-model track's."""
    return real_headlines(results) if "identity" in results else toy_headlines(results)


def run(cfg: Config, out: Path, inputs: HookedTransformer | None = None) -> dict[str, Any]:
    """Run the experiment into `out` and return what becomes results.json: the real-model track when cfg.model names
    a pretrained model (`inputs`, that model loaded: experiments.kl.real), else the toy worlds. The Markov model
    (steps 1–3), the hidden-Markov model (5) and each width of the scaling sweep (4) train independently:
    `cfg.workers` processes share them out (lab.parallel), and the results do not depend on how many."""
    out = Path(out)
    if cfg.real_track:
        return run_real(load_real(cfg.model) if inputs is None else inputs, cfg.model, cfg.real_profile, cfg.seed, out)
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
    results["headlines"] = toy_headlines(results)
    began = time.perf_counter()
    results["figures"] = write_figures(out, results)
    seconds["figures"] = time.perf_counter() - began
    # Each part's own time (in its worker), and the run's wall time: with workers > 1 the parts overlap.
    results["seconds"] = seconds | {"total": time.perf_counter() - clock}
    results["profile"] = dataclasses.asdict(profile)
    return results
