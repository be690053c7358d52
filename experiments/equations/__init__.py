"""The seeds' equations, each checked by running it (the claims are docs/definitions.md §4).

Every check is a computation with Forma's own implementation where one exists — `sinusoidal_table`,
`Rotary`, `Attention` (its mask and its 1/√d_k), `next_token_loss`, `ModelConfig.n_params` against a
meta-device `HookedTransformer`, `sample_next`, `filter_logits`, `decode` with and without the KV
cache — compared with what the equation predicts. A check returns

    {name, item, equation (LaTeX), measured, expected, tolerance, passed, note, seconds, timing}

where `item` is the claim's number in the list of checks and `note` states the pass rule when it is not
|measured − expected| ≤ tolerance. `seconds` and `timing` (wall times measured alongside, never gated) are
the only fields that differ between two runs with one seed (lab.runs.TIMING_FIELDS); every least-squares
fit uses the SVD driver gelsd, because MKL's default gelsy (QR with column pivoting) gives different
solutions for one input from call to call. The implementation a check tests is a parameter (`attention=`,
`filter_fn=`, `formula=`, …), so a test can hand it a wrong one — the mask written j ≥ i, no √d_k, a
nucleus one token too wide — and see that check fail.

Artefacts in `out`: universal_approximation.html (sup error against width, and the fits) and
softmax_saturation.html (attention entropy against d_k, with and without the scaling).

Where each claim is checked: `positions` (1, 2), `attention` (3, 4), `networks` (5–7), `parameters` (8),
`sampling` (9, 10), `kv_cache` (11), `perplexity` (12); `check` holds the Check record and its rules,
`seeded` what the checks compute with (float64, seeded generators and layers, recording hooks), `figures` the
figures, `config` the Config and its two profiles; run and headlines are here, and every name is imported from
`experiments.equations` itself.
"""

import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import torch

# Every name the experiment had as one module, where it lives now: the tests import them from here.
from experiments.equations.attention import (
    check_attention_scaling,
    check_causal_mask,
    check_dot_product_variance,
    check_reversed_mask,
    check_softmax_saturation,
)
from experiments.equations.check import Check, entries
from experiments.equations.config import Config
from experiments.equations.figures import write_figures
from experiments.equations.kv_cache import check_kv_cache_cost, check_kv_cache_tokens
from experiments.equations.networks import (
    check_affine_collapse,
    check_cross_entropy_gradient,
    check_nonlinearity_breaks_collapse,
    check_universal_approximation,
    universal_approximation,
)
from experiments.equations.parameters import check_llama_7b, check_parameter_approximation, check_parameter_count_exact
from experiments.equations.perplexity import check_kl_identity, check_perplexity
from experiments.equations.positions import check_rotary_relative, check_sinusoidal_shift, check_sinusoidal_wavelengths
from experiments.equations.sampling import check_nucleus, check_temperature
from lab.headlines import title


def _plan(cfg: Config, ua: dict[str, Any]) -> list[Callable[[], Check]]:
    """Every check, in order, bound to the run's seed and sizes; the universal-approximation check also fills `ua`
    with its run."""
    seed, samples = cfg.seed, cfg.profile.samples

    def ua_check() -> Check:
        ua.update(universal_approximation())
        return check_universal_approximation(ua)

    return [
        check_sinusoidal_shift,
        check_sinusoidal_wavelengths,
        partial(check_rotary_relative, seed=seed),
        partial(check_dot_product_variance, n_samples=samples, seed=seed),
        partial(check_attention_scaling, n_samples=samples, seed=seed),
        partial(check_softmax_saturation, seed=seed),
        partial(check_causal_mask, seed=seed),
        partial(check_reversed_mask, seed=seed),
        partial(check_cross_entropy_gradient, seed=seed),
        partial(check_affine_collapse, seed=seed),
        partial(check_nonlinearity_breaks_collapse, seed=seed),
        ua_check,
        check_parameter_count_exact,
        check_parameter_approximation,
        check_llama_7b,
        partial(check_temperature, n_draws=samples, seed=seed),
        partial(check_nucleus, seed=seed),
        partial(check_kv_cache_tokens, seed=seed),
        partial(
            check_kv_cache_cost,
            prefixes=cfg.profile.kv_prefixes,
            repeats=cfg.profile.kv_repeats,
            seed=seed,
        ),
        partial(check_perplexity, seed=seed),
        partial(check_kl_identity, n_samples=samples, seed=seed),
    ]


def run(cfg: Config, out: Path) -> dict:
    """Run every check, write the figures into `out`, return {checks, all_passed, ...} for results.json."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ua: dict[str, Any] = {}  # the universal-approximation run, which its check fills and the figures draw
    plan = _plan(cfg, ua)
    checks = []
    start = time.perf_counter()
    # Every tensor here is tiny: on shared cores, intra-op threads cost more in synchronisation than they
    # gain (measured ≈ 10× slower with 2 threads under load), so run on one and restore the caller's setting.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for make in plan:
            began = time.perf_counter()
            check = make()
            check.seconds = time.perf_counter() - began
            checks.append(check)
        figures = write_figures(out, ua, cfg.seed)
    finally:
        torch.set_num_threads(threads)
    results = {
        "checks": [_plain(asdict(c)) for c in checks],
        "all_passed": all(c.passed for c in checks),
        "n_checks": len(checks),
        "n_passed": sum(c.passed for c in checks),
        "failed": [c.name for c in checks if not c.passed],
        "figures": figures,
        "seconds": time.perf_counter() - start,
    }
    results["headlines"] = headlines(results)
    return results


def headlines(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One headline per check, computed from results["checks"]: the claim, whether it passed (the direction,
    which the quick and default runs must share), and each measured entry against its rule, in words and in
    symbols (`check.entries`); a check that fails is not supported, its sentence the reason. Every check is a
    computation that a wrong implementation fails (the tests hand each one a wrong one)."""
    out = []
    for check in results["checks"]:
        measured = check["measured"]
        stated = [f"{e['what']}: {e['passes when']} ({e['in symbols']})" for e in entries(check) if e["in symbols"]]
        shown = any(not e["in symbols"] for e in entries(check))
        sentence = (
            f"{title(check['name'])} (claim {check['item']}) "
            f"{'passes' if check['passed'] else 'FAILS'}: "
            + "; ".join(stated)
            + ("; and the rule in its note" if shown else "")
            + "."
        )
        out.append(
            {
                "name": check["name"],
                "sentence": sentence,
                "value": measured if not isinstance(measured, list) else measured[0],
                "interval": None,
                "direction": bool(check["passed"]),
                "supported": bool(check["passed"]),
                "why_not": None if check["passed"] else sentence,
            }
        )
    return out


def _plain(record: dict[str, Any]) -> dict[str, Any]:
    """Python floats and bools only, so results.json is plain JSON (no numpy or torch scalars)."""

    def plain(value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (bool, str)) or value is None:
            return value
        return float(value)

    return {k: plain(v) if k not in ("name", "item", "equation", "note") else v for k, v in record.items()}
