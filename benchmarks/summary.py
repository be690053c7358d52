"""benchmarks/results/summary.md (and summary_<device>.md) from whatever results exist: the peer
benchmarks (peers.json), the forward benchmark (forward.json), the wall times (walltime.json), the dashboard's response
times (dashboard.json),
the command line's start (cli.json), a training step's thread-invariant kernels (determinism.json), the real sizes,
patching sweeps and harvesting (real_sizes.json, patching.json, harvest.json with harvest_saelens.json,
distributed.json); off the CPU, the last four's <name>_<device>.json; and the peers at real size, on smollm2
(SMOLLM2_PEERS: graphs_circuit_tracer_smollm2.json, harvest_saelens_smollm2.json, transcoders_saelens_smollm2.json)
and the tuned lens beside tuned-lens's on smollm2 (tuned_lens_smollm2.json).
Every benchmark script calls `write_summary()` when it finishes, so the summary always shows the latest
measurement of each."""

import json
from pathlib import Path
from typing import Any

from benchmarks.real_sizes import summary_lines as real_sizes_lines
from benchmarks.timing import RESULTS


def _read(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def peers_lines(results: dict[str, Any]) -> list[str]:
    f, c, g, tr = results["forward"], results["run_with_cache"], results["generation"], results["training"]
    rows = [
        ("forward 4×256 vs HF sdpa", f["4x256"]["ratio_vs_hf_sdpa"], "≤ 1.0×"),
        ("forward 8×512 vs HF sdpa", f["8x512"]["ratio_vs_hf_sdpa"], "≤ 1.0×"),
        ("forward 4×256 vs HF eager", f["4x256"]["ratio_vs_hf_eager"], "—"),
        ("forward 8×512 vs HF eager", f["8x512"]["ratio_vs_hf_eager"], "—"),
        ("run_with_cache(all) vs bridge", c["cache_all_vs_bridge"], "≤ 0.7×"),
        ("run_with_cache(one resid_post) vs bridge", c["cache_one_vs_bridge"], "—"),
        ("run_with_cache(all) vs own forward", c["cache_all_vs_own_forward"], "≤ 1.15×"),
        ("generation speed vs HF (greedy)", g["greedy_speed_vs_hf"], "≥ 1.0×"),
        ("generation speed vs HF (sampling, top_k=0)", g["sample_speed_vs_hf"], "≥ 1.0×"),
        ("training step vs HF", tr["step_vs_hf"], "≤ 1.0×"),
        ("forward 8×512: share in its matrix products (run alone)", f["8x512"]["utilisation"], "≥ 0.40"),
    ]
    lines = [
        f"{results['machine']['utc']} · torch {results['machine']['torch']} · {results['machine']['threads']} threads "
        "· "
        f"batch {results['shape']['batch']} × {results['shape']['tokens']} tokens · medians of "
        f"{results['shape']['rounds']} "
        "interleaved rounds",
        "",
        "| measure | value | target |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {value:.3f} | {target} |" for name, value, target in rows]
    lines += [
        "",
        f"Cache bytes (all hooks): Forma {c['cache_all_bytes']['forma'] / 1e6:.1f} MB, bridge "
        f"{c['cache_all_bytes']['bridge'] / 1e6:.1f} MB.",
        "Generation tokens/s: " + ", ".join(f"{k} {v:.1f}" for k, v in g["tokens_per_s"].items()) + ".",
    ]
    return lines


def forward_lines(results: dict[str, Any]) -> list[str]:
    shape = results["shape"]
    lines = [
        f"## Forward and cache at {shape['layers']}×{shape['d_model']}, batch {shape['batch']} × {shape['tokens']} "
        "tokens "
        "(benchmarks/forward.py)",
        "",
        f"{results['machine']['utc']} · medians of {results['timing']['forma_forward']['rounds']} interleaved rounds",
        "",
        "| measure | value | target |",
        "|---|---|---|",
    ]
    names = {
        "forward_vs_hf_sdpa": "forward vs HF sdpa",
        "cache_all_vs_bridge": "run_with_cache(all) vs bridge",
        "cache_all_vs_own_forward": "run_with_cache(all) vs own forward",
    }
    lines += [f"| {names.get(k, k)} | {v:.3f} | ≤ {results['targets'][k]}× |" for k, v in results["ratios"].items()]
    return lines


def real_model_lines(r: dict[str, Any]) -> list[str]:
    """real_model.json's section: Forma on the real model (smollm2) against transformers and the bridge, each row
    Forma's median, the peer's, their ratio, the goal and the peak resident memory of one call of each; then where
    the time of each missed goal goes (its profile's top entries)."""
    m, goals = r["machine"], r["goals"]
    lines = [
        f"## The real model, {r['model']} (benchmarks/real_model.py{', --quick' if r.get('quick') else ''})",
        "",
        f"{m['utc']} · torch {m['torch']} · {m['threads']} threads · load average "
        f"{m['load_average_1_5_15'][0]:.2f} at the start, {r['load_average_at_end'][0]:.2f} at the end · medians of "
        f"{r['rounds']} interleaved rounds after {r['warmup']} warm-up"
        + ("" if r["complete"] else " · stopped part-way: what it measured"),
        "",
        "| measure | Forma s | peer s | ratio | goal | peak MB Forma / peer |",
        "|---|---|---|---|---|---|",
    ]
    for measure, where, ours, theirs, peer, ratio_key, goal in _real_model_rows(r):
        part = r[where[0]][where[1]] if isinstance(where, tuple) else r.get(where)
        if part is None:
            continue
        t, memory = part["timing"], part["peak_memory_bytes"]
        mb = " / ".join("—" if memory[k] is None else f"{memory[k] / 2**20:.0f}" for k in (ours, theirs))
        target = "—" if goal is None else f"≤ {goals[goal]} s (Forma)" if goal == "load_s" else f"≤ {goals[goal]}×"
        lines.append(
            f"| {measure} | {t[ours]['median_s']:.3f} | {t[theirs]['median_s']:.3f} ({peer}) | "
            f"{part[ratio_key]:.3f}× | {target} | {mb} |"
        )
    return lines + _real_model_notes(r)


def _real_model_rows(r: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The table's rows, one per measure and peer: (measure, where in real_model.json — a key, or (section, key) —,
    Forma's timing key, the peer's, the peer's name, the ratio's key, the goal's key or None)."""
    rows = [("load", "load", "forma_load_model", "hf_from_pretrained", "from_pretrained", "ratio_vs_hf", "load_s")]
    rows.append(
        (
            "load",
            "load",
            "forma_load_model",
            "hf_from_pretrained_and_tokenizer",
            "from_pretrained + tokenizer",
            "ratio_vs_hf_and_tokenizer",
            None,
        )
    )
    for key in r.get("forward", {}):
        rows += [
            (f"forward {key}", ("forward", key), "forma", "hf_sdpa", "sdpa", "ratio_vs_hf_sdpa", "forward_vs_hf_sdpa"),
            (f"forward {key}", ("forward", key), "forma", "hf_eager", "eager", "ratio_vs_hf_eager", None),
        ]
    rows += [
        (
            "run_with_cache(all)",
            "run_with_cache",
            "forma_cache_all",
            "bridge_cache_all",
            "bridge",
            "cache_all_vs_bridge",
            "cache_all_vs_bridge",
        ),
        (
            "its floor: Forma's forward, nothing cached",
            "run_with_cache",
            "forma_forward",
            "bridge_cache_all",
            "bridge cache(all)",
            "forward_vs_bridge_cache_all",
            None,
        ),
        (
            "generate (greedy, KV cache)",
            "generate",
            "forma_generate",
            "hf_generate",
            "HF generate",
            "ratio_vs_hf",
            "generate_vs_hf",
        ),
    ]
    return rows


def _real_model_notes(r: dict[str, Any]) -> list[str]:
    """Under the table: what the caches held, whether the greedy tokens agree, and each missed goal's profile."""
    lines = [""]
    if "run_with_cache" in r:
        held = r["run_with_cache"]["cache_all"]
        lines.append(
            "Caches (every hook, "
            f"{r['run_with_cache']['batch']} × {r['run_with_cache']['tokens']} tokens): "
            + ", ".join(f"{who} {h['hooks']} hooks, {h['bytes'] / 2**20:.0f} MB" for who, h in held.items())
            + "."
        )
    if "generate" in r:
        g = r["generate"]
        lines.append(
            f"Generate: {g['new_tokens']} new tokens after a {g['prompt_tokens']}-token prompt; "
            + ", ".join(f"{k} {v:.1f} tokens/s" for k, v in g["tokens_per_s"].items())
            + f"; the same tokens as transformers: {g['same_tokens_as_hf']}."
        )
    profiles = dict(r.get("profile") or {})
    layout = profiles.pop("weight_layout", None)
    for goal, profile in profiles.items():
        forma = next(v for k, v in profile.items() if k.startswith("forma"))
        top = forma.get("own_s") or {k: v for k, v in forma.items() if k != "total"}  # cProfile's, or torch's ops
        unit = "s" if "own_s" in forma else "ms"
        lines.append(
            f"Goal missed, {goal}: Forma's time goes to "
            + ", ".join(f"{name} {value:.3g} {unit}" for name, value in list(top.items())[:4])
            + " (top entries; the whole profile is in the file)."
        )
    for product, row in (layout or {}).items():
        ms = row["median_ms"]
        lines.append(
            f"Weight layout, {product} {' × '.join(map(str, row['shape']))}: x·W with W as TransformerLens lays it out "
            f"{ms['in_out']:.3f} ms, as nn.Linear does {ms['out_in']:.3f} ms ({row['in_out_over_out_in']:.2f}×)."
        )
    return lines


# the wall-time targets of each profile of `forma run` (benchmarks/walltime.py PROFILES): the real-model tracks'
# quick profiles promise ≤ 5 minutes on 2 cores; their default profiles' times are stated, with no target
WALLTIME_TARGETS = {"quick": "≤ 90", "default": "≤ 600", "real-quick": "≤ 300", "real-default": "—"}


def walltime_lines(results: dict[str, Any]) -> list[str]:
    lines = [
        "## Wall time (one run each, fresh clone, idle machine)",
        "",
        f"{results['machine']['utc']} · commit {str(results.get('commit'))[:10]} · load average at start "
        f"{results['load_average_at_start'][0]:.2f}",
        "",
        "| what | seconds | target |",
        "|---|---|---|",
    ]
    if "clean_install_s" in results:
        lines.append(f"| clean install (`make venv`, no pip cache) | {results['clean_install_s']:.0f} | — |")
    for key, where in (("demo_after_install", "at rest"), ("demo_under_load", "under load")):
        demo = results.get(key)
        if not demo:
            continue
        load = (
            f" (load {demo['load_average_1min_mean']:.1f} on average, {demo['busy_processes']} processes spinning)"
            if "load_average_1min_mean" in demo
            else ""
        )
        lines += [
            f"| `make demo` after install {where}{load}, until the dashboard serves | "
            f"{demo['until_dashboard_serves_s']:.0f} | ≤ 480 |",
            f"| `make demo` after install {where}, until every page is filled in | "
            f"{demo['demo_reported_ready_s']:.0f} | — |",
        ]
    rows = []
    for name, profiles in sorted((results.get("experiments") or {}).items()):
        for profile, target in WALLTIME_TARGETS.items():
            if profile in profiles:
                entry = profiles[profile]
                measured_at = (
                    f"commit {entry['commit'][:10]}, load {entry['load_average_1min_at_start']:.1f}"
                    if "commit" in entry
                    else "the commit above"
                )
                flags = {
                    "quick": " --quick",
                    "real-quick": " --model smollm2 --quick",
                    "real-default": " --model smollm2",
                }
                memory = f", peak {entry['peak_rss_gb']:.2f} GB" if "peak_rss_gb" in entry else ""
                rows.append(
                    f"| `forma run {name}{flags.get(profile, '')}` | "
                    f"{entry['process_s']:.0f} | {target} | {measured_at}{memory} |"
                )
    if rows:
        lines += ["", "| experiment | seconds | target | measured at |", "|---|---|---|---|", *rows]
    return lines


def dashboard_lines(results: dict[str, Any]) -> list[str]:
    lines = [
        "## Dashboard response (real browser, after warm-up)",
        "",
        f"{results['machine']['utc']} · median of {results['rounds']} loads per page",
        "",
        "| page | seconds | target |",
        "|---|---|---|",
    ]
    lines += [f"| {page} | {row['median_s']:.2f} | ≤ 3 |" for page, row in results["pages"].items()]
    lines += [f"| {name} | {row['median_s']:.2f} | ≤ 3 |" for name, row in results.get("interactions", {}).items()]
    return lines


def cli_lines(results: dict[str, Any]) -> list[str]:
    lines = [
        "## Command-line start (a fresh process each; benchmarks/cli.py)",
        "",
        f"{results['machine']['utc']} · medians of {next(iter(results['timing'].values()))['rounds']} "
        f"interleaved rounds · load average at the end {results['machine']['load_average_1_5_15'][0]:.2f}",
        "",
        "| command | seconds | target |",
        "|---|---|---|",
    ]
    target = f"< {results['target_s']:g}"
    lines += [
        f"| {row['command']} | {row['median_s']:.2f} | {'—' if name.startswith('peer') else target} |"
        for name, row in results["timing"].items()
    ]
    return lines


def demo_lines(results: dict[str, Any]) -> list[str]:
    timing = results["timing"]
    lines = [
        f"## Demo start (`{results['command']}`; benchmarks/demo.py)",
        "",
        f"{results['machine']['utc']} · medians of {timing['first_page']['rounds']} starts · load average at the "
        f"start {results['machine']['load_average_1_5_15'][0]:.2f}",
        "",
        "| from `forma demo` start to | seconds | target |",
        "|---|---|---|",
    ]
    for key, what, target in (
        ("health", "the health check answers", "—"),
        ("first_page", "the first page drawn in Chromium", f"≤ {results['target_first_page_s']:g}"),
        ("first_progress", "the first progress on a page", "—"),
        ("first_step", "that progress counting steps", "—"),
    ):
        lines.append(f"| {what} | {timing[key]['median_s']:.1f} | {target} |")
    return lines


def determinism_lines(results: dict[str, Any]) -> list[str]:
    lines = [
        "## A training step with the thread-invariant kernels (benchmarks/determinism.py)",
        "",
        f"{results['machine']['utc']} · {results['machine']['threads']} threads · medians of "
        f"{next(iter(results['recipes'].values()))['timing']['invariant']['rounds']} interleaved rounds",
        "",
        "| recipe | batch × tokens | step (ms) | with the former kernels (ms) | ratio |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {name} | {r['batch']} × {r['seq_len']} | {r['step_s']['invariant'] * 1e3:.1f} | "
        f"{r['step_s']['former'] * 1e3:.1f} | {r['invariant_over_former']:.3f} |"
        for name, r in results["recipes"].items()
    ]
    return lines


def patching_lines(r: dict[str, Any]) -> list[str]:
    shape, attribution = r["shape"], r["attribution"]
    lines = [
        f"## Patching sweeps at {shape['layers']} layers × d_model {shape['d_model']}, vocab {shape['vocab']}, "
        f"{shape['tokens']} tokens (benchmarks/patching.py{', --quick' if shape.get('quick') else ''})",
        "",
        f"{r['machine']['utc']} · {shape['rounds']} round(s)",
        "",
        "| sweep | Forma s | TransformerLens on the bridge s | ratio | TransformerLens on Forma s | ratio | "
        "max abs diff | target |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {name} | {row['timing']['forma']['median_s']:.1f} | {row['timing']['tl_bridge']['median_s']:.1f} | "
        f"{row['ratio_vs_tl_bridge']:.3f}× | {row['timing']['tl_forma']['median_s']:.1f} | "
        f"{row['ratio_vs_tl_forma']:.3f}× | {max(row['max_abs_diff'], row['max_abs_diff_vs_tl_forma']):.1e} | "
        f"≤ 0.2×, ≤ 1e-5 |"
        for name, row in r["sweeps"].items()
    ]
    agreement = ", ".join(f"{name} {row['pearson_r']:.3f}" for name, row in attribution["agreement"].items())
    lines += [
        "",
        f"Attribution patching: {attribution['ratio_vs_sweeps']:.3f}× the time of the sweeps it estimates; "
        f"Pearson r against them: {agreement}.",
    ]
    zoo = r.get("zoo") or {}
    for name, row in zoo.items():
        built = {True: ", built with --quick", False: ""}.get(row.get("quick_build"), "")
        lines.append(
            f"On the zoo's {name} ({row['tokens']} tokens{built}): Pearson r "
            + ", ".join(f"{s} {a['pearson_r']:.3f}" for s, a in row["agreement"].items())
            + "; top-k overlap "
            + ", ".join(f"{s} {a['top_k_overlap']:.1f}" for s, a in row["agreement"].items())
            + "."
        )
    if not zoo:
        lines.append(
            "No trained decoder-only zoo model was there to compare on (`forma build NAME`, then "
            "`python -m benchmarks.patching --zoo-only`)."
        )
    return lines


def harvest_lines(r: dict[str, Any], saelens: dict[str, Any] | None = None) -> list[str]:
    """harvest.json's section; with harvest_saelens.json's results (`saelens`), its row against SAELens' store."""
    ratio, small, corpus = r["ratio"], r["memory_gpt2_small"], r["corpus"]
    shape = ratio["shape"]
    device = "" if r.get("device", "cpu") == "cpu" else f", --device {r['device']}"
    lines = [
        f"## Activation harvesting (benchmarks/harvest.py{device})",
        "",
        f"{r['machine']['utc']} · GPT-2-small shapes ({shape['n_layers']} layers × {shape['d_model']}, vocab "
        f"{shape['d_vocab']}), {ratio['tokens_per_round']} tokens a round, medians of {ratio['rounds']}",
        "",
        "| what | Forma | peer | ratio | target |",
        "|---|---|---|---|---|",
    ]
    for where in ("early", "middle"):
        lines.append(
            f"| harvest {ratio['hooks'][where]} to shards vs the bridge's run_with_cache (names_filter), "
            f"tokens/s | {ratio[f'forma_tokens_per_s_{where}']:.0f} | {ratio[f'bridge_tokens_per_s_{where}']:.0f} | "
            f"{ratio[f'throughput_vs_bridge_{where}']:.2f}× | ≥ 2× |"
        )
    if saelens:
        rate, v = saelens["tokens_per_s"], saelens["versions"]
        lines.append(
            f"| harvest {saelens['hook']} to shards vs SAELens' ActivationsStore on a TransformerLens "
            f"HookedTransformer (in memory; benchmarks/harvest_saelens.py), tokens/s | "
            f"{rate['forma_harvest']:.0f} | {rate['saelens_store_tl']:.0f} | "
            f"{saelens['throughput_vs_saelens_tl']:.2f}× | ≥ {saelens['target_throughput_vs_saelens']:g}× |"
        )
    for name, row in (("GPT-2 small", small), (f"{corpus['tokens']:,} tokens, {corpus['size']} model", corpus)):
        where = "gpu" if row.get("peak_measure") == "peak_gpu" else "rss"
        lines.append(
            f"| peak memory ({'GPU' if where == 'gpu' else 'resident'}) of a harvest ({name}) vs one batch's "
            f"run_with_cache, MB | {row[f'harvest_peak_{where}_mb']:.0f} | "
            f"{row[f'one_batch_run_with_cache_peak_{where}_mb']:.0f} | "
            f"{row['harvest_vs_one_batch']:.2f}× | ≤ {row['target_harvest_vs_one_batch']:g}× |"
        )
    lines += [
        "",
        f"Corpus harvest: {corpus['tokens']:,} tokens of {corpus['hook']} at {corpus['tokens_per_s']:.0f} "
        f"tokens/s into {corpus['shards']} shards ({corpus['gb_written']:.2f} GB).",
    ]
    if saelens:
        diff = saelens["max_abs_diff_vs_forma"]
        lines.append(
            f"Against SAELens (sae-lens {v['sae-lens']}, transformer-lens {v['transformer-lens']}; "
            f"{saelens['size']}, {saelens['tokens_per_round']:,} tokens a round, medians of "
            f"{saelens['rounds']}, {saelens['machine']['utc']}): the same store over Forma's model "
            f"{rate['saelens_store_forma']:.0f} tokens/s ({saelens['throughput_vs_saelens_forma']:.2f}×); "
            f"max |diff| of its rows from Forma's: {diff['saelens_store_tl']:.1e} (TransformerLens), "
            f"{diff['saelens_store_forma']:.1e} (Forma's model)."
        )
    return lines


def tuned_lens_lines(r: dict[str, Any]) -> list[str]:
    """Forma's tuned lens against the tuned-lens package's recipe on one model (benchmarks/tuned_lens.py)."""
    t, model = r["timing"], r["model"]
    setting = (
        f"{r['machine']['utc']} · {model['n_layers']} layers × d_model {model['d_model']} on the order-2 Markov "
        f"chain · fitted on {r['tokens']['fit_sequences']} sequences, judged on "
        f"{r['tokens']['held_out_sequences']} · medians of {t['forma']['rounds']} interleaved fits"
    )
    lines = [
        "## Tuned lens against tuned-lens (benchmarks/tuned_lens.py)",
        "",
        setting,
        "",
        "| layer | KL(P_θ ‖ lens), Forma | KL(P_θ ‖ lens), tuned-lens | logit lens |",
        "|---|---|---|---|",
    ]
    for i, layer in enumerate(r["layers"][:-1]):
        cells = [r["kl"][name]["kl_model"][i] for name in ("forma", "package", "logit_lens")]
        lines.append(f"| {layer} | " + " | ".join(f"{v:.4f} [{lo:.4f}, {hi:.4f}]" for v, lo, hi in cells) + " |")
    timing = (
        f"Fit time: Forma {t['forma']['median_s']:.2f} s, tuned-lens {t['package']['median_s']:.2f} s "
        f"({r['forma_faster_by']:.1f}× faster); Forma within the package's interval at every layer: "
        f"{r['forma_within_every_interval']}."
    )
    return [*lines, "", timing]


def tuned_lens_smollm2_lines(r: dict[str, Any]) -> list[str]:
    """Forma's tuned lens against the tuned-lens package's recipe on smollm2 over the real corpus, per layer
    (benchmarks/tuned_lens.py --model smollm2)."""
    sizes, fit = r["sizes"], r["fit_seconds"]
    setting = (
        f"{r['machine']['utc']} · both fitted on {sizes['fit_windows']} training windows of {sizes['length']} tokens "
        f"(Forma {sizes['forma_iterations']} L-BFGS iterations a layer, the package {sizes['package_steps']} steps of "
        f"{sizes['package_batch']} windows), judged on {sizes['held_out_windows']} held-out windows · "
        f"{r['layers_chosen']} · {r['threads']} thread, load {r['machine_at_start']['load_average_1_5_15'][0]:.1f}"
    )
    lines = [
        "## Tuned lens against tuned-lens on smollm2 (benchmarks/tuned_lens.py --model smollm2)",
        "",
        setting,
        "",
        "| layer | KL(P_θ ‖ lens), Forma | KL(P_θ ‖ lens), tuned-lens | logit lens | Forma ≤ tuned-lens's high |",
        "|---|---|---|---|---|",
    ]
    for row in r["layers"]:
        cells = [row["kl_model_nats"][name] for name in ("forma", "package", "logit_lens")]
        lines.append(
            f"| {row['readout']} | "
            + " | ".join(f"{v:.3f} [{lo:.3f}, {hi:.3f}]" for v, lo, hi in cells)
            + f" | {'yes' if row['forma_at_or_below_package_high'] else 'no'} |"
        )
    timing = (
        f"Fit time: Forma {fit['forma']:.0f} s, tuned-lens {fit['package']:.0f} s; Forma at or below the top of the "
        f"package's interval at every layer: {r['forma_at_or_below_package_high_at_every_layer']}."
    )
    return [*lines, "", timing]


def graphs_lines(
    r: dict[str, Any], transcoders: dict[str, Any] | None = None, peer: dict[str, Any] | None = None
) -> list[str]:
    """graphs.json's section (benchmarks/graphs.py), with transcoders.json's quality table and
    graphs_circuit_tracer.json's side-by-side rows when they exist."""
    lines = [
        "## Attribution graphs (benchmarks/graphs.py, benchmarks/transcoders.py)",
        "",
        f"{r['machine']['utc']} · {r['model']} with {r['transcoders']} transcoders",
    ]
    if transcoders:
        lines += _transcoder_quality(transcoders)
    if r.get("scale"):
        lines += [
            "",
            "| prompt tokens | active features | nodes | seconds | peak MB above the call's start |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {row['n_pos']} | {row['n_features']:,} | {row['n_nodes']:,} | {row['seconds']:.1f} | "
            f"{(row['peak_bytes'] or 0) / 2**20:.0f} |"
            for row in r["scale"]
        ]
    if r.get("prompts"):
        lines += [
            "",
            "| prompt | max node residual / max input | max replacement logit diff | ablation corr. (live) | "
            "sign agr. (live) | corr. (frozen) | sign agr. (frozen) | influence kept (nodes, edges) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for i, row in enumerate(r["prompts"]):
            live, frozen, pruning = row["ablation_live"], row["ablation_frozen"], row["pruning"]
            lines.append(
                f"| {i} ({row['n_pos']} tokens) | {row['max_node_residual'] / row['max_node_input']:.1e} | "
                f"{row['max_replacement_logit_difference']:.1e} | {live['correlation']:.2f} | "
                f"{live['sign_agreement']:.0%} | {frozen['correlation']:.2f} | "
                f"{frozen['sign_agreement']:.0%} | {pruning['node_share']:.0%}, {pruning['edge_share']:.0%} |"
            )
    for world, m in r.get("mechanisms", {}).items():
        lines.append(
            f"\nKnown mechanism, {world}: {m['mean']:.0%} of the tokens' path influence at {m['relevant']} "
            f"(chance {m['chance']:.0%}), mean of {len(m['share_per_prompt'])} prompts."
        )
    if peer:
        lines += _beside_circuit_tracer(peer)
    return lines


def _transcoder_quality(transcoders: dict[str, Any]) -> list[str]:
    """transcoders.json's table: each kind's held-out FVU, L0 and dead share by layer, and the loss recovered."""
    lines = [
        "",
        "| transcoders | FVU by layer | L0 by layer | dead by layer | loss recovered |",
        "|---|---|---|---|---|",
    ]
    for kind, q in transcoders["kinds"].items():
        held = q["held_out"]
        lines.append(
            f"| {kind} | {' '.join(f'{v:.3f}' for v in held['fvu'])} | "
            f"{' '.join(f'{v:.1f}' for v in held['l0'])} | "
            f"{' '.join(f'{v:.0%}' for v in held['dead'])} | {q['loss']['recovered']:.1%} |"
        )
    return lines


def _beside_circuit_tracer(peer: dict[str, Any]) -> list[str]:
    """graphs_circuit_tracer.json's rows: per prompt length, each side's time and peak, and their largest edge
    difference."""
    lines = [
        "",
        f"Beside circuit-tracer {peer['circuit_tracer']} ({peer['model']}; {peer['transcoders']}; "
        f"{peer['threads']} threads, {peer['machine']['utc']}):",
        "",
        "| tokens | Forma s | circuit-tracer s | Forma peak MB | circuit-tracer peak MB | max edge diff |",
        "|---|---|---|---|---|---|",
    ]
    return lines + [
        f"| {row['n_pos']} | {row['forma']['seconds']:.2f} | {row['circuit_tracer']['seconds']:.2f} | "
        f"{row['forma']['peak_bytes'] / 2**20:.0f} | {row['circuit_tracer']['peak_bytes'] / 2**20:.0f} | "
        f"{row['agreement']['max_abs_difference']:.1e} |"
        for row in peer["rows"]
    ]


SMOLLM2_PEERS = ("graphs_circuit_tracer_smollm2", "harvest_saelens_smollm2", "transcoders_saelens_smollm2")


def smollm2_peers_lines(
    graphs: dict[str, Any] | None, harvest: dict[str, Any] | None, training: dict[str, Any] | None
) -> list[str]:
    """The real-size section: Forma over circuit-tracer (time, peak memory) per prompt length, and tokens/s against
    SAELens' activation store and trainer, from whichever of the three files exist."""
    lines = ["## Peers at real size: smollm2", ""]
    if graphs:
        lines += [
            f"Attribution graphs beside circuit-tracer {graphs['circuit_tracer']} ({graphs['transcoders']}; "
            f"at most {graphs['max_feature_nodes']} feature nodes, {graphs['batch_size']} targets a backward pass; "
            f"{graphs['threads']} threads, load {graphs['machine']['load_average_1_5_15'][0]:.1f}, "
            f"{graphs['machine']['utc']}; benchmarks/graphs_circuit_tracer.py --model smollm2):",
            "",
            "| tokens | Forma s | circuit-tracer s | time ratio | Forma peak MB | circuit-tracer peak MB | "
            "memory ratio | features both kept | max shared edge diff |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for row in graphs["rows"]:
            a = row["agreement"]
            lines.append(
                f"| {row['n_pos']} | {row['forma']['seconds']:.1f} | {row['circuit_tracer']['seconds']:.1f} | "
                f"{row['time_ratio_forma_over_ct']:.2f}× | {row['forma']['peak_bytes'] / 2**20:.0f} | "
                f"{row['circuit_tracer']['peak_bytes'] / 2**20:.0f} | {row['memory_ratio_forma_over_ct']:.2f}× | "
                f"{a['shared_features']} of {a['forma_features']} / {a['ct_features']} | "
                f"{a['max_abs_difference']:.1e} |"
            )
        for row in graphs.get("circuit_tracer_unfinished", []):
            failed = row["circuit_tracer_failed"]
            lines.append(
                f"| {row['n_pos']} | {row['forma']['seconds']:.1f} | not finished (return code "
                f"{failed['returncode']}) | — | {row['forma']['peak_bytes'] / 2**20:.0f} | — | — | — | — |"
            )
        every = graphs.get("every_feature")
        if every:
            lines += [
                "",
                f"Every active feature ({every['forma']['n_features']:,}) at {every['n_pos']} tokens, no budget: the "
                f"shared edges differ by at most {every['agreement']['max_abs_difference']:.1e} (largest "
                f"{every['agreement']['scale']:.2f}); Forma {every['forma']['seconds']:.1f} s, circuit-tracer "
                f"{every['circuit_tracer']['seconds']:.1f} s.",
            ]
    lines += ["", "| what (tokens/s) | Forma | SAELens | ratio |", "|---|---|---|---|"][0 if graphs else 1 :]
    if harvest:
        rate = harvest["tokens_per_s"]
        lines.append(
            f"| harvest {harvest['hook']} to shards vs SAELens' ActivationsStore on TransformerLens "
            f"(benchmarks/harvest_saelens.py --size smollm2) | {rate['forma_harvest']:.0f} | "
            f"{rate['saelens_store_tl']:.0f} | {harvest['throughput_vs_saelens_tl']:.2f}× |"
        )
    if training:
        lines.append(
            f"| top-k autoencoder of {training['setting']['hook']}, harvest and training, vs SAELens' trainer "
            f"(benchmarks/transcoders_saelens.py --model smollm2) | {training['forma']['tokens_per_s']:.0f} | "
            f"{training['saelens']['tokens_per_s']:.0f} | {training['throughput_ratio_forma_over_saelens']:.2f}× |"
        )
    return lines


DISTRIBUTED = (
    ("harvest", "tokens", "harvest"),
    ("sweep", "pairs", "sweep"),
    ("train_data", "tokens", "transcoder training, data-parallel"),
    ("train_modules", "tokens", "transcoder training, module-parallel"),
)


def distributed_lines(r: dict[str, Any]) -> list[str]:
    """distributed.json's section: 2 ranks against 1, one thread a rank."""
    device = "" if r.get("device", "cpu") == "cpu" else f", --device {r['device']}"
    lines = [
        f"## Harvests, sweeps and transcoder training on 2 ranks against 1 (benchmarks/distributed.py{device})",
        "",
        f"{r['machine']['utc']} · one thread a rank · load average {r['machine']['load_average_1_5_15'][0]:.1f} "
        f"on {r['machine']['cpu_count']} cores · medians of {r['rounds']}",
        "",
        "| what | 1 rank | 2 ranks | scaling | target |",
        "|---|---|---|---|---|",
    ]
    kinds = [(kind, unit, what) for kind, unit, what in DISTRIBUTED if kind in r]
    for kind, unit, what in kinds:
        s = r[kind]
        two = s.get("ranks_2")
        lines.append(
            f"| {what}, {unit}/s | {s['ranks_1'][f'{unit}_per_s']:.1f} | "
            f"{'—' if two is None else format(two[f'{unit}_per_s'], '.1f')} | "
            f"{'—' if s['scaling'] is None else format(s['scaling'], '.2f') + '×'} | ≥ {r['target_scaling']:g}× |"
        )
    rounds = {kind: r[kind].get("scaling_each_round") for kind, _, _ in kinds}
    if all(rounds.values()):
        lines += [
            "",
            "Each round's own ratio (its two launches back to back): "
            + "; ".join(f"{kind} {', '.join(f'{x:.2f}' for x in each)}" for kind, each in rounds.items())
            + ".",
        ]
    if r.get("skipped"):
        lines += ["", f"2 ranks not run: {r['skipped']}."]
    if r.get("training_skipped"):
        lines += ["", f"Transcoder training not timed: {r['training_skipped']}."]
    return lines


def write_summary(device: str = "cpu") -> Path:
    suffix = "" if device == "cpu" else f"_{device}"
    lines = [f"# Forma benchmarks ({device})", ""]
    peers = _read(f"peers{suffix}")
    if peers and {"forward", "run_with_cache", "generation", "training"} <= set(peers):
        lines += peers_lines(peers)
    sections = (
        [
            ("forward", forward_lines),
            ("real_model", real_model_lines),
            ("walltime", walltime_lines),
            ("dashboard", dashboard_lines),
            ("demo", demo_lines),
            ("cli", cli_lines),
            ("determinism", determinism_lines),
            ("tuned_lens", tuned_lens_lines),
            ("tuned_lens_smollm2", tuned_lens_smollm2_lines),
        ]
        if device == "cpu"
        else []
    )
    sections += [
        ("real_sizes", real_sizes_lines),
        ("patching", patching_lines),
        ("harvest", lambda r: harvest_lines(r, _read(f"harvest_saelens{suffix}"))),
        ("distributed", distributed_lines),
    ]
    if device == "cpu":
        sections.append(("graphs", lambda r: graphs_lines(r, _read("transcoders"), _read("graphs_circuit_tracer"))))
    for name, render in sections:
        results = _read(name + suffix)
        if results:
            lines += ["", *render(results)]
    real_size = [_read(name) for name in SMOLLM2_PEERS]
    if device == "cpu" and any(real_size):
        lines += ["", *smollm2_peers_lines(*real_size)]
    path = RESULTS / f"summary{suffix}.md"
    path.write_text("\n".join(lines) + "\n")
    return path
