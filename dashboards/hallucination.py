"""Hallucination on arbitrary facts: the Kalai–Vempala bound g(H) ≥ MF − Mis − …, and what moves it."""

from pathlib import Path

import streamlit as st

from dashboards.display import (
    number,
    plain,
    short,
    show_figures,
    show_headlines,
    show_real_track,
    show_run,
    show_table,
    words,
)
from experiments.hallucination.summary import relative_change
from lab.headlines import split as split_headlines

# The run's world in words (results.json "world"), and the columns the tables show (every column is in the download).
WORLD_WORDS = {
    "n_facts": "facts",
    "n_factoids": "well-formed factoids",
    "n_train": "training documents",
    "n_hallucinations": "hallucinations (well-formed non-facts)",
    "n_persons": "persons",
    "n_first_names": "first names",
    "n_last_names": "last names",
    "n_name_pairs": "name pairs",
    "attribute": "attribute",
    "n_values": "values",
    "facts_per_hallucination": "facts per hallucination",
    "kv_term_delta_0_01": "the bound's 3e^(−s)/δ term at δ = 0.01",
    "document": "a document",
    "n_heldout": "held-out documents",
    "d_vocab": "vocabulary",
}
BOUND = "bound_rhs_delta_"
SWEEP_COLUMNS = {
    "gamma": "γ",
    "monofact_rate": "monofact rate MF",
    "missing_mass": "missing mass",
    "checkpoint": "checkpoint",
    "epoch": "epoch",
    "hallucination_rate": "hallucination rate g(H)",
    "fact_rate": "fact rate",
    "miscalibration_tv_eps": "miscalibration Mis (ε bins)",
    "recall_seen": "recall on seen facts",
}
UPWEIGHTING_COLUMNS = {
    "condition": "condition",
    "n_draws": "draws",
    "hallucination_rate": "hallucination rate g(H)",
    "hallucination_rate_se": "its SE",
    "miscalibration_tv_eps": "miscalibration Mis (ε bins)",
    "recall_seen": "recall on seen facts",
    "steps": "steps",
    "documents_seen": "documents seen",
    "upweighted_examples": "upweighted examples",
}


def render(folder: Path, results: dict) -> None:
    st.latex(
        r"g(\mathcal{H}) \;\ge\; \widehat{MF} - \mathrm{Mis}(g, p) - \frac{3e^{-s}}{\delta} - "
        r"\sqrt{\frac{6\ln(6/\delta)}{n}}"
    )
    world = results.get("world") or {}
    if world:
        st.text(
            "The world: "
            + " · ".join(
                f"{WORLD_WORDS.get(k) or words(k)}: {short(v)}"
                for k, v in world.items()
                if isinstance(v, (int, float, str))
            )
        )
    show_headlines(results)
    _warn_one_fact_worlds(results)
    _show_cards(results.get("acceptance") or {}, supported_headlines(results))
    rows = _sweep_rows(results.get("sweep") or [])
    if rows:
        st.subheader("Sweep over the popularity shape γ, at each checkpoint")
        bounds = {
            key: f"bound's right side, δ = {key.removeprefix(BOUND).replace('_', '.')}"
            for key in rows[0]
            if key.startswith(BOUND)
        }
        show_table(rows, SWEEP_COLUMNS | bounds, download="hallucination_sweep")
    upweighting = results.get("upweighting") or []
    if upweighting:
        st.subheader("Selective upweighting (matched compute; each condition the mean over draws of its blocks)")
        show_table(upweighting, UPWEIGHTING_COLUMNS, download="hallucination_upweighting")
    if results.get("singleton"):
        _show_singleton(results["singleton"])
    show_figures(folder)


def _warn_one_fact_worlds(results: dict) -> None:
    """Warn where one fact holds so much of p that the bound's premise fails (the sweep's flagged γ)."""
    flagged = [entry for entry in results.get("sweep") or [] if entry.get("max_fact_probability_flagged")]
    if flagged:
        st.warning(
            "One fact holds a large share of p at "
            + ", ".join(
                f"γ = {plain(entry.get('gamma'))} ({entry.get('max_fact_probability', float('nan')):.1%})"
                for entry in flagged
            )
            + ": the bound is proved for a bounded largest fact probability (the theorem gives no number; Forma flags "
            f"≥ {(results.get('config') or {}).get('max_fact_probability_flag', float('nan')):.0%}), and such a world "
            "is "
            "mostly one fact."
        )


# Each card and the headline whose claim its number is: a card is drawn only where the run supports that claim
# (a claim it cannot support is the reason under "Not shown", never a big number).
CARD_HEADLINES = {
    "spearman": "hallucination_rises_with_monofact_rate_at_every_epoch",
    "right side": "bound_holds",
    "upweighting": "upweighting {condition}",
}


def supported_headlines(results: dict) -> set[str]:
    """The names of the headlines this run supports."""
    parts = split_headlines(results)
    return {h.get("name") for h in parts[0]} if parts else set()


def _show_cards(acceptance: dict, supported: set[str]) -> None:
    """The acceptance cards of the claims the run supports, two a row: the worst Spearman, the largest right side,
    and each upweighting's change."""
    cards = []
    spearman = acceptance.get("spearman_monofact_vs_hallucination") or {}
    if not isinstance(spearman, dict):  # read whether or not its card is drawn: a malformed file is said as one
        raise TypeError(f"spearman_monofact_vs_hallucination is a {type(spearman).__name__}, not a table by epoch")
    if CARD_HEADLINES["spearman"] in supported:
        cards.append(
            (
                "Spearman(MF, g(H)), worst epoch",
                min(spearman.values()) if spearman else None,
                "{:.3f}",
                "rank correlation of the monofact rate with the hallucination rate across γ, at each fixed epoch",
            )
        )
    if CARD_HEADLINES["right side"] in supported:
        cards.append(
            (
                "Largest right side of the bound",
                acceptance.get("largest_right_side"),
                "{:+.3f}",
                f"MF − Mis − slack over {acceptance.get('bound_checks')} checks (both δ); positive in "
                f"{acceptance.get('bound_checks_with_positive_right_side')} of them. Where it is negative the bound "
                f"holds whatever the model does",
            )
        )
    for entry in (acceptance.get("upweighting") or [])[:2]:
        if CARD_HEADLINES["upweighting"].format(condition=entry.get("condition")) not in supported:
            continue
        draws = entry.get("hallucination_reduction_draws") or []
        spread = f" (draws: {', '.join(relative_change(d) for d in draws)})" if draws else ""
        reduction = entry.get("hallucination_reduction")
        lower = not isinstance(reduction, (int, float)) or reduction >= 0
        cards.append(
            (
                f"g(H) {'lowered' if lower else 'raised'} by, {plain(entry.get('condition'))}",  # a label is Markdown
                abs(reduction) if isinstance(reduction, (int, float)) else reduction,
                "{:.1%}",
                f"against the matched-compute control{spread}; miscalibration change "
                f"{entry.get('miscalibration_change', float('nan')):+.3f}, recall change "
                f"{entry.get('recall_change', float('nan')):+.3f}",
            )
        )
    for row in range(0, len(cards), 2):  # two cards a row: each label in full
        for col, (label, value, fmt, help) in zip(st.columns(2), cards[row : row + 2]):
            with col:
                number(label, value, fmt, help=help)


def _sweep_rows(sweep: list) -> list[dict]:
    """One row per (γ, checkpoint): the world's MF and missing mass beside that checkpoint's measures."""
    rows = []
    for entry in sweep:
        for checkpoint in entry.get("checkpoints") or []:
            rows.append(
                {
                    "gamma": entry.get("gamma"),
                    "monofact_rate": entry.get("monofact_rate"),
                    "missing_mass": entry.get("missing_mass"),
                    **checkpoint,
                }
            )
    return rows


def _show_singleton(single: dict) -> None:
    st.subheader("Singleton-rate variant (Kalai, Nachum, Vempala & Zhang 2025)")
    holds = isinstance(single.get("margin"), (int, float)) and single["margin"] >= 0
    st.markdown(
        plain(  # every number here is the run's: shown as text
            f"At γ = {short(single.get('gamma'))}, epoch {short(single.get('epoch'))}: error "
            f"{short(single.get('error'))} against a singleton rate of {short(single.get('singleton_rate'))} "
            f"(calibration δ {short(single.get('calibration_delta'))}, {short(single.get('min_wrong_answers'))} "
            "wrong "
            f"answers per prompt at least, n = {short(single.get('n_train'))}). The bound's right side is "
            f"{short(single.get('bound_rhs'))} with the finite-n term ({short(single.get('finite_n_term'))}) and "
            f"{short(single.get('bound_rhs_without_finite_n'))} without it; the error "
            f"{'exceeds it' if holds else 'falls below it'} by {short(abs(single.get('margin') or 0.0))}."
        )
    )
    if single.get("note"):
        st.caption(plain(single["note"]))


show_run(
    "hallucination",
    render,
    fields={"world": dict, "acceptance": dict, "sweep": list, "upweighting": list, "config": dict, "headlines": list},
    required=("sweep",),
)

REAL_COLUMNS = {
    "monofact_rate": "monofact rate MF",
    "hallucination_rate": "hallucination rate g(H)",
    "hallucination_rate_interval": "g(H): 95% interval",
    "miscalibration": "miscalibration Mis (ε bins)",
    "bound": "MF − Mis",
    "bound_interval": "MF − Mis: 95% interval",
    "margin": "margin g(H) − (MF − Mis)",
    "other_rate": "mass on no city",
    "heldout_wrong_city_mass": "held-out persons: wrong-city mass",
    "heldout_hallucinated": "held-out persons: greedy answer a wrong city",
    "repeated_correct": "repeated persons: greedy answer right",
    "train_s": "fine-tuning (s)",
}

TOY_COLUMNS = {
    "gamma": "γ",
    "monofact_rate": "monofact rate MF",
    "hallucination_rate": "hallucination rate g(H)",
    "miscalibration": "miscalibration Mis (ε bins)",
    "bound": "MF − Mis",
}


def _real_rows(rates: list) -> list[dict]:
    rows = []
    for r in sorted(rates, key=lambda r: r["monofact_rate"]):
        kinds = r.get("by_kind") or {}
        rows.append(
            {
                **{k: r.get(k) for k in REAL_COLUMNS if k in r},
                "heldout_wrong_city_mass": (kinds.get("heldout") or {}).get("wrong_city_mass"),
                "heldout_hallucinated": (kinds.get("heldout") or {}).get("hallucinated"),
                "repeated_correct": (kinds.get("repeated") or {}).get("correct"),
                "train_s": (r.get("training") or {}).get("seconds"),
            }
        )
    return rows


def render_real(folder: Path, results: dict) -> None:
    """The real-model track: the model and the corpus named, the pretrained model on invented persons, then each
    monofact rate's hallucination rate and bound, and the toy run it stands beside."""
    st.markdown(plain(f"{results.get('model_label', results.get('model'))} · {results.get('corpus', '')}"))
    trained = results.get("trained") or {}
    if trained:
        st.caption(plain(f"Fine-tuned: {trained.get('what', '')} ({short(trained.get('n_parameters'))} parameters)."))
    show_headlines(results)
    before = results.get("pretrained") or {}
    if before:
        st.subheader("Before fine-tuning: the pretrained model on invented persons")
        st.markdown(
            plain(
                f"The model {before.get('verdict')}. On “NAME was born in”, {short(before.get('city_mass'))} of its "
                f"next-token mass is on the world's cities; its greedy answer is a wrong city for "
                f"{short(before.get('greedy_hallucinated'))} of the persons and no city for "
                f"{short(before.get('greedy_no_answer'))}."
            )
        )
        show_table(before.get("chat") or [], {"name": "invented person", "reply": "reply", "class": "read as"})
    st.subheader("At each monofact rate, after fine-tuning")
    show_table(_real_rows(results["rates"]), REAL_COLUMNS, download="hallucination_real_rates")
    toy = results.get("toy") or {}
    st.caption(
        plain(
            "The zoo's facts model beside it: the toy run above is cited, not re-measured here"
            + (f" ({toy['run']})." if toy.get("run") else f": {toy.get('note', 'no toy run yet')}.")
        )
    )
    if toy.get("sweep"):
        show_table(toy["sweep"], TOY_COLUMNS)


show_real_track(
    "hallucination",
    render_real,
    fields={"pretrained": dict, "rates": list, "headlines": list, "trained": dict, "toy": dict},
    required=("rates",),
)
