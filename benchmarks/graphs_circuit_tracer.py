"""Forma's attribution graph beside circuit-tracer 0.5's, on the same weights and transcoders, against prompt length.

A GPT-2 of 4 layers, d_model 128, 4 heads, a vocabulary of 4,096 and n_ctx 128 (transformers, from a config), and
per-layer ReLU transcoders of 1,024 features whose encoder biases are set so that about 16 features a layer fire at
a position (the 98.5th percentile of each feature's pre-activation on random prompts), written by Forma in
circuit-tracer's format. circuit-tracer runs in its own environment (.venv-ct; tests/ct/circuit_tracer_side.py, a
subprocess), Forma here; both attribute the same prompts (position 0 circuit-tracer's special token) with 128
targets per backward pass, on this machine's default threads. Per prompt length: wall time and peak resident memory
above the start of the call, the number of active features, and the largest difference of the shared edges.
Writes benchmarks/results/graphs_circuit_tracer.json.

--model smollm2: the same at real size, on the zoo's smollm2 (SmolLM2-135M-Instruct, 30 layers) with its trained
top-k transcoder set (`forma transcoders smollm2`: 1,024 features a layer, k = 16). circuit-tracer reads smollm2's
folder (a Llama in transformers' layout) through TransformerLens 3.2's HookedTransformerConfig and
convert_llama_weights, the top-k set as its TopK then ReLU (tests/ct/circuit_tracer_side.py). Prompts of 16, 64 and
256 tokens: smollm2's <|im_start|> then a held-out window of the real corpus (`forma corpus real`). Both keep at most
256 feature nodes (max_feature_nodes, as `forma graphs smollm2` does) with SMOLLM2_BATCH targets a backward pass,
and each side attributes the 16-token prompt once untimed first. Within a budget the two pick their features
differently (circuit-tracer by influence on the logits, dropping the rest; Forma by activation × decoder norm,
folding the rest into its error nodes), so the error nodes differ: the record holds how many features both kept
and the largest difference of the edges among the nodes both hold but the errors. A prompt circuit-tracer does
not finish (its process killed, say for memory) is recorded with Forma's figures and how circuit-tracer's side
ended. --every-feature adds the 16-token prompt with no budget (every active feature on both sides, thousands),
compared node for node as the tiny GPT-2's. Writes benchmarks/results/graphs_circuit_tracer_smollm2.json.

    make venv-ct && python -m benchmarks.graphs_circuit_tracer [--model smollm2 [--corpus DIR] [--every-feature]]
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from benchmarks.summary import write_summary
from benchmarks.timing import machine, peak_memory, write
from lab.analysis.graphs.attribute import attribute
from lab.analysis.graphs.graph import Graph
from lab.folders import zoo_model_dir
from lab.hf.convert import from_hf
from lab.zoo.transcoders import corpus_windows, open_set
from tests.ct.peer import (
    REPO,
    circuit_tracer_files,
    compare,
    compare_shared,
    run_circuit_tracer,
    tiny_gpt2,
    transcoders_for,
)

LENGTHS = (8, 16, 32, 64, 128)
SMOLLM2_LENGTHS = (16, 64, 256)
BUDGET = 256  # feature nodes, as `forma graphs smollm2` keeps
# targets a backward pass: circuit-tracer runs its forward on this many copies of the prompt and keeps them for the
# backward passes (at 256 tokens and 32 copies it passed 8 GB and was killed on a 23 GB machine shared with others)
SMOLLM2_BATCH = 16


def calibrated(model, d_features: int = 1024, active: int = 16):
    tc = transcoders_for(model, "relu", d_features)
    probe = torch.randint(1, model.cfg.d_vocab, (16, 64), generator=torch.Generator().manual_seed(5))
    hooks = tc.cfg.hooks()
    with torch.no_grad():
        _, cache = model.run_with_cache(probe, names_filter=hooks)
        for layer in range(tc.cfg.n_layers):
            pre = tc.encode(cache[tc.cfg.hook("input", layer)].reshape(-1, model.cfg.d_model), layer) - tc.b_enc[layer]
            tc.b_enc[layer] = -pre.quantile(1 - active / d_features, dim=0)
    return tc


def forma_timed(model, transcoders, prompt: list[int], folder: Path, **options) -> dict:
    """One graph of `prompt`: its seconds, peak resident bytes above the start and features; saved in folder."""
    holder = {}
    start = time.perf_counter()
    peak = peak_memory(
        lambda: holder.setdefault("g", attribute(model, transcoders, prompt, **options)),
        "cpu",
    )
    row = {
        "n_pos": len(prompt),
        "seconds": time.perf_counter() - start,
        "peak_bytes": peak,
        "n_features": holder["g"].n_features,
    }
    holder["g"].save(folder / f"forma-{len(prompt)}")
    print("forma", json.dumps(row), flush=True)
    return row


def ratio_row(folder: Path, i: int, forma: dict, ct: dict, agree) -> dict:
    """Prompt i's timings on both sides, their ratios and `agree`(Forma's graph, circuit-tracer's)."""
    agreement = agree(Graph.load(folder / f"forma-{forma['n_pos']}"), load_file(str(folder / f"ct-{i}.safetensors")))
    row = {
        "n_pos": forma["n_pos"],
        "forma": forma,
        "circuit_tracer": ct,
        "time_ratio_forma_over_ct": forma["seconds"] / ct["seconds"],
        "memory_ratio_forma_over_ct": forma["peak_bytes"] / max(1, ct["peak_bytes"]),
        "agreement": agreement,
    }
    print("row", json.dumps(row), flush=True)
    return row


def tiny() -> None:
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work)
        model = from_hf(tiny_gpt2(folder, layers=4, d_model=128, vocab=4096, n_ctx=128))
        transcoders = calibrated(model)
        transcoders.to_circuit_tracer(folder / "transcoders")
        generator = torch.Generator().manual_seed(9)
        prompts = [[0, *torch.randint(1, 4096, (n - 1,), generator=generator).tolist()] for n in LENGTHS]
        attribute(model, transcoders, prompts[0])  # warm up
        forma = [forma_timed(model, transcoders, prompt, folder) for prompt in prompts]
        ct = run_circuit_tracer({folder: prompts}, batch_size=128, threads=threads)[folder]
        rows = [ratio_row(folder, i, forma[i], ct["prompts"][i], compare) for i in range(len(prompts))]
    write(
        "graphs_circuit_tracer",
        {
            "machine": machine(),
            "threads": threads,
            "circuit_tracer": ct["circuit_tracer"],
            "model": "gpt2: 4 layers, d_model 128, 4 heads, vocab 4096, n_ctx 128",
            "transcoders": "per-layer ReLU, 1,024 features, ~16 active a layer and position",
            "rows": rows,
        },
    )
    write_summary()


def smollm2(corpus: Path, every_feature: bool = False) -> None:
    threads, load = torch.get_num_threads(), machine()["load_average_1_5_15"]
    hf = zoo_model_dir("smollm2")
    model, transcoders = open_set(hf, "topk", every_layer=True)
    bos = model.tokenizer.convert_tokens_to_ids("<|im_start|>")
    prompts = [[bos, *corpus_windows(corpus, 1, n - 1, split="val", seed=n)[0].tolist()] for n in SMOLLM2_LENGTHS]
    options = {"batch_size": SMOLLM2_BATCH, "max_feature_nodes": BUDGET}
    side = {"hf": str(hf), "n_ctx": 2 * max(SMOLLM2_LENGTHS), "timeout": 3600, "tolerate_failure": True}
    record = {
        "machine_at_start": {"load_average_1_5_15": load},
        "threads": threads,
        "model": "smollm2 (SmolLM2-135M-Instruct): 30 layers, d_model 576, 9 heads over 3 key/value heads",
        "transcoders": f"smollm2's topk set: per-layer top-k, {transcoders.cfg.d_features} features, "
        f"k = {transcoders.cfg.k}",
        "prompts": f"<|im_start|> then a held-out window of {corpus.name}",
        "max_feature_nodes": BUDGET,
        "batch_size": SMOLLM2_BATCH,
    }
    with tempfile.TemporaryDirectory(dir="/tmp") as work:
        budget, exact = Path(work) / "budget", Path(work) / "exact"
        side["k"] = circuit_tracer_files(transcoders, budget / "transcoders")
        attribute(model, transcoders, prompts[0], **options)  # warm up
        forma = [forma_timed(model, transcoders, prompt, budget, **options) for prompt in prompts]
        ct = run_circuit_tracer({budget: prompts}, threads=threads, warmup=True, **options, **side)[budget]
        done = ct["prompts"]
        record["circuit_tracer"] = ct["circuit_tracer"]
        record["rows"] = [ratio_row(budget, i, forma[i], done[i], compare_shared) for i in range(len(done))]
        # what circuit-tracer did not finish (its side killed, say for memory): Forma's figures and how it ended
        record["circuit_tracer_unfinished"] = [
            {"n_pos": f["n_pos"], "forma": f, "circuit_tracer_failed": ct["failed"]} for f in forma[len(done) :]
        ]
        if every_feature:
            circuit_tracer_files(transcoders, exact / "transcoders")
            forma_exact = forma_timed(model, transcoders, prompts[0], exact, batch_size=SMOLLM2_BATCH)
            ct_exact = run_circuit_tracer({exact: prompts[:1]}, threads=threads, batch_size=SMOLLM2_BATCH, **side)
            record["every_feature"] = ratio_row(exact, 0, forma_exact, ct_exact[exact]["prompts"][0], compare)
    write("graphs_circuit_tracer_smollm2", {"machine": machine(), **record})
    write_summary()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("gpt2", "smollm2"), default="gpt2", help="tiny GPT-2 or smollm2")
    parser.add_argument("--corpus", type=Path, default=REPO / "corpora" / "real", help="smollm2's real corpus")
    parser.add_argument(
        "--every-feature",
        action="store_true",
        help="smollm2: also the 16-token graph with no budget on both sides, compared node for node (slow: "
        "thousands of features)",
    )
    args = parser.parse_args(argv)
    if args.model == "smollm2":
        smollm2(args.corpus, args.every_feature)
    else:
        tiny()


if __name__ == "__main__":
    main()
