"""Judging the signals on the test split: AUROC (overall, per error kind, and familywise), risk–coverage and AURC,
and the abstention rules (conformal risk control, Learn then Test) calibrated on the calibration split, on one
split and over re-draws of it."""

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from experiments.monitor.config import ABSTENTION_SIGNAL, ERROR_KINDS, KINDS, Config
from lab.analysis.monitor import RISK_SIGN
from lab.metrics.discrimination import auroc_ci
from lab.metrics.selective import (
    aurc,
    crc_threshold,
    ltt_grid,
    ltt_threshold,
    optimal_aurc,
    risk_coverage,
    selective_outcome,
)


# --------------------------------------------------------------------------------------------
# Judging the signals
# --------------------------------------------------------------------------------------------
def _familywise(risk: np.ndarray, false: np.ndarray, level: float) -> dict[str, Any]:
    """AUROC's interval at the familywise `level`."""
    # DeLong's interval: a bootstrap at this level would rest on (1 − level)/2 · n_boot resamples per tail
    return {
        "auroc_familywise_ci": auroc_ci(risk, false, level=level, method="delong").interval,
        "auroc_familywise_level": level,
        "auroc_familywise_method": "DeLong",
    }


def _by_kind(
    risk: np.ndarray, false: np.ndarray, kinds: np.ndarray, test: np.ndarray, cfg: Config, level: float
) -> dict[str, Any]:
    """AUROC per error kind on the test split: each kind's false claims against every right one."""
    by_kind = {}
    for kind in KINDS:
        keep = test & ((kinds == kind) & false | ~false)  # this kind's false claims against every right one
        if (kinds[test] == kind).any():
            by_kind[kind] = {
                "error": ERROR_KINDS[kind],
                "n_false": int((keep & false).sum()),
                **auroc_ci(risk[keep], false[keep], n_boot=cfg.n_boot, seed=cfg.seed).fields("auroc"),
                **_familywise(risk[keep], false[keep], level),
            }
    return by_kind


def _curve_points(name: str, risk: np.ndarray, false: np.ndarray) -> list[dict[str, Any]]:
    """The risk–coverage curve, thinned to at most 200 evenly spaced points."""
    curve = risk_coverage(risk, false)
    keep_points = np.unique(np.linspace(0, len(curve.coverage) - 1, min(200, len(curve.coverage))).astype(int))
    return [
        {
            "signal": name,
            "threshold": float(curve.threshold[i]),
            "coverage": float(curve.coverage[i]),
            "risk": float(curve.risk[i]),
        }
        for i in keep_points
    ]


def _abstention(
    name: str, risk: np.ndarray, false: np.ndarray, split: np.ndarray, alpha: float, cfg: Config
) -> dict[str, Any]:
    """CRC's and LTT's thresholds at `alpha` from the calibration split (LTT's grid from the fit split), applied to
    the test split; over re-draws of the split too for the abstention signal."""
    test, calibration, fit = split == "test", split == "calibration", split == "fit"
    s, e = risk[test], false[test]
    crc = crc_threshold(risk[calibration], false[calibration], alpha)
    grid = ltt_grid(risk[fit], int(calibration.sum()), alpha, cfg.ltt_delta)
    ltt = ltt_threshold(risk[calibration], false[calibration], alpha, cfg.ltt_delta, grid)
    row = {
        "signal": name,
        "alpha": alpha,
        "n_calibration": int(calibration.sum()),
        "crc": selective_outcome(s, e, crc),
        "ltt": selective_outcome(s, e, ltt.threshold)
        | {
            "delta": cfg.ltt_delta,
            "n_certified": ltt.n_certified,
            "n_grid": ltt.n_grid,
            "smallest_p_value": ltt.smallest_p_value,
        },
    }
    if name == ABSTENTION_SIGNAL:
        row["resplits"] = resplit(risk, false, split, alpha, cfg, risk[fit])
    return row


def judge(
    scores: dict[str, np.ndarray],
    false: np.ndarray,
    kinds: np.ndarray,
    split: np.ndarray,
    signs: dict[str, int],
    cfg: Config,
    alphas: list[float] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """On the test split, per signal: AUROC (overall and per error kind), AURC; for each α (`alphas`, default
    cfg.alphas), CRC's and LTT's thresholds from the calibration split applied to the test split. Returns (signals,
    abstention, curve points)."""
    test = split == "test"
    alphas = cfg.alphas if alphas is None else alphas
    rows, abstention, curves = [], [], []
    level = familywise_level(len(scores) + len(KINDS))
    for name, risk in scores.items():
        s, e = risk[test], false[test]
        row: dict[str, Any] = {
            "signal": name,
            "sign": signs[name],
            "a_priori_sign": RISK_SIGN[name],
            "n_test": int(test.sum()),
        }
        row |= auroc_ci(s, e, n_boot=cfg.n_boot, seed=cfg.seed).fields("auroc") | _familywise(s, e, level)
        row |= {"aurc": aurc(s, e), "aurc_optimal": optimal_aurc(e), "error_rate": float(e.mean())}
        row["e_aurc"] = row["aurc"] - row["aurc_optimal"]
        row["by_kind"] = _by_kind(risk, false, kinds, test, cfg, level)
        rows.append(row)
        curves += _curve_points(name, s, e)
        abstention += [_abstention(name, risk, false, split, alpha, cfg) for alpha in alphas]
    return rows, abstention, curves


def _over_draws(series: dict[str, list[float]]) -> dict[str, Any]:
    """Each series over the re-draws: its mean (`key`), the mean's 95% interval (± 1.96 standard errors,
    `key_ci95`) and the draws' 5th and 95th percentiles (`key_range90`); None for a series with no draws."""
    out: dict[str, Any] = {}
    for key, values in series.items():
        if values:
            m = float(np.mean(values))
            se = float(np.std(values, ddof=1) / math.sqrt(len(values))) if len(values) > 1 else 0.0
            out[key], out[f"{key}_ci95"] = m, [m - 1.96 * se, m + 1.96 * se]
        else:
            out[key], out[f"{key}_ci95"] = None, None
        out[f"{key}_range90"] = [float(q) for q in np.quantile(values, [0.05, 0.95])] if values else None
    return out


def resplit(
    risk: np.ndarray, false: np.ndarray, split: np.ndarray, alpha: float, cfg: Config, reference: np.ndarray
) -> dict[str, Any]:
    """Both rules over `cfg.n_resplits` random re-draws of which calibration ∪ test subjects calibrate (as many as
    the calibration split holds) and which are scored. CRC promises E[answered and false] ≤ α over the calibration
    draw, so its check is the mean realised joint rate over re-draws (± 1.96 standard errors) — one split's
    Wilson interval leaves out the calibration draw's own spread; `<key>_range90` is the draws' own spread (their
    5th and 95th percentiles). LTT promises P(error rate among answered > α) ≤ δ for the true rate, a draw that
    certifies nothing (and so answers nothing) counting as kept: `ltt_share_above_alpha` is the share of all
    re-draws whose realised rate exceeds α (realised rates add the test split's sampling noise). Beside it, what
    the draws that answer do: how many certify a threshold (`ltt_n_certifying`) and answer at least one test
    prompt (`ltt_n_answering`), their coverage (`ltt_coverage_answering`), their error rate among answers (mean
    over those draws, `ltt_selective_risk`, and pooled over their answers, `ltt_pooled_selective_risk`), how many
    of them exceed α (`ltt_n_above_alpha`), and the smallest LTT p-value over the grid (`ltt_smallest_p_value`,
    the smallest over draws; `ltt_smallest_p_value_median`, the median over draws of each one's smallest)."""
    pool = np.flatnonzero((split == "calibration") | (split == "test"))
    n_cal = int((split == "calibration").sum())
    rng = np.random.default_rng([cfg.seed, 41, round(alpha * 1e6)])
    grid = ltt_grid(reference, n_cal, alpha, cfg.ltt_delta)
    draws: dict[str, list[float]] = {
        key: []
        for key in ("crc_joint_risk", "crc_coverage", "crc_selective_risk")
        + ("ltt_coverage", "ltt_selective_risk", "ltt_coverage_answering")
    }
    ltt_risk = draws["ltt_selective_risk"]
    smallest_p, certifying, answered, wrong = [], 0, 0, 0
    for _ in range(cfg.n_resplits):
        order = rng.permutation(pool)
        cal, test = order[:n_cal], order[n_cal:]
        crc = selective_outcome(risk[test], false[test], crc_threshold(risk[cal], false[cal], alpha))
        draws["crc_joint_risk"].append(crc["joint_risk"])
        draws["crc_coverage"].append(crc["coverage"])
        if crc["selective_risk"] is not None:
            draws["crc_selective_risk"].append(crc["selective_risk"])
        ltt = ltt_threshold(risk[cal], false[cal], alpha, cfg.ltt_delta, grid)
        smallest_p.append(ltt.smallest_p_value)
        certifying += ltt.n_certified > 0
        outcome = selective_outcome(risk[test], false[test], ltt.threshold)
        draws["ltt_coverage"].append(outcome["coverage"])
        if outcome["selective_risk"] is not None:
            ltt_risk.append(outcome["selective_risk"])
            draws["ltt_coverage_answering"].append(outcome["coverage"])
            answered += outcome["n_answered"]
            wrong += outcome["n_wrong_answered"]

    out: dict[str, Any] = {"n_resplits": cfg.n_resplits, "n_calibration": n_cal, "n_test": len(pool) - n_cal}
    out |= _over_draws(draws)
    out["ltt_n_certifying"] = int(certifying)
    out["ltt_n_answering"] = len(ltt_risk)
    out["ltt_n_above_alpha"] = int(np.sum([r > alpha for r in ltt_risk]))
    out["ltt_answered_total"], out["ltt_wrong_total"] = int(answered), int(wrong)
    out["ltt_pooled_selective_risk"] = wrong / answered if answered else None
    out["ltt_smallest_p_value"] = float(min(smallest_p))
    out["ltt_smallest_p_value_median"] = float(np.median(smallest_p))
    # LTT's promise counts a draw that answers nothing as kept: it takes no risk
    out["ltt_share_above_alpha"] = out["ltt_n_above_alpha"] / cfg.n_resplits
    return out


def familywise_level(n_claims: int, alpha: float = 0.05) -> float:
    """The confidence level at which `n_claims` intervals hold together with probability ≥ 1 − alpha (Bonferroni):
    the run makes one separation claim per signal and one per error kind, and with a dozen 95% intervals one
    would exclude ½ by chance about half the time."""
    return 1 - alpha / n_claims


def crc_check(
    risk: np.ndarray,
    false: np.ndarray,
    split: np.ndarray,
    alpha: float,
    n_draws: int,
    seed: int,
    rule: Callable[[np.ndarray, np.ndarray, float], float] = crc_threshold,
) -> dict[str, Any]:
    """Conformal risk control's promise checked on held-out questions, not assumed: the bound is α on the expected
    joint rate E[1{answered and false}] of a new question, over the draw of the calibration questions. Over
    `n_draws` random re-draws of which of the calibration ∪ test questions calibrate (as many as the calibration
    split holds), `rule(scores, false, α)` — `crc_threshold`, the largest λ with (Σ_i L_i(λ) + 1)/(n + 1) ≤ α —
    sets the threshold and the other (held-out) questions realise a joint rate. Every re-draw is an exchangeable
    calibration draw from these questions, so under CRC the mean realised rate is at most α (up to the re-draws'
    own noise): the check holds unless the 95% interval of that mean lies wholly above α. The one split the run
    reports (`split`) is given beside it, with Wilson's interval."""
    calibration, test = split == "calibration", split == "test"
    pool = np.flatnonzero(calibration | test)
    n_cal = int(calibration.sum())
    rng = np.random.default_rng([seed, 43, round(alpha * 1e6)])
    realised = []
    for _ in range(n_draws):
        order = rng.permutation(pool)
        cal, held = order[:n_cal], order[n_cal:]
        threshold = rule(risk[cal], false[cal], alpha)
        realised.append(float(np.mean((risk[held] <= threshold) & false[held])))
    mean = float(np.mean(realised))
    se = float(np.std(realised, ddof=1) / math.sqrt(n_draws)) if n_draws > 1 else 0.0
    interval = [mean - 1.96 * se, mean + 1.96 * se]
    one = selective_outcome(risk[test], false[test], rule(risk[calibration], false[calibration], alpha))
    return {
        "alpha": alpha,
        "bound": alpha,
        "n_calibration": n_cal,
        "n_held_out": len(pool) - n_cal,
        "n_draws": n_draws,
        "realised_joint_risk": mean,
        "realised_joint_risk_ci95": interval,
        "realised_joint_risk_range90": [float(q) for q in np.quantile(realised, [0.05, 0.95])],
        "one_split_joint_risk": one["joint_risk"],
        "one_split_joint_risk_ci95": one["joint_risk_ci95"],
        "one_split_coverage": one["coverage"],
        "holds": bool(interval[0] <= alpha),
    }
