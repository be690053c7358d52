"""The kl experiment's two sources, each a module-level function that lab.parallel.run_tasks can hand to a worker:
the Markov source's checkpoints, lens, KL by position and temperature (`markov_part`) and the hidden-Markov
source's checkpoints (`hmm_part`)."""

import dataclasses
import time
from pathlib import Path
from typing import Any

from experiments.kl.config import RECIPE, Config, Profile, sample_seed
from experiments.kl.measure import (
    HeldOut,
    decompose,
    entropy_rate_check,
    ground_truth_lens,
    kl_by_position,
    lengths_in_words,
    model_logits,
)
from experiments.kl.training import sequences, train_with_checkpoints
from lab.data.sources import MarkovSource
from lab.metrics.information import temperature_scan, to_bits, truncated_context_kl_of
from lab.model.config import ModelConfig
from lab.model.transformer import HookedTransformer
from lab.train.config import TrainConfig
from lab.zoo.recipes import load_recipe
from lab.zoo.worlds import make_source


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


def _markov_source_block(source: MarkovSource, rate: float, profile: Profile) -> dict[str, Any]:
    """results["source"]: the chain, its entropy rate, the KL of the best shorter-context models, and the recipe."""
    return {
        **source.to_dict(),
        "entropy_rate_nats": rate,
        "entropy_rate_bits": to_bits(rate),
        **{
            f"best_{name}_kl_nats": truncated_context_kl(source, width)
            for name, width in (("unigram", 0), ("bigram", 1))
            if width < source.order
        },
        "recipe": RECIPE,
        "changed_from_recipe": profile.world,
    }


def _regions(order: int) -> dict[str, str]:
    """The prefix regions the decomposition is reported on, in words."""
    return {
        "complete": f"prefix lengths ≥ {order}, the chain's order: a complete, π-distributed context, where "
        f"E[H_t] is the entropy rate; CE over these prefixes is what the rate belongs beside",
        "first": f"{lengths_in_words(1, order - 1)}: shorter than the chain's order, conditioned through π's "
        f"marginals, so H_t there exceeds the rate (reported apart, never mixed in)",
        "all": "every held-out prefix, complete or not",
    }


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

    return {
        "source": _markov_source_block(source, rate, profile),
        "regions": _regions(source.order),
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
