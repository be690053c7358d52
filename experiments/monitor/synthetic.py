"""The synthetic experiment: train on the fact world, fit the readouts on the fit split, generate every subject's
value with the monitor on, judge the signals, write the tables, the model, the readouts and the figures."""

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from experiments.monitor.config import ABSTENTION_SIGNAL, ATTRIBUTE, KINDS, SPLITS, Config
from experiments.monitor.figures import write_figures
from experiments.monitor.judging import judge
from experiments.monitor.readouts import save_readouts
from experiments.monitor.setting import Setting, make_setting, train_model
from experiments.monitor.signals import (
    choose_signs,
    claim_risks,
    fit_readouts,
    monitored,
    row_slices,
    sampling_risks,
    value_strings,
)
from experiments.monitor.summary import headlines
from lab.analysis.monitor import RISK_SIGN, Monitor
from lab.runs import save_table


# --------------------------------------------------------------------------------------------
# The synthetic experiment
# --------------------------------------------------------------------------------------------
def _fit_readouts(model: Any, setting: Setting, fit: np.ndarray, cfg: Config) -> tuple[torch.Tensor, Any, Any, dict]:
    """The probe and P(IK), trained on the fit split's own greedy answers (generated here with no readouts on):
    (those answers' tokens, probe, P(IK), their info)."""
    subjects, prompts, n_new = setting.subjects, setting.prompts, setting.value_len
    groups = np.arange(len(subjects))  # one prompt per subject: a row is its own group
    first, _, _ = monitored(Monitor(model), prompts[fit], n_new)
    answers_fit = value_strings(setting, first)
    false_fit = np.array([a != t for a, t in zip(answers_fit, subjects["truth"][fit])])
    probe, p_ik, readout_info = fit_readouts(
        model, torch.cat([prompts[fit], first], 1), prompts.shape[1], n_new, false_fit, groups[fit], cfg.seed
    )
    return first, probe, p_ik, readout_info


def _sampling_risks(model: Any, setting: Setting, answers: list[str], cfg: Config) -> dict[str, np.ndarray]:
    """The sampling signals: k values per subject at T = 1, compared with its greedy answer."""
    prompts = setting.prompts
    return sampling_risks(
        model,
        [prompts[part] for part in row_slices(len(prompts), 256)],
        answers,
        lambda ids: " ".join(setting.tokenizer.id_to_token(int(t)) for t in ids),
        cfg.k_samples,
        setting.value_len,
        cfg.seed + 31,
    )


def _world_block(cfg: Config, setting: Setting) -> dict[str, Any]:
    """results["world"]: the world's sizes, its prompt and statement, and how the subjects are split."""
    split, kinds = setting.subjects["split"].to_numpy(), setting.subjects["kind"].to_numpy()
    return {
        "n_persons": cfg.n_persons,
        "n_train_statements": cfg.n_train,
        "monofact_rate": setting.world.monofact_rate(),
        "n_values": len(setting.world.value_spaces[ATTRIBUTE]),
        "prompt": "<bos> First Last birthday",
        "statement": "<bos> First Last birthday Month day . <eos>",
        "n_subjects": {kind: int((kinds == kind).sum()) for kind in KINDS},
        "n_by_split": {s: int((split == s).sum()) for s in SPLITS},
        "split": "subjects (persons and invented name pairs) drawn into fit / calibration / test, disjoint; "
        "fit trains the probe and P(IK) and chooses the signs, calibration the thresholds, test "
        "reports",
        "held_out": setting.held_out,
    }


def _model_block(cfg: Config, monitor: Monitor, training: dict[str, Any]) -> dict[str, Any]:
    """results["model"]: its shape, the layers the monitor reads, and how it trained."""
    return {
        "d_model": cfg.d_model,
        "n_layers": cfg.n_layers,
        "n_heads": cfg.n_heads,
        "middle_layer": monitor.middle_layer,
        "attention_layers": list(monitor.attention_layers),
        **training,
    }


def run_synthetic(cfg: Config, out: Path) -> dict[str, Any]:
    timing: dict[str, float] = {}
    began = time.perf_counter()
    setting = make_setting(cfg)
    model, training = train_model(cfg, setting)
    timing["train_s"] = time.perf_counter() - began
    subjects, prompts, n_new = setting.subjects, setting.prompts, setting.value_len
    split, kinds = subjects["split"].to_numpy(), subjects["kind"].to_numpy()

    began = time.perf_counter()
    fit = split == "fit"
    first, probe, p_ik, readout_info = _fit_readouts(model, setting, fit, cfg)
    timing["readouts_s"] = time.perf_counter() - began

    began = time.perf_counter()
    monitor = Monitor(model, probe=probe, p_ik=p_ik)
    new_tokens, token_signals, prompt_signals = monitored(monitor, prompts, n_new)
    timing["monitored_generation_s"] = time.perf_counter() - began
    assert torch.equal(new_tokens[fit], first), "the readouts changed what the model generates"
    answers = value_strings(setting, new_tokens)
    false = np.array([a != t for a, t in zip(answers, subjects["truth"])])  # invented: truth None, always false
    lengths = torch.full((len(subjects),), n_new)

    began = time.perf_counter()
    values = {name: value.double().numpy() for name, value in prompt_signals.items()}
    values |= _sampling_risks(model, setting, answers, cfg)
    timing["sampling_s"] = time.perf_counter() - began
    signs = choose_signs(claim_risks(token_signals, values, lengths, RISK_SIGN), false, fit)
    risks = claim_risks(token_signals, values, lengths, signs)

    began = time.perf_counter()
    rows, abstention, curves = judge(risks, false, kinds, split, signs, cfg)
    timing["judging_s"] = time.perf_counter() - began

    frame = subjects.assign(answer=answers, false=false, truth=subjects["truth"].fillna(""))
    for name, value in risks.items():
        frame[f"risk_{name}"] = value
    results: dict[str, Any] = {
        "world": _world_block(cfg, setting),
        "model": _model_block(cfg, monitor, training),
        "answers": {
            kind: {"n": int((kinds == kind).sum()), "false_rate": float(false[kinds == kind].mean())} for kind in KINDS
        },
        "readouts": readout_info,
        "unavailable": dict(monitor.unavailable),
        "signals": rows,
        "abstention": abstention,
        "abstention_signal": ABSTENTION_SIGNAL,
        "alphas": list(cfg.alphas),
    }
    results["headlines"] = headlines(results)
    results["timing"] = timing

    save_table(frame, out, "prompts")
    save_table(curves, out, "curves")
    model.save(out / "model")
    save_readouts(out, probe, p_ik, signs)
    write_figures(out, results, curves)
    return results
