"""Reading the signals: greedy generation with the monitor on, the residual streams the two readouts are fitted on,
each claim's risk and each signal's sign, and the sampling baselines (self-consistency, semantic entropy)."""

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from experiments.monitor.config import SUBJECT, TRAINED
from experiments.monitor.setting import Setting
from lab.analysis.monitor import RISK_SIGN, LinearReadout, Monitor, claim_risk, sample_continuations
from lab.analysis.probes.probe import fit_probe
from lab.metrics.discrimination import MIN_PER_CLASS, auroc
from lab.metrics.selective import answer_agreement, discrete_semantic_entropy
from lab.model.transformer import HookedTransformer


# --------------------------------------------------------------------------------------------
# Reading the signals
# --------------------------------------------------------------------------------------------
def row_slices(n: int, size: int = 512) -> list[slice]:
    return [slice(start, min(n, start + size)) for start in range(0, n, size)]


def monitored(monitor: Monitor, prompts: Tensor, n_new: int) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]:
    """Greedy generation of every prompt with the monitor on, in chunks: the new tokens, the token signals
    [n, n_new] and the prompt signals [n]."""
    tokens, signals, prompt_signals = [], {}, {}
    for part in row_slices(len(prompts)):
        out = monitor.generate(prompts[part], n_new, subject=SUBJECT if monitor.attention else None)
        tokens.append(out.new_tokens)
        for name, value in out.signals.items():
            signals.setdefault(name, []).append(value)
        for name, value in out.prompt_signals.items():
            prompt_signals.setdefault(name, []).append(value)
    return (
        torch.cat(tokens),
        {k: torch.cat(v) for k, v in signals.items()},
        {k: torch.cat(v) for k, v in prompt_signals.items()},
    )


@torch.inference_mode()
def residuals(model: HookedTransformer, tokens: Tensor, hooks: list[str]) -> dict[str, Tensor]:
    """The residual stream of the named hooks over whole sequences (prompt + answer), [n, pos, d_model]."""
    out: dict[str, list[Tensor]] = {h: [] for h in hooks}
    for part in row_slices(len(tokens)):
        _, cache = model.run_with_cache(tokens[part], names_filter=hooks)
        for h in hooks:
            out[h].append(cache[h].float())
    return {h: torch.cat(v) for h, v in out.items()}


def fit_readouts(
    model: HookedTransformer,
    tokens: Tensor,
    prompt_len: int,
    n_new: int,
    false: np.ndarray,
    groups: np.ndarray,
    seed: int,
) -> tuple[LinearReadout | None, LinearReadout | None, dict[str, Any]]:
    """The probe (middle layer, every answer token, label: the claim is false) and P(IK) (last layer, last name
    token, label: the claim is right), logistic, fitted on these rows only (the fit split's subjects)."""
    middle = max(0, model.cfg.n_layers // 2 - 1)
    middle_hook, last_hook = f"blocks.{middle}.hook_resid_post", f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    info: dict[str, Any] = {}
    if min(int(false.sum()), int((~false).sum())) < MIN_PER_CLASS:
        why = (
            f"the fit split holds {int(false.sum())} false and {int((~false).sum())} right claims: a readout "
            f"needs at least {MIN_PER_CLASS} of each"
        )
        return None, None, {"probe": why, "p_ik": why}
    acts = residuals(model, tokens, [middle_hook, last_hook])
    produced = list(range(prompt_len - 1, prompt_len - 1 + n_new))  # the positions that produced each answer token
    X = acts[middle_hook][:, produced].reshape(-1, acts[middle_hook].shape[-1])
    y = np.repeat(false, n_new)
    probe_fit = fit_probe(X, y, "logistic", groups=np.repeat(groups, n_new), seed=seed, n_bootstrap=200)
    pik_fit = fit_probe(acts[last_hook][:, SUBJECT[-1]], ~false, "logistic", groups=groups, seed=seed, n_bootstrap=200)
    probe = None if probe_fit.constant else LinearReadout.from_probe(probe_fit, middle_hook)
    p_ik = None if pik_fit.constant else LinearReadout.from_probe(pik_fit, last_hook, position=SUBJECT[-1])
    for name, fitted in (("probe", probe_fit), ("p_ik", pik_fit)):
        info[name] = {
            "hook": middle_hook if name == "probe" else last_hook,
            "held_out_auroc_within_fit": fitted.metrics["auroc"].value if "auroc" in fitted.metrics else None,
            "regularization": fitted.regularization,
            "constant": fitted.constant,
        }
    return probe, p_ik, info


def claim_risks(
    series: dict[str, Tensor], values: dict[str, np.ndarray], lengths: Tensor, signs: dict[str, int]
) -> dict[str, np.ndarray]:
    """Each claim's risk under `signs`: a token signal's riskiest answer token (`claim_risk`), sign · value for a
    signal read once per prompt."""
    risks = {name: claim_risk(s, lengths, signs[name]).numpy() for name, s in series.items()}
    return risks | {name: signs[name] * np.asarray(v, dtype=np.float64) for name, v in values.items()}


def choose_signs(a_priori: dict[str, np.ndarray], false: np.ndarray, fit: np.ndarray) -> dict[str, int]:
    """Each signal's sign: the probe's and P(IK)'s are their labels' (RISK_SIGN); any other signal keeps RISK_SIGN when
    the claim risk under it (`a_priori`) has AUROC ≥ ½ for a false claim on
    the fit split — or the fit split lacks a class —, the opposite sign otherwise."""
    signs = {}
    for name, risk in a_priori.items():
        if name in TRAINED:  # fitted on the fit split for this label: their AUROC there is not held out
            signs[name] = RISK_SIGN[name]
            continue
        a = auroc(risk[fit], false[fit])
        signs[name] = RISK_SIGN[name] if not math.isfinite(a) or a >= 0.5 else -RISK_SIGN[name]
    return signs


def value_strings(setting: Setting, new_tokens: Tensor) -> list[str]:
    vocab = setting.tokenizer
    return [" ".join(vocab.id_to_token(int(t)) for t in row) for row in new_tokens]


def sampling_risks(
    model: Any,
    batches: list[Tensor],
    answers: list[str],
    answer_of: Any,
    k: int,
    n_new: int,
    seed: int,
    eos_token_id: int | None = None,
) -> dict[str, np.ndarray]:
    """Self-consistency and semantic entropy over k answers sampled at T = 1 (risk values before any sign): the
    prompts come in `batches` (rows of one length each), `answer_of` turns a sampled row of new tokens into the
    answer compared with `answers` (the greedy ones) and with the other samples. Each batch is seeded with `seed`
    plus the number of prompts before it."""
    agreement, entropy, start = [], [], 0
    for batch in batches:
        samples = sample_continuations(model, batch, k, n_new, seed=seed + start, eos_token_id=eos_token_id)
        for row, answer in zip(samples, answers[start : start + len(batch)]):
            texts = [answer_of(s.tolist()) for s in row]
            agreement.append(answer_agreement(texts, answer))
            entropy.append(discrete_semantic_entropy(texts))
        start += len(batch)
    return {"self_consistency": np.array(agreement), "semantic_entropy": np.array(entropy)}
