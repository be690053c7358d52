"""dashboards/graphs.py: the attribution-graph page, without a browser (Streamlit's AppTest) and in Chromium."""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from streamlit.testing.v1 import AppTest

import lab.zoo as zoo
from dashboards.pages import page_file
from lab import HookedTransformer, ModelConfig
from lab.analysis.activations import save_activations
from lab.analysis.graphs.graph import GRAPHS_DIR, Graph
from lab.analysis.transcoders.measures import top_contexts
from lab.data.tokenizers import word_level
from tests.graph_fixtures import random_transcoders

WORDS = ["Return", "the", "number", "of", "items", "in", "list", "file", "."]
PROMPT = "Return the number of items in the list ."


def zoo_with_transcoders(root: Path) -> Path:
    """A private zoo: the recipes, a tiny word-level 'pydoc' and top-k transcoders for it with top contexts."""
    zoo_copy = root / "models"
    for name in zoo.zoo_names():
        (zoo_copy / name).mkdir(parents=True)
        shutil.copy(zoo.DEFAULT_ZOO_DIR / name / "model.toml", zoo_copy / name / "model.toml")
    tokenizer = word_level(WORDS)
    cfg = ModelConfig(d_vocab=tokenizer.get_vocab_size(), d_model=32, n_layers=3, n_heads=4, n_ctx=32)
    model = HookedTransformer(cfg, seed=0, tokenizer=tokenizer).eval()
    model.save(zoo_copy / "pydoc")
    transcoders = random_transcoders(model, activation="topk")
    folder = zoo_copy / "pydoc" / "transcoders" / "topk"
    transcoders.save(folder)
    windows = torch.randint(0, cfg.d_vocab, (16, 12), generator=torch.Generator().manual_seed(0))
    store = save_activations(model, windows, transcoders.cfg.hooks(), root / "harvest", positions="all", progress=False)
    save_file(top_contexts(transcoders, store) | {"windows": windows}, str(folder / "contexts.safetensors"))
    return zoo_copy


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


@pytest.mark.browser
def test_the_page_in_a_browser_draws_the_graph_and_shows_a_clicked_feature(tmp_path):
    from tests.test_browser import CHROMIUM, SCREENSHOTS, no_exceptions, open_page, reads_right, serve, wait_rendered

    if not Path(CHROMIUM).exists():
        if os.environ.get("CI") == "true":
            raise RuntimeError("CI needs Debian's chromium at /usr/bin/chromium (.ci/run installs it)")
        pytest.skip("Debian chromium is not installed; CI runs this")
    from playwright.sync_api import sync_playwright

    env = os.environ | {"FORMA_ZOO_DIR": str(zoo_with_transcoders(tmp_path)), "FORMA_RUNS_DIR": str(tmp_path / "runs")}
    user_data = tmp_path / "chromium"
    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(user_data),
            executable_path=CHROMIUM,
            headless=True,
            viewport={"width": 1280, "height": 1100},
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
            ],
        )
        try:
            for url in serve(env):
                errors: list[str] = []
                page = open_page(browser, f"{url}/graphs", errors, timeout=120_000)
                page.wait_for_selector("[data-testid='stPlotlyChart'] .main-svg", timeout=120_000)
                no_exceptions(page)
                points = page.locator("[data-testid='stPlotlyChart'] .scatterlayer .trace:has(path.point) path.point")
                assert points.count() > 10  # nodes drawn
                feature_trace = page.locator("[data-testid='stPlotlyChart'] .scatterlayer .trace").nth(
                    _feature_trace_index(page)
                )
                feature_trace.locator("path.point").first.click(force=True)
                page.get_by_text("Top activating contexts").wait_for(timeout=120_000)
                wait_rendered(page, 120_000)
                reads_right(page)  # the chart drawn as every chart is, the contexts' table headed in words
                headers = page.locator("[data-testid='stTable'] thead th").all_inner_texts()
                assert "token (where it fires)" in headers, headers
                page.screenshot(path=str(SCREENSHOTS / "graphs.png"))
                assert errors == []
        finally:
            browser.close()


def _feature_trace_index(page) -> int:
    """The index of the feature markers' trace among the chart's scatter traces (edges come first)."""
    names = page.evaluate(
        "() => document.querySelector(\"[data-testid='stPlotlyChart'] .js-plotly-plot\").data.map(t => t.name || '')"
    )
    return names.index("feature")
