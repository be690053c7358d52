"""The KL decomposition: E_p[−log P_θ] = H(p) + KL(p‖P_θ), measured exactly on a known source."""

from pathlib import Path

import streamlit as st

from dashboards.common import number, show_figures, show_run


def render(folder: Path, results: dict) -> None:
    st.latex(r"\mathbb{E}_{x\sim p}[-\log P_\theta(x)] = H(p) + \mathrm{KL}(p\,\|\,P_\theta)")
    checkpoints = results.get("checkpoints") or []
    source = results.get("source") or {}
    scaling = results.get("scaling") or {}
    cols = st.columns(4)
    with cols[0]:
        number("Entropy rate H(p) (nats/token)", source.get("entropy_rate_nats"))
    if checkpoints:
        last = checkpoints[-1]
        with cols[1]:
            number("Final cross-entropy (nats)", last.get("cross_entropy_nats"))
        with cols[2]:
            number("Final KL (nats)", last.get("kl_nats"))
        with cols[3]:
            se = last.get("sampled_kl_se")
            number("Sampled KL̂ ± SE (nats)", last.get("sampled_kl_nats"),
                   "{:.4f}" + (f" ± {se:.4f}" if isinstance(se, (int, float)) else ""),
                   help="mean of −log P_θ + log p at the tokens that came, with the standard error over sequences")
    best = results.get("temperature_min") or {}
    if isinstance(best.get("T"), (int, float)):
        st.write(f"KL is smallest at temperature **T = {best['T']:.3f}** ({best.get('kl_nats', float('nan')):.4f} "
                 f"nats; {best.get('kl_at_T1_nats', float('nan')):.4f} at T = 1).")
    if scaling.get("E_nats") is not None:
        ci = scaling.get("E_ci95") or [None, None]
        chain = scaling.get("source") or {}
        on = f" on the order-{chain['order']} chain over {chain['vocab_size']} symbols" if "order" in chain else ""
        st.write(f"Scaling fit L(N) = E + A·N^(−α){on}: **E = {scaling['E_nats']:.4f}** nats, 95% interval "
                 f"[{ci[0]:.4f}, {ci[1]:.4f}], against that chain's entropy rate "
                 f"{scaling.get('true_entropy_nats', float('nan')):.4f}; "
                 f"α = {scaling.get('alpha', float('nan')):.3f}.")
    show_figures(folder)


show_run("kl", render, fields={"checkpoints": list, "source": dict, "scaling": dict, "temperature_min": dict},
         required=("checkpoints", "source"))
