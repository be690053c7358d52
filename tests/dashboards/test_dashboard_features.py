"""dashboards/features.py: a transcoder feature's page, without a browser (Streamlit's AppTest)."""

import json
import re
from urllib.parse import parse_qsl, urlsplit

import pytest
import streamlit as st

from dashboards.display import IDENTIFIER, SYMBOL, feature_page
from lab.analysis.transcoders.features import feature_card
from lab.analysis.transcoders.model import Transcoders
from lab.model.transformer import HookedTransformer
from lab.zoo.transcoders import model_windows
from tests.builders import page, texts, zoo_with_transcoders

WORLD = {
    "kind": "markov",
    "vocab_size": 8,
    "order": 1,
    "concentration": 0.5,
    "seed": 0,
    "n_sequences": 64,
    "val_sequences": 32,
}


@pytest.fixture
def zoo_dir(tmp_path, monkeypatch):
    """The graphs page's private zoo (a tiny word-level pydoc and top-k transcoders), its pydoc trained on a small
    Markov world (recipe.json) whose held-out windows the page reads."""
    zoo_copy = zoo_with_transcoders(tmp_path)
    recipe = {"format": "forma-build/1", "name": "pydoc", "quick": True, "world": WORLD}
    (zoo_copy / "pydoc" / "recipe.json").write_text(json.dumps(recipe))
    monkeypatch.setenv("FORMA_ZOO_DIR", str(zoo_copy))
    monkeypatch.setenv("FORMA_RUNS_DIR", str(tmp_path / "runs"))
    st.cache_resource.clear()
    yield zoo_copy
    st.cache_resource.clear()


def library_card(zoo_copy, layer: int, feature: int, n_windows: int = 64):
    """The card the library makes of the same feature over the same held-out windows the page reads."""
    model = HookedTransformer.from_pretrained(str(zoo_copy / "pydoc")).eval()
    transcoders = Transcoders.load(zoo_copy / "pydoc" / "transcoders" / "topk", model)
    windows = model_windows(zoo_copy / "pydoc", n_windows, 32, split="val")
    return feature_card(model, transcoders, layer, feature, windows)


def words_only(source: str) -> list[str]:
    """The identifiers in a page's text outside its code spans (as the browser's check reads them)."""
    found = [m.group(2) for m in IDENTIFIER.finditer(source) if m.group(2)]
    return [token for token in found if not SYMBOL.fullmatch(token)]


def test_the_page_shows_the_libraries_card_of_the_feature_its_query_names(zoo_dir):
    """Opened at the address the graph page's feature links to (layer 1, feature 5), it shows that feature: the
    histogram of every held-out position (its counts the library's, summing to the positions), the top contexts with the
    feature's token in bold and the library's activations, the quantile bins, the logits and the reads/writes
    tables; in words, no identifier outside a code span."""
    at = page("features")
    at.default_timeout = 120
    link = urlsplit(feature_page("pydoc", "topk", 1, 5))  # the graph page's feature detail links there
    assert link.path == "/features"
    for key, value in parse_qsl(link.query):
        at.query_params[key] = value
    at.run()
    assert not at.exception, at.exception
    assert not at.warning, [w.value for w in at.warning]
    assert [h.value for h in at.header] == ["Feature 5 of layer 1"]
    card = library_card(zoo_dir, 1, 5)
    (chart,) = at.get("plotly_chart")
    spec = json.loads(chart.proto.spec)
    (bars,) = spec["data"]
    assert bars["type"] == "bar" and [int(c) for c in bars["y"]] == card.counts
    assert sum(card.counts) == card.positions
    said = texts(at) + " ".join(str(c.value) for c in at.caption)
    assert f"Over {card.positions} positions" in said
    assert card.top, "this feature fires on the held-out windows"
    lines = [line for m in at.markdown for line in str(m.value).splitlines() if line.startswith("- ")]
    assert lines[0].startswith(f"- {card.top[0].activation:.3f} · window {card.top[0].window}")
    assert all(re.search(r"\*\*.+\*\*", line) for line in lines)  # the feature's token, in bold
    subheaders = [s.value for s in at.subheader]
    assert subheaders == [
        "Top activating contexts",
        "Contexts by quantile of its nonzero activations",
        "Tokens its decoder promotes and suppresses",
        "Features it reads from and writes to",
    ]
    assert len(at.table) == 4  # promotes, suppresses, reads from (layer 0), writes to (layer 2)
    reads = at.table[2].value
    assert list(reads.columns) == ["feature", "virtual weight"] and set(reads.index) == {"0"}
    assert set(at.table[3].value.index) == {"2"}
    chart_text = [spec["layout"]["title"]["text"], spec["layout"]["xaxis"]["title"]["text"]]
    for source in [*(str(m.value) for m in [*at.markdown, *at.caption, *at.subheader, *at.header]), *chart_text]:
        assert not words_only(source), source


def test_the_first_and_last_layers_say_they_read_or_write_no_layer_and_a_broken_set_is_one_warning(zoo_dir):
    at = page("features")
    at.default_timeout = 120
    at.run()
    assert not at.exception, at.exception
    assert [h.value for h in at.header] == ["Feature 0 of layer 0"]
    assert "None: no layer of the set lies that way." in " ".join(str(c.value) for c in at.caption)
    weights = zoo_dir / "pydoc" / "transcoders" / "topk" / "transcoders.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    st.cache_resource.clear()
    at = page("features")
    at.default_timeout = 120
    at.run()
    assert not at.exception, at.exception
    (warning,) = [str(w.value) for w in at.warning]
    assert "malformed or truncated" in warning.replace("\\", "")
