"""benchmarks/summary.py renders every committed results file: a section per benchmark, its numbers read from
the file (a renamed field fails here, not in the middle of `make bench`)."""

import json

import pytest

from benchmarks import summary


@pytest.mark.parametrize("name, render, title", [
    ("walltime", summary.walltime_lines, "## Wall time"),
    ("dashboard", summary.dashboard_lines, "## Dashboard response"),
    ("demo", summary.demo_lines, "## Demo start"),
    ("cli", summary.cli_lines, "## Command-line start"),
    ("patching", summary.patching_lines, "## Patching sweeps"),
    ("harvest", summary.harvest_lines, "## Activation harvesting"),
    ("real_sizes", summary.real_sizes_lines, "## Real sizes"),
])
def test_each_results_file_renders_its_section(name, render, title):
    results = json.loads((summary.RESULTS / f"{name}.json").read_text())
    lines = render(results)
    assert lines[0].startswith(title)
    assert any(line.startswith("| ") for line in lines)  # a table of what was measured


def test_the_patching_section_shows_each_sweeps_measured_ratio():
    results = json.loads((summary.RESULTS / "patching.json").read_text())
    text = "\n".join(summary.patching_lines(results))
    for name, row in results["sweeps"].items():
        assert f"| {name} |" in text and f"{row['ratio_vs_tl_bridge']:.3f}×" in text
