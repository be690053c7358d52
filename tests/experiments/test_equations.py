"""The equations experiment: every check passes on Forma's code, and fails when one detail is flipped."""

import json
import math

import einops
import pytest
import torch
from torch import Tensor

from experiments import equations
from experiments.equations import Config
from experiments.equations.attention import check_attention_scaling, check_causal_mask, check_softmax_saturation
from experiments.equations.check import entries
from experiments.equations.networks import ce_gradient_formula, check_cross_entropy_gradient
from experiments.equations.parameters import PARAMETER_CONFIGS, check_parameter_count_exact, meta_parameter_count
from experiments.equations.perplexity import check_kl_identity
from experiments.equations.positions import check_rotary_relative, check_sinusoidal_shift, check_sinusoidal_wavelengths
from experiments.equations.sampling import check_nucleus, check_temperature
from experiments.equations.seeded import attention_config
from lab.model.attention import Attention
from lab.model.decoding import filter_logits, sample_next
from lab.model.embeddings import sinusoidal_table

REQUIRED = {
    "sinusoidal_shift_is_rotation",
    "sinusoidal_wavelengths",  # 1
    "rotary_relative_position",  # 2
    "dot_product_variance",
    "attention_scaling",
    "softmax_saturation",  # 3
    "causal_mask",
    "reversed_mask_hides_past",  # 4
    "cross_entropy_gradient",  # 5
    "affine_collapse",
    "nonlinearity_breaks_collapse",  # 6
    "universal_approximation",  # 7
    "parameter_count_exact",
    "parameter_count_approximation",
    "llama_7b_parameters",  # 8
    "temperature_limits",  # 9
    "nucleus_smallest_set",  # 10
    "kv_cache_same_tokens",
    "kv_cache_cost",  # 11
    "perplexity",
    "kl_identity",  # 12
}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("equations")
    return equations.run(Config(quick=True), out), out


def test_every_check_passes_and_every_claim_is_covered(quick_run):
    results, _ = quick_run
    names = [c["name"] for c in results["checks"]]
    assert REQUIRED <= set(names), f"missing checks: {REQUIRED - set(names)}"
    assert len(names) == len(set(names))
    assert {c["item"] for c in results["checks"]} == set(range(1, 13))
    failed = {c["name"]: (c["measured"], c["expected"], c["note"]) for c in results["checks"] if not c["passed"]}
    assert not failed, failed
    assert results["all_passed"] is True


def test_results_are_plain_json_with_the_documented_fields(quick_run):
    results, out = quick_run
    text = json.dumps(results, allow_nan=False)
    assert json.loads(text)["all_passed"] is True
    for check in results["checks"]:
        assert {"name", "equation", "measured", "expected", "tolerance", "passed", "note"} <= set(check)
        assert isinstance(check["passed"], bool)
        assert isinstance(check["equation"], str) and check["equation"]
        for key in ("measured", "expected", "tolerance"):
            values = check[key] if isinstance(check[key], list) else [check[key]]
            assert all(type(v) is float and math.isfinite(v) for v in values), (check["name"], key, values)
    for figure in results["figures"]:
        assert (out / figure).stat().st_size > 1000


def test_the_cli_runs_the_experiment_into_a_run_folder(tmp_path):
    from lab.cli.parser import main

    folder = tmp_path / "run"
    assert main(["run", "equations", "--quick", "--out", str(folder)]) == 0
    for name in ("results.json", "config.json", "provenance.json", "universal_approximation.html"):
        assert (folder / name).is_file(), name
    results = json.loads((folder / "results.json").read_text())
    assert results["all_passed"] is True
    assert json.loads((folder / "config.json").read_text()) == {"seed": 0, "quick": True}


# --- flip one implementation detail: the check that guards it must fail -------------------------
def _config(d_model: int, n_heads: int, n_ctx: int):
    return attention_config(d_model, n_heads, n_ctx)


class FutureMaskAttention(Attention):
    """The reversed inequality: query i may read keys j ≥ i."""

    def _causal_mask(self, q_len: int, k_len: int, offset: int, device: torch.device) -> Tensor:
        i = torch.arange(q_len, device=device)[:, None] + offset
        j = torch.arange(k_len, device=device)[None, :]
        return j >= i


class UnscaledAttention(Attention):
    """Attention's explicit path without the 1/√d_k."""

    def _explicit(self, q: Tensor, k: Tensor, v: Tensor, offset: int) -> Tensor:
        scores = einops.einsum(q, k, "batch q_pos head d_head, batch k_pos head d_head -> batch head q_pos k_pos")
        allowed = self._causal_mask(q.shape[1], k.shape[1], offset, q.device)
        scores = self.hook_attn_scores(scores.masked_fill(~allowed, float("-inf")))
        pattern = self.hook_pattern(scores.softmax(dim=-1))
        return einops.einsum(pattern, v, "batch head q_pos k_pos, batch k_pos head d_head -> batch q_pos head d_head")


def test_the_mask_check_fails_when_the_inequality_is_reversed():
    assert check_causal_mask(Attention(_config(32, 4, 12))).passed
    flipped = check_causal_mask(FutureMaskAttention(_config(32, 4, 12)))
    assert not flipped.passed
    assert flipped.measured[0] > 0.1  # weight on the future
    assert flipped.measured[1] > 1e-3  # a later token moves earlier outputs


def test_the_scaling_checks_fail_without_the_square_root():
    assert check_attention_scaling(Attention(_config(128, 1, 2)), n_samples=4000).passed
    unscaled = check_attention_scaling(UnscaledAttention(_config(128, 1, 2)), n_samples=4000)
    assert not unscaled.passed
    assert unscaled.measured == pytest.approx(128, rel=0.1)  # Var(q·k) = d_k
    saturated = check_softmax_saturation(UnscaledAttention(_config(128, 1, 64)))
    assert not saturated.passed


def test_the_nucleus_check_fails_for_a_nucleus_one_token_too_wide():
    def one_too_many(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
        kept = torch.isfinite(filter_logits(logits, top_k, top_p))
        order = logits.argsort(dim=-1, descending=True)
        next_best = order.gather(-1, kept.sum(-1, keepdim=True).clamp(max=logits.shape[-1] - 1))
        return logits.masked_fill(~kept.scatter(-1, next_best, True), float("-inf"))

    assert check_nucleus(filter_logits).passed
    assert not check_nucleus(one_too_many).passed


def test_the_gradient_check_fails_for_a_wrong_formula():
    def flipped_sign(logits: Tensor, targets: Tensor) -> Tensor:
        return -ce_gradient_formula(logits, targets)

    def softmax_only(logits: Tensor, targets: Tensor) -> Tensor:
        return logits.softmax(-1)

    assert check_cross_entropy_gradient().passed
    assert not check_cross_entropy_gradient(formula=flipped_sign).passed
    assert not check_cross_entropy_gradient(formula=softmax_only).passed


def test_the_position_checks_fail_for_wrong_frequencies_or_no_rotation():
    def half_frequencies(n_ctx: int, d_model: int) -> Tensor:
        return sinusoidal_table(n_ctx, d_model, base=10000.0**2)  # ω_i = 10000^(−4i/d)

    assert not check_sinusoidal_shift(half_frequencies, n_ctx=256).passed
    assert not check_sinusoidal_wavelengths(half_frequencies).passed

    class NoRotation(torch.nn.Module):
        def __init__(self, cfg):
            super().__init__()

        def forward(self, x: Tensor, offset: int) -> Tensor:
            return x

    assert not check_rotary_relative(NoRotation).passed


def test_the_temperature_check_fails_when_temperature_multiplies():
    def multiplied(logits: Tensor, temperature: float = 1.0, top_k=None, top_p=None, generator=None) -> Tensor:
        return sample_next(logits * temperature, 1.0, top_k, top_p, generator)  # z·T instead of z/T

    assert check_temperature(sample_next, n_draws=4000).passed
    assert not check_temperature(multiplied, n_draws=4000).passed


def test_the_parameter_check_fails_when_a_count_is_off_by_one_bias():
    small = {name: cfg for name, cfg in PARAMETER_CONFIGS.items() if cfg.d_model < 512}
    assert check_parameter_count_exact(small).passed
    off = check_parameter_count_exact(small, lambda cfg: meta_parameter_count(cfg) + cfg.d_model)
    assert not off.passed


def test_the_kl_identity_check_fails_for_a_wrong_entropy_or_divergence():
    from lab.metrics.information import entropy, kl

    def entropy_in_bits(p: Tensor) -> Tensor:
        return entropy(p, base=2)

    def reversed_kl(p: Tensor, q: Tensor) -> Tensor:
        return kl(q, p)

    assert check_kl_identity(n_samples=20000).passed
    assert not check_kl_identity(n_samples=20000, entropy_fn=entropy_in_bits).passed
    assert not check_kl_identity(n_samples=20000, kl_fn=reversed_kl).passed


def test_headlines_are_one_per_check_and_carry_its_verdict(quick_run):
    results, _ = quick_run
    heads = equations.headlines(results)
    assert results["headlines"] == heads
    assert [h["name"] for h in heads] == [c["name"] for c in results["checks"]]
    assert all(h["direction"] is c["passed"] is h["supported"] for h, c in zip(heads, results["checks"]))
    failing = dict(results, checks=[dict(results["checks"][0], passed=False)] + results["checks"][1:])
    head = equations.headlines(failing)[0]
    assert head["direction"] is False and not head["supported"] and "FAILS" in head["why_not"]


def test_each_check_states_what_it_measured_and_how_each_entry_passes(quick_run):
    """Every measured entry is named in words and carries its rule in words and in symbols (a lower bound reads
    "more than 0.05 (0.6222 > 0.05)", never "within 0"); a passing check's stated rules all hold, and a failing one
    names the entry that breaks its rule. The headline says the same."""
    from dataclasses import asdict

    results, _ = quick_run
    for check in results["checks"]:
        stated = entries(check)
        n = len(check["measured"]) if isinstance(check["measured"], list) else 1
        assert len(stated) == n and all(not e["what"].startswith("entry ") for e in stated), check["name"]
        assert all(e["holds"] for e in stated if e["holds"] is not None), check["name"]
        assert all(e["in symbols"] for e in stated if e["holds"] is not None), check["name"]
    by_name = {c["name"]: c for c in results["checks"]}
    breaks, control = entries(by_name["nonlinearity_breaks_collapse"])
    assert breaks["passes when"] == "more than 0.05" and breaks["in symbols"].endswith(" > 0.05")
    assert control["passes when"] == "at most 1e-10 from 0" and control["in symbols"].endswith(" ≤ 1e-10")
    sentence = next(h["sentence"] for h in results["headlines"] if h["name"] == "nonlinearity_breaks_collapse")
    assert f"more than 0.05 ({breaks['in symbols']})" in sentence and "within [" not in sentence
    saturation = entries(by_name["softmax_saturation"])[-1]
    assert saturation["passes when"] == "at least 0.1" and saturation["holds"]
    flipped = asdict(check_causal_mask(FutureMaskAttention(_config(32, 4, 12))))
    assert [e["holds"] for e in entries(flipped)][:2] == [False, False]


def test_the_config_refuses_a_negative_seed():
    with pytest.raises(ValueError, match="Config: seed must be a non-negative integer, got -1"):
        Config(seed=-1)
