"""No markup from files: a Markdown image (`![x](http://127.0.0.1:9/leak.png)`) and HTML tags (`<img src=x
onerror=alert(1)>`, `<b>bold</b>`) put into every string of every folder kind the dashboard reads — a run folder's
results.json, config.json and provenance.json (the measured runs of docs/measured/runs, every string value
poisoned), a model's card.json and its recipe's description, a transcoder set's source.json and quality.json, a
graph folder's meta and supernode names — and every page opened (Streamlit's AppTest): wherever a page shows one of
those strings, in any element that Streamlit reads as Markdown (markdown, captions, headers, messages, metric
labels and their help, expander and tab labels, radio options, table cells), it renders as the words themselves,
never as an image, a link or HTML. In every plotly chart a page draws, and in the HTML a run writes beside each of
its figures, a file's string (a link, bold, italics, a styled span and an entity planted in it) is drawn as its
characters: each `&`, `<` and `>` escaped (lab.figure_text.as_text). tests/browser/test_browser.py opens the same
folders in Chromium and checks that no image is made from them and no request leaves the page."""

import json
import re

import plotly.graph_objects as go
import pytest
import streamlit as st

from dashboards.pages import pages
from lab.runs import save_figure
from tests.builders import (
    MARKUP,
    MARKUP_FORBIDDEN,
    MARKUP_WORDS,
    POISONED_FIGURE,
    markup_in,
    page,
    poison_graph,
    poisoned_folders,
    rendered,
)


def shown(at) -> tuple[list[str], list[str]]:
    """(every string a page hands Streamlit to read as Markdown, every string it shows as plain text)."""
    markdown = [
        str(e.value)
        for kind in ("markdown", "caption", "title", "header", "subheader", "warning", "info", "error", "success")
        for e in at.get(kind)
    ]
    for kind in ("metric", "expander", "tab", "selectbox", "multiselect", "radio", "text_input", "slider", "button"):
        for e in at.get(kind):
            markdown += [str(getattr(e, field, None) or "") for field in ("label", "help")]
    for radio in at.get("radio"):
        markdown += [str(o) for o in radio.options]
    for table in at.table:
        markdown += [str(c) for c in [*table.value.index, *table.value.columns, *table.value.to_numpy().ravel()]]
    return markdown, [str(e.value) for e in at.get("text")]


def chart_strings(at) -> list[str]:
    """Every string of every plotly chart on the page, as its spec reaches the browser."""
    found: list[str] = []

    def walk(value) -> None:
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    for chart in at.get("plotly_chart"):
        walk(json.loads(chart.proto.spec))
    return found


PLOTLY_KEPT = re.compile(r"<br\s*/?>|</?extra>", re.IGNORECASE)  # a line break, hover's box: never a file's markup
PLOTLY_ENTITIES = (("&lt;", "<"), ("&gt;", ">"), ("&amp;", "&"))


def unescaped(source: str) -> list[str]:
    """The characters of a chart string that plotly would read as markup: a `<` or `>` of any tag but a line break
    or hover's <extra>, and an `&` that begins no entity but the three of escaped text (&amp;, &lt;, &gt;)."""
    text = PLOTLY_KEPT.sub(" ", source)
    return re.findall(r"[<>]|&(?!amp;|lt;|gt;)", text)


def plotly_shows(source: str) -> str:
    """The words plotly draws of a chart string with no markup left in it: line breaks as spaces, entities as
    their characters."""
    text = PLOTLY_KEPT.sub(" ", source)
    for entity, character in PLOTLY_ENTITIES:
        text = text.replace(entity, character)
    return re.sub(r"\s+", " ", text)


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory):
    root = tmp_path_factory.mktemp("markup")
    mp = pytest.MonkeyPatch()
    zoo_copy = poisoned_folders(root)
    mp.setenv("FORMA_ZOO_DIR", str(zoo_copy))
    mp.setenv("FORMA_RUNS_DIR", str(root / "runs"))
    st.cache_resource.clear()
    st.cache_data.clear()
    at = page("graphs")
    at.default_timeout = 120
    at.run()  # draws and saves the default prompt's graph
    assert not at.exception, at.exception
    poison_graph(zoo_copy)
    st.cache_resource.clear()
    st.cache_data.clear()
    yield root
    st.cache_resource.clear()
    st.cache_data.clear()
    mp.undo()


@pytest.mark.parametrize("name", [name for name, _ in pages()])
def test_every_string_from_a_folder_is_shown_as_text_on_every_page(poisoned, name):
    at = page(name)
    at.default_timeout = 120
    at.run()
    assert not at.exception, at.exception
    markdown, text = shown(at)
    for source in markdown:
        words = rendered(source)
        if "leak" in source or "leak" in words:
            assert not set(markup_in(source)) & MARKUP_FORBIDDEN, (name, source)
            assert MARKUP_WORDS[0] in words or "leak.png" not in words, (name, source, words)  # the image as its words
    for source in text:
        if "leak.png" in source:
            assert MARKUP_WORDS[0] in source, (name, source)
    for source in chart_strings(at):  # plotly draws <a>, <b>, <span style> of any string: a file's are escaped
        if "leak" in source:
            assert not unescaped(source), (name, source, unescaped(source))


# The pages on which each folder kind's strings must appear (so that the test above cannot pass by showing none).
SHOWN_ON = {
    "a run's results.json": ("kl", "hallucination", "calibration", "monitor", "equations"),
    "a run's provenance.json": ("kl",),
    "a model's card and recipe": ("home",),
    "a graph's supernodes": ("graphs",),
}


@pytest.mark.parametrize("kind", SHOWN_ON)
def test_each_folder_kinds_strings_reach_a_page(poisoned, kind):
    for name in SHOWN_ON[kind]:
        at = page(name)
        at.default_timeout = 120
        at.run()
        markdown, text = shown(at)
        assert any(MARKUP_WORDS[0] in s for s in [*map(rendered, markdown), *text, *chart_strings(at)]), (kind, name)


@pytest.mark.parametrize("name", SHOWN_ON["a run's results.json"])
def test_a_string_from_a_file_reaches_a_chart_as_text(poisoned, name):
    """The chart check above cannot pass by drawing no file's string: a run's saved figure, every string of it
    poisoned (tests.builders.POISONED_FIGURE), is drawn with each tag escaped."""
    at = page(name)
    at.default_timeout = 120
    at.run()
    leaked = [s for s in chart_strings(at) if "leak" in s]
    assert leaked and not [s for s in leaked if unescaped(s)], leaked[:3]
    for words in MARKUP_WORDS[3:]:  # a link, bold, italics, a styled span and an entity: drawn as the characters
        assert any(words in plotly_shows(s) for s in leaked), (name, words, leaked[:3])


def strings_in(value) -> list[str]:
    """Every string in parsed JSON, at any depth."""
    if isinstance(value, str):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return [s for v in items for s in strings_in(v)]


def test_a_figure_a_run_saves_draws_a_files_strings_as_text_in_its_html(tmp_path):
    """The HTML a run writes beside each figure (lab.runs.save_figure), opened in a browser: every string of a
    figure built from a file's strings (titles, axis titles and ticks, trace and legend names, annotations, hover and
    bar text) is drawn as its characters. Its JSON, which the dashboard escapes when it draws it, keeps them as they
    are: escaped twice, a label would read `&amp;lt;`."""
    save_figure(go.Figure(POISONED_FIGURE), tmp_path, "poisoned")
    html = (tmp_path / "poisoned.html").read_text()
    decoder, at = json.JSONDecoder(), html.index("Plotly.newPlot(") + len("Plotly.newPlot(")
    drawn = []
    for _ in range(3):  # the chart's element id, its data, its layout
        while html[at].isspace():
            at += 1
        value, at = decoder.raw_decode(html, at)
        drawn.append(value)
        at = html.index(",", at) + 1
    leaked = [s for s in strings_in(drawn[1:]) if "leak" in s]
    assert len(leaked) >= 10 and not [s for s in leaked if unescaped(s)], leaked[:3]
    for words in MARKUP_WORDS:
        assert any(words in plotly_shows(s) for s in leaked), words
    assert MARKUP in strings_in(json.loads((tmp_path / "poisoned.json").read_text())["data"][0]["hovertext"])
