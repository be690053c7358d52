"""What a run of the ported suite records, and the table made of it: conftest.py's hooks fill it as the tests run
(`record`, COLLECTED, COMPLETE), test_table.py reads it after them (`outcomes`, `complete`, `table`), and the
session's end writes the table (TABLE) when the run was `complete`."""

from pathlib import Path

import pytest

from tests.transformer_lens.expected import PORTED, UPSTREAM

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TABLE = REPO / "docs" / "measured" / "transformer_lens.json"
COMPLETE = pytest.StashKey[bool]()  # False once any ported test is deselected
COLLECTED: set[tuple[str, str, str]] = set()  # (file, implementation, test) of every ported test collected
_outcomes: dict[tuple[str, str, str], dict] = {}  # (file, implementation, test) -> how its phases went


def record(found: tuple[str, str, str], report) -> None:
    """One phase's report of the ported test `found` (file, implementation, test)."""
    entry = _outcomes.setdefault(found, {"call": False, "ok": True})
    if report.when == "call":
        entry["call"] = report.passed and not hasattr(report, "wasxfail")
    elif not report.passed:  # an error in setup or teardown, or a skip
        entry["ok"] = False


def outcomes() -> dict[tuple[str, str, str], bool]:
    """Whether each ported test that ran passed, on each implementation (an expected failure does not)."""
    return {key: entry["call"] and entry["ok"] for key, entry in _outcomes.items()}


def table(outcomes: dict) -> dict:
    """The table of a run: per ported file (by its name less .py) its upstream file and commit, its tests and how
    many pass on each implementation."""
    files: dict[str, dict] = {}
    for (file, impl, test), passed in sorted(outcomes.items()):
        row = files.setdefault(file.removesuffix(".py"), {  # no dot in a key: docs' markers read dotted paths
            "upstream": UPSTREAM[file][0], "commit": UPSTREAM[file][1], "tests": set(), "reference": 0, "forma": 0})
        row["tests"].add(test)
        row[impl] += int(bool(passed))
    for row in files.values():
        row["tests"] = len(row["tests"])
    totals = {key: sum(row[key] for row in files.values()) for key in ("tests", "reference", "forma")}
    return {"transformer_lens": "3.9.0", "files": files, "totals": totals, "files_ported": len(files)}


def complete(config) -> bool:
    """Whether this run ran every test of every ported file, on both implementations."""
    ran = set(_outcomes)
    return config.stash.get(COMPLETE, False) and ran == COLLECTED and {file for file, _, _ in ran} == set(PORTED)
