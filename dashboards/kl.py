"""The KL decomposition: E_p[−log P_θ] = H(p) + KL(p‖P_θ), measured exactly on a known source."""

from pathlib import Path

import streamlit as st

from dashboards.display import number, plain, show_figures, show_headlines, show_real_track, show_run


def render(folder: Path, results: dict) -> None:
    st.latex(r"\mathbb{E}_{x\sim p}[-\log P_\theta(x)] = H(p) + \mathrm{KL}(p\,\|\,P_\theta)")
    show_headlines(results)
    checkpoints = results.get("checkpoints") or []
    regions = results.get("regions") or {}
    last = checkpoints[-1] if checkpoints else {}
    # Like with like: the entropy rate is E[H_t] over complete contexts, so it stands beside CE over those.
    _show_complete(results.get("source") or {}, last.get("complete") or {}, regions.get("complete"))
    first = last.get("first") or {}
    if first:
        st.subheader("The first positions, apart")
        if regions.get("first"):
            st.caption(plain(regions["first"]))
        cols = st.columns(3)
        with cols[0]:
            number("H over those prefixes (nats)", first.get("entropy_nats"))
        with cols[1]:
            number("Cross-entropy (nats)", first.get("cross_entropy_nats"))
        with cols[2]:
            number("KL (nats)", first.get("kl_nats"))
    best = results.get("temperature_min") or {}
    if isinstance(best.get("T"), (int, float)):
        st.write(
            f"KL over complete contexts is smallest at temperature **T = {best['T']:.3f}** "
            f"({best.get('kl_nats', float('nan')):.4f} nats; {best.get('kl_at_T1_nats', float('nan')):.4f} at T = 1)."
        )
    scaling = results.get("scaling") or {}
    if scaling.get("E_nats") is not None:
        _show_scaling(scaling)
    hmm = results.get("hmm_source") or {}
    if hmm.get("entropy_rate_estimate_note"):
        st.caption(
            f"Hidden-Markov source: entropy rate ≈ {hmm.get('entropy_rate_estimate_nats', float('nan')):.3f} "
            f"nats ({plain(hmm['entropy_rate_estimate_note'])})."
        )
    show_figures(folder)


def _show_complete(source: dict, complete: dict, region: str | None) -> None:
    """The final checkpoint over complete contexts, two cards a row: H(p), CE, the exact KL and the sampled KL̂."""
    st.subheader("Final checkpoint, complete contexts")
    if region:
        st.caption(plain(region))
    cols = [*st.columns(2), *st.columns(2)]  # two cards a row: each label and number in full
    with cols[0]:
        number(
            "Entropy rate H(p) (nats/token)",
            source.get("entropy_rate_nats"),
            help="Σ_c π(c)·H(p(·|c)), closed form from the stationary law over contexts",
        )
    with cols[1]:
        number("Cross-entropy (nats)", complete.get("cross_entropy_nats"))
    with cols[2]:
        number(
            "KL (nats)",
            complete.get("kl_nats"),
            help=f"mean H over the same prefixes: "
            f"{complete.get('entropy_nats', float('nan')):.4f} (CE − that H is this KL)",
        )
    with cols[3]:
        se = complete.get("sampled_kl_se")
        number(
            "Sampled KL̂ ± SE (nats)",
            complete.get("sampled_kl_nats"),
            "{:.4f}" + (f" ± {se:.4f}" if isinstance(se, (int, float)) else ""),
            help="mean of −log P_θ + log p at the tokens that came, with its standard error over sequences",
        )


def _show_scaling(scaling: dict) -> None:
    """The scaling fit L(N) = E + A·N^(−α): its E with the interval, against the chain's entropy rate."""
    ci = scaling.get("E_ci95") or [float("nan"), float("nan")]
    chain = scaling.get("source") or {}
    on = (
        f" on the order-{plain(chain['order'])} chain over {plain(chain['vocab_size'])} symbols"
        if "order" in chain
        else ""
    )
    opened = f" (open {plain(scaling['E_ci95_open'])})" if scaling.get("E_ci95_open") else ""
    st.write(
        f"Scaling fit L(N) = E + A·N^(−α){on}, {plain(scaling.get('constraints', ''))}: "
        f"**E = {scaling['E_nats']:.4f}** nats, 95% interval [{ci[0]:.4f}, {ci[1]:.4f}]{opened}, against that "
        f"chain's entropy rate {scaling.get('true_entropy_nats', float('nan')):.4f} and the held-out entropy "
        f"{scaling.get('heldout_entropy_nats', float('nan')):.4f}; α = {scaling.get('alpha', float('nan')):.3f}."
    )


show_run(
    "kl",
    render,
    fields={
        "checkpoints": list,
        "source": dict,
        "scaling": dict,
        "temperature_min": dict,
        "regions": dict,
        "hmm_source": dict,
        "headlines": list,
    },
    required=("checkpoints", "source"),
)


def render_real(folder: Path, results: dict) -> None:
    """The real-model track (experiments.kl.real): the model and the world it measured on, the headlines, the
    decomposition before and after fine-tuning, and KL's fall against fine-tuning tokens."""
    world = results.get("world") or {}
    words = world.get("words") or []
    st.markdown(
        f"**{plain(results.get('model_label') or results.get('model') or 'a pretrained model')}** on text from a "
        f"Markov chain of order {plain(world.get('order', '?'))} over {len(words)} words "
        f"({plain(', '.join(w.strip() for w in words))}; entropy rate "
        f"{world.get('entropy_rate_nats', float('nan')):.4f} nats/word), each word one token, after "
        f"{plain(world.get('start_token', 'the start token'))}."
    )
    show_headlines(results)
    checkpoints = results.get("checkpoints") or []
    if checkpoints:
        first, last = checkpoints[0], checkpoints[-1]
        for label, row in (("Before fine-tuning", first), (f"After {last.get('tokens_seen', 0):,} tokens", last)):
            cols = st.columns(4)
            with cols[0]:
                number(f"{label}: CE (nats)", row.get("cross_entropy_nats"))
            with cols[1]:
                number("H(p) (nats)", row.get("entropy_nats"))
            with cols[2]:
                number("KL(p ‖ P_θ) (nats)", row.get("kl_nats"))
            with cols[3]:
                number("P_θ's mass on the words", row.get("mass_on_words"))
    identity = results.get("identity") or {}
    if isinstance(identity.get("max_abs_residual_nats"), (int, float)):
        st.caption(
            f"Largest |CE − H − KL| over every held-out position: {identity['max_abs_residual_nats']:.2e} nats "
            f"(round-off limit {identity.get('tolerance_nats', float('nan')):.0e})."
        )
    show_figures(folder)


show_real_track(
    "kl",
    render_real,
    fields={"checkpoints": list, "world": dict, "identity": dict, "kl_change": dict, "headlines": list},
    required=("checkpoints", "world", "identity"),
)
