"""Fixtures of the experiments' tests."""

import json

import pytest


@pytest.fixture(scope="module")
def quick(request, quick_run):
    """(results.json, folder) of `forma run NAME --quick` for the module's EXPERIMENT: the session's quick run,
    shared with the dashboard's tests."""
    folder = quick_run(request.module.EXPERIMENT)
    return json.loads((folder / "results.json").read_text()), folder
