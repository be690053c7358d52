"""Grades of interpretability methods against a known truth, with bootstrap intervals over prompts and a control
that must score at chance (pure numpy: scores and truths in, `Grade`s out).

Every grade is a mean over prompts (independent draws from the world) with its percentile bootstrap 95% interval,
resampling prompts (`lab.metrics.discrimination.bootstrap_ci`). Beside it, the same grade of a control that knows
nothing, and the value chance gives that control; the control is "at chance" when its interval does not clear
chance in the grade's good direction (a control that beats chance would mean the grade rewards something other
than the truth).

Input attribution (`attribution_grades`), per prompt over its valid positions, with s_i = |score_i|:

    auroc            P(s of a relevant position > s of an irrelevant one), ties ½      chance ½
    relevant_mass    Σ_{i relevant} s_i / Σ_i s_i                                     chance |relevant| / |valid|
    rank_correlation Spearman ρ(s, the model's exhaustive causal effects)             chance 0

  control: the method's own scores permuted among the prompt's valid positions, each prompt's grade averaged over
  CONTROL_PERMUTATIONS permutations (seeded): its expectation is chance exactly, and the average leaves little
  noise beside the prompts' own.

A lens (`lens_grades`), per layer, per prompt the mean over its valid positions of

    kl_true      KL(p ‖ P^(l))        the world's law against the lens's reading
    kl_model     KL(P_θ ‖ P^(l))      the model's own distribution against it
    prompt_gain  KL(p ‖ P^(l)_other) − KL(p ‖ P^(l))   what the lens gains by reading this prompt's residual stream
                 rather than another's (the prompts rolled by one, position by position)              chance 0

  chance of the two KLs is the KL of the best reading that knows nothing of the prompt, E KL(p ‖ p̄_t) with p̄_t the
  mean law at position t (no prompt-blind reading does better in expectation); they carry no control. The check
  that can fail is prompt_gain's, two-sided: a lens that reads the prompt gains (its interval above 0); a lens that
  ignores it — random logits, or one reading for every prompt — gains nothing (its interval holds 0, exactly 0
  for a prompt-blind lens); a lens that reads the wrong thing loses (its interval below 0). Another prompt's
  reading alone, as a control set against the floor, could not fail: whatever the lens, it knows nothing of the
  prompt and so never beats the floor.
"""

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from lab.metrics.discrimination import Metric, bootstrap_ci

__all__ = ["CONTROL_PERMUTATIONS", "Grade", "attribution_grades", "lens_grades", "mean_over_prompts"]


@dataclass(frozen=True)
class Grade:
    """One grade: the method's value with its interval, its control's, and what chance is."""

    name: str
    value: Metric
    control: Metric | None
    chance: float | None
    better: Literal["higher", "lower"]
    n: int  # prompts (or items) behind the value

    @property
    def control_at_chance(self) -> bool | None:
        """True when the control's interval does not clear chance in the good direction; None with no control."""
        if self.control is None or self.chance is None or self.control.interval is None:
            return None
        return (
            bool(self.control.low <= self.chance) if self.better == "higher" else bool(self.control.high >= self.chance)
        )

    def row(self) -> dict[str, Any]:
        """A flat dict for a table: value, low, high, control, control_low, control_high, chance, …"""
        control = self.control
        return {
            "grade": self.name,
            "value": self.value.value,
            "low": self.value.low,
            "high": self.value.high,
            "why_no_interval": self.value.why_no_interval,
            "better": self.better,
            "n": self.n,
            "chance": self.chance,
            "control": None if control is None else control.value,
            "control_low": None if control is None else control.low,
            "control_high": None if control is None else control.high,
            "control_at_chance": self.control_at_chance,
        }


def mean_over_prompts(values: ArrayLike, *, n_boot: int = 1000, seed: int = 0) -> Metric:
    """The mean of per-prompt values and its bootstrap interval over prompts (NaN values, prompts a grade does not
    apply to, are left out and the count says so)."""
    values = np.asarray(values, dtype=np.float64).ravel()
    kept = values[np.isfinite(values)]
    if len(kept) < 2:
        return Metric(
            float(np.mean(kept)) if len(kept) else float("nan"),
            float("nan"),
            float("nan"),
            why_no_interval=f"{len(kept)} prompt(s) with a finite value: no interval",
        )
    return bootstrap_ci(np.mean, kept, n_boot=n_boot, seed=seed)


CONTROL_PERMUTATIONS = 32  # permutations per prompt whose grades the control averages: chance, with little noise


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks along the last axis of [k, n], ties sharing their average rank."""
    return pd.DataFrame(x).rank(axis=1).to_numpy()


def _per_prompt(
    variants: np.ndarray, relevant: np.ndarray, effects: np.ndarray | None, valid: np.ndarray
) -> dict[str, np.ndarray]:
    """Each prompt's AUROC (Mann–Whitney U from average ranks), relevant mass and Spearman ρ (Pearson's r of
    average ranks) of |scores|, averaged over the k score variants of `variants` [k, prompt, pos] (one: the
    method's own; many: its permutations)."""
    n = variants.shape[1]
    out = {
        "auroc": np.full(n, np.nan),
        "relevant_mass": np.full(n, np.nan),
        "rank_correlation": np.full(n, np.nan),
        "chance_mass": np.full(n, np.nan),
    }
    for row in range(n):
        keep = valid[row]
        s, r = np.abs(variants[:, row][:, keep]), relevant[row, keep]
        ranks = _average_ranks(s)
        n_pos, n_neg = int(r.sum()), int((~r).sum())
        if n_pos and n_neg:
            out["auroc"][row] = np.mean((ranks[:, r].sum(1) - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
            out["chance_mass"][row] = r.mean()
            total = s.sum(1)
            out["relevant_mass"][row] = np.mean(s[:, r].sum(1) / total) if (total > 0).all() else np.nan
        if effects is not None and keep.sum() >= 3:
            a = ranks - ranks.mean(1, keepdims=True)
            b = _average_ranks(effects[row, keep][None])[0]
            b = b - b.mean()
            spread = np.sqrt((a * a).sum(1) * (b * b).sum())
            out["rank_correlation"][row] = np.mean((a @ b) / spread) if (spread > 0).all() else np.nan
    return out


def attribution_grades(
    scores: ArrayLike,
    relevant: ArrayLike,
    effects: ArrayLike | None = None,
    valid: ArrayLike | None = None,
    *,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, Grade]:
    """AUROC, relevant mass and (with `effects`) rank correlation of one method's scores [prompt, pos] against the
    relevant positions [prompt, pos] (bool) and the model's causal effects [prompt, pos], over the `valid`
    positions (default all), each with its permuted-scores control (see the module's docstring). Prompts whose
    valid positions are all relevant or all irrelevant have no AUROC or mass and are left out."""
    scores = np.asarray(scores, dtype=np.float64)
    relevant = np.asarray(relevant, dtype=bool)
    valid = np.ones_like(relevant) if valid is None else np.asarray(valid, dtype=bool)
    if scores.ndim != 2 or relevant.shape != scores.shape or valid.shape != scores.shape:
        raise ValueError(
            f"scores {scores.shape}, relevant {relevant.shape} and valid {valid.shape} must all be [prompt, position]"
        )
    effects_array = None if effects is None else np.asarray(effects, dtype=np.float64)
    if effects_array is not None and effects_array.shape != scores.shape:
        raise ValueError(f"effects {effects_array.shape} must have the scores' shape {scores.shape}")
    rng = np.random.default_rng(seed)
    permuted = np.repeat(scores[None], CONTROL_PERMUTATIONS, axis=0)
    for row in range(scores.shape[0]):  # each prompt's scores shuffled among its own valid positions
        where = np.flatnonzero(valid[row])
        for k in range(CONTROL_PERMUTATIONS):
            permuted[k, row, where] = scores[row, rng.permutation(where)]
    real = _per_prompt(scores[None], relevant, effects_array, valid)
    control = _per_prompt(permuted, relevant, effects_array, valid)
    boot = {"n_boot": n_boot, "seed": seed}
    chance = {"auroc": 0.5, "relevant_mass": float(np.nanmean(real["chance_mass"])), "rank_correlation": 0.0}
    names = ["auroc", "relevant_mass"] + ([] if effects_array is None else ["rank_correlation"])
    return {
        name: Grade(
            name,
            mean_over_prompts(real[name], **boot),
            mean_over_prompts(control[name], **boot),
            chance[name],
            "higher",
            int(np.isfinite(real[name]).sum()),
        )
        for name in names
    }


def _kl_rows(p: np.ndarray, log_q: np.ndarray) -> np.ndarray:
    """KL(p ‖ q) along the last axis with q given as log-probabilities, 0·log 0 = 0."""
    log_p = np.log(np.where(p > 0, p, 1.0))
    return np.where(p > 0, p * (log_p - log_q), 0.0).sum(axis=-1)


def lens_grades(
    lens_log_probs: ArrayLike, p: ArrayLike, valid: ArrayLike | None = None, *, n_boot: int = 1000, seed: int = 0
) -> list[dict[str, Grade]]:
    """Per layer (rows of `lens_log_probs` [layer, prompt, pos, vocab], log-probabilities; the last row is the
    model's own output), KL(p ‖ P^(l)), KL(P_θ ‖ P^(l)) and the gain over another prompt's reading, averaged over
    each prompt's `valid` positions [pos] or [prompt, pos], with the prompt-blind chance of the module's docstring."""
    lens = np.asarray(lens_log_probs, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    if lens.ndim != 4 or lens.shape[1:] != p.shape:
        raise ValueError(
            f"lens log-probabilities {lens.shape} must be [layer, prompt, pos, vocab] over the truth's "
            f"{p.shape} [prompt, pos, vocab]"
        )
    n_prompts, n_pos = p.shape[:2]
    if n_prompts < 2:
        raise ValueError("a lens is graded over at least two prompts (its prompt gain reads another prompt)")
    mask = (
        np.ones((n_prompts, n_pos), dtype=bool)
        if valid is None
        else np.broadcast_to(np.asarray(valid, dtype=bool), (n_prompts, n_pos))
    )
    count = mask.sum(axis=1)

    def per_prompt(kl: np.ndarray) -> np.ndarray:
        return np.where(mask, kl, 0.0).sum(axis=1) / np.maximum(count, 1)

    model_p = np.exp(lens[-1])
    marginal = p.mean(axis=0, keepdims=True)  # p̄_t: the best prompt-blind law at each position
    model_marginal = model_p.mean(axis=0, keepdims=True)
    chance_true = float(per_prompt(_kl_rows(p, np.log(np.maximum(marginal, 1e-300)))).mean())
    chance_model = float(per_prompt(_kl_rows(model_p, np.log(np.maximum(model_marginal, 1e-300)))).mean())
    boot = {"n_boot": n_boot, "seed": seed}
    out = []
    for layer in range(lens.shape[0]):
        own = per_prompt(_kl_rows(p, lens[layer]))
        other = per_prompt(_kl_rows(p, np.roll(lens[layer], 1, axis=0)))  # prompt b read through prompt b − 1's
        kl_model = per_prompt(_kl_rows(model_p, lens[layer]))
        out.append(
            {
                "kl_true": Grade("kl_true", mean_over_prompts(own, **boot), None, chance_true, "lower", n_prompts),
                "kl_model": Grade(
                    "kl_model", mean_over_prompts(kl_model, **boot), None, chance_model, "lower", n_prompts
                ),
                "prompt_gain": Grade(
                    "prompt_gain", mean_over_prompts(other - own, **boot), None, 0.0, "higher", n_prompts
                ),
            }
        )
    return out
