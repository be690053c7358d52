"""Home: what Forma is, the zoo with each model's card numbers, the latest run of each experiment and the
commands that make the missing ones."""

from typing import Any

import streamlit as st

from dashboards.display import PROGRESS_REFRESH_S, code, latest_run, made_at, plain, show_table
from experiments import REGISTRY
from lab.folders import ZooEntry, zoo_entries
from lab.jobs import model_progress, queued, run_progress
from lab.runs import run_record

# The card.json numbers the table shows (`forma build NAME` measures them; lab.zoo writes the card). A world
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
    training, place = model_progress(entry.name), queued("build", entry.name)
    if not entry.trained and training is not None and training.active:
        state = f"training now: {training.line()}"
    elif not entry.trained and place is not None:
        state = f"no: {place.short()}"
    elif not entry.trained:
        state = f"no: forma build {entry.name} makes it"
    elif card.get("kind") == "pretrained":
        state = "yes (pretrained, made from its file)"
    else:
        state = "yes (quick recipe)" if card.get("quick") else "yes"
    return (
        {"model": entry.name, "trained": state}
        | {column: card.get(key) for column, key in CARD_COLUMNS.items()}
        | {"description": entry.description}
    )


st.title("Forma")
st.markdown(
    "Forma writes the decoder-only transformer down equation by equation, exposes every activation "
    "through TransformerLens hooks, and measures where likelihood and truth part ways on worlds whose "
    "true distribution is known: the **KL decomposition** of the loss, **hallucination** on arbitrary "
    "facts (Kalai–Vempala), and **calibration** (Kadavath)."
)

st.header("Models")
entries = zoo_entries()
show_table([zoo_row(entry) for entry in entries], download="zoo_models")
for entry in entries:
    if entry.problem:
        st.warning(plain(entry.problem))

st.header("Experiments")
st.caption(
    "Each experiment trains and measures models of its own (its page names the run, its profile and its config): "
    "its numbers are that run's, not those of the zoo's models above, and a quick run's are not the full "
    "experiment's."
)
for entry in REGISTRY:
    folder, results, problem = latest_run(entry.name)
    working, place = run_progress(entry.name), queued("run", entry.name)
    if folder is None and working is not None and working.active:
        st.markdown(f"**{entry.nav}** — running now: {code(working.line())}; its page shows its progress.")
    elif folder is None and place is not None:
        st.markdown(f"**{entry.nav}** — {place.sentence()}")
    elif problem:
        st.markdown(f"**{entry.nav}** — {problem}")
    else:
        profile = "a quick run" if run_record(folder)["config"].get("quick") else "a default-profile run"
        st.markdown(
            f"**{entry.nav}** — latest run {code(folder.name)}, made {made_at(folder)}, {profile}; open its page in "
            "the sidebar."
        )


def state() -> tuple:
    """What Home shows that a job changes: each model trained or not and its job, each experiment's latest run
    and its job."""
    return (
        tuple(
            (e.trained, queued("build", e.name), getattr(model_progress(e.name), "state", None)) for e in zoo_entries()
        ),
        tuple(
            (latest_run(e.name)[0], queued("run", e.name), getattr(run_progress(e.name), "state", None))
            for e in REGISTRY
        ),
    )


def look_again(shown: tuple) -> None:
    if state() != shown:
        st.rerun()  # a job started or ended: the whole page again


shown = state()
if any(place is not None or job in ("running", "done") for group in shown for *_, place, job in group):
    st.fragment(look_again, run_every=PROGRESS_REFRESH_S)(shown)
