"""lab.names: one display name for each method, signal, grade and readout a run writes by key, read by the pages,
the figures and the headlines."""

import re

from lab import names
from lab.analysis import monitor
from lab.analysis.input_attribution import METHODS

SNAKE = re.compile(r"[A-Za-z0-9]_[A-Za-z0-9]")


def test_every_key_a_run_writes_has_a_display_name_in_words():
    """Every attribution method and every risk signal is in the table, and no display name is an identifier."""
    assert set(METHODS) <= set(names.METHODS)
    assert set(monitor.SIGNALS) == set(names.SIGNALS)
    assert [shown for shown in names.NAMES.values() if SNAKE.search(shown) or "`" in shown] == []
    assert names.name("gradient_x_input") == "gradient × input" and names.name("max_prob") == "top probability"
    assert names.name("some_new_key") == "some new key"  # a key not in the table still reads as words


def test_one_display_name_per_method():
    """The two spellings a run writes of one method ("attribution patching" from the patching comparison,
    "attribution_patching" from input attribution) read as one name, so a filter lists it once."""
    assert names.name("attribution patching") == names.name("attribution_patching")


def test_in_words_replaces_keys_and_leaves_english_alone():
    """A figure's title or a panel's: keys become display names; an English word that is also a key ("margin",
    "heads"), and a key inside a longer word, stay as they are."""
    text = "markov: kl_true; jacobian lens at resid_pre 0; the margin of heads; auroc; max_probability"
    assert names.in_words(text) == (
        "markov: KL to the truth (nats); Jacobian lens at before block 0; the margin of heads; AUROC; max_probability"
    )
    assert names.in_words("p_ik", {}) == "p_ik"
