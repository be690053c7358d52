"""The KL decomposition: E_p[−log P_θ] = H(p) + KL(p‖P_θ), measured exactly on a known source."""

import streamlit as st

from dashboards.common import number, show_figures, show_run_header

folder, results = show_run_header("kl")
if results is None:
    st.stop()
st.latex(r"\mathbb{E}_{x\sim p}[-\log P_\theta(x)] = H(p) + \mathrm{KL}(p\,\|\,P_\theta)")
checkpoints = results.get("checkpoints") or []
source = results.get("source") or {}
scaling = results.get("scaling") or {}
temperature = results.get("temperature") or []
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
        number("Sampled KL̂ ± SE", last.get("sampled_kl_nats"),
               help=f"standard error {last.get('sampled_kl_se')}")
if temperature:
    best = min(temperature, key=lambda r: r.get("kl_nats", float("inf")))
    st.write(f"KL is smallest at temperature **T = {best.get('T')}** ({best.get('kl_nats'):.4f} nats).")
if scaling.get("E_nats") is not None:
    ci = scaling.get("E_ci95") or [None, None]
    st.write(f"Scaling fit L(N) = E + A·N^(−α): **E = {scaling['E_nats']:.4f}** nats, 95% interval "
             f"[{ci[0]:.4f}, {ci[1]:.4f}], against the true entropy rate {scaling.get('true_entropy_nats', float('nan')):.4f}; "
             f"α = {scaling.get('alpha', float('nan')):.3f}.")
show_figures(folder)
