"""The dashboard's pages, in the navigation's order: Home, the Explorer, attribution graphs and transcoder features,
one page per registered experiment (experiments.REGISTRY: dashboards/<name>.py under its navigation title), then
Compare runs and the training curves. dashboards/app.py builds the navigation from it; the dashboard benchmark and
the tests open every page from it. Standard library only."""

from pathlib import Path

import experiments

HERE = Path(__file__).resolve().parent
BEFORE = (
    ("home", "Home"),
    ("explorer", "Explorer"),
    ("graphs", "Attribution graphs"),
    ("features", "Transcoder features"),
)
AFTER = (("compare", "Compare runs"), ("training", "Training curves"))


def pages() -> list[tuple[str, str]]:
    """(page name, navigation title) of every page; the page's script is dashboards/<name>.py and its address
    /<name> (Home's is /)."""
    return [*BEFORE, *((e.name, e.nav) for e in experiments.REGISTRY), *AFTER]


def page_file(name: str) -> Path:
    return HERE / f"{name}.py"
