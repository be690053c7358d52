"""The kl experiment's scaling sweep: one width trained and measured (`scaling_point`, a module-level function
that lab.parallel.run_tasks can hand to a worker), and the fit L(N) = E + A·N^(−α) over the widths
(`scaling_fit`)."""

import math
import time
from typing import Any

from experiments.kl.config import SCALING_MODEL, SCALING_TRAIN, SCALING_WORLD, Profile, sample_seed
from experiments.kl.measure import (
    HeldOut,
    decompose,
    model_logits,
    paired_mean_se,
)
from experiments.kl.training import sequences
from lab.data.sources import MarkovSource
from lab.metrics.information import entropy
from lab.metrics.scaling import fit_power_law
from lab.model.config import ModelConfig
from lab.model.transformer import HookedTransformer
from lab.train.config import TrainConfig
from lab.train.loop import train
from lab.zoo.worlds import make_source


def scaling_setting(profile: Profile, seed: int) -> tuple[MarkovSource, TrainConfig, HeldOut]:
    source = make_source(SCALING_WORLD)
    train_cfg = TrainConfig.from_dict(
        SCALING_TRAIN
        | {"steps": profile.scaling_steps, "seed": seed, "eval_interval": profile.scaling_steps, "eval_batches": 2}
    )
    held_out = HeldOut.draw(source, profile.eval_sequences, train_cfg.seq_len, sample_seed(seed, "scaling-eval"))
    return source, train_cfg, held_out


def scaling_point(profile: Profile, seed: int, d_model: int) -> dict[str, Any]:
    """One width of the sweep trained on the sweep's tokens: its exact held-out loss over complete contexts
    (for an order-k chain, prefix length ≥ k), whose entropy term has the entropy rate as its expectation."""
    clock = time.perf_counter()
    source, train_cfg, held_out = scaling_setting(profile, seed)
    data = sequences(source, train_cfg, seed, "scaling")
    architecture = SCALING_MODEL | {
        "d_vocab": SCALING_WORLD["vocab_size"],
        "tokenizer": f"markov-{SCALING_WORLD['vocab_size']}",
    }
    full = slice(held_out.complete_from, None)
    model = HookedTransformer(
        ModelConfig.from_dict(
            architecture | {"d_model": d_model, "n_heads": heads_for(d_model, architecture["n_heads"])}
        ),
        seed=seed,
    )
    train(model, train_cfg, data, progress=False)
    d = decompose(model_logits(model, held_out.tokens), held_out)
    return {
        "d_model": d_model,
        "n_params": model.cfg.n_params(),
        "loss_nats": float(d.cross_entropy[:, full].mean()),
        "kl_nats": float(d.kl[:, full].mean()),
        "eval_entropy_nats": float(d.entropy[:, full].mean()),
        "seconds": time.perf_counter() - clock,
    }


def scaling_fit(points: list[dict[str, Any]], profile: Profile, seed: int) -> dict[str, Any]:
    """The fit L(N) = E + A·N^(−α) over the widths' points, beside the true rate and the held-out entropy."""
    source, train_cfg, held_out = scaling_setting(profile, seed)
    full = slice(held_out.complete_from, None)
    eval_entropy, eval_entropy_se = paired_mean_se(entropy(held_out.p[:, full]))
    fit = fit_power_law([p["n_params"] for p in points], [p["loss_nats"] for p in points])
    low, high = fit["E_ci95"]
    return {
        "points": points,
        **fit,
        "tokens": train_cfg.steps * train_cfg.batch_size * train_cfg.seq_len,
        "source": source.to_dict(),
        "true_entropy_nats": source.entropy_rate(),
        # No model's expected loss is below the held-out entropy: an E under it extrapolates past the truth.
        "heldout_entropy_nats": eval_entropy,
        "heldout_entropy_se": eval_entropy_se,
        "E_minus_heldout_entropy_nats": fit["E_nats"] - eval_entropy,
        "E_ci95_below_heldout_entropy": bool(high < eval_entropy) if math.isfinite(high) else None,
        "model": SCALING_MODEL,
        "train": train_cfg.to_dict(),
    }


def heads_for(d_model: int, most: int) -> int:
    """The most heads (≤ `most`) that split d_model into heads of an even width (ModelConfig checks the
    rotary width, d_head by default, to be even even where positions are learned)."""
    return max(h for h in range(1, most + 1) if d_model % h == 0 and (d_model // h) % 2 == 0)
