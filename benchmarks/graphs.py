"""Attribution graphs on the zoo models, measured. Reads the transcoders `forma transcoders` (or
benchmarks/transcoders.py) left in models/NAME/transcoders/KIND and writes benchmarks/results/graphs.json:

    scale          pydoc (4 layers, d_model 128): graphs of one held-out text at each prompt length (8 … n_ctx = 128
                   tokens), --rounds of them (lengths interleaved): the median wall time and process CPU time (all
                   threads; wall ≫ CPU / threads means the machine's other load held the run back), the 1-minute
                   load average at each run, the largest peak resident memory above the start of the call
                   (benchmarks.timing's peak_memory), the number of active features and nodes, the replacement and
                   completeness scores, at the default chunk of 128 targets and this machine's default threads;
                   every active feature a node ("scale") and with a node budget of --max-feature-nodes
                   ("scale_budget": the features of largest activation × decoder norm kept, the rest in the error
                   nodes).
    exactness      per prompt: the largest |node input − (Σ incoming edges + bias)| against the largest input, and
                   the largest difference between the local replacement's logits and the model's.
    interventions  per prompt: the 10 features with the largest edges into the logits, each ablated in the full
                   model (MLPs always live) with nothing frozen ("live"), the attention patterns frozen, every norm's
                   scale frozen, the final norm's alone, and patterns and scales both ("frozen", the graph's own
                   assumptions), and each steered by 0.9 with nothing frozen (a small step: is it the ablation's
                   size?); Pearson correlation and sign agreement of the logit changes with the graph's total
                   effects, per prompt and their range over the prompts ("interventions").
    pruning        per prompt: nodes and edges kept at the paper's thresholds (0.8, 0.98), the shares of influence
                   they keep, the replacement and completeness scores.
    markov, facts  worlds whose relevant positions are known: the order-2 Markov zoo model (the last 2 tokens) and
                   the facts zoo model (the subject's two name tokens before "birthday"), each with top-k
                   transcoders trained here if it has none: the share of the tokens' path influence at the relevant
                   positions (lab.analysis.graphs.influence.position_share), per prompt, beside chance (k / n).

    python -m benchmarks.graphs [--phases scale scale_budget exactness interventions pruning markov facts]
                                [--kind topk] [--max-feature-nodes 1024]
"""

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from benchmarks.summary import write_summary
from benchmarks.timing import machine, peak_memory, write
from lab.analysis.graphs.attribute import attribute
from lab.analysis.graphs.checks import intervention_agreement, node_residuals, replacement_logits
from lab.analysis.graphs.influence import graph_scores, position_share, prune
from lab.analysis.transcoders.model import Transcoders
from lab.folders import is_trained, zoo_dir
from lab.load import load_model
from lab.zoo.transcoders import TRANSCODERS_DIR, build_transcoders, preset, transcoder_sets, world_windows

LENGTHS = (8, 16, 32, 64, 96, 128)
INTERVENTIONS = (  # (key, what is frozen, factor): 0 ablates, 0.9 steers by a small step
    ("ablation_live", (), 0.0),
    ("ablation_attention_frozen", ("attention",), 0.0),
    ("ablation_norms_frozen", ("norms",), 0.0),
    ("ablation_final_norm_frozen", ("final_norm",), 0.0),
    ("ablation_frozen", ("attention", "norms"), 0.0),
    ("steering_live", (), 0.9),
)
RESULTS_FILE = Path(__file__).resolve().parent / "results" / "graphs.json"  # phases run apart keep the others


def open_pair(name: str, kind: str) -> tuple:
    folder = zoo_dir() / name
    return load_model(folder).eval(), Transcoders.load(folder / TRANSCODERS_DIR / kind)


def scale(model, transcoders, prompts: torch.Tensor, rounds: int, budget: int | None = None) -> list[dict]:
    """Per prompt length: the median wall and CPU time of `rounds` graphs (the lengths interleaved, round by round,
    so that drift in the machine's load hits every length alike) and the largest peak."""
    lengths = [n for n in LENGTHS if n <= model.cfg.n_ctx]
    times: dict[int, list[float]] = {n: [] for n in lengths}
    cpu: dict[int, list[float]] = {n: [] for n in lengths}
    load: dict[int, list[float]] = {n: [] for n in lengths}
    peaks: dict[int, list[int]] = {n: [] for n in lengths}
    graphs = {}
    for _ in range(rounds):
        for length in lengths:
            holder = {}
            load[length].append(os.getloadavg()[0])
            start, start_cpu = time.perf_counter(), time.process_time()
            peak = peak_memory(
                lambda holder=holder, length=length: holder.setdefault(
                    "graph", attribute(model, transcoders, prompts[0, :length], max_feature_nodes=budget)
                ),
                "cpu",
            )
            times[length].append(time.perf_counter() - start)
            cpu[length].append(time.process_time() - start_cpu)
            peaks[length].append(peak or 0)
            graphs[length] = holder["graph"]
    rows = []
    for length in lengths:
        graph = graphs[length]
        rows.append(
            {
                "n_pos": length,
                "max_feature_nodes": budget,
                "seconds": statistics.median(times[length]),
                "seconds_all": times[length],
                "cpu_seconds": statistics.median(cpu[length]),
                "cpu_seconds_all": cpu[length],
                "load_average_1min_all": load[length],
                "peak_bytes": max(peaks[length]),
                "n_active_features": graph.meta["n_active_features"],
                "n_features": graph.n_features,
                "n_nodes": graph.n_nodes,
                "adjacency_bytes": graph.adjacency.numel() * 4,
                "max_node_residual": float(node_residuals(graph).abs().max()),
                **graph_scores(graph),
            }
        )
        print("scale", json.dumps(rows[-1]), flush=True)
    return rows


def per_prompt(model, transcoders, prompts: torch.Tensor, phases: list[str]) -> list[dict]:
    rows = []
    for prompt in prompts:
        graph = attribute(model, transcoders, prompt)
        row = {"n_pos": graph.n_pos, "n_features": graph.n_features, "seconds": graph.meta["seconds"]}
        if "exactness" in phases:
            residual = node_residuals(graph).abs().max()
            with torch.no_grad():
                logits = model(prompt[None])[0]
            row |= {
                "max_node_residual": float(residual),
                "max_node_input": float(graph.inputs.abs().max()),
                "max_replacement_logit_difference": float(
                    (replacement_logits(model, transcoders, prompt) - logits).abs().max()
                ),
            }
        if "interventions" in phases:
            for key, freeze, factor in INTERVENTIONS:
                result = intervention_agreement(model, transcoders, graph, top=10, factor=factor, freeze=freeze)
                row[key] = {
                    k: result[k]
                    for k in ("correlation", "sign_agreement", "pairs", "direct_correlation", "direct_sign_agreement")
                }
        if "pruning" in phases:
            pruned = prune(graph)
            row["pruning"] = {
                "nodes_kept": int(pruned.node_mask.sum()),
                "edges_kept": int(pruned.edge_mask.sum()),
                "node_share": pruned.node_share,
                "edge_share": pruned.edge_share,
                **graph_scores(graph),
            }
        rows.append(row)
        print("prompt", json.dumps(row), flush=True)
    return rows


def ensure_transcoders(name: str, features: int, steps: int) -> None:
    folder = zoo_dir() / name
    if "topk" not in transcoder_sets(folder):
        cfg, training = preset("topk", folder, features, steps)
        build_transcoders(folder, cfg, training, "topk", n_windows=512, eval_windows=64)


def markov(n_prompts: int) -> dict:
    from lab.zoo.worlds import world_source

    ensure_transcoders("markov", 512, 800)
    model, transcoders = open_pair("markov", "topk")
    source = world_source(zoo_dir() / "markov")
    prompts = torch.from_numpy(source.sample(n_prompts, 16, seed=123)).long()
    shares = [position_share(attribute(model, transcoders, p), [-2, -1]) for p in prompts]
    out = {
        "relevant": "the last 2 positions (order 2)",
        "n_pos": 16,
        "chance": 2 / 16,
        "share_per_prompt": shares,
        "mean": statistics.fmean(shares),
    }
    print("markov", json.dumps(out), flush=True)
    return out


def facts(n_prompts: int) -> dict:
    ensure_transcoders("facts", 512, 800)
    model, transcoders = open_pair("facts", "topk")
    shares, lengths = [], []
    for document in facts_prompts(n_prompts):
        graph = attribute(model, transcoders, model.to_tokens(document)[0])
        shares.append(position_share(graph, [1, 2]))  # "<bos> First Last birthday": the name is at 1 and 2
        lengths.append(graph.n_pos)
    out = {
        "relevant": "the subject's name (positions 1 and 2 of '<bos> First Last birthday')",
        "n_pos": lengths[0],
        "chance": 2 / lengths[0],
        "share_per_prompt": shares,
        "mean": statistics.fmean(shares),
    }
    print("facts", json.dumps(out), flush=True)
    return out


def facts_prompts(n: int) -> list[str]:
    """'<bos> First Last birthday' of the first n distinct persons of the facts model's training documents (drawn by
    popularity: the persons the model saw most)."""
    from lab.data.facts import FactWorld, FactWorldConfig

    spec = json.loads((zoo_dir() / "facts" / "recipe.json").read_text())["world"]
    world = FactWorld(
        FactWorldConfig.from_dict({k: v for k, v in spec.items() if k not in ("kind", "form", "n_heldout")})
    )
    prompts = []
    for document in world.documents(form="bare", seed=world.cfg.seed):
        prompt = "<bos> " + " ".join(document.split()[:3])
        if prompt not in prompts:
            prompts.append(prompt)
        if len(prompts) == n:
            break
    return prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--phases",
        nargs="+",
        default=["scale", "scale_budget", "exactness", "interventions", "pruning", "markov", "facts"],
    )
    parser.add_argument("--max-feature-nodes", type=int, default=1024, help="the node budget of scale_budget")
    parser.add_argument("--kind", default="topk")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="graphs per prompt length (median time)")
    args = parser.parse_args()
    needed = ["pydoc"] + [world for world in ("markov", "facts") if world in args.phases]
    missing = [name for name in needed if not is_trained(name)]
    if missing:
        raise SystemExit(
            f"benchmarks.graphs needs trained zoo models: run `forma build {missing[0]}` "
            f"({', '.join(missing)} missing) and `python -m benchmarks.transcoders` first"
        )
    previous = RESULTS_FILE.is_file() and json.loads(RESULTS_FILE.read_text())
    results = (previous or {}) | {"machine": machine(), "model": "pydoc", "transcoders": args.kind}
    model, transcoders = open_pair("pydoc", args.kind)
    prompts = world_windows(zoo_dir() / "pydoc", args.prompts, model.cfg.n_ctx, "val", seed=7)
    if "scale" in args.phases:
        results["scale"] = scale(model, transcoders, prompts, args.rounds)
        write("graphs", results)
    if "scale_budget" in args.phases:
        results["scale_budget"] = scale(model, transcoders, prompts, args.rounds, args.max_feature_nodes)
        write("graphs", results)
    if {"exactness", "interventions", "pruning"} & set(args.phases):
        results["prompts"] = per_prompt(model, transcoders, prompts[:, :32], args.phases)
        if "interventions" in args.phases:
            results["interventions"] = {
                key: {
                    f"{stat}_{how}": fn([row[key][stat] for row in results["prompts"]])
                    for stat in ("correlation", "sign_agreement")
                    for how, fn in (("min", min), ("max", max))
                }
                for key, _, _ in INTERVENTIONS
            }
        write("graphs", results)
    for world, measure in (("markov", markov), ("facts", facts)):
        if world in args.phases:
            results.setdefault("mechanisms", {})[world] = measure(args.prompts * 2)
            write("graphs", results)
    write_summary()


if __name__ == "__main__":
    main()
