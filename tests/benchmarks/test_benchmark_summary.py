"""benchmarks/summary.py renders every committed results file: a section per benchmark, its numbers read from
the file (a renamed field fails here, not in the middle of `make bench`)."""

import json

import pytest

from benchmarks import summary


@pytest.mark.parametrize(
    "name, render, title",
    [
        ("walltime", summary.walltime_lines, "## Wall time"),
        ("dashboard", summary.dashboard_lines, "## Dashboard response"),
        ("demo", summary.demo_lines, "## Demo start"),
        ("cli", summary.cli_lines, "## Command-line start"),
        ("patching", summary.patching_lines, "## Patching sweeps"),
        ("harvest", summary.harvest_lines, "## Activation harvesting"),
        ("real_sizes", summary.real_sizes_lines, "## Real sizes"),
        ("real_model", summary.real_model_lines, "## The real model"),
        ("tuned_lens", summary.tuned_lens_lines, "## Tuned lens against tuned-lens"),
        ("tuned_lens_smollm2", summary.tuned_lens_smollm2_lines, "## Tuned lens against tuned-lens on smollm2"),
    ],
)
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
        assert f"{row['ratio_vs_tl_forma']:.3f}×" in text  # TransformerLens's function on Forma's own model


def test_the_real_sizes_section_shows_each_measured_ratio_and_never_a_utilisation_above_one():
    results = json.loads((summary.RESULTS / "real_sizes.json").read_text())
    text = "\n".join(summary.real_sizes_lines(results))
    for name, shape in results["shapes"].items():
        assert f"| {name} | forward | " in text and f"{shape['forward']['ratio_vs_hf_sdpa']:.3f}×" in text
        assert f"{shape['generation']['speed_vs_hf']:.3f}×" in text
    impossible = json.loads(json.dumps(results))
    first = next(iter(impossible["shapes"].values()))
    first["forward"]["utilisation"] = 2.08  # products alone read while the machine was slower than in the forward
    text = "\n".join(summary.real_sizes_lines(impossible))
    assert "2.08" not in text and "not shown: the products alone were measured slower" in text
    name = next(iter(impossible["shapes"]))
    for floor, said in ((0.95, True), (0.85, False)):  # the forward's own matrix products against HF's forward
        first["forward"]["products_vs_hf_sdpa"] = floor
        (line,) = [line for line in summary.real_sizes_lines(impossible) if line.startswith(f"{name}: the forward's")]
        assert f"{floor:.3f}× HF's forward, the lowest ratio" in line
        assert ("above the forward target (≤ 0.9×): no forward made of these products meets it" in line) is said
    for floor, said in ((0.95, True), (0.5, False)):  # Forma's own forward against the bridge's cache(all)
        first["run_with_cache"]["forward_vs_bridge_cache_all"] = floor
        text = "\n".join(summary.real_sizes_lines(impossible))
        assert (f"caching nothing, takes {floor:.3f}× the bridge's run_with_cache(all)" in text) is said


def test_the_harvest_section_shows_the_ratio_against_saelens_store():
    """harvest_saelens.json (SAELens' ActivationsStore, measured in the SAE environment) is a row of the harvest
    section, with its ratio and the agreement of the activations, as the file holds them."""
    results, saelens = (
        json.loads((summary.RESULTS / f"{name}.json").read_text()) for name in ("harvest", "harvest_saelens")
    )
    text = "\n".join(summary.harvest_lines(results, saelens))
    row = next(line for line in text.splitlines() if "SAELens' ActivationsStore" in line)
    assert f"| {saelens['throughput_vs_saelens_tl']:.2f}× |" in row
    assert f"{saelens['max_abs_diff_vs_forma']['saelens_store_tl']:.1e} (TransformerLens)" in text
    assert "SAELens" not in "\n".join(summary.harvest_lines(results))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_summary_of_a_device_shows_that_devices_harvest_beside_saelens(device, tmp_path, monkeypatch):
    """write_summary(device) reads <name>.json on the CPU and <name>_<device>.json elsewhere (what gpu.sh's
    runs write), the harvest section with its SAELens row either way."""
    suffix = "" if device == "cpu" else f"_{device}"
    for name in ("harvest", "harvest_saelens"):
        (tmp_path / f"{name}{suffix}.json").write_text((summary.RESULTS / f"{name}.json").read_text())
    monkeypatch.setattr(summary, "RESULTS", tmp_path)
    text = summary.write_summary(device).read_text()
    assert "## Activation harvesting" in text and "SAELens' ActivationsStore" in text
    assert (tmp_path / f"summary{suffix}.md").is_file()


def test_the_patching_section_reports_the_zoo_agreement_or_says_there_was_no_zoo_model():
    results = json.loads((summary.RESULTS / "patching.json").read_text())
    text = "\n".join(summary.patching_lines(results))
    for name, row in results["zoo"].items():
        assert f"On the zoo's {name} " in text
        assert all(f"{sweep} {a['pearson_r']:.3f}" in text for sweep, a in row["agreement"].items())
    bare = dict(results, zoo={})
    assert "No trained decoder-only zoo model" in "\n".join(summary.patching_lines(bare))


def test_the_graphs_section_shows_the_transcoders_graphs_and_circuit_tracer_beside():
    results = json.loads((summary.RESULTS / "graphs.json").read_text())
    transcoders = json.loads((summary.RESULTS / "transcoders.json").read_text())
    peer = json.loads((summary.RESULTS / "graphs_circuit_tracer.json").read_text())
    lines = summary.graphs_lines(results, transcoders, peer)
    text = "\n".join(lines)
    assert lines[0].startswith("## Attribution graphs")
    for kind, quality in transcoders["kinds"].items():
        assert f"| {kind} | {quality['held_out']['fvu'][0]:.3f} " in text
    for row in results["scale"]:
        assert f"| {row['n_pos']} | {row['n_features']:,} | " in text
    for row in peer["rows"]:
        assert f"| {row['n_pos']} | {row['forma']['seconds']:.2f} | {row['circuit_tracer']['seconds']:.2f} |" in text
    for world, mechanism in results["mechanisms"].items():
        assert f"Known mechanism, {world}: {mechanism['mean']:.0%}" in text


def test_the_wall_time_section_names_the_real_model_profiles_their_target_and_memory():
    """benchmarks/walltime.py --profiles real-quick real-default: each row says the command a user types, the
    quick profile's 5-minute target and the run's peak memory."""
    entry = {"process_s": 61.0, "commit": "0123456789abcdef", "load_average_1min_at_start": 0.5, "peak_rss_gb": 2.5}
    results = {
        "machine": {"utc": "2026-12-05T10:00:00Z"},
        "load_average_at_start": [0.5, 0.5, 0.5],
        "experiments": {"kl": {"real-quick": entry, "real-default": entry | {"process_s": 900.0}}},
    }
    text = "\n".join(summary.walltime_lines(results))
    assert "| `forma run kl --model smollm2 --quick` | 61 | ≤ 300 | commit 0123456789, load 0.5, peak 2.50 GB |" in text
    assert "| `forma run kl --model smollm2` | 900 | — |" in text


def test_the_wall_time_section_states_the_demo_at_rest_and_under_load_with_the_load():
    demo = {"until_dashboard_serves_s": 20.0, "demo_reported_ready_s": 291.0, "commit": "0123456789"}
    loaded = demo | {"demo_reported_ready_s": 700.0, "load_average_1min_mean": 6.25, "busy_processes": 4}
    results = {
        "machine": {"utc": "2026-12-05T10:00:00Z"},
        "load_average_at_start": [0.5, 0.5, 0.5],
        "demo_after_install": demo,
        "demo_under_load": loaded,
    }
    text = "\n".join(summary.walltime_lines(results))
    assert "| `make demo` after install at rest, until every page is filled in | 291 |" in text
    assert "under load (load 6.2 on average, 4 processes spinning), until the dashboard serves | 20 |" in text
    assert "| `make demo` after install under load, until every page is filled in | 700 |" in text


def test_the_real_size_section_shows_each_ratio_against_circuit_tracer_and_saelens():
    """The smollm2 files (summary.SMOLLM2_PEERS): per prompt length Forma's time and memory over circuit-tracer's and
    the features both kept (or that circuit-tracer did not finish), and the tokens/s ratios against SAELens' store
    and trainer; a file not there leaves its rows out."""
    paths = [summary.RESULTS / f"{name}.json" for name in summary.SMOLLM2_PEERS]
    graphs, harvest, training = (json.loads(path.read_text()) if path.is_file() else None for path in paths)
    assert harvest and training
    text = "\n".join(summary.smollm2_peers_lines(graphs, harvest, training))
    assert f"| {harvest['throughput_vs_saelens_tl']:.2f}× |" in text
    assert f"| {training['throughput_ratio_forma_over_saelens']:.2f}× |" in text
    alone = "\n".join(summary.smollm2_peers_lines(None, harvest, None))
    assert "circuit-tracer" not in alone and f"| {harvest['throughput_vs_saelens_tl']:.2f}× |" in alone
    if graphs is None:
        return
    unfinished = graphs["circuit_tracer_unfinished"]
    assert [row["n_pos"] for row in graphs["rows"] + unfinished] == [16, 64, 256]
    for row in graphs["rows"]:
        assert f"| {row['time_ratio_forma_over_ct']:.2f}× |" in text
        assert f"| {row['memory_ratio_forma_over_ct']:.2f}× |" in text
        assert f"| {row['agreement']['shared_features']} of " in text
    for row in unfinished:
        assert f"| {row['n_pos']} | {row['forma']['seconds']:.1f} | not finished (return code " in text
