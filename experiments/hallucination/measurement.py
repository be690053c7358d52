"""Everything the bound needs at one checkpoint: g(F), g(H) and the malformed mass, miscalibration in
ε-log and adaptive bins, both sides of the Kalai–Vempala bound, the sampled documents against the enumeration,
and the singleton-rate variant."""

import math
from typing import Any

import numpy as np

from experiments.hallucination.config import ADAPTIVE_BINS, DELTAS, EPS, Config, delta_key
from experiments.hallucination.enumeration import enumerate_g, sample_documents
from experiments.hallucination.setting import Setting
from lab.metrics.hallucination import (
    bin_table,
    bound_slack,
    kl_hat,
    monofact_rate,
    singleton_bound,
    singleton_calibration_delta,
)
from lab.model.transformer import HookedTransformer


# --------------------------------------------------------------------------------------------
# Everything measured at one checkpoint
# --------------------------------------------------------------------------------------------
def _name_pair_masses(g: np.ndarray, setting: Setting) -> dict[str, float]:
    """g's mass on name pairs whose person training never showed, and on pairs that are no person (invented)."""
    n_first, n_last, n_values = setting.shape
    pair_mass = g.reshape(n_first * n_last, n_values).sum(axis=1)
    seen_pair = np.zeros(n_first * n_last, dtype=bool)
    person_pair = np.zeros(n_first * n_last, dtype=bool)
    pair_of_fact = setting.fact_first * n_last + setting.fact_last
    person_pair[pair_of_fact] = True
    seen_pair[pair_of_fact[setting.world.train_counts > 0]] = True
    return {
        "unseen_person_mass": float(pair_mass[~seen_pair].sum()),
        "invented_person_mass": float(pair_mass[~person_pair].sum()),
    }


def _sampled(
    model: HookedTransformer, setting: Setting, cfg: Config, seed: int, exact: dict[str, float]
) -> dict[str, Any]:
    """cfg.n_samples documents drawn at T = 1 and judged: each kind's rate, and its z against the exact rate."""
    drawn = sample_documents(model, setting, cfg.n_samples, seed)
    n = cfg.n_samples
    out: dict[str, Any] = {}
    for kind, rate_exact in exact.items():
        rate = drawn[kind] / n
        se = math.sqrt(max(rate_exact * (1.0 - rate_exact), 1e-300) / n)  # the binomial SE at the exact rate
        out[f"sampled_{kind}_rate"] = rate
        out[f"sampled_{kind}_z"] = (rate - rate_exact) / se
    g_hall = exact["hallucination"]
    out["sampled_se"] = math.sqrt(g_hall * (1.0 - g_hall) / n)
    out["n_samples"] = n
    return out


def _singleton(setting: Setting, conditional: np.ndarray, cfg: Config) -> dict[str, Any]:
    """The singleton variant from each person's conditional over values (`conditional`, [fact, value]): prompts
    c = persons ("First Last attribute"), μ(c) = p(c's fact), one correct answer."""
    world = setting.world
    min_wrong = setting.shape[2] - 1
    error = float(world.p @ (conditional.sum(axis=1) - conditional[np.arange(len(world.facts)), setting.fact_value]))
    sr = monofact_rate(world.train_counts)  # prompts are facts here: the singleton rate is the monofact rate
    delta = singleton_calibration_delta(conditional, setting.fact_value, world.p, 1.0 / min_wrong)
    sb = singleton_bound(error, sr, min_wrong, cfg.n_train, delta)
    return {
        "error": error,
        "singleton_rate": sr,
        "calibration_delta": delta,
        "min_wrong_answers": min_wrong,
        "n_train": cfg.n_train,
        "finite_n_term": sb.finite_n_term,
        "bound_rhs": sb.right_side,
        "bound_rhs_without_finite_n": sb.right_side_without_finite_n,
        "margin": sb.margin,
        "margin_without_finite_n": sb.margin_without_finite_n,
        "malformed_answer_mass": float(world.p @ (1.0 - conditional.sum(axis=1))),
    }


def measure(model: HookedTransformer, setting: Setting, cfg: Config, seed: int) -> tuple[dict, list[dict], dict]:
    """(the bound's metrics, per-bin rows, singleton-variant numbers) for the model as it is."""
    world = setting.world
    enum = enumerate_g(model, setting)
    g = np.exp(enum.log_g).reshape(-1)
    counts = world.train_counts
    is_fact = np.zeros(g.size, dtype=bool)
    is_fact[setting.fact_y] = True
    p = np.zeros(g.size)
    p[setting.fact_y] = world.p
    g_facts = float(g[setting.fact_y].sum())
    g_hall = float(g[~is_fact].sum())
    malformed = enum.malformed

    seen = counts > 0
    answers = enum.log_g[setting.fact_first, setting.fact_last]  # [fact, value]
    recalled = answers.argmax(axis=1) == setting.fact_value
    conditional = np.exp(answers - enum.prompt_log_p[setting.fact_first, setting.fact_last][:, None])

    tables = {scheme: bin_table(g, p, scheme, EPS, ADAPTIVE_BINS) for scheme in ("eps", "adaptive")}
    mis_eps = tables["eps"].miscalibration
    mf = monofact_rate(counts)
    n_hall = setting.n_factoids - len(world.facts)
    metrics: dict[str, Any] = {
        "hallucination_rate": g_hall,
        "fact_rate": g_facts,
        "malformed_rate": malformed,
        "sum_check": g_facts + g_hall + malformed - 1.0,
        "malformed_by_position": enum.leaks,
        "hallucination_share": g_hall / (g_hall + g_facts),
        **_name_pair_masses(g, setting),
        "miscalibration_tv_eps": mis_eps,
        "miscalibration_tv_adaptive": tables["adaptive"].miscalibration,
        "miscalibration_binmass": tables["eps"].binmass,
        "miscalibration_binmass_adaptive": tables["adaptive"].binmass,
        # p^Π(H) (p lives on all of F): g(H) ≥ p^Π(H) − Mis for every model, the deterministic half of the bound.
        "p_pi_hallucination_mass": tables["eps"].spread_off_support,
        "kl_hat": kl_hat(g[setting.fact_y[seen]], counts[seen], "eps", EPS),
        "recall_seen": float(recalled[seen].mean()),
        "recall_seen_mass": float(conditional[seen, setting.fact_value[seen]].mean()),
    }
    for delta in DELTAS:
        bound = bound_slack(g_hall, mf, mis_eps, len(world.facts), n_hall, cfg.n_train, delta)
        metrics[f"bound_rhs_delta_{delta_key(delta)}"] = bound.right_side
        metrics[f"bound_slack_delta_{delta_key(delta)}"] = bound.slack
        metrics[f"bound_margin_delta_{delta_key(delta)}"] = bound.margin

    metrics |= _sampled(model, setting, cfg, seed, {"hallucination": g_hall, "fact": g_facts, "malformed": malformed})

    bins = [{"scheme": scheme, **row} for scheme, table in tables.items() for row in table.rows()]

    return metrics, bins, _singleton(setting, conditional, cfg)
