"""P(True): the model judges its own sampled answer, from its output and through each layer's logit lens."""

from typing import Any

import numpy as np
import pandas as pd
import torch

from experiments.calibration.config import Config
from experiments.calibration.readouts import class_counts, fixed_readout_row, judge, make_parts, public_rows
from experiments.calibration.setting import Setting, continuation_logprobs, next_token_logprobs, statement_prefix
from lab.analysis.lens import logit_lens
from lab.metrics.discrimination import MIN_PER_CLASS, auroc_ci
from lab.model.decoding import generate
from lab.model.transformer import HookedTransformer


# --------------------------------------------------------------------------------------------
# P(True): the model judges its own sampled answer, layer by layer
# --------------------------------------------------------------------------------------------
@torch.inference_mode()
def p_true_table(
    model: HookedTransformer, setting: Setting, persons: np.ndarray, samples: int, seed: int
) -> tuple[pd.DataFrame, list[list[int]]]:
    """Sample the value at T = 1 from the full softmax after "<bos> F L birthday", put it into the claim
    "… F L birthday <sample> . Answer :" and read P(True) = p(True) / (p(True) + p(False)). Also the model's own
    probability of the value it sampled (the baseline). Returns the table and the claims' token ids."""
    world, attribute = setting.world, setting.attribute
    value_len = len(world.value_spaces[attribute][0].split())
    people = np.repeat(persons, samples)
    prompts = torch.tensor([setting.ids(statement_prefix(world, int(p), attribute)) for p in people])
    sampled = generate(model, prompts, value_len, temperature=1.0, seed=seed)[:, prompts.shape[1] :]
    tail = setting.ids(". Answer :")
    claims = [row + ids + tail for row, ids in zip(prompts.tolist(), sampled.tolist())]
    log_p = next_token_logprobs(model, claims, setting.token("<pad>"))
    p_yes, p_no = log_p[:, setting.token("True")].exp(), log_p[:, setting.token("False")].exp()
    answer = continuation_logprobs(model, prompts.tolist(), sampled.tolist(), setting.token("<pad>"))
    values = [" ".join(setting.tokenizer.id_to_token(i) for i in ids) for ids in sampled.tolist()]
    truth = [world.true_value(int(p), attribute) for p in people]
    space = set(world.value_spaces[attribute])
    frame = pd.DataFrame(
        {
            "person": people,
            "exposure": setting.exposure[people],
            "value": values,
            "truth": truth,
            "well_formed": [v in space for v in values],
            "correct": [v == t for v, t in zip(values, truth)],
            "p_true": (p_yes / (p_yes + p_no)).numpy(),
            "judgement_mass": (p_yes + p_no).numpy(),
            "answer_probability": np.exp(answer),
        }
    )
    return frame, claims


@torch.inference_mode()
def lens_p_true(model: HookedTransformer, claims: list[list[int]], setting: Setting) -> np.ndarray:
    """[layer, n]: p(True) / (p(True) + p(False)) read through each layer's logit lens after "Answer :" (the last
    row is the model's own P(True))."""
    tokens = torch.tensor(claims)
    ids = [setting.token("True"), setting.token("False")]
    out = []
    for start in range(0, len(claims), 256):
        log_p = logit_lens(model, tokens[start : start + 256])[:, :, -1][..., ids].double()  # [layer, n, 2]
        out.append(log_p.softmax(-1)[..., 0])
    return torch.cat(out, dim=1).numpy()


def p_true_summary(frame: pd.DataFrame, n_boot: int, seed: int) -> dict[str, Any]:
    """P(True) of the model's own answer (the last layer) for every claim and for the subsets; each AUROC with
    n_pos / n_neg and a stratified interval over persons (refused below MIN_PER_CLASS of a class)."""

    def summary(part: pd.DataFrame) -> dict[str, Any]:
        y, s = part["correct"].to_numpy(), part["p_true"].to_numpy()
        return {
            "n": len(part),
            "n_correct": int(y.sum()),
            "accuracy": float(y.mean()),
            "mean_p_true": float(s.mean()),
            "judgement_mass": float(part["judgement_mass"].mean()),
            "well_formed": float(part["well_formed"].mean()),
            **auroc_ci(s, y, part["person"].to_numpy(), n_boot=n_boot, seed=seed).fields("auroc"),
            "brier": float(np.mean((s - y) ** 2)),
        }

    block = summary(frame)
    block["in_subset"] = summary(frame[frame["subset"] == "format"])
    block["out_of_subset"] = summary(frame[frame["subset"] == "outside"])
    block["out_of_subset_seen"] = summary(frame[(frame["subset"] == "outside") & (frame["exposure"] > 0)])
    return block


def p_true_layers(
    model: HookedTransformer,
    untrained: HookedTransformer,
    frame: pd.DataFrame,
    claims: list[list[int]],
    setting: Setting,
    cfg: Config,
) -> dict[str, Any]:
    """P(True) given P(IK)'s treatment: the lens P(True) of every layer (the last is the model's own) as the
    candidates, chosen on a validation half of the persons and reported on the other half (nothing is fitted, so
    there is no training split), beside shuffled labels and the untrained model's lens P(True). Baseline: the
    model's own probability of the answer it sampled."""
    y = frame["correct"].to_numpy().astype(int)
    parts = make_parts(frame["person"].to_numpy(), cfg, probes=False)
    lens = {"trained": lens_p_true(model, claims, setting), "untrained": lens_p_true(untrained, claims, setting)}
    rows = []
    n_layers = lens["trained"].shape[0] - 1
    for layer in range(n_layers + 1):
        rows.append(
            {
                "layer": layer,
                "readout": "lens P(True)",
                "position": "judgement slot",
                "candidate": True,
                "hook": "the model's own output" if layer == n_layers else f"blocks.{layer}.hook_resid_pre",
                **fixed_readout_row(lens["trained"][layer], lens["untrained"][layer], y, parts, cfg.n_boot, cfg.seed),
                "test_scores": lens["trained"][layer][parts.test],
            }
        )
    baseline_scores = frame["answer_probability"].to_numpy()
    baseline = auroc_ci(
        baseline_scores[parts.test], y[parts.test], parts.groups[parts.test], n_boot=cfg.n_boot, seed=cfg.seed
    )
    verdict = judge(rows, "P(True) by layer", baseline, y, parts, baseline_scores, cfg.n_boot, cfg.seed)
    return {
        "by_layer": public_rows(rows),
        "verdict": verdict,
        "class_counts": class_counts(y, parts),
        "baseline": "the model's own probability of the answer it sampled",
        "min_per_class": MIN_PER_CLASS,
        "split": "persons: validation half chooses the layer, test half reports it",
    }
