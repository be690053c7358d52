"""The kl experiment's independent parts, each a module-level function that lab.parallel.run_tasks can hand
to a worker: the Markov source's checkpoints, lens, KL by position and temperature (`markov_part`), the
hidden-Markov source's checkpoints (`hmm_part`), one width of the scaling sweep (`scaling_point`), and the
fit over the widths (`scaling_fit`); with the training that stops at log-spaced checkpoints to measure."""

import dataclasses
import math
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from experiments.kl.config import RECIPE, SCALING_MODEL, SCALING_TRAIN, SCALING_WORLD, Config, Profile, sample_seed
from experiments.kl.measure import (
    HeldOut,
    Source,
    decompose,
    entropy_rate_check,
    ground_truth_lens,
    kl_by_position,
    lengths_in_words,
    measure,
    model_logits,
    paired_mean_se,
)
from lab.data.sources import MarkovSource
from lab.metrics.information import entropy, temperature_scan, to_bits, truncated_context_kl_of
from lab.metrics.scaling import fit_power_law
from lab.model import HookedTransformer, ModelConfig
from lab.train import SequenceBatches, TrainConfig, train
from lab.zoo import load_recipe, make_source


def log_spaced_steps(steps: int, n: int) -> list[int]:
    """n distinct steps, geometrically spaced from ≈ steps/200 to steps (fewer only if steps < n)."""
    first = max(1, steps // 200)
    points = np.unique(np.round(np.geomspace(first, steps, n)).astype(int))
    while len(points) < min(n, steps):  # rounding merged some: fill in from the start
        points = np.unique(np.r_[points, np.setdiff1d(np.arange(1, steps + 1), points)[0]])
    return [int(s) for s in points]


def train_with_checkpoints(
    model: HookedTransformer,
    cfg: TrainConfig,
    data: SequenceBatches,
    held_out: HeldOut,
    n_checkpoints: int,
    workdir: Path,
) -> list[dict[str, Any]]:
    """Train on cfg's schedule, stopping at log-spaced steps to measure (resuming from the checkpoint)."""
    rows = []
    for i, step in enumerate(log_spaced_steps(cfg.steps, n_checkpoints)):
        train(model, cfg, data, out_dir=workdir, resume=i > 0, progress=False, stop_after=step)
        rows.append({"step": step, "tokens_seen": step * cfg.batch_size * cfg.seq_len, **measure(model, held_out)})
    shutil.rmtree(workdir / "checkpoint", ignore_errors=True)  # optimizer state: the weights are saved apart
    return rows


def sequences(source: Source, cfg: TrainConfig, seed: int, purpose: str) -> SequenceBatches:
    """Fresh training sequences, one per batch row of the whole schedule, and a small validation draw."""
    train_tokens = source.sample(cfg.steps * cfg.batch_size, cfg.seq_len, seed=sample_seed(seed, f"{purpose}-train"))
    val_tokens = source.sample(64, cfg.seq_len, seed=sample_seed(seed, f"{purpose}-val"))
    return SequenceBatches(torch.from_numpy(train_tokens), torch.from_numpy(val_tokens))


def markov_setting(cfg: Config) -> tuple[MarkovSource, TrainConfig, ModelConfig]:
    """The recipe's world, training schedule and architecture with the profile's changes, for steps 1–3 and
    (the same schedule and architecture) step 5."""
    profile = cfg.profile
    recipe = load_recipe(RECIPE)
    world = recipe["world"] | profile.world
    steps = profile.train.get("steps", recipe["train"]["steps"])
    # One evaluation of train's own (small) validation loss per stage; the measurements here are ours.
    train_cfg = TrainConfig.from_dict(
        recipe["train"]
        | profile.train
        | {"seed": cfg.seed, "eval_interval": steps, "eval_batches": 2, "checkpoint_interval": 0}
    )
    architecture = (
        recipe["model"]
        | profile.model
        | {"d_vocab": world["vocab_size"], "tokenizer": f"{RECIPE}-{world['vocab_size']}"}
    )
    return make_source(world), train_cfg, ModelConfig.from_dict(architecture)


def markov_part(cfg: Config, out: Path) -> dict[str, Any]:
    """Steps 1–3 on the Markov source: checkpoints, then lens, KL by position and temperature at the last."""
    profile = cfg.profile
    seconds: dict[str, float] = {}
    clock = time.perf_counter()
    source, train_cfg, model_cfg = markov_setting(cfg)
    held_out = HeldOut.draw(source, profile.eval_sequences, train_cfg.seq_len, sample_seed(cfg.seed, "markov-eval"))
    data = sequences(source, train_cfg, cfg.seed, "markov")
    seconds["data"] = time.perf_counter() - clock

    # 1. Checkpoints on the Markov source.
    clock = time.perf_counter()
    model = HookedTransformer(model_cfg, seed=cfg.seed)
    checkpoints = train_with_checkpoints(
        model, train_cfg, data, held_out, profile.n_checkpoints, out / "train" / "markov"
    )
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
        "source": {
            **source.to_dict(),
            "entropy_rate_nats": rate,
            "entropy_rate_bits": to_bits(rate),
            **{
                f"best_{name}_kl_nats": truncated_context_kl(source, width)
                for name, width in (("unigram", 0), ("bigram", 1))
                if width < order
            },
            "recipe": RECIPE,
            "changed_from_recipe": profile.world,
        },
        "regions": {
            "complete": f"prefix lengths ≥ {order}, the chain's order: a complete, π-distributed context, where "
            f"E[H_t] is the entropy rate; CE over these prefixes is what the rate belongs beside",
            "first": f"{lengths_in_words(1, order - 1)}: shorter than the chain's order, conditioned through π's "
            f"marginals, so H_t there exceeds the rate (reported apart, never mixed in)",
            "all": "every held-out prefix, complete or not",
        },
        "model": {"n_params": model_cfg.n_params(), **model_cfg.to_dict()},
        "train": train_cfg.to_dict() | {"train_sequences": len(data.sequences["train"])},
        "eval": {
            "sequences": profile.eval_sequences,
            "prefixes": held_out.n_prefixes,
            "complete_prefixes": held_out.p[:, complete].shape[0] * held_out.p[:, complete].shape[1],
        },
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
    _, train_cfg, model_cfg = markov_setting(cfg)
    hmm_source = make_source(profile.hmm_world)
    hmm_train = train_cfg.replace(
        steps=profile.hmm_steps,
        eval_interval=profile.hmm_steps,
        warmup_steps=min(train_cfg.warmup_steps, profile.hmm_steps),
    )
    hmm_held_out = HeldOut.draw(
        hmm_source, profile.eval_sequences, hmm_train.seq_len, sample_seed(cfg.seed, "hmm-eval")
    )
    hmm_model = HookedTransformer(
        dataclasses.replace(model_cfg, d_vocab=hmm_source.vocab_size, tokenizer=f"hmm-{hmm_source.vocab_size}"),
        seed=cfg.seed,
    )
    hmm = train_with_checkpoints(
        hmm_model,
        hmm_train,
        sequences(hmm_source, hmm_train, cfg.seed, "hmm"),
        hmm_held_out,
        profile.n_checkpoints,
        out / "train" / "hmm",
    )
    hmm_model.save(out / "models" / "hmm")
    hmm_rate = hmm_source.entropy_rate_estimate(512, 256, seed=sample_seed(cfg.seed, "hmm-rate"))
    return {
        "hmm": hmm,
        "hmm_source": {
            **hmm_source.to_dict(),
            "entropy_rate_estimate_nats": hmm_rate.value,
            "entropy_rate_estimate_se": hmm_rate.standard_error,
            "entropy_rate_estimate_note": "Monte Carlo over positions ≥ 128 of 512 sequences of 256 "
            "tokens; biased upward by at most H_128 − rate. A limit no "
            f"held-out prefix (lengths 1 … {hmm_train.seq_len - 1}) reaches: "
            "not comparable with their CE",
        },
        "seconds": {"hmm": time.perf_counter() - clock},
    }


def truncated_context_kl(source: MarkovSource, width: int) -> float:
    """KL(p ‖ best predictor that sees only the last `width` tokens) over π-distributed complete contexts:
    H(X_{t+1} | last width tokens) − rate, exactly, from the joint π(c)·p(x|c)."""
    joint = source.stationary()[:, None] * source.transition  # [context, next]
    return float(truncated_context_kl_of(joint, source.vocab_size, width))


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
