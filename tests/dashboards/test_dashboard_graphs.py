"""dashboards/graphs.py: the attribution-graph page, without a browser (Streamlit's AppTest) and in Chromium."""

import json

import pytest
import streamlit as st
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
