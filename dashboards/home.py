"""Home: what Forma is, the zoo with each model's card numbers, the latest run of each experiment and the
commands that make the missing ones."""

from typing import Any

import streamlit as st

from dashboards.common import code, latest_run, plain, show_table
from experiments import REGISTRY
from lab.folders import ZooEntry, zoo_entries

# The card.json numbers the table shows (`forma train NAME` measures them; lab.zoo writes the card). A world
# measures what its truth allows: the KL to the true law on a source world, perplexity on English, exact
# match on translation; a column a model's world does not measure shows "—".
CARD_COLUMNS = {
    "parameters": "n_params",
    "steps": "steps",
    "train time (s)": "train_s",
    "held-out loss (nats)": "best_val_loss_nats",
    "KL to the true law (nats)": "val_kl_to_truth_nats",
    "perplexity": "val_perplexity",
    "exact match": "held_out_exact_match",
}


def zoo_row(entry: ZooEntry) -> dict[str, Any]:
    card = entry.card or {}
    if not entry.trained:
        state = f"no: run `forma train {entry.name}`"
    else:
        state = "yes (quick recipe)" if card.get("quick") else "yes"
    return ({"model": entry.name, "trained": state}
            | {column: card.get(key) for column, key in CARD_COLUMNS.items()}
            | {"description": entry.description})


st.title("Forma")
st.markdown(
    "Forma writes the decoder-only transformer down equation by equation, exposes every activation "
    "through TransformerLens hooks, and measures where likelihood and truth part ways on worlds whose "
    "true distribution is known: the **KL decomposition** of the loss, **hallucination** on arbitrary "
    "facts (Kalai–Vempala), and **calibration** (Kadavath).")

st.header("Models")
entries = zoo_entries()
show_table([zoo_row(entry) for entry in entries])
for entry in entries:
    if entry.problem:
        st.warning(plain(entry.problem))

st.header("Experiments")
for entry in REGISTRY:
    folder, results, problem = latest_run(entry.name)
    if problem:
        st.markdown(f"**{entry.title}** — {problem}")
    else:
        st.markdown(f"**{entry.title}** — latest run {code(folder.name)}; open its page in the sidebar.")
