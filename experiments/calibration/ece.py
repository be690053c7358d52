"""Calibration numbers of a table of items: every ECE with its bootstrap interval and its noise floor, and
temperature scaling fitted on the calibration split."""

from typing import Any

import numpy as np
import pandas as pd

from experiments.calibration.config import EXPOSURE_BINS, N_OPTIONS
from experiments.calibration.setting import exposure_bin
from lab.metrics.calibration import brier, ece_fields, fit_temperature, multiclass_summary, nll, softmax
from lab.metrics.discrimination import bootstrap_ci


# --------------------------------------------------------------------------------------------
# Calibration numbers: every ECE with its bootstrap interval and its noise floor
# --------------------------------------------------------------------------------------------
def option_logits(frame: pd.DataFrame) -> np.ndarray:
    return frame[[f"option_logit_{k}" for k in range(N_OPTIONS)]].to_numpy(dtype=np.float64)


def calibration_summary(frame: pd.DataFrame, n_boot: int, seed: int) -> dict[str, Any]:
    """Issue 7 item 8's `mc` / `lettered` block for a table of items, with the per-exposure breakdown. Every ECE
    (15 equal-width and 10 equal-mass bins) carries its interval, noise floor and debiased estimate."""
    probs = softmax(option_logits(frame))
    labels = frame["answer_index"].to_numpy()
    block = multiclass_summary(probs, labels, n_boot=n_boot, seed=seed)
    confidence, correct = probs.max(axis=1), probs.argmax(axis=1) == labels
    block["label_mass"] = float(frame["label_mass"].mean())
    block["by_exposure"] = []
    if "exposure" not in frame:  # items of a real benchmark: nobody counted what the model saw
        return block
    bins = exposure_bin(frame["exposure"].to_numpy())
    for _, _, label in EXPOSURE_BINS:
        rows = bins == label
        if not rows.any():
            continue
        gap = confidence[rows] - correct[rows]  # per item: confidence − correctness, whose mean is the overconfidence
        block["by_exposure"].append(
            {
                "exposure": label,
                "n": int(rows.sum()),
                "accuracy": float(correct[rows].mean()),
                "mean_confidence": float(confidence[rows].mean()),
                "label_mass": float(frame["label_mass"][rows].mean()),
                "overconfidence": float(gap.mean()),
                "overconfidence_se": float(gap.std(ddof=1) / np.sqrt(len(gap))) if len(gap) > 1 else None,
                **ece_fields(confidence[rows], correct[rows], "ece", n_boot=n_boot, seed=seed),
            }
        )
    return block


BINNINGS = (("ece_15_equal_width", 15, "equal_width"), ("ece_10_equal_mass", 10, "equal_mass"))


def temperature_summary(frame: pd.DataFrame, n_boot: int, seed: int) -> dict[str, Any]:
    """One T fitted by NLL on the calibration split (Guo et al. 2017 §4.2); both ECEs (15 equal-width, 10
    equal-mass bins), NLL and Brier before and after on the test split. Accuracy cannot change: dividing logits by
    T > 0 keeps their order. T's interval resamples the calibration split (refitting T each time); the NLL change's
    interval resamples the test items, paired (the same items before and after)."""
    cal, test = frame[frame["split"] == "calibration"], frame[frame["split"] == "test"]
    cal_logits, cal_labels = option_logits(cal), cal["answer_index"].to_numpy()
    T = fit_temperature(cal_logits, cal_labels)
    t_interval = bootstrap_ci(
        lambda z, y: fit_temperature(z, y, iterations=40), cal_logits, cal_labels, n_boot=min(n_boot, 200), seed=seed
    )
    logits, labels = option_logits(test), test["answer_index"].to_numpy()
    block: dict[str, Any] = {"T": T, "T_ci95": t_interval.interval, "n_calibration": len(cal), "n_test": len(test)}
    for name, temperature in (("before", 1.0), ("after", T)):
        probs = softmax(logits, temperature)
        confidence, correct = probs.max(axis=1), probs.argmax(axis=1) == labels
        for key, n_bins, scheme in BINNINGS:
            block |= ece_fields(confidence, correct, f"{key}_{name}", n_bins, scheme, n_boot=n_boot, seed=seed)
        block[f"nll_{name}"] = nll(probs, labels)
        block[f"brier_{name}"] = brier(confidence, correct).score
        block[f"accuracy_{name}"] = float(correct.mean())
        block[f"mean_confidence_{name}"] = float(confidence.mean())
        block[f"nll_calibration_split_{name}"] = nll(softmax(cal_logits, temperature), cal_labels)
    change = bootstrap_ci(
        lambda z, y: nll(softmax(z), y) - nll(softmax(z, T), y), logits, labels, n_boot=n_boot, seed=seed
    )
    block["nll_decrease"], block["nll_decrease_ci95"] = change.value, change.interval
    return block
