"""Forma's words for the keys its runs write: one display name for each method, risk signal, grade and readout
(`max_prob` is "top probability", `gradient_x_input` is "gradient × input", `kl_true` is "KL to the truth"). Every
dashboard page, every figure a page draws and every headline `forma run` prints names them from these tables, and
nowhere else. Standard library only.
"""

import re

# The monitor's risk signals (experiments.monitor), as its table, its charts, its prompt box and its headlines say them.
SIGNALS = {
    "max_prob": "top probability",
    "entropy": "entropy",
    "margin": "top-two margin",
    "lens_kl": "logit-lens KL",
    "subject_attention": "attention on the subject",
    "probe": "probe",
    "p_ik": "P(IK)",
    "self_consistency": "self-consistency",
    "semantic_entropy": "semantic entropy",
}

# The interpretability methods the scoreboard grades (lab.analysis.input_attribution.METHODS and the rest).
METHODS = {
    "gradient": "gradient",
    "gradient_x_input": "gradient × input",
    "integrated_gradients": "integrated gradients",
    "occlusion": "occlusion",
    "attention": "attention",
    "attention_rollout": "attention rollout",
    "attribution_patching": "attribution patching",
    "attribution_graph": "attribution graph",
    # the trivial baselines every attribution method is graded beside (lab.metrics.grades.BASELINES)
    "recency": "recency (score = position)",
    "last_token": "last token only",
    "uniform": "uniform",
    "random": "random scores",
    "logit lens": "logit lens",
    "tuned lens": "tuned lens",
    "jacobian lens": "Jacobian lens",
    "same-position jacobian lens": "same-position Jacobian lens",
    "linear probe": "linear probe",
    "last-tokens lookup": "lookup of the last k tokens",
    "head detectors": "head detectors",
    "previous_token": "previous-token",
}

# The grades of the scoreboard's table (experiments.scoreboard), each what it measures.
GRADES = {
    "auroc": "AUROC",
    "auroc_necessary": "AUROC for the heads copying needs",
    "margin_induction": "lead of the induction detector's heads (nats)",
    "margin_previous_token": "lead of the previous-token detector's heads (nats)",
    "kl_true": "KL to the truth (nats)",
    "kl_model": "KL to the model (nats)",
    "prompt_gain": "nats gained over another prompt's reading",
    "relevant_mass": "mass on the relevant positions",
    "replacement_score": "replacement score",
    "rank_correlation": "Spearman ρ with the model's effects",
    "spearman_induction": "Spearman ρ of the induction score",
    "spearman_previous_token": "Spearman ρ of the previous-token score",
    "pearson r": "Pearson r",
    "selectivity": "selectivity",
    "r2 belief state": "R² of the belief state",
    "r2 beyond the token": "R² beyond the token",
    "r2 beyond the token untrained": "R² beyond the token, untrained model",
    "r2 control task": "R², control task",
    "r2 untrained": "R², untrained model",
    "accuracy fact value": "accuracy on the fact's value",
    "accuracy control task": "accuracy, control task",
    "accuracy untrained": "accuracy, untrained model",
    "accuracy logit lens": "accuracy of the model's own logit-lens reading",
    "accuracy beyond lens": "accuracy beyond the model's own reading",
}

# Where a method reads the model (the scoreboard's "readout" column and the patching figure's panels).
READOUTS = {
    "resid_pre": "residual stream before the block",
    "attn_out": "attention's output",
    "mlp_out": "the MLP's output",
    "resid_post": "residual stream after the block",
    "resid_pre 0": "before block 0",
    "resid_pre 1": "before block 1",
    "all sources": "all sources",  # the induction world's truth: every lawful copy source
    "unique source": "unique source",  # its prompts with one copy source
}

# The scoreboard's worlds whose keys are not words.
WORLDS = {"long_induction": "long-span induction"}

NAMES = SIGNALS | METHODS | GRADES | READOUTS | WORLDS


def keys(names: dict[str, str]) -> list[str]:
    """The keys of `names` that no sentence uses as English ("max_prob", "jacobian lens", "auroc"; not "margin" or
    "heads"), longest first: those `in_words` replaces in free text."""
    found = [k for k, v in names.items() if "_" in k or (" " in k and v != k) or (v != k and v.lower() == k.lower())]
    return sorted(found, key=len, reverse=True)


def name(key: str) -> str:
    """The display name of a method, signal, grade or readout; any other key with its underscores read as spaces."""
    return NAMES.get(key) or str(key).replace("_", " ")


def in_words(text: str, names: dict[str, str] = NAMES) -> str:
    """`text` with every key of `names` that no sentence uses as English (`keys`), where it stands as a word of its
    own, replaced by its display name (a figure's title "markov: kl_true" → "markov: KL to the truth (nats)")."""
    found = keys(names)
    if not found:
        return str(text)
    pattern = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, found)) + r")(?![\w-])")
    return pattern.sub(lambda m: names[m.group(1)], str(text))
