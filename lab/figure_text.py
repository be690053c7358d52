"""A plotly figure's strings as text. Plotly reads a subset of HTML in every string it draws — a title, an axis's
title and tick labels, a trace's name, legend, annotation, hover and bar text — and draws a link (<a href>), bold,
italics or a styled span (<span style>) of it. A string from a file (a run's model label or question, a
supernode's name, a note) must be drawn as the characters it is, so every figure Forma draws or saves passes
through `as_text` first (the dashboard's charts, the HTML a run writes beside its figure's JSON): each `&`, `<`
and `>` becomes its entity, which plotly draws as the character. Two tags are kept, because Forma's own strings put
them there and neither makes markup of the words around it: a line break (<br>) and hover's <extra> box."""

import re
from typing import Any

import numpy as np

KEPT_TAG = re.compile(r"(<br\s*/?>|</?extra>)", re.IGNORECASE)  # split() keeps them: odd pieces are kept tags
ENTITIES = (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"))  # "&" first, so that no entity is escaped twice


def escape(text: str) -> str:
    """`text` as plotly draws it literally: every `&`, `<` and `>` as its entity, but a line break and <extra>."""
    pieces = KEPT_TAG.split(text)
    for i in range(0, len(pieces), 2):
        for character, entity in ENTITIES:
            pieces[i] = pieces[i].replace(character, entity)
    return "".join(pieces)


def _escaped(value: Any) -> Any:
    if isinstance(value, str):
        return escape(value)
    if isinstance(value, dict):
        return {k: _escaped(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_escaped(v) for v in value)
    if isinstance(value, np.ndarray) and value.dtype.kind in "OUS":
        return np.array([_escaped(v) for v in value.ravel().tolist()], dtype=object).reshape(value.shape)
    return value


def as_text(fig: Any) -> Any:
    """A copy of plotly figure `fig` with every string in it `escape`d: drawn as its characters, never as markup.
    Applied once, where a figure is drawn or written as HTML (the figure's JSON keeps the strings as they are)."""
    import plotly.graph_objects as go

    return go.Figure(_escaped(fig.to_plotly_json()))
