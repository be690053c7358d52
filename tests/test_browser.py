"""The dashboard in a real browser: Debian's Chromium driven by Playwright against `forma dashboard`'s server.

In CI (CI=true) these tests must run: .ci/run installs chromium first, and a missing browser fails.
Screenshots land in tests/screenshots/ so a person can look at what the dashboard shows.
"""

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

import experiments
import lab.zoo as zoo
from lab import HookedTransformer, ModelConfig
from lab.cli import dashboard_command, free_port, wait_until_serving
from lab.tokenize import word_level

CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = Path(__file__).resolve().parent / "screenshots"
RENDERED = ("[data-testid='stApp'][data-test-connection-state='CONNECTED']"
            "[data-test-script-state='notRunning']")

if not Path(CHROMIUM).exists():
    if os.environ.get("CI") == "true":
        raise RuntimeError("CI needs Debian's chromium at /usr/bin/chromium (.ci/run installs it)")
    pytest.skip("Debian chromium is not installed (apt-get install chromium); CI runs these", allow_module_level=True)

pytestmark = pytest.mark.browser


def private_zoo(root: Path) -> Path:
    """A zoo of the recipes with one tiny English-ish model, trained on nothing, and its card (the numbers Home
    shows; the parameter count measured here)."""
    zoo_copy = root / "models"
    for name in zoo.zoo_names():
        (zoo_copy / name).mkdir(parents=True)
        shutil.copy(zoo.DEFAULT_ZOO_DIR / name / "model.toml", zoo_copy / name / "model.toml")
    tokenizer = word_level(["Return", "the", "number", "of", "items", "in", "list", "."])
    cfg = ModelConfig(d_vocab=tokenizer.get_vocab_size(), d_model=32, n_layers=2, n_heads=4, n_ctx=32)
    model = HookedTransformer(cfg, seed=0, tokenizer=tokenizer)
    model.save(zoo_copy / "pydoc")
    card = {"name": "pydoc", "quick": True, "n_params": sum(p.numel() for p in model.parameters()), "steps": 60,
            "train_s": 12.3456789, "best_val_loss_nats": 4.32138482041246, "val_perplexity": 79.36003421529529}
    (zoo_copy / "pydoc" / "card.json").write_text(json.dumps(card))
    return zoo_copy


@pytest.fixture(scope="module")
def world(tmp_path_factory, quick_run, quick_runs_dir):
    """A private zoo with a tiny English-ish model, and the session's quick run of every experiment."""
    zoo_copy = private_zoo(tmp_path_factory.mktemp("dashboard"))
    for name in experiments.experiment_names():
        quick_run(name)
    return os.environ | {"FORMA_ZOO_DIR": str(zoo_copy), "FORMA_RUNS_DIR": str(quick_runs_dir)}


def serve(env: dict[str, str]):
    """`forma dashboard`'s server on a free port, with `env`; its URL while it serves, stopped afterwards."""
    port = free_port()
    process = subprocess.Popen(dashboard_command(port), env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(url, process, timeout_s=90)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=20)


@pytest.fixture(scope="module")
def server(world):
    yield from serve(world)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    user_data = Path(os.environ.get("TMPDIR", "/tmp")) / f"forma-chromium-{os.getpid()}"
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(user_data), executable_path=CHROMIUM, headless=True, viewport={"width": 1280, "height": 1100},
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage"])
        try:
            yield context
        finally:
            context.close()
            shutil.rmtree(user_data, ignore_errors=True)


def open_page(browser, url: str, errors: list[str], timeout: float = 60_000):
    page = browser.new_page()
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.goto(url)
    wait_rendered(page, timeout)
    return page


def wait_rendered(page, timeout: float = 60_000) -> None:
    page.wait_for_selector(RENDERED, timeout=timeout)
    page.wait_for_function("!document.querySelector(\"[data-testid='stSkeleton']\") && "
                           "!document.querySelector(\"[data-stale='true']\")", timeout=timeout)


def no_exceptions(page) -> None:
    assert page.locator("[data-testid='stException']").count() == 0


def test_home_lists_the_zoo_and_the_experiments(server, browser, quick_run):
    errors: list[str] = []
    page = open_page(browser, server, errors)
    page.get_by_text("KL decomposition").first.wait_for()
    content = page.content()
    for name in experiments.experiment_names():  # each experiment's latest run, by its folder
        assert quick_run(name).name in content, name
    no_exceptions(page)
    page.screenshot(path=str(SCREENSHOTS / "home.png"))
    assert errors == []


def test_explorer_draws_attention_and_the_logit_lens(server, browser):
    errors: list[str] = []
    page = open_page(browser, f"{server}/explorer", errors)
    page.wait_for_selector("[data-testid='stPlotlyChart'] .main-svg", timeout=60_000)
    no_exceptions(page)
    page.get_by_role("tab", name="Lenses").click()
    page.locator("[role='tabpanel']:visible [data-testid='stPlotlyChart'] .main-svg").first.wait_for(timeout=60_000)
    wait_rendered(page)
    no_exceptions(page)
    page.screenshot(path=str(SCREENSHOTS / "explorer.png"))
    assert errors == []


def test_equations_page_renders_every_check(server, browser):
    errors: list[str] = []
    page = open_page(browser, f"{server}/equations", errors)
    page.get_by_text("checks pass").wait_for(timeout=60_000)
    assert page.locator(".katex").count() >= 10  # st.latex rendered each equation
    page.wait_for_selector("[data-testid='stPlotlyChart'] .main-svg", timeout=60_000)
    no_exceptions(page)
    page.screenshot(path=str(SCREENSHOTS / "equations-checks.png"), full_page=True)
    assert errors == []


LIVE_CHARTS = {"calibration": 1}  # the reliability diagram the temperature slider redraws


@pytest.mark.parametrize("path", experiments.experiment_names())
def test_every_experiment_page_shows_its_quick_runs_headlines_and_figures(server, browser, quick_run, path):
    """What a reader sees in Chromium on each experiment's page: the run it shows named in its header; each headline
    the run supports in its own sentence (each one it cannot, with why not), as results.json has it; every figure
    the run saved, drawn; no raw JSON tree; no number with more than 6 significant digits."""
    from dashboards.common import figures
    from tests.test_dashboard import long_numbers

    folder = quick_run(path)
    results = json.loads((folder / "results.json").read_text())
    errors: list[str] = []
    page = open_page(browser, f"{server}/{path}", errors)
    page.locator("h1").first.wait_for(timeout=60_000)
    assert folder.name in page.content()  # the run header names the run it shows
    expected = len(figures(folder)) + LIVE_CHARTS.get(path, 0)
    assert expected >= 2  # every experiment saves two figures or more
    charts = "[data-testid='stPlotlyChart']"
    page.wait_for_function(f"document.querySelectorAll(\"{charts} .main-svg\").length >= {expected}", timeout=60_000)
    assert page.locator(charts).count() == expected
    text = " ".join(page.locator("[data-testid='stMain']").inner_text().split())
    for headline in results["headlines"]:
        said = headline["sentence"] if headline["supported"] else headline["why_not"]
        assert " ".join(said.split()) in text, headline["name"]
    assert page.locator("[data-testid='stJson']").count() == 0
    assert long_numbers(text) == []
    no_exceptions(page)
    page.screenshot(path=str(SCREENSHOTS / f"{path}.png"), full_page=True)
    assert errors == []


def test_training_page_renders_without_errors(server, browser):
    errors: list[str] = []
    page = open_page(browser, f"{server}/training", errors)
    page.locator("h1").first.wait_for(timeout=60_000)
    no_exceptions(page)
    page.screenshot(path=str(SCREENSHOTS / "training.png"))
    assert errors == []


# --- the explorer on a local Hugging Face folder, and Home's zoo table -------------------------------------------
@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A tiny GPT-2 and its word-level tokenizer, saved with save_pretrained: what a user points the explorer at."""
    from tests.conftest import hf_gpt2, word_tokenizer

    folder = tmp_path_factory.mktemp("hf-gpt2")
    hf_gpt2().save_pretrained(folder)
    word_tokenizer(folder)
    return folder


def open_tab(page, name: str, chart_key: str) -> None:
    """Click a tab, then wait until its chart is drawn and the app is idle."""
    page.get_by_role("tab", name=name).click()
    page.locator(f".st-key-{chart_key} .main-svg").first.wait_for(timeout=60_000)
    wait_rendered(page)


def test_explorer_reads_a_local_hugging_face_folder(server, browser, hf_folder):
    """The folder typed into the sidebar is converted and read: its route and trust box, then the patching heatmaps
    (by position and by head, from the default corruption) and the head detectors are drawn."""
    errors: list[str] = []
    page = open_page(browser, f"{server}/explorer", errors, timeout=180_000)
    page.get_by_role("combobox").first.click()
    page.get_by_role("option", name="local folder…").click()
    path = page.locator(".st-key-model_path input")
    path.wait_for(timeout=60_000)
    path.fill(str(hf_folder))
    path.press("Enter")
    page.get_by_text("converted to a Forma model by lab.hf.from_hf").wait_for(timeout=120_000)
    wait_rendered(page, timeout=120_000)
    assert page.get_by_text("Trust report").count() >= 1
    open_tab(page, "Patching", "patching")
    page.locator(".st-key-patching_heads .main-svg").first.wait_for(timeout=60_000)
    no_exceptions(page)
    page.screenshot(path=str(SCREENSHOTS / "explorer-hf-patching.png"), full_page=True)
    open_tab(page, "Head detectors", "heads")
    assert page.locator(".st-key-heads .main-svg").first.is_visible()
    no_exceptions(page)
    page.screenshot(path=str(SCREENSHOTS / "explorer-hf-heads.png"), full_page=True)
    assert errors == []


def test_home_table_shows_each_models_card_numbers(server, browser, world):
    """Home's zoo is a plain HTML table (drawn by a headless browser too) with the card's numbers as the page
    writes them (dashboards.common.short)."""
    from dashboards.common import short

    card = json.loads((Path(world["FORMA_ZOO_DIR"]) / "pydoc" / "card.json").read_text())
    errors: list[str] = []
    page = open_page(browser, server, errors)
    table = page.locator("[data-testid='stTable']").first
    table.wait_for(timeout=60_000)
    row = table.locator("tr", has_text="pydoc").first.inner_text()
    for key in ("n_params", "steps", "best_val_loss_nats", "val_perplexity"):
        assert short(card[key]) in row, (key, row)
    assert "yes (quick recipe)" in row
    assert "forma train markov" in table.locator("tr", has_text="markov").first.inner_text()
    no_exceptions(page)
    page.screenshot(path=str(SCREENSHOTS / "home-models.png"), full_page=True)
    assert errors == []


@pytest.mark.slow
def test_the_demo_serves_first_then_each_page_shows_its_jobs_progress_and_fills_in(tmp_path, browser):
    """`forma demo`: the dashboard answers before its job has written a result; the job's page shows its
    progress (a progress bar with elapsed time) while it works, then the run's results once it ends."""
    import sys

    zoo_copy, runs = tmp_path / "models", tmp_path / "runs"
    for name in zoo.zoo_names():  # recipes only: --only equations trains nothing
        (zoo_copy / name).mkdir(parents=True)
        shutil.copy(zoo.DEFAULT_ZOO_DIR / name / "model.toml", zoo_copy / name / "model.toml")
    env = os.environ | {"FORMA_ZOO_DIR": str(zoo_copy), "FORMA_RUNS_DIR": str(runs)}
    port = free_port()
    demo = subprocess.Popen([sys.executable, "-m", "lab.cli", "demo", "--only", "equations", "--port", str(port)],
                            env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(url, demo, timeout_s=120)
        assert not list(runs.glob("equations/*/results.json"))  # served before the job's result
        errors: list[str] = []
        home = open_page(browser, url, errors)
        no_exceptions(home)
        page = open_page(browser, f"{url}/equations", errors)
        page.wait_for_selector("[data-testid='stProgress']", timeout=120_000)
        page.get_by_text("forma run equations --quick:").first.wait_for(timeout=60_000)
        assert "elapsed" in page.locator("[data-testid='stProgress']").inner_text()
        page.screenshot(path=str(SCREENSHOTS / "demo-progress.png"))
        page.get_by_text("checks pass").wait_for(timeout=600_000)  # the page ran again by itself
        wait_rendered(page)
        results = json.loads(next(runs.glob("equations/*/results.json")).read_text())
        assert f"{results['n_passed']} of {results['n_checks']} checks pass" in page.content()
        assert page.locator("[data-testid='stProgress']").count() == 0
        no_exceptions(page)
        page.screenshot(path=str(SCREENSHOTS / "demo-filled.png"), full_page=True)
        assert errors == []
    finally:
        os.killpg(demo.pid, signal.SIGTERM)
        output = demo.communicate(timeout=60)[0]
    assert "[demo] dashboard at" in output and "[demo] forma run equations --quick: done" in output, output
    assert output.index("[demo] dashboard at") < output.index("[demo] forma run equations --quick …")


@pytest.mark.slow
def test_compare_sets_two_runs_side_by_side(tmp_path, browser, quick_run):
    """Two runs of the equations experiment (the session's quick run, and a copy with another seed recorded):
    the headline table, both runs' headlines and each figure twice, drawn."""
    runs = tmp_path / "runs" / "equations"
    original = quick_run("equations")
    shutil.copytree(original, runs / original.name)
    copy = runs / "9999-01-01T00-00-00Z"
    shutil.copytree(original, copy)
    provenance = json.loads((copy / "provenance.json").read_text())
    (copy / "provenance.json").write_text(json.dumps(provenance | {"seed": 7}))
    port = free_port()
    process = subprocess.Popen(dashboard_command(port), env=os.environ | {"FORMA_RUNS_DIR": str(tmp_path / "runs")},
                               start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(url, process, timeout_s=90)
        errors: list[str] = []
        page = open_page(browser, f"{url}/compare", errors)
        page.get_by_text("Headlines, number by number").wait_for(timeout=60_000)
        from dashboards.common import figures

        charts = len(figures(original))
        page.wait_for_function(f"document.querySelectorAll(\"[data-testid='stPlotlyChart'] .main-svg\").length >= "
                               f"{2 * charts}", timeout=60_000)
        content = page.content()
        assert "seed 7" in content and original.name in content and copy.name in content
        results = json.loads((original / "results.json").read_text())
        assert all(h["name"] in content for h in results["headlines"])
        no_exceptions(page)
        page.screenshot(path=str(SCREENSHOTS / "compare.png"), full_page=True)
        assert errors == []
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=20)


def test_a_headline_with_markup_fetches_nothing_and_shows_its_words(tmp_path, browser):
    """A results.json whose headline holds a Markdown image, a link, raw HTML and an autolink, each pointing at a
    server of the test's own: Chromium shows the words as they are written, and the server is never asked."""
    import http.server
    import threading

    asked: list[str] = []

    class Beacon(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the standard library's name)
            asked.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    beacon = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Beacon)
    threading.Thread(target=beacon.serve_forever, daemon=True).start()
    at = f"http://127.0.0.1:{beacon.server_address[1]}"
    sentence = (f"Fetched? ![beacon]({at}/image.png) [link]({at}/link) <img src=\"{at}/html.png\"> {at}/auto "
                "**bold** :red[red]")
    folder = tmp_path / "runs" / "kl" / "2026-01-01T00-00-00Z"
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({"checkpoints": [], "source": {}, "headlines": [
        {"name": "beacon", "sentence": sentence, "value": 1.0, "interval": None, "direction": 1, "supported": True,
         "why_not": None}]}))
    try:
        for url in serve(os.environ | {"FORMA_RUNS_DIR": str(tmp_path / "runs")}):
            errors: list[str] = []
            page = open_page(browser, f"{url}/kl", errors)
            page.get_by_text("Fetched?").first.wait_for(timeout=60_000)
            text = " ".join(page.locator("[data-testid='stMain']").inner_text().split())
            assert " ".join(sentence.split()) in text, text
            assert page.locator("[data-testid='stMain'] img").count() == 0
            page.wait_for_timeout(1_000)  # time for any request an element would make
            no_exceptions(page)
    finally:
        beacon.shutdown()
    assert asked == []
