"""Catch hallucinations while they are generated: generate with the monitor on, each token coloured by its risk,
the point where conformal risk control would abstain, and the experiment's curves."""

import math
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from dashboards.display import (
    plain,
    read_table,
    show_figures,
    show_headlines,
    show_real_track,
    show_run,
    show_table,
    warn_shape,
)
from lab.names import SIGNALS, name


@st.cache_resource(show_spinner="Loading the run's model…")
def load_monitor(folder: str, version: float):
    from experiments.monitor.readouts import load_readouts
    from lab import HookedTransformer

    model = HookedTransformer.load(Path(folder) / "model")
    probe, p_ik, signs = load_readouts(Path(folder))
    return model, probe, p_ik, signs


def _prompt(folder: Path, model: Any) -> tuple[str, list[int]] | None:
    """The prompt box (the run's first prompt to start with): its text and ids, or None after a warning where it is
    not 1 … n_ctx − 1 of the world's words."""
    prompts = read_table(folder / "prompts.parquet", "monitor", columns=["first", "last"])
    example = "<bos> " + " ".join(prompts.iloc[0]) + " birthday" if prompts is not None and len(prompts) else "<bos>"
    text = st.text_input("Prompt (the world's words; the name's two tokens follow <bos>)", example)
    ids = model.tokenizer.encode(text).ids
    unknown = [w for w, i in zip(text.split(), ids) if model.tokenizer.id_to_token(i) == "<unk>"]
    if not ids or unknown or len(ids) >= model.cfg.n_ctx:
        st.warning(
            f"The prompt must be 1 … {model.cfg.n_ctx - 1} of the world's words"
            + (f"; not in its vocabulary: {', '.join(unknown)}" if unknown else "")
        )
        return None
    return text, ids


def live(folder: Path, results: dict) -> None:
    """A prompt box: generate with every signal read, colour each new token by the chosen signal's risk against
    the CRC threshold for the chosen α, and say where the monitor would stop."""
    from experiments.monitor.config import SUBJECT
    from lab.analysis.monitor import Monitor, abstain_at

    st.subheader("Generate with the monitor on")
    if not (folder / "model").is_dir():
        st.info(
            "This run has no model/ folder (a `--model --qa` run, or an older one): run `forma run monitor "
            "--quick` to generate here."
        )
        return
    model, probe, p_ik, signs = load_monitor(str(folder), (folder / "model").stat().st_mtime)
    prompt = _prompt(folder, model)
    if prompt is None:
        return
    text, ids = prompt
    entries = [a for a in results.get("abstention") or [] if isinstance(a, dict)]
    monitor = Monitor(model, probe=probe, p_ik=p_ik, attention=len(ids) > SUBJECT[-1])
    signal = st.selectbox(
        "Risk signal",
        [s for s in monitor.token_signals if s in signs],
        format_func=name,
    )
    alphas = sorted({a["alpha"] for a in entries if a.get("signal") == signal})
    alpha = st.selectbox("Target error rate α (conformal risk control)", alphas) if alphas else None
    new = st.slider("New tokens", 1, model.cfg.n_ctx - len(ids), min(2, model.cfg.n_ctx - len(ids)))
    import torch

    out = monitor.generate(torch.tensor([ids]), new, subject=SUBJECT if monitor.attention else None)
    risk = (signs[signal] * out.signals[signal][0].double()).tolist()
    threshold = next(
        (a["crc"]["threshold"] for a in entries if a.get("signal") == signal and a.get("alpha") == alpha), math.inf
    )
    stop = abstain_at(risk, len(risk), threshold)
    words = [model.tokenizer.id_to_token(int(t)) for t in out.new_tokens[0]]
    coloured = [f":{'red' if r > threshold else 'green'}[{plain(w)}]" for w, r in zip(words, risk)]
    st.markdown(f"{plain(text)} " + " ".join(coloured))
    named = plain(name(signal))
    st.markdown(
        f"Threshold λ̂ = {threshold:.3f} on risk = {signs[signal]:+d} · {named}: "
        + (
            f"the monitor abstains at new token {stop + 1} (**{plain(words[stop])}**)."
            if stop is not None
            else "every token stays at or below it: the answer is given."
        )
    )
    show_table(
        pd.DataFrame({"token": words, **{key: out.signals[key][0].tolist() for key in out.signals}}),
        {"token": "new token"} | {key: name(key) for key in out.signals},
    )


SIGNAL_COLUMNS = {
    "signal": "signal",
    "sign": "sign (+1: higher is riskier)",
    "n_test": "test prompts",
    "error_rate": "error rate",
    "auroc": "AUROC",
    "auroc_ci95": "95% interval",
    "auroc_familywise_ci": "familywise interval",
    "aurc": "AURC",
    "aurc_optimal": "best possible AURC",
    "e_aurc": "AURC above the best",
}


def show_answers(results: dict) -> None:
    answers = results.get("answers") or {}
    if answers:
        st.write(
            " · ".join(
                f"{plain(kind)}: **{plain(a.get('n'))}** prompts, false **{a.get('false_rate', float('nan')):.0%}**"
                for kind, a in answers.items()
                if isinstance(a, dict)
            )
        )


def show_signals(folder: Path, results: dict, experiment: str = "monitor") -> None:
    """The signals' table on the test split, each signal named in words."""
    signals = results.get("signals") or []
    malformed = [
        i
        for i, row in enumerate(signals)
        if not isinstance(row, dict)
        or not isinstance(row.get("signal"), str)
        or not all(isinstance(row.get(k), (int, float)) for k in ("auroc", "aurc"))
    ]
    if malformed:
        warn_shape(
            folder,
            experiment,
            f"signals {malformed} are not objects with a signal name and numbers for auroc and aurc; they are left out",
        )
    rows = [{k: v for k, v in row.items() if k != "by_kind"} for i, row in enumerate(signals) if i not in malformed]
    if rows:
        st.subheader("Signals on the test split")
        level = rows[0].get("auroc_familywise_level")
        columns = SIGNAL_COLUMNS | (
            {"auroc_familywise_ci": f"{level:.2%} familywise interval"} if isinstance(level, float) else {}
        )
        show_table(
            [row | {"signal": name(row["signal"])} for row in rows],
            columns,
            download=f"{experiment}_signals",
        )


def render(folder: Path, results: dict) -> None:
    show_headlines(results)
    show_answers(results)
    show_signals(folder, results)
    live(folder, results)
    show_figures(folder, names=SIGNALS)  # the signals named as the table above names them


CRC_COLUMNS = {
    "signal": "signal",
    "alpha": "α (the bound)",
    "n_calibration": "calibration questions",
    "n_held_out": "held-out questions",
    "n_draws": "draws",
    "realised_joint_risk": "answered and false, held out (mean over draws)",
    "realised_joint_risk_ci95": "95% interval of the mean",
    "one_split_joint_risk": "answered and false, the run's test split",
    "one_split_coverage": "coverage, the run's test split",
    "holds": "within the bound",
}


def render_real(folder: Path, results: dict) -> None:
    """The real-model track: the model and the questions it answered, its accuracy, the signals' table, conformal
    risk control checked on held-out questions, and the figures."""
    source = results.get("source") or {}
    st.markdown(
        f"**{plain(source.get('model_label', source.get('model', 'a pretrained model')))}** on "
        f"{plain(source.get('questions', 'the real question set'))}: {plain(source.get('n_items'))} questions, "
        f"{plain(source.get('prompt_format', ''))}; {plain(source.get('scoring', ''))}."
    )
    show_headlines(results)
    show_answers(results)
    by_kind = results.get("accuracy_by_kind") or {}
    if by_kind:
        st.write("Right answers by kind of question: " + " · ".join(f"{plain(k)} {v:.0%}" for k, v in by_kind.items()))
    show_signals(folder, results, "monitor_real")
    checks = [c for c in results.get("crc_check") or [] if isinstance(c, dict) and isinstance(c.get("signal"), str)]
    if checks:
        st.subheader("Conformal risk control, checked on held-out questions")
        st.caption(
            "Each draw calibrates the threshold on as many questions as the calibration split holds and measures "
            "the share of the other questions answered and false; the promise is that its mean is at most α."
        )
        show_table([c | {"signal": name(c["signal"])} for c in checks], CRC_COLUMNS, download="monitor_real_crc")
    show_figures(folder, names=SIGNALS)


show_run(
    "monitor",
    render,
    fields={"signals": list, "abstention": list, "answers": dict, "headlines": list},
    required=("signals",),
)
show_real_track(
    "monitor",
    render_real,
    fields={"signals": list, "crc_check": list, "answers": dict, "headlines": list, "source": dict},
    required=("signals",),
)
