"""dashboards/graphs.py: the attribution-graph page, without a browser (Streamlit's AppTest) and in Chromium."""

import json

import pytest
import streamlit as st
from safetensors.torch import load_file, save_file
from streamlit.testing.v1 import AppTest

from dashboards.pages import page_file
from lab.analysis.graphs.graph import GRAPHS_DIR, Graph
from tests.builders import zoo_with_transcoders

PROMPT = "Return the number of items in the list ."


@pytest.fixture
def zoo_dir(tmp_path, monkeypatch):
    zoo_copy = zoo_with_transcoders(tmp_path)
    monkeypatch.setenv("FORMA_ZOO_DIR", str(zoo_copy))
    monkeypatch.setenv("FORMA_RUNS_DIR", str(tmp_path / "runs"))
    return zoo_copy


def test_the_page_draws_a_prompts_graph_saves_supernodes_and_exports(zoo_dir):
    at = AppTest.from_file(str(page_file("graphs")), default_timeout=120)
    at.run()
    assert not at.exception, at.exception
    at.text_input(key="graph_prompt").input(PROMPT).run()
    assert not at.exception, at.exception
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    kinds = {trace.get("name") for trace in spec["data"]}
    assert {"token", "feature", "logit"} <= kinds
    assert any(trace["mode"] == "lines" for trace in spec["data"])  # edges drawn
    saved = list((zoo_dir / "pydoc" / "transcoders" / "topk" / GRAPHS_DIR).iterdir())
    assert len(saved) == 2  # each prompt's graph is kept, for its supernodes
    saved = [folder for folder in saved if Graph.load(folder).n_pos == len(PROMPT.split())]
    graph = Graph.load(saved[0])
    feature_ids = [i for i in at.multiselect(key="supernode_nodes").options if not i.startswith(("E_", "err_"))]
    at.multiselect(key="supernode_nodes").select(feature_ids[0]).select(feature_ids[1])
    at.text_input(key="supernode_name").input("pair")
    at.button(key="supernode_save").click().run()
    assert not at.exception
    assert Graph.load(saved[0]).supernodes == [{"name": "pair", "nodes": feature_ids[:2]}]
    assert graph.n_features > 0
    assert at.get("download_button")  # the circuit-tracer export
    at.button(key="qk_go").click().run()
    assert not at.exception, at.exception
    assert "over node pairs" in " ".join(str(m.value) for m in at.markdown)


def test_a_model_without_a_tokenizer_draws_from_its_default_prompt_of_token_ids(zoo_dir):
    """markov reads token ids: the page opens on its default prompt of ids and draws its graph (no "no tokenizer")."""
    from lab.analysis.transcoders.model import built_from, model_fingerprint
    from lab.model.config import ModelConfig
    from lab.model.transformer import HookedTransformer
    from tests.builders import random_transcoders

    model = HookedTransformer(ModelConfig(d_vocab=32, d_model=16, n_layers=2, n_heads=2, n_ctx=16), seed=0).eval()
    model.save(zoo_dir / "markov")
    random_transcoders(model, activation="topk").save(
        zoo_dir / "markov" / "transcoders" / "topk", built_from(model_fingerprint(model), 0)
    )
    at = AppTest.from_file(str(page_file("graphs")), default_timeout=120)
    at.run()
    at.sidebar.selectbox(key="graph_model").select("markov").run()
    assert not at.exception, at.exception
    assert not at.warning, [w.value for w in at.warning]
    assert at.text_input(key="graph_prompt").value == "1 2 3 4 5 6 7 8"
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert {"token", "logit"} <= {trace.get("name") for trace in spec["data"]}


def test_a_prompt_longer_than_the_context_is_refused_not_cut(zoo_dir):
    at = AppTest.from_file(str(page_file("graphs")), default_timeout=120)
    at.run()
    at.text_input(key="graph_prompt").input(" ".join(["the"] * 40)).run()  # the tiny pydoc reads 32 tokens
    assert not at.exception, at.exception
    (warning,) = [w.value for w in at.warning]
    assert "40 tokens" in warning and "32" in warning, warning
    assert not at.get("plotly_chart")


def test_a_shared_graphs_strings_are_text_and_a_graph_that_fails_its_checks_is_left_as_it_is(zoo_dir):
    """A supernode named with a Markdown image and an HTML tag (a graph folder someone shared) is shown as text: no
    image, no tag reaches the page. A graph.json that fails its checks (a supernode naming a node the graph does
    not have) is named in a warning and left byte for byte as it was, never rebuilt over."""
    at = AppTest.from_file(str(page_file("graphs")), default_timeout=120)
    at.run()
    assert not at.exception, at.exception
    (folder,) = list((zoo_dir / "pydoc" / "transcoders" / "topk" / GRAPHS_DIR).iterdir())
    graph = Graph.load(folder)
    hostile = "![x](http://host/leak.png) <img src=x onerror=alert(1)>"
    graph.supernodes = [{"name": hostile, "nodes": graph.node_ids()[:1]}]
    graph.save_supernodes(folder)
    st.cache_resource.clear()  # the page keeps a graph it drew: read the folder again, as a new session would
    at = AppTest.from_file(str(page_file("graphs")), default_timeout=120)
    at.run()
    assert not at.exception, at.exception
    assert any(hostile in str(t.value) for t in at.text)  # shown, as text
    markdown = " ".join(str(m.value) for m in [*at.markdown, *at.caption, *at.warning, *at.info])
    assert "](http" not in markdown and "<img" not in markdown, markdown

    meta = json.loads((folder / "graph.json").read_text())
    meta["supernodes"] = [{"name": "bad", "nodes": ["0_99999_0"]}]
    (folder / "graph.json").write_text(json.dumps(meta))
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    st.cache_resource.clear()
    at = AppTest.from_file(str(page_file("graphs")), default_timeout=120)
    at.run()
    assert not at.exception, at.exception
    warned = " ".join(str(w.value) for w in at.warning)
    assert "cannot be read" in warned and "left as it is" in warned, warned
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def _graph_json(folder, **changes):
    meta = json.loads((folder / "graph.json").read_text())
    (folder / "graph.json").write_text(json.dumps(meta | changes))


def _nan_adjacency(folder):
    tensors = load_file(str(folder / "graph.safetensors"))
    tensors["adjacency"][0, 0] = float("nan")
    save_file(tensors, str(folder / "graph.safetensors"))


def _truncated_transcoders(folder):
    weights = folder.parent.parent / "transcoders.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])


def _quality_without_held_out(folder):
    (folder.parent.parent / "quality.json").write_text(json.dumps({"loss": {"recovered": 0.5}}))


def _huge_d_features(folder):
    config = folder.parent.parent / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"d_features": 10**9}))


def _another_models(folder):
    source = folder.parent.parent / "source.json"
    record = json.loads(source.read_text())
    source.write_text(json.dumps(record | {"model": record["model"] | {"weights_sha256": "0" * 64}}))


@pytest.mark.parametrize(
    "spoil, says",
    [
        (lambda folder: _graph_json(folder, n_layers=0), "at least one layer"),
        (lambda folder: (folder / "graph.safetensors").unlink(), "holds graph.json but no graph.safetensors"),
        (_nan_adjacency, "not finite numbers"),
        (_truncated_transcoders, "malformed or truncated"),
        (_quality_without_held_out, "quality.json cannot be read"),
        (_huge_d_features, "too few for the"),
        (_another_models, "built from another model"),
    ],
    ids=[
        "n_layers 0",
        "graph.json alone",
        "NaN adjacency",
        "truncated transcoders",
        "quality without held_out",
        "d_features 1e9",
        "other",
    ],
)
def test_a_broken_file_is_one_clear_message_on_the_page(zoo_dir, spoil, says):
    """Each file the page reads, spoilt as a crash, a disk or a hand can spoil it: one warning naming what is
    wrong, no traceback, and the file left as it was."""
    at = AppTest.from_file(str(page_file("graphs")), default_timeout=120)
    at.run()
    assert not at.exception, at.exception
    (folder,) = list((zoo_dir / "pydoc" / "transcoders" / "topk" / GRAPHS_DIR).iterdir())
    spoil(folder)
    before = {str(p): p.read_bytes() for p in (zoo_dir / "pydoc" / "transcoders").rglob("*") if p.is_file()}
    st.cache_resource.clear()
    at = AppTest.from_file(str(page_file("graphs")), default_timeout=120)
    at.run()
    assert not at.exception, at.exception
    warned = [str(w.value) for w in at.warning]
    assert len(warned) == 1 and says in warned[0].replace("\\", ""), warned
    after = {str(p): p.read_bytes() for p in (zoo_dir / "pydoc" / "transcoders").rglob("*") if p.is_file()}
    assert after == before
