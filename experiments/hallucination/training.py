"""The trainings: the sweep over γ (one-epoch stages, measured at the listed epochs and the held-out optimum) and
the upweighting conditions from that optimum; each a top-level function that lab.parallel's workers import."""

import copy
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from experiments.hallucination.config import Config
from experiments.hallucination.enumeration import heldout_nll
from experiments.hallucination.measurement import measure
from experiments.hallucination.setting import Setting, make_model, make_setting
from lab.model.transformer import HookedTransformer
from lab.train.batches import SequenceBatches
from lab.train.config import TrainConfig
from lab.train.loop import train

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# Training: the sweep over γ, and the upweighting conditions
# --------------------------------------------------------------------------------------------
@dataclass
class SweepRun:
    """One γ: the world, what was measured at each checkpoint, and the weights at the held-out optimum."""

    setting: Setting
    heldout: list[dict[str, float]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    bins: list[dict[str, Any]] = field(default_factory=list)
    singleton: list[dict[str, Any]] = field(default_factory=list)
    optimum_epoch: int = 0
    optimum_state: dict[str, Tensor] | None = None
    seconds: float = 0.0  # its own time, in whichever process ran it


def _record(run: SweepRun, model: HookedTransformer, cfg: Config, epoch: int, label: str, seed: int) -> None:
    metrics, bins, singleton = measure(model, run.setting, cfg, seed)
    logger.info(
        "γ = %s, %s: g(H) %.4f, malformed %.4f, Mis %.4f, recall %.3f",
        run.setting.world.cfg.pareto_gamma,
        label,
        metrics["hallucination_rate"],
        metrics["malformed_rate"],
        metrics["miscalibration_tv_eps"],
        metrics["recall_seen"],
    )
    run.checkpoints.append({"epoch": epoch, "checkpoint": label, **metrics})
    run.bins += [{"checkpoint": label, "epoch": epoch, **row} for row in bins]
    run.singleton.append({"checkpoint": label, "epoch": epoch, **singleton})


def sweep_gamma(cfg: Config, gamma: float, work: Path) -> SweepRun:
    """Train at shape γ in one-epoch stages; measure at cfg.epochs and at the held-out optimum."""
    began = time.perf_counter()
    setting = make_setting(cfg, gamma)
    run = SweepRun(setting)
    model = make_model(cfg, setting)
    steps_per_epoch = cfg.n_train // cfg.batch_size
    last = cfg.epochs[-1]
    train_cfg = TrainConfig(
        steps=last * steps_per_epoch,
        batch_size=cfg.batch_size,
        seq_len=setting.doc_len,
        lr=cfg.lr,
        min_lr=cfg.min_lr,
        warmup_steps=min(cfg.warmup_steps, steps_per_epoch),
        eval_interval=last * steps_per_epoch,
        eval_batches=1,
        seed=cfg.seed,
    )
    data = SequenceBatches(setting.train_rows, setting.heldout_rows)
    best = math.inf
    for epoch in range(1, last + 1):
        train(
            model, train_cfg, data, out_dir=work, resume=epoch > 1, progress=False, stop_after=epoch * steps_per_epoch
        )
        nll = heldout_nll(model, setting.heldout_rows)
        run.heldout.append({"epoch": epoch, "heldout_nll": nll})
        if nll < best:
            best, run.optimum_epoch = nll, epoch
            run.optimum_state = copy.deepcopy(model.state_dict())
        if epoch in cfg.epochs:
            _record(run, model, cfg, epoch, f"epoch {epoch}", seed=cfg.seed + epoch)
    model.load_state_dict(run.optimum_state)
    _record(run, model, cfg, run.optimum_epoch, "optimum", seed=cfg.seed + 1000)
    run.seconds = time.perf_counter() - began
    return run


def upweighting_conditions(cfg: Config, setting: Setting, draw: int = 0) -> dict[str, Tensor]:
    """Training rows per condition: the full sample, plus blocks of its examples repeated ×factor.

    A share s is s·n training examples drawn without replacement (the blocks are nested: the 5% block opens
    the 15% one), so frequent facts are in it as often as in the sample; "of monofacts" takes that share of
    the examples whose fact occurs exactly once. "full + block ×k" adds k copies of the block to the sample.
    Each `draw` picks other blocks (the control, the full sample, is the same in every draw; its draws differ in
    their batch order, as every condition's do: `upweight_condition`).
    """
    rng = np.random.default_rng([cfg.seed, 11, draw])
    n = cfg.n_train
    order = rng.permutation(n)  # nested blocks: the 5% block is the start of the 15% block
    full = setting.train_rows
    factor = cfg.upweight_factor
    counts = setting.world.train_counts[setting.world.train_fact_indices]
    monofacts = np.flatnonzero(counts == 1)
    first_share = cfg.upweight_shares[0]
    mono_block = rng.choice(monofacts, size=max(1, round(first_share * len(monofacts))), replace=False)
    first_block = full[order[: round(first_share * n)]]
    conditions = {CONTROL: full}
    for share in cfg.upweight_shares:
        block = full[order[: round(share * n)]]
        conditions[f"full + {share:.0%} ×{factor}"] = torch.cat([full, block.repeat(factor, 1)])
    conditions[f"{first_share:.0%} block ×{factor} alone"] = first_block.repeat(factor, 1)
    conditions[f"full + {first_share:.0%} of monofacts ×{factor}"] = torch.cat(
        [full, full[mono_block].repeat(factor, 1)]
    )
    return conditions


CONTROL = "control (full data)"
UPWEIGHT_KEYS = (
    "hallucination_rate",
    "miscalibration_tv_eps",
    "miscalibration_tv_adaptive",
    "kl_hat",
    "recall_seen",
    "malformed_rate",
    "unseen_person_mass",
)


def upweighting_tasks(cfg: Config, run: SweepRun) -> list[tuple[Any, ...]]:
    """One training per condition and draw (the control too: its draws are its run-to-run spread, what an
    upweighted condition is tested against), each from the held-out optimum of `run`: lab.parallel tasks."""
    names = list(upweighting_conditions(cfg, run.setting))
    return [
        (upweight_condition, cfg, run, draw, condition) for draw in range(cfg.upweight_draws) for condition in names
    ]


def upweight_condition(cfg: Config, run: SweepRun, draw: int, condition: str) -> dict[str, Any]:
    """From the held-out optimum, the same optimizer steps (matched compute) on one condition's data; draw d
    trains with batch-order seed cfg.seed + d (and, for an upweighted condition, draw d's blocks), so the draws of
    every condition, the control's included, spread as independent trainings do."""
    began = time.perf_counter()
    setting = run.setting
    steps = cfg.upweight_epochs * (cfg.n_train // cfg.batch_size)
    train_cfg = TrainConfig(
        steps=steps,
        batch_size=cfg.batch_size,
        seq_len=setting.doc_len,
        lr=cfg.upweight_lr,
        min_lr=cfg.upweight_lr / 10,
        warmup_steps=min(cfg.warmup_steps, steps),
        eval_interval=steps,
        eval_batches=1,
        seed=cfg.seed + draw,
    )
    rows = upweighting_conditions(cfg, setting, draw)[condition]
    model = make_model(cfg, setting)
    model.load_state_dict(run.optimum_state)
    train(model, train_cfg, SequenceBatches(rows, setting.heldout_rows), progress=False)
    metrics, _, _ = measure(model, setting, cfg, seed=cfg.seed + 2000)
    logger.info(
        "upweighting, draw %d, %s: g(H) %.4f, Mis %.4f, recall %.3f",
        draw,
        condition,
        metrics["hallucination_rate"],
        metrics["miscalibration_tv_eps"],
        metrics["recall_seen"],
    )
    # Distinct training examples repeated ×factor (the alone condition holds only them).
    repeated = (len(rows) - cfg.n_train * (not condition.endswith("alone"))) // cfg.upweight_factor
    return {
        "condition": condition,
        "draw": draw,
        "n_documents": len(rows),
        "steps": steps,
        "documents_seen": steps * cfg.batch_size,
        "upweighted_examples": repeated,
        **metrics,
        "seconds": time.perf_counter() - began,
    }


def summarise_upweighting(per_draw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per condition: the mean over its draws (and the standard error of g(H) over them)."""
    summary = []
    for condition in dict.fromkeys(r["condition"] for r in per_draw):
        rows = [r for r in per_draw if r["condition"] == condition]
        rates = np.array([r["hallucination_rate"] for r in rows])
        entry = {k: v for k, v in rows[0].items() if k not in ("draw", *UPWEIGHT_KEYS, "malformed_by_position")}
        entry |= {key: float(np.mean([r[key] for r in rows])) for key in UPWEIGHT_KEYS}
        entry |= {
            "n_draws": len(rows),
            "hallucination_rate_draws": rates.tolist(),
            "miscalibration_tv_eps_draws": [r["miscalibration_tv_eps"] for r in rows],
            "hallucination_rate_se": float(rates.std(ddof=1) / math.sqrt(len(rates))) if len(rates) > 1 else 0.0,
        }
        summary.append(entry)
    return summary
