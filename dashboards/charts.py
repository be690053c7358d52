"""How every chart reads on a page (`readable`, applied to each figure a page draws: a run's saved figures and
the explorer's own): one colour per series across all of a figure's panels, with its legend entry shown once;
whole-number ticks on an axis that counts (layers, exposures); a log axis labelled at 1, 2 and 5 of each power of
ten, or at the powers alone where it is short; text values ("2-5", "6+") as categories, every one
shown; powers of ten, never SI prefixes (10f, 1p) on a probability; a second axis at its own round ticks, the
legend right of them; a title wrapped to the width it is drawn at, each panel's title to its panel's; a figure
tall enough for every legend entry."""

import base64
import numbers
import re
from typing import Any

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from lab.figure_text import as_text
from lab.names import in_words

TITLE_CHARS = 95  # a title line at most this long: about what a full-width chart holds at the title's size
LEGEND_ENTRY_PX = 24  # the height of one legend entry, with room to spare
DEFAULT_HEIGHT = 450  # plotly's own default figure height
MOST_LAYER_TICKS = 24  # a layer axis ticks at every layer up to this many
COUNT_TICKS = 8  # an axis that counts ticks about this many times
PX_PER_TITLE_CHAR = 11  # a full-width chart's width in px is about this many times TITLE_CHARS (1,050 px)
LOG_LABEL_PX = 200  # a log axis labelled at 1, 2 and 5 of each power of ten needs about this many px a power (the
# estimate counts the whole panel, its legend and margins too)
TITLE_PAD = 12  # px above a figure's title
PANEL_TITLE_PX = 22  # the height of one line of a panel's title (plotly's 16 px font)
COLOURED = ("scatter", "scattergl", "bar", "box", "violin", "histogram")


def wrap(text: str, width: int) -> str:
    """`text` broken into lines of at most `width` characters at spaces, joined by <br> (plotly's line break)."""
    lines: list[str] = []
    for paragraph in text.split("<br>"):
        line = ""
        for word in paragraph.split(" "):
            if line and len(line) + 1 + len(word) > width:
                lines.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        lines.append(line)
    return "<br>".join(lines)


def series(trace: Any) -> str:
    """What makes traces one series: their legend group, else their name ("" for an unnamed trace)."""
    return str(trace.legendgroup or trace.name or "")


def _own_colour(trace: Any) -> bool:
    """The trace sets its colour itself (then it keeps it)."""
    line = getattr(trace, "line", None)
    marker = getattr(trace, "marker", None)
    return bool((line is not None and line.color is not None) or (marker is not None and marker.color is not None))


def one_colour_per_series(fig: go.Figure) -> None:
    """Give every trace of one series (`series`) the same colour in every panel: the colour its first trace
    has (its own, or the next of the figure's colour cycle); the legend shows each series once and toggles
    all its traces together."""
    palette = list(fig.layout.template.layout.colorway or ()) if fig.layout.template else []
    palette = list(fig.layout.colorway or palette) or [
        "#636efa",
        "#EF553B",
        "#00cc96",
        "#ab63fa",
        "#FFA15A",
        "#19d3f3",
        "#FF6692",
        "#B6E880",
        "#FF97FF",
        "#FECB52",
    ]
    colours: dict[str, Any] = {}
    shown: set[str] = set()
    cycle = 0
    for trace in fig.data:
        if trace.type not in COLOURED:
            continue
        key = series(trace)
        if key not in colours:
            if _own_colour(trace):
                colours[key] = None  # the series keeps the colours it set
            else:
                colours[key] = palette[cycle % len(palette)]
                cycle += 1
        colour = colours[key]
        if colour is not None and not _own_colour(trace):
            if trace.type in ("scatter", "scattergl"):
                trace.line.color = colour
                trace.marker.color = colour
            else:
                trace.marker.color = colour
        if key and trace.showlegend is not False:
            trace.legendgroup = key
            if key in shown:
                trace.showlegend = False
            shown.add(key)


def _axes(fig: go.Figure) -> list[tuple[str, Any]]:
    """(name, axis) of every x and y axis in the layout: ("xaxis", …), ("yaxis2", …)."""
    layout = fig.layout
    names = [name for name in layout if re.fullmatch(r"[xy]axis\d*", name)]
    return [(name, layout[name]) for name in names]


def _values_on(fig: go.Figure, axis_name: str) -> list[Any]:
    """Every x (or y) value drawn against the axis `axis_name` ("xaxis2" is the traces' "x2")."""
    letter, number = axis_name[0], axis_name[5:]
    ref = letter + number
    values: list[Any] = []
    for trace in fig.data:
        if (getattr(trace, f"{letter}axis", None) or letter) == ref and getattr(trace, letter, None) is not None:
            values.extend(_decoded(trace[letter]))
    return values


def _decoded(values: Any) -> list[Any]:
    """A trace's values as a list: plotly writes a numpy array to JSON as a typed array ({"dtype": "f8", "bdata":
    base64}), and reads it back as that dict."""
    if isinstance(values, dict) and "bdata" in values:
        return np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"]).ravel().tolist()
    return list(values)


def _decades(values: list[Any]) -> float:
    """How many powers of ten the positive numbers among `values` span (inf with none)."""
    positive = [float(v) for v in values if isinstance(v, numbers.Real) and not isinstance(v, bool) and v > 0]
    return float(np.log10(max(positive) / min(positive))) if positive else float("inf")


def whole_step(least: float) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, … that is at least `least`: a round whole-number tick step."""
    for power in range(19):
        for mantissa in (1, 2, 5):
            if mantissa * 10**power >= least:
                return mantissa * 10**power
    raise ValueError(f"no whole-number tick step reaches {least}")


def integer_ticks(fig: go.Figure) -> None:
    """An axis that counts ticks at whole numbers only: one whose title names layers at every layer (up to
    MOST_LAYER_TICKS), an x axis whose values are all whole numbers (exposures, steps, prefix lengths) at a round
    whole step, about COUNT_TICKS of them; a log axis, a category axis or one with ticks of its own keeps them."""
    for name, axis in _axes(fig):
        if axis.type in ("log", "category", "date") or axis.tickmode == "array" or axis.tickvals:
            continue
        title = (axis.title.text or "") if axis.title else ""
        values = [float(v) for v in _values_on(fig, name) if isinstance(v, numbers.Real) and not isinstance(v, bool)]
        if not values:
            continue
        span = max(values) - min(values)
        if "layer" in title.lower():
            step = whole_step(span / MOST_LAYER_TICKS)
        elif name.startswith("x") and all(v.is_integer() for v in values):
            step = whole_step(span / COUNT_TICKS)
        else:
            continue
        fig.layout[name].update(tickmode="linear", tick0=0, dtick=step, tickformat="d")


def categories_kept(fig: go.Figure) -> None:
    """An axis whose values are all text is a category axis: plotly would read "0" and "1" as numbers and leave
    "2-5" and "6+" off the axis."""
    for name, axis in _axes(fig):
        values = _values_on(fig, name)
        if axis.type is None and values and all(isinstance(v, str) for v in values):
            fig.layout[name].type = "category"


def _is_panel_title(note: Any) -> bool:
    """A subplot title: the text plotly's make_subplots writes just above a panel (paper coordinates, no arrow)."""
    return bool(note.text) and not note.showarrow and note.yref == "paper" and note.yanchor == "bottom"


def readable(fig: go.Figure, title_chars: int = TITLE_CHARS) -> go.Figure:
    """`fig` as a page draws it (see the module's docstring); changed in place and returned."""
    one_colour_per_series(fig)
    categories_kept(fig)
    integer_ticks(fig)
    for name, axis in _axes(fig):
        fig.layout[name].exponentformat = "power"
        if axis.overlaying:  # a second axis ticks at its own round numbers, not at the first one's grid lines
            fig.layout[name].update(tickmode="auto", showgrid=False)
        if axis.side == "right" and fig.layout.legend.orientation != "h":  # the legend right of its ticks
            fig.update_layout(legend=dict(x=1.12, xanchor="left"))
    panels = len({tuple(axis.domain or (0, 1)) for name, axis in _axes(fig) if name.startswith("x")}) or 1
    extra = 0  # lines a wrapped panel title adds above its panel
    for note in fig.layout.annotations or ():  # subplot titles and labels: wrapped to their panel's width
        if note.text and not note.showarrow and len(note.text) > title_chars // panels:
            note.text = wrap(note.text, max(12, title_chars // panels - 4))
            extra = max(extra, note.text.count("<br>"))
    title = fig.layout.title.text if fig.layout.title else None
    lines = 1
    if title:
        wrapped = wrap(title, title_chars)
        lines = wrapped.count("<br>") + 1
        # at the top of the figure, so that the panels' own titles below it have the margin's rest to themselves
        fig.update_layout(
            title=dict(text=wrapped, font=dict(size=16), y=1, yref="container", yanchor="top", pad=dict(t=TITLE_PAD))
        )
    entries = sum(1 for t in fig.data if t.type in COLOURED and t.showlegend is not False and (t.name or "") != "")
    panel_titles = any(_is_panel_title(note) for note in fig.layout.annotations or ())
    top = max(40 + 22 * lines + 16 * extra, TITLE_PAD + 22 * lines + (PANEL_TITLE_PX * (extra + 1) + 8) * panel_titles)
    needed = top + 80 + LEGEND_ENTRY_PX * entries  # plotly's bottom margin is 80 px
    height = fig.layout.height or DEFAULT_HEIGHT
    # legend groups (one per series) keep plotly's 10 px gap between groups out: the entries sit as close as usual
    fig.update_layout(margin=dict(t=top), height=max(height, needed), legend_tracegroupgap=0)
    log_ticks(fig, title_chars * PX_PER_TITLE_CHAR, max(height, needed) - top - 80)
    return fig


def log_ticks(fig: go.Figure, width_px: float, height_px: float) -> None:
    """Each log axis labelled as often as its length allows (plotly's own choice labels 2 … 9 of every power of ten,
    and they print over each other on a short axis): 1, 2 and 5 of each power with LOG_LABEL_PX a power or more,
    the powers alone with less; an axis with ticks of its own keeps them."""
    for name, axis in _axes(fig):
        decades = _decades(_values_on(fig, name))
        if axis.type != "log" or axis.dtick is not None or axis.tickvals or decades == float("inf"):
            continue
        low, high = axis.domain or (0, 1)
        per_decade = (high - low) * (width_px if name.startswith("x") else height_px) / max(decades, 1.0)
        # within one power of ten the powers alone might label nothing: 1, 2 and 5 there whatever the length
        fig.layout[name].dtick = "D2" if per_decade >= LOG_LABEL_PX or decades < 1 else 1


def relabel(fig: go.Figure, names: dict[str, str]) -> go.Figure:
    """`fig` with the keys it shows (a trace's name, a category on an axis, a word of its title) in the words
    `names` gives them ("max_prob" → "top probability"), as the page's tables name them; changed in place."""
    for trace in fig.data:
        if trace.name in names:
            trace.name = names[trace.name]
        for letter in ("x", "y"):
            values = getattr(trace, letter, None)
            if (
                values is not None
                and not isinstance(values, dict)
                and any(v in names for v in values if isinstance(v, str))
            ):
                trace[letter] = [names.get(v, v) if isinstance(v, str) else v for v in values]
    if fig.layout.title and fig.layout.title.text:
        fig.layout.title.text = in_words(fig.layout.title.text, names)
    for note in fig.layout.annotations or ():  # subplot titles
        if note.text:
            note.text = in_words(note.text, names)
    for _, axis in _axes(fig):
        if axis.title and axis.title.text:
            axis.title.text = in_words(axis.title.text, names)
    return fig


def draw(fig: go.Figure, key: str, title_chars: int = TITLE_CHARS) -> None:
    """A chart on the page, `readable`, its strings shown as text (lab.figure_text.as_text)."""
    st.plotly_chart(as_text(readable(fig, title_chars)), key=key)
