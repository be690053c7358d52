"""The quick profile is a smaller calibration experiment, not a different one: every headline that both the quick
run and the committed default run support points the same way, and every headline a run cannot support says why.

The default run is committed as docs/measured/runs/calibration.json (its results.json) with
calibration.provenance.json beside it (the provenance.json the run wrote)."""

import json
from pathlib import Path

import pytest

from experiments.calibration import headlines

MEASURED = Path(__file__).resolve().parents[1] / "docs" / "measured" / "runs"


@pytest.fixture(scope="module")
def default():
    return json.loads((MEASURED / "calibration.json").read_text())


@pytest.fixture(scope="module")
def quick(quick_run):
    return json.loads((quick_run("calibration") / "results.json").read_text())


def test_the_committed_run_is_the_default_profile_and_its_headlines_are_recomputable(default):
    provenance = json.loads((MEASURED / "calibration.provenance.json").read_text())
    assert provenance["experiment"] == "calibration" and "--quick" not in provenance["argv"]
    assert provenance["git"]["commit"] and provenance["wall_time_s"] > 0
    assert headlines({k: v for k, v in default.items() if k != "headlines"}) == default["headlines"]


def test_quick_and_default_agree_in_direction_on_every_headline_both_support(quick, default):
    q = {h["name"]: h for h in quick["headlines"]}
    d = {h["name"]: h for h in default["headlines"]}
    assert set(q) == set(d)  # the same experiment: the same headlines
    both = [name for name in q if q[name]["supported"] and d[name]["supported"]]
    assert both, "no headline is supported by both profiles"
    disagree = {name: (q[name]["direction"], d[name]["direction"]) for name in both
                if q[name]["direction"] != d[name]["direction"]}
    assert not disagree, f"quick and default point different ways: {disagree}"


def test_every_unsupported_headline_says_why_in_words(quick, default):
    for run in (quick, default):
        for h in run["headlines"]:
            assert h["supported"] == (h["why_not"] is None)
            if not h["supported"]:
                assert isinstance(h["why_not"], str) and len(h["why_not"].split()) >= 4, h
                assert h["direction"] is None
            else:
                assert h["sentence"] and h["direction"] is not None
