"""The dashboard in a real browser: Debian's Chromium driven by Playwright against `forma dashboard`'s server.

In CI (CI=true) these tests must run: .ci/run installs chromium first, and a missing browser fails.
Screenshots land in tests/screenshots/ so a person can look at what the dashboard shows.
"""

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

import experiments
from dashboards.pages import pages
from lab import HookedTransformer, ModelConfig
from lab.cli.dashboard import dashboard_command, free_port, wait_until_serving
from lab.folders import DEFAULT_ZOO_DIR, zoo_names
from lab.zoo.recipes import load_recipe
from lab.zoo.worlds import make_source
from tests.builders import REPO, signals_as_sent, zoo_with_transcoders

CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = REPO / "tests" / "screenshots"
RENDERED = "[data-testid='stApp'][data-test-connection-state='CONNECTED'][data-test-script-state='notRunning']"

if not Path(CHROMIUM).exists():
    if os.environ.get("CI") == "true":
        raise RuntimeError("CI needs Debian's chromium at /usr/bin/chromium (.ci/run installs it)")
    pytest.skip("Debian chromium is not installed (apt-get install chromium); CI runs these", allow_module_level=True)

pytestmark = pytest.mark.browser


def private_zoo(root: Path) -> Path:
    """A zoo of the recipes with one tiny English-ish model, trained on nothing, with a byte-level BPE as pydoc's
    (so that a character of two bytes is two tokens), and its card (the numbers Home shows; the parameter count
    measured here); and a training curve for markov, with the entropy rate of its recipe's chain on its card."""
    from lab.data.stdlib_corpus import train_bpe

    zoo_copy = root / "models"
    for name in zoo_names():
        (zoo_copy / name).mkdir(parents=True)
        shutil.copy(DEFAULT_ZOO_DIR / name / "model.toml", zoo_copy / name / "model.toml")
    tokenizer = train_bpe("Return the number of items in the list.\n\n\nReturn the list of items.", vocab_size=300)
    cfg = ModelConfig(d_vocab=tokenizer.get_vocab_size(), d_model=32, n_layers=2, n_heads=4, n_ctx=32)
    model = HookedTransformer(cfg, seed=0, tokenizer=tokenizer)
    model.save(zoo_copy / "pydoc")
    card = {
        "name": "pydoc",
        "quick": True,
        "n_params": sum(p.numel() for p in model.parameters()),
        "steps": 60,
        "train_s": 12.3456789,
        "best_val_loss_nats": 4.32138482041246,
        "val_perplexity": 79.36003421529529,
    }
    (zoo_copy / "pydoc" / "card.json").write_text(json.dumps(card))
    curve = [
        {"step": s, "train_loss_nats": 3.5 - s / 100, **({"val_loss_nats": 3.6 - s / 100} if s % 20 == 0 else {})}
        for s in range(1, 61)
    ]
    (zoo_copy / "markov" / "train").mkdir()
    (zoo_copy / "markov" / "train" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in curve))
    rate = make_source(load_recipe("markov")["world"]).entropy_rate()
    (zoo_copy / "markov" / "card.json").write_text(
        json.dumps({"name": "markov", "quick": True, "steps": 60, "entropy_rate_nats": rate})
    )
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
    process = subprocess.Popen(
        dashboard_command(port),
        env=env,
        start_new_session=True,
        preexec_fn=signals_as_sent(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
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
            yield context
        finally:
            context.close()
            shutil.rmtree(user_data, ignore_errors=True)


@pytest.fixture(autouse=True)
def close_pages(request):
    """Each test's pages close when it ends, as a reader closes a tab: a page left open keeps its session on the
    server (a page waiting for a run looks for one every few seconds), and thirty of them slow the tests after."""
    yield
    if "browser" in request.fixturenames:
        for page in request.getfixturevalue("browser").pages:
            page.close()


def open_page(browser, url: str, errors: list[str], timeout: float = 60_000):
    page = browser.new_page()
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.goto(url)
    wait_rendered(page, timeout)
    return page


def wait_rendered(page, timeout: float = 60_000) -> None:
    page.wait_for_selector(RENDERED, timeout=timeout)
    page.wait_for_function(
        "!document.querySelector(\"[data-testid='stSkeleton']\") && !document.querySelector(\"[data-stale='true']\")",
        timeout=timeout,
    )


def no_exceptions(page) -> None:
    assert page.locator("[data-testid='stException']").count() == 0


# What a person reading the page trips over, found in the page as drawn (a list of problems, each in words): a
# table header in snake_case, a cell wider than the page, a table cut off at the right instead of scrolling, a
# metric card cut short, "nan" or '\ufffd' in the text, a chart whose layer axis (or an x axis that counts, its
# values whole numbers) ticks at fractions, that leaves text values ("2-5") off a number axis, whose ticks carry SI
# prefixes or odd steps, whose one series changes colour from panel to panel, whose title runs off it, whose legend
# hides entries or covers axis ticks, or whose annotations overlap each other or the data.
READS_RIGHT = """() => {
  const problems = [];
  const main = document.querySelector("[data-testid='stMain'] [data-testid='stMainBlockContainer']")
            || document.querySelector("[data-testid='stMain']");
  const page = main.getBoundingClientRect();
  const box = el => el.getBoundingClientRect();
  const overlap = (a, b) => a.left < b.right - 1 && b.left < a.right - 1
                            && a.top < b.bottom - 1 && b.top < a.bottom - 1;
  for (const table of main.querySelectorAll("[data-testid='stTable'] table")) {
    for (const th of table.querySelectorAll("thead th")) {
      if (/[A-Za-z0-9]_[A-Za-z0-9]/.test(th.innerText)) problems.push("snake_case header: " + th.innerText.trim());
    }
    for (const cell of table.querySelectorAll("td, th")) {
      if (box(cell).width > page.width) problems.push("a cell wider than the page: " + cell.innerText.slice(0, 40));
    }
    let scroller = table.parentElement;
    while (scroller && scroller !== main && !["auto", "scroll"].includes(getComputedStyle(scroller).overflowX)) {
      scroller = scroller.parentElement;
    }
    const scrolls = scroller && scroller !== main;
    if (box(table).right > page.right + 1 && !scrolls) problems.push("a table cut off at the right: "
                                                                     + table.innerText.slice(0, 40));
  }
  for (const value of main.querySelectorAll("[data-testid='stMetricValue'], [data-testid='stMetricLabel']")) {
    for (const el of [value, ...value.querySelectorAll("*")]) {
      if (el.scrollWidth > el.clientWidth + 1) { problems.push("a metric card cut short: " + value.innerText); break; }
    }
  }
  const text = main.innerText;
  if (/\bnan\b/i.test(text)) problems.push("nan in the text");
  if (text.includes("\ufffd")) problems.push("a replacement glyph in the text");
  for (const gd of main.querySelectorAll(".js-plotly-plot")) {
    const layout = gd._fullLayout, title = (layout.title && layout.title.text) || "(untitled)";
    for (const name of Object.keys(layout).filter(k => /^[xy]axis[0-9]*$/.test(k))) {
      const axis = layout[name], ticks = axis._vals || [];
      const axisTitle = ((axis.title && axis.title.text) || "").toLowerCase();
      const fractional = ticks.some(t => Math.abs(t.x - Math.round(t.x)) > 1e-9);
      if (axisTitle.includes("layer") && axis.type === "linear" && fractional) {
        problems.push("fractional ticks on a layer axis in " + title + ": " + ticks.map(t => t.text).join(" "));
      }
      const on = gd._fullData.filter(t => (name[0] === "x" ? t.xaxis : t.yaxis) === name[0] + name.slice(5));
      const values = on.flatMap(t => Array.from((name[0] === "x" ? t.x : t.y) || []));
      const counts = name[0] === "x" && values.length > 0
                     && values.every(v => typeof v === "number" && Number.isInteger(v));
      const dropped = values.filter(v => typeof v === "string" && v.trim() !== "" && isNaN(Number(v)));
      if (["linear", "log"].includes(axis.type) && dropped.length) {
        problems.push("values left off a number axis in " + title + ": " + dropped.join(" "));
      }
      if (counts && axis.type === "linear" && axis.tickmode !== "array" && fractional) {
        problems.push("fractional ticks on an axis that counts in " + title + ": "
                      + ticks.map(t => t.text).join(" "));
      }
      for (const t of ["linear", "log"].includes(axis.type) ? ticks : []) {
        if (/[0-9.](f|p|n|µ|m|k|M|G)$/.test(t.text || "")) problems.push("an SI prefix (" + t.text + ") in " + title);
      }
      const step = ticks.length > 1 ? Math.abs(ticks[1].x - ticks[0].x) : 0;
      if (axis.type === "linear" && step > 0) {
        const mantissa = step / Math.pow(10, Math.floor(Math.log10(step) + 1e-9));
        if (![1, 2, 2.5, 5, 10].some(m => Math.abs(mantissa - m) < 1e-6)) {
          problems.push("ticks at odd steps (" + ticks.map(t => t.text).join(" ") + ") in " + title);
        }
      }
    }
    const colours = {};
    for (const trace of gd._fullData) {
      const key = trace.legendgroup || trace.name;
      if (!key || !["scatter", "bar"].includes(trace.type)) continue;
      const lines = trace.type === "scatter" && String(trace.mode).includes("lines");
      const colour = JSON.stringify(lines ? trace.line.color : trace.marker.color);
      (colours[key] = colours[key] || new Set()).add(colour);
    }
    for (const [key, seen] of Object.entries(colours)) {
      if (seen.size > 1) problems.push("the series " + key + " in " + title + " changes colour (" + seen.size + ")");
    }
    const drawn = box(gd), heading = gd.querySelector(".gtitle");
    if (heading && (box(heading).right > drawn.right + 1 || box(heading).left < drawn.left - 1)) {
      problems.push("a title runs off its chart: " + title);
    }
    const legend = gd.querySelector(".legend .bg");
    for (const entry of gd.querySelectorAll(".legend .traces")) {
      if (legend && box(entry).bottom > box(legend).bottom + 1) {
        problems.push("a legend hides entries: " + title);
        break;
      }
    }
    if (legend) {
      const ticks = [...gd.querySelectorAll(".xtick text, .ytick text, .y2tick text, .y3tick text")];
      const hidden = ticks.filter(t => t.textContent && overlap(box(legend), box(t)));
      if (hidden.length) problems.push("the legend covers axis ticks in " + title + ": "
                                       + hidden.map(t => t.textContent).join(" "));
    }
    const heading2 = gd.querySelector(".g-gtitle text");
    for (const note of heading2 ? gd.querySelectorAll(".annotation-text-g") : []) {
      if (overlap(box(heading2), box(note))) problems.push("the title over a panel's title in " + title + ": "
                                                            + note.textContent);
    }
    const labels = [...gd.querySelectorAll(".textpoint text")].filter(t => t.textContent.trim());
    for (let i = 0; i < labels.length; i++) {
      for (let j = i + 1; j < labels.length; j++) {
        if (overlap(box(labels[i]), box(labels[j]))) {
          problems.push("overlapping labels in " + title + ": " + labels[i].textContent + " / "
                        + labels[j].textContent);
        }
      }
    }
    for (const axis of gd.querySelectorAll(".xaxislayer-above, .yaxislayer-above")) {
      // a rotated label's box is wider than its text: only level labels are compared
      const ticks = [...axis.querySelectorAll(".xtick text, .ytick text")]
        .filter(t => t.textContent.trim() && !/rotate\\((?!0[,)])/.test(t.getAttribute("transform") || ""));
      for (let i = 0; i + 1 < ticks.length; i++) {
        if (overlap(box(ticks[i]), box(ticks[i + 1]))) {
          problems.push("overlapping tick labels in " + title + ": " + ticks[i].textContent + " / "
                        + ticks[i + 1].textContent);
        }
      }
    }
    const notes = [...gd.querySelectorAll(".annotation-text-g")];
    const points = [...gd.querySelectorAll(".scatterlayer .point")];
    for (let i = 0; i < notes.length; i++) {
      for (let j = i + 1; j < notes.length; j++) {
        if (overlap(box(notes[i]), box(notes[j]))) problems.push("overlapping annotations in " + title + ": "
                                                                 + notes[i].textContent + " / " + notes[j].textContent);
      }
      if (points.some(p => overlap(box(notes[i]), box(p)))) problems.push("an annotation over the data in " + title
                                                                          + ": " + notes[i].textContent);
    }
  }
  return problems;
}"""

# Words, not identifiers, in the text a reader reads (the page outside its code spans, and every chart's drawn text;
# a code span — a command, a file, a function — is code and may be written as one): a problem for each snake_case
# token (a symbol with a subscript, H_t, d_k, W_U, is mathematics, not one), a backtick, a replacement character, a
# "nan" or "None" where a number or a word belongs, a number written as ±d.ddde-NN (|exponent| ≥ 10) where 0 is meant.
IN_WORDS = """() => {
  const problems = [], seen = new Set();
  const say = p => { if (!seen.has(p)) { seen.add(p); problems.push(p); } };
  const main = document.querySelector("[data-testid='stMain']");
  const texts = [["page", main.innerText]];
  for (const t of main.querySelectorAll(".js-plotly-plot text")) {
    if (t.textContent.trim()) texts.push(["chart", t.textContent]);
  }
  let prose = main.innerText;
  // code is code (a code span, a block, an equation's \\texttt); an icon's name (keyboard_arrow_right) is drawn as
  // its glyph
  for (const c of main.querySelectorAll("code, pre, .katex-html .texttt, [data-testid='stIconMaterial']")) {
    prose = prose.split(c.innerText).join(" ");
  }
  const snake = /(?<![\\w./-])[A-Za-z][A-Za-z0-9]*_[A-Za-z0-9_]*[A-Za-z0-9](?![\\w/])/g;
  const symbol = /^[A-Za-z]{1,2}_([A-Za-z]|[A-Z]+|[0-9]+)$/;
  const identifiers = text => [...text.matchAll(snake)].map(m => m[0]).filter(t => !symbol.test(t));
  for (const token of identifiers(prose)) say("snake_case: " + token);
  for (const [where, text] of texts) {
    if (where === "chart") for (const token of identifiers(text)) say("snake_case in a chart: " + token);
    const tick = text.indexOf("`");
    if (tick >= 0) say("a backtick (" + where + "): " + text.slice(Math.max(0, tick - 30), tick + 30));
    if (text.includes("\\ufffd")) say("a replacement character (" + where + ")");
    for (const m of text.matchAll(/[-\\u2212+]?[0-9](?:\\.[0-9]+)?[eE][-\\u2212+]?[0-9]+/g)) {
      if (Number(m[0].split(/[eE]/)[1].replace("\\u2212", "-")) <= -10) say("a number that means 0 (" + where + "): "
                                                                             + m[0]);
    }
  }
  for (const el of main.querySelectorAll("td, th, [data-testid='stMetricValue']")) {
    if (/^\\s*(nan|NaN|None|null|undefined)\\s*$/.test(el.innerText)) say("a cell reads " + el.innerText.trim());
  }
  const empty = prose.match(/.{0,30}\\b(nan|NaN|None)\\b.{0,30}/);
  if (empty) say("nan or None in the text: " + empty[0]);
  return problems;
}"""
ROUND_OFF_PAGES = {"equations"}  # its checks measure floating-point error: 5.551e-16 there is a measurement, not 0

# The numbers a page shows where a reader compares them: every metric card (label → value), every chart by title
# (each trace's name, x and y), the text.
SHOWN = """() => {
  const main = document.querySelector("[data-testid='stMain']");
  const cards = {};
  for (const m of main.querySelectorAll("[data-testid='stMetric']")) {
    const label = m.querySelector("[data-testid='stMetricLabel']").innerText.trim();
    if (!(label in cards)) cards[label] = m.querySelector("[data-testid='stMetricValue']").innerText.trim();
  }
  const charts = {};
  for (const gd of main.querySelectorAll(".js-plotly-plot")) {
    const title = ((gd.layout.title && gd.layout.title.text) || "").replace(/<[^>]*>/g, " ")
      .replace(/\\s+/g, " ").trim();
    charts[title] = gd._fullData.map(t => ({name: t.name, x: Array.from(t.x || []), y: Array.from(t.y || [])}));
  }
  return {cards, charts, text: main.innerText.replace(/\\s+/g, " ")};
}"""


def snapshot(page, name: str) -> None:
    """A PNG of the whole page in tests/screenshots/ (the app scrolls inside itself, so the viewport is made as tall
    as its content first), for a person to look at."""
    height = page.evaluate("() => document.querySelector(\"[data-testid='stMain']\").scrollHeight")
    page.set_viewport_size({"width": 1280, "height": min(max(1100, height), 16_000)})
    page.screenshot(path=str(SCREENSHOTS / name))
    page.set_viewport_size({"width": 1280, "height": 1100})


def reads_right(page) -> None:
    """The page as a person reads it (READS_RIGHT): no problem found, no exception drawn."""
    assert page.evaluate(READS_RIGHT) == []
    no_exceptions(page)


def in_words(page, name: str) -> list[str]:
    """What on the page `name` is an identifier, a glyph or a number where words belong (IN_WORDS)."""
    problems = page.evaluate(IN_WORDS)
    return [p for p in problems if not (name in ROUND_OFF_PAGES and p.startswith("a number that means 0"))]


def shown(page) -> dict:
    return page.evaluate(SHOWN)


def chart(seen: dict, starts: str) -> list[dict]:
    return next(traces for title, traces in seen["charts"].items() if title.startswith(starts))


def test_home_lists_the_zoo_and_each_experiments_latest_run(server, browser, quick_run, world):
    """Home's zoo is a plain HTML table (drawn by a headless browser too) with the card's numbers as the page
    writes them (dashboards.display.short), its raw rows one click away; each experiment's latest run by its
    folder; and the page reads right."""
    from dashboards.display import short

    card = json.loads((Path(world["FORMA_ZOO_DIR"]) / "pydoc" / "card.json").read_text())
    errors: list[str] = []
    page = open_page(browser, server, errors)
    page.get_by_text("KL decomposition").first.wait_for()
    table = page.locator("[data-testid='stTable']").first
    row = table.locator("tr", has_text="pydoc").first.inner_text()
    for key in ("n_params", "steps", "best_val_loss_nats", "val_perplexity"):
        assert short(card[key]) in row, (key, row)
    assert "yes (quick recipe)" in row
    assert "forma build markov" in table.locator("tr", has_text="markov").first.inner_text()
    assert page.get_by_role("button", name="Download these rows").count() == 1
    content = page.content()
    for name in experiments.experiment_names():
        assert quick_run(name).name in content, name
    reads_right(page)
    snapshot(page, "home.png")
    assert errors == []


def test_explorer_shows_every_head_tokens_in_bytes_and_the_layers_in_whole_numbers(server, browser):
    """The one-head pattern beside every head's; the residual stream's legend names every position; a character
    of two bytes reads as its bytes (⟨0xC3⟩⟨0xA9⟩), never '\ufffd'; the layer axes tick at whole numbers."""
    errors: list[str] = []
    page = open_page(browser, f"{server}/explorer", errors)
    page.locator(".st-key-attention_heads .main-svg").first.wait_for(timeout=60_000)
    heads = page.evaluate("() => document.querySelector('.st-key-attention_heads .js-plotly-plot')._fullData.length")
    assert heads == 2 * 4  # every head of the 2 layers × 4 heads
    reads_right(page)
    snapshot(page, "explorer.png")
    prompt = page.locator(".st-key-prompt input")
    prompt.fill("Return the café list of items in the list.")
    prompt.press("Enter")
    page.get_by_text("⟨0xC3⟩").first.wait_for(timeout=60_000)
    wait_rendered(page)
    open_tab(page, "Residual stream", "norms")
    n_tokens = page.evaluate("() => document.querySelector('.st-key-norms .js-plotly-plot')._fullData.length")
    assert page.locator(".st-key-norms .legend .traces").count() == n_tokens > 12
    reads_right(page)
    snapshot(page, "explorer-residual.png")
    open_tab(page, "Lenses", "lens")
    reads_right(page)
    snapshot(page, "explorer-lens.png")
    assert errors == []


def agreements(name: str, results: dict, seen: dict) -> list[tuple[str, float, float, float]]:
    """(what, the headline's number, the number the page shows for the same quantity elsewhere — a card, a
    chart, a table —, how close they must be): what a reader compares, the page's own way."""
    heads = {h["name"]: h for h in results["headlines"]}
    cards, text = seen["cards"], seen["text"]
    pairs = []
    if name == "calibration":
        ece = next(v for k, v in cards.items() if k.startswith("ECE"))  # the first section's: cloze, end of training
        pairs.append(("cloze ECE at the end of training", heads["cloze_ece_beyond_noise"]["value"], float(ece), 5e-4))
        T = re.search(r"Temperature scaling, end of training.*? T = ([0-9.]+)", text)
        pairs.append(("the fitted temperature", heads["temperature_above_1"]["value"], float(T.group(1)), 5e-4))
    elif name == "kl":
        pairs.append(("KL over complete contexts", heads["kl_falls"]["value"], float(cards["KL (nats)"]), 5e-5))
        T = re.search(r"smallest at temperature T = ([0-9.]+)", text)
        pairs.append(("the KL-minimising temperature", heads["temperature"]["value"], float(T.group(1)), 5e-4))
        lens = chart(seen, "Ground-truth lens")[0]["y"]
        pairs.append(("the lens's KL after the last layer", heads["lens"]["value"], lens[-1], 1e-9))
    elif name == "hallucination":
        for key, value in cards.items():
            condition = re.match(r"g\(H\) (lowered|raised) by, (.*)", key)
            if condition:
                pairs.append(
                    (
                        key,
                        abs(heads[f"upweighting {condition.group(2)}"]["value"]),
                        float(value.rstrip("%")) / 100,
                        5e-4,
                    )
                )
        if not heads["bound_holds"]["supported"]:  # vacuous: said as the reason, never as a big number
            assert "Largest right side of the bound" not in cards
    elif name == "monitor":
        from lab.names import SIGNALS

        keys = {shown: key for key, shown in SIGNALS.items()}
        bars = next(t for t in chart(seen, "AUROC for a false claim") if t["name"] == "all false claims")
        assert all(SIGNALS.get(x, x) == x for x in bars["x"]), bars["x"]  # named as the table names them
        for signal, auroc in zip([keys.get(x, x) for x in bars["x"]], bars["y"]):
            if f"{signal}_separates" in heads and heads[f"{signal}_separates"]["value"] is not None:
                pairs.append((f"AUROC of {signal}", heads[f"{signal}_separates"]["value"], auroc, 1e-9))
    elif name == "equations":
        passed = re.search(r"([0-9]+) of ([0-9]+) checks pass", text)
        verdicts = [h["direction"] for h in results["headlines"]]
        pairs += [
            ("checks", len(verdicts), int(passed.group(2)), 0),
            ("passing", sum(verdicts), int(passed.group(1)), 0),
        ]
    elif name == "scoreboard":  # the bars of each world's relevant mass (the second of each truth's three panels)
        bars = [t for t in chart(seen, "Input attribution") if t["name"] == "method"]
        for index, world in enumerate(w for w in ("markov", "induction", "facts") if w in results["worlds"]):
            mass = bars[3 * index + 1]
            pairs.append(
                (
                    f"integrated gradients' relevant mass, {world}",
                    heads[f"attribution_{world}"]["value"],
                    mass["x"][mass["y"].index("integrated gradients")],  # horizontal bars
                    1e-9,
                )
            )
    return pairs


LIVE_CHARTS = {"calibration": 1}  # the reliability diagram the temperature slider redraws


@pytest.mark.parametrize("path", experiments.experiment_names())
def test_every_experiment_page_reads_right_and_agrees_with_its_headlines(server, browser, quick_run, path):
    """What a reader sees in Chromium on each experiment's page: the run it shows named in its header; each headline
    the run supports in its own sentence (each one it cannot, with why not), as results.json has it; every figure
    the run saved, drawn; no raw JSON tree; no number with more than 6 significant digits; each number a headline
    states equal to the card, chart or table that shows the same quantity (`agreements`); and the page reads
    right (READS_RIGHT). On calibration, the checkpoint selector sits above what it controls, starts at the end of
    training (what the headlines describe), and every section names the checkpoint it shows."""
    from dashboards.display import figures
    from tests.builders import long_numbers

    folder = quick_run(path)
    results = json.loads((folder / "results.json").read_text())
    errors: list[str] = []
    page = open_page(browser, f"{server}/{path}", errors)
    page.locator("h1").first.wait_for(timeout=60_000)
    assert folder.name in page.content()  # the run header names the run it shows
    expected = len(figures(folder)) + LIVE_CHARTS.get(path, 0)
    assert expected >= 2  # every experiment saves two figures or more
    charts = "[data-testid='stPlotlyChart']"
    page.wait_for_function(f'document.querySelectorAll("{charts} .main-svg").length >= {expected}', timeout=60_000)
    assert page.locator(charts).count() == expected
    seen = shown(page)
    text = seen["text"]
    for headline in results["headlines"]:
        said = headline["sentence"] if headline["supported"] else headline["why_not"]
        assert " ".join(said.split()) in text, headline["name"]
    assert page.locator("[data-testid='stJson']").count() == 0
    assert long_numbers(text) == []
    pairs = agreements(path, results, seen)
    assert pairs, path  # every page shows some headline's number a second time
    assert [(what, said, drawn) for what, said, drawn, close in pairs if abs(said - drawn) > close] == []
    reads_right(page)
    snapshot(page, f"{path}.png")
    if path == "calibration":
        selector = page.locator(".st-key-checkpoint")
        first_card = page.locator("[data-testid='stMetric']").first
        assert selector.bounding_box()["y"] < first_card.bounding_box()["y"]  # above what it controls
        sections = [h.inner_text() for h in page.locator("h3").all()]
        assert sections and all(
            "end of training" in s for s in sections if "multiple choice" in s or "Temperature" in s
        )
        page.get_by_text("partial checkpoint (step").first.click()
        page.get_by_text("Cloze multiple choice, partial checkpoint").wait_for(timeout=60_000)
        wait_rendered(page)
        ece = next(v for k, v in shown(page)["cards"].items() if k.startswith("ECE"))
        assert abs(float(ece) - results["mc"]["ece_15_equal_width"]) <= 5e-4
        reads_right(page)
        snapshot(page, "calibration-partial.png")
    assert errors == []


CHARTS_DRAWN = """() => [...document.querySelectorAll("[data-testid='stPlotlyChart']")]
                         .every(chart => chart.querySelector('.main-svg'))"""


@pytest.mark.parametrize("name", [name for name, _ in pages()])
def test_every_page_reads_in_words(server, browser, name):
    """Every page of the dashboard as drawn in Chromium, its charts included (`IN_WORDS`): no snake_case token
    outside a code span, no backtick, no '\ufffd', no "nan" or "None" cell, no ±d.ddde-18 where 0 is meant. The
    methods, signals, grades and readouts a run writes by key are named by lab.names, the one table of their
    display names."""
    errors: list[str] = []
    page = open_page(browser, f"{server}/{'' if name == 'home' else name}", errors, timeout=120_000)
    page.wait_for_timeout(1_000)  # a page's charts arrive after its first idle moment
    page.wait_for_function(CHARTS_DRAWN, timeout=60_000)
    wait_rendered(page)
    assert in_words(page, name) == []
    no_exceptions(page)
    assert errors == []


def test_training_curves_show_the_entropy_rate_of_a_known_world(server, browser, world):
    """markov's curves beside its chain's entropy rate (the card's number), read right."""
    errors: list[str] = []
    page = open_page(browser, f"{server}/training", errors)
    page.get_by_role("combobox").first.click()
    page.get_by_role("option", name="markov").click()
    page.get_by_text("entropy rate H(p)").first.wait_for(timeout=60_000)
    wait_rendered(page)
    rate = json.loads((Path(world["FORMA_ZOO_DIR"]) / "markov" / "card.json").read_text())["entropy_rate_nats"]
    line = next(t for t in chart(shown(page), "markov") if t["name"].startswith("entropy rate"))
    assert line["y"] == [rate, rate]
    reads_right(page)
    snapshot(page, "training.png")
    assert errors == []


# --- the explorer on a local Hugging Face folder, and Home's zoo table -------------------------------------------
@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A tiny GPT-2 and its word-level tokenizer, saved with save_pretrained: what a user points the explorer at."""
    from tests.builders import hf_model, word_tokenizer

    folder = tmp_path_factory.mktemp("hf-gpt2")
    hf_model("gpt2", randomise=False).save_pretrained(folder)
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
    wait_rendered(page, timeout=300_000)  # the default model's page drawn and idle before another model is chosen
    page.get_by_role("combobox").first.click()
    page.get_by_role("option", name="local folder…").click()
    path = page.locator(".st-key-model_path input")
    path.wait_for(timeout=60_000)
    path.fill(str(hf_folder))
    path.press("Enter")
    page.get_by_text("converted to a Forma model by lab.hf.convert.from_hf").wait_for(timeout=120_000)
    wait_rendered(page, timeout=300_000)  # the trust report and the first tab
    assert page.get_by_text("Trust report").count() >= 1
    open_tab(page, "Patching", "patching")
    page.locator(".st-key-patching_heads .main-svg").first.wait_for(timeout=60_000)
    reads_right(page)
    snapshot(page, "explorer-hf-patching.png")
    open_tab(page, "Head detectors", "heads")
    assert page.locator(".st-key-heads .main-svg").first.is_visible()
    reads_right(page)
    snapshot(page, "explorer-hf-heads.png")
    assert errors == []


@pytest.mark.slow
def test_the_demo_serves_first_then_each_page_shows_its_jobs_progress_and_fills_in(tmp_path, browser):
    """`forma demo`: the dashboard answers before its job has written a result; the job's page shows its
    progress (a progress bar with elapsed time) while it works, then the run's results once it ends."""
    import sys

    zoo_copy, runs = tmp_path / "models", tmp_path / "runs"
    for name in zoo_names():  # recipes only: --only equations trains nothing
        (zoo_copy / name).mkdir(parents=True)
        shutil.copy(DEFAULT_ZOO_DIR / name / "model.toml", zoo_copy / name / "model.toml")
    env = os.environ | {"FORMA_ZOO_DIR": str(zoo_copy), "FORMA_RUNS_DIR": str(runs)}
    port = free_port()
    demo = subprocess.Popen(
        [sys.executable, "-m", "lab.cli", "demo", "--only", "equations", "--port", str(port)],
        env=env,
        start_new_session=True,
        preexec_fn=signals_as_sent(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
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
        snapshot(page, "demo-progress.png")
        page.get_by_text("checks pass").wait_for(timeout=600_000)  # the page ran again by itself
        wait_rendered(page)
        results = json.loads(next(runs.glob("equations/*/results.json")).read_text())
        assert f"{results['n_passed']} of {results['n_checks']} checks pass" in page.content()
        assert page.locator("[data-testid='stProgress']").count() == 0
        no_exceptions(page)
        snapshot(page, "demo-filled.png")
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
    process = subprocess.Popen(
        dashboard_command(port),
        env=os.environ | {"FORMA_RUNS_DIR": str(tmp_path / "runs")},
        start_new_session=True,
        preexec_fn=signals_as_sent(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(url, process, timeout_s=90)
        errors: list[str] = []
        page = open_page(browser, f"{url}/compare", errors)
        page.get_by_text("Headlines, number by number").wait_for(timeout=60_000)
        from dashboards.display import figures
        from lab.headlines import title

        charts = len(figures(original))
        page.wait_for_function(
            f"document.querySelectorAll(\"[data-testid='stPlotlyChart'] .main-svg\").length >= {2 * charts}",
            timeout=60_000,
        )
        content = page.content()
        assert "seed 7" in content and original.name in content and copy.name in content
        results = json.loads((original / "results.json").read_text())
        assert all(title(h["name"]) in content for h in results["headlines"])
        reads_right(page)
        snapshot(page, "compare.png")
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
    sentence = (
        f'Fetched? ![beacon]({at}/image.png) [link]({at}/link) <img src="{at}/html.png"> {at}/auto **bold** :red[red]'
    )
    folder = tmp_path / "runs" / "kl" / "2026-01-01T00-00-00Z"
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(
        json.dumps(
            {
                "checkpoints": [],
                "source": {},
                "headlines": [
                    {
                        "name": "beacon",
                        "sentence": sentence,
                        "value": 1.0,
                        "interval": None,
                        "direction": 1,
                        "supported": True,
                        "why_not": None,
                    }
                ],
            }
        )
    )
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


def test_the_graphs_page_draws_the_graph_and_shows_a_clicked_feature(browser, tmp_path):
    """dashboards/graphs.py in Chromium: a prompt's graph drawn, a clicked feature's top contexts shown."""
    env = os.environ | {"FORMA_ZOO_DIR": str(zoo_with_transcoders(tmp_path)), "FORMA_RUNS_DIR": str(tmp_path / "runs")}
    for url in serve(env):
        errors: list[str] = []
        page = open_page(browser, f"{url}/graphs", errors, timeout=120_000)
        page.wait_for_selector("[data-testid='stPlotlyChart'] .main-svg", timeout=120_000)
        no_exceptions(page)
        points = page.locator("[data-testid='stPlotlyChart'] .scatterlayer .trace:has(path.point) path.point")
        assert points.count() > 10  # nodes drawn
        labels = label_boxes(page)  # the positions' tokens and the output tokens, as drawn at the default width
        assert len(labels) > 5
        overlaps = [(a["text"], b["text"]) for k, a in enumerate(labels) for b in labels[k + 1 :] if overlap(a, b)]
        assert not overlaps, overlaps
        nodes = node_boxes(page)  # every node's marker: none drawn over another, the last position's crowd included
        crowded = [(a["text"], b["text"]) for k, a in enumerate(nodes) for b in nodes[k + 1 :] if overlap(a, b)]
        assert not crowded, f"{len(crowded)} of {len(nodes)} nodes' markers overlap: {crowded[:5]}"
        feature_trace = page.locator("[data-testid='stPlotlyChart'] .scatterlayer .trace").nth(
            feature_trace_index(page)
        )
        feature_trace.locator("path.point").first.click(force=True)
        page.get_by_text("Top activating contexts").wait_for(timeout=120_000)
        wait_rendered(page, 120_000)
        reads_right(page)  # the chart drawn as every chart is, the contexts' table headed in words
        headers = page.locator("[data-testid='stTable'] thead th").all_inner_texts()
        assert "token (where it fires)" in headers, headers
        page.screenshot(path=str(SCREENSHOTS / "graphs.png"))
        assert errors == []


def label_boxes(page) -> list[dict]:
    """The bounding boxes, in the page's pixels, of the graph's x-axis tick labels and its nodes' text labels."""
    return page.evaluate(
        """() => [...document.querySelectorAll(
            "[data-testid='stPlotlyChart'] .xtick text, [data-testid='stPlotlyChart'] .textpoint text")]
          .map(e => { const r = e.getBoundingClientRect();
                      return {text: e.textContent, left: r.left, right: r.right, top: r.top, bottom: r.bottom}; })
          .filter(b => b.right > b.left)"""
    )


def node_boxes(page) -> list[dict]:
    """The bounding boxes of the graph's node markers (each named by its trace and index)."""
    return page.evaluate(
        """() => [...document.querySelectorAll("[data-testid='stPlotlyChart'] .scatterlayer .trace")]
          .flatMap((t, k) => [...t.querySelectorAll("path.point")].map((e, j) => {
              const r = e.getBoundingClientRect();
              return {text: `${k}:${j}`, left: r.left, right: r.right, top: r.top, bottom: r.bottom}; }))"""
    )


def overlap(a: dict, b: dict) -> bool:
    return a["left"] < b["right"] and b["left"] < a["right"] and a["top"] < b["bottom"] and b["top"] < a["bottom"]


def feature_trace_index(page) -> int:
    """The index of the feature markers' trace among the chart's scatter traces (edges come first)."""
    names = page.evaluate(
        "() => document.querySelector(\"[data-testid='stPlotlyChart'] .js-plotly-plot\").data.map(t => t.name || '')"
    )
    return names.index("feature")


def test_strings_from_every_folder_kind_fetch_nothing_and_make_no_image_on_any_page(browser, tmp_path, monkeypatch):
    """tests/faults/test_markup_from_files.py's folders (every string of a run's results, config and provenance,
    a model's card and description, a transcoder set's files, a graph's meta and supernode names, each with a
    Markdown image of http://127.0.0.1:9/leak.png and an <img onerror> tag) served to Chromium: on every page, no
    request for the image leaves the page, no <img> element is made from them, and the page draws without an
    exception."""
    import streamlit as st

    from tests.builders import poison_graph, poisoned_folders

    zoo_copy = poisoned_folders(tmp_path)
    monkeypatch.setenv("FORMA_ZOO_DIR", str(zoo_copy))
    monkeypatch.setenv("FORMA_RUNS_DIR", str(tmp_path / "runs"))
    from tests.builders import page as app_page

    st.cache_resource.clear()
    drawn = app_page("graphs")
    drawn.default_timeout = 120
    assert not drawn.run().exception  # the default prompt's graph saved, then given a hostile supernode
    poison_graph(zoo_copy)
    st.cache_resource.clear()
    asked: list[str] = []
    for url in serve(os.environ | {"FORMA_ZOO_DIR": str(zoo_copy), "FORMA_RUNS_DIR": str(tmp_path / "runs")}):
        for name, _ in pages():
            errors: list[str] = []
            page = browser.new_page()
            page.on("pageerror", lambda err, errors=errors: errors.append(str(err)))
            page.on("request", lambda request: asked.append(request.url) if ":9/" in request.url else None)
            page.goto(f"{url}/{'' if name == 'home' else name}")
            wait_rendered(page, 120_000)
            page.wait_for_timeout(1_000)  # time for any request an element would make
            images = page.evaluate("() => [...document.querySelectorAll('img')].map(i => i.getAttribute('src'))")
            assert not [src for src in images if src in ("x", "http://127.0.0.1:9/leak.png")], (name, images)
            no_exceptions(page)
            if name == "graphs":
                assert "group ![x](http://127.0.0.1:9/leak.png)" in page.locator("[data-testid='stMain']").inner_text()
            page.close()
            assert errors == [], (name, errors)
    assert asked == []
