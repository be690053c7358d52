"""Grades of interpretability methods against a known truth, with bootstrap intervals over prompts and a control
(pure numpy: scores and truths in, `Grade`s out).

Every grade is a mean over prompts (independent draws from the world) with its percentile bootstrap 95% interval,
resampling prompts (`lab.metrics.discrimination.bootstrap_ci`). Beside it, a control of one of two kinds
(`Grade.control_kind`, what it is in words in `Grade.control_means`):

    "chance"  a control that knows nothing, and the value chance gives it: the control is "at chance" when its
              interval does not clear chance in the grade's good direction (a control that beats chance would
              mean the grade rewards something other than the truth);
    "beaten"  the same method where the mechanism is absent (an untrained model of the same shape, a model trained
              on a world with another mechanism, untrained transcoders): the method finds the mechanism only where
              its value beats this control by its interval (`Grade.beats_control`). Such a control can fail: a
              method that reads nothing of the model (recency, random scores) scores the same on both.

Input attribution (`attribution_grades`), per prompt over its valid positions, with s_i = |score_i| and the truth a
SET of relevant positions (every position the law may read the answer from: the last k of an order-k chain, every
lawful copy source of the induction world, the name's two words), each grade treating the set as a whole:

    auroc            P(s of a relevant position > s of an irrelevant one), ties ½: every relevant position
                     against every irrelevant one, so a method must rank the whole set above the rest   chance ½
    relevant_mass    Σ_{i relevant} s_i / Σ_i s_i: the share on the set, however it is split within it
                                                                                      chance |relevant| / |valid|
    rank_correlation Spearman ρ(s, the model's exhaustive causal effects) (no set: the model's own effects)  chance 0

  control ("beaten"): the same method's scores on models without the world's mechanism (`controls`), graded against
  this world's truth (and, for ρ, this model's effects); the grade's control is the one hardest to beat (the
  highest interval). Beside every method, the trivial baselines (`BASELINES`, `baseline_scores`) are graded the
  same way: recency (score = position), the last token only, uniform, and seeded random scores; a method finds
  the mechanism only where it beats the best of them by its interval too.

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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from lab.metrics.discrimination import Metric, bootstrap_ci

__all__ = ["BASELINES", "Grade", "attribution_grades", "baseline_scores", "lens_grades", "mean_over_prompts"]


@dataclass(frozen=True)
class Grade:
    """One grade: the method's value with its interval, its control's, what chance is, and what the control is
    (`control_kind`: "chance", a control that knows nothing and must sit at chance; "beaten", the same method
    where the mechanism is absent, which the value must beat; see the module's docstring)."""

    name: str
    value: Metric
    control: Metric | None
    chance: float | None
    better: Literal["higher", "lower"]
    n: int  # prompts (or items) behind the value
    control_kind: Literal["chance", "beaten"] = "chance"
    control_means: str = ""  # what the control is, in words

    @property
    def control_at_chance(self) -> bool | None:
        """For a "chance" control: True when its interval does not clear chance in the good direction; None with
        no control or a "beaten" one."""
        if self.control_kind != "chance" or self.control is None or self.chance is None:
            return None
        if self.control.interval is None:
            return None
        return (
            bool(self.control.low <= self.chance) if self.better == "higher" else bool(self.control.high >= self.chance)
        )

    @property
    def beats_control(self) -> bool | None:
        """True when the value's interval lies wholly on the good side of the control's; None without both."""
        if self.control is None or self.value.interval is None or self.control.interval is None:
            return None
        if self.better == "higher":
            return bool(self.value.low > self.control.high)
        return bool(self.value.high < self.control.low)

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
            "control_means": self.control_means or None,
            "beats_control": self.beats_control,
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


BASELINES = ("recency", "last_token", "uniform", "random")  # the trivial attributions every method must beat


def baseline_scores(name: str, valid: ArrayLike, *, seed: int = 0) -> np.ndarray:
    """A trivial attribution's scores [prompt, pos] over the `valid` positions [prompt, pos] (bool), knowing
    nothing of the model: "recency" the position's index (later counts more), "last_token" 1 at each prompt's last
    valid position and 0 elsewhere, "uniform" 1 everywhere, "random" independent uniform draws (seeded)."""
    valid = np.asarray(valid, dtype=bool)
    if valid.ndim != 2:
        raise ValueError(f"valid must be [prompt, position], got shape {valid.shape}")
    n, length = valid.shape
    if name == "recency":
        return np.broadcast_to(np.arange(length, dtype=np.float64), (n, length)).copy()
    if name == "last_token":
        scores = np.zeros((n, length))
        last = length - 1 - np.argmax(valid[:, ::-1], axis=1)
        scores[np.arange(n), last] = 1.0
        return scores
    if name == "uniform":
        return np.ones((n, length))
    if name == "random":
        return np.random.default_rng(seed).random((n, length))
    raise ValueError(f"unknown baseline {name!r}: one of {', '.join(BASELINES)}")


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks along the last axis of [k, n], ties sharing their average rank."""
    return pd.DataFrame(x).rank(axis=1).to_numpy()


def _per_prompt(
    scores: np.ndarray, relevant: np.ndarray, effects: np.ndarray | None, valid: np.ndarray
) -> dict[str, np.ndarray]:
    """Each prompt's AUROC (Mann–Whitney U from average ranks), relevant mass and Spearman ρ (Pearson's r of
    average ranks) of |scores| [prompt, pos]; NaN where a prompt has no value (all or none of its valid positions
    relevant; fewer than 3 valid positions or a constant score for ρ)."""
    n = scores.shape[0]
    out = {
        "auroc": np.full(n, np.nan),
        "relevant_mass": np.full(n, np.nan),
        "rank_correlation": np.full(n, np.nan),
        "chance_mass": np.full(n, np.nan),
    }
    for row in range(n):
        keep = valid[row]
        s, r = np.abs(scores[row, keep]), relevant[row, keep]
        ranks = _average_ranks(s[None])[0]
        n_pos, n_neg = int(r.sum()), int((~r).sum())
        if n_pos and n_neg:
            out["auroc"][row] = (ranks[r].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
            out["chance_mass"][row] = r.mean()
            total = s.sum()
            out["relevant_mass"][row] = s[r].sum() / total if total > 0 else np.nan
        if effects is not None and keep.sum() >= 3:
            a = ranks - ranks.mean()
            b = _average_ranks(effects[row, keep][None])[0]
            b = b - b.mean()
            spread = np.sqrt((a * a).sum() * (b * b).sum())
            out["rank_correlation"][row] = (a @ b) / spread if spread > 0 else np.nan
    return out


def _hardest(controls: dict[str, Metric], better: str) -> tuple[str, Metric] | tuple[str, None]:
    """The control whose interval is hardest to beat (the highest top for a higher-is-better grade), or none."""
    usable = {k: m for k, m in controls.items() if m.interval is not None}
    if not usable:
        return "", None
    pick = max if better == "higher" else min
    what = pick(usable, key=lambda k: usable[k].high if better == "higher" else usable[k].low)
    return what, usable[what]


def attribution_grades(
    scores: ArrayLike,
    relevant: ArrayLike,
    effects: ArrayLike | None = None,
    valid: ArrayLike | None = None,
    *,
    controls: Mapping[str, ArrayLike] | None = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, Grade]:
    """AUROC, relevant mass and (with `effects`) rank correlation of one method's scores [prompt, pos] against the
    relevant positions [prompt, pos] (bool; a set per prompt, see the module's docstring) and the model's causal
    effects [prompt, pos], over the `valid` positions (default all). `controls`, {what: scores [prompt, pos]}: the
    same method's scores on models without the world's mechanism, graded against the same truth; each grade's
    control is the hardest of them to beat (a "beaten" control), none without them. Prompts whose valid
    positions are all relevant or all irrelevant have no AUROC or mass and are left out."""
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
    against = {what: np.asarray(c, dtype=np.float64) for what, c in (controls or {}).items()}
    for what, c in against.items():
        if c.shape != scores.shape:
            raise ValueError(f"control {what!r} {c.shape} must have the scores' shape {scores.shape}")
    boot = {"n_boot": n_boot, "seed": seed}
    real = _per_prompt(scores, relevant, effects_array, valid)
    per_control = {what: _per_prompt(c, relevant, effects_array, valid) for what, c in against.items()}
    chance = {"auroc": 0.5, "relevant_mass": float(np.nanmean(real["chance_mass"])), "rank_correlation": 0.0}
    names = ["auroc", "relevant_mass"] + ([] if effects_array is None else ["rank_correlation"])
    out = {}
    for name in names:
        what, control = _hardest({w: mean_over_prompts(v[name], **boot) for w, v in per_control.items()}, "higher")
        out[name] = Grade(
            name,
            mean_over_prompts(real[name], **boot),
            control,
            chance[name],
            "higher",
            int(np.isfinite(real[name]).sum()),
            control_kind="beaten",
            control_means=what,
        )
    return out


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
