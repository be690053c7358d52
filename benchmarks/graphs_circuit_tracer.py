"""Forma's attribution graph beside circuit-tracer 0.5's, on the same weights and transcoders, against prompt length.

A GPT-2 of 4 layers, d_model 128, 4 heads, a vocabulary of 4,096 and n_ctx 128 (transformers, from a config), and
per-layer ReLU transcoders of 1,024 features whose encoder biases are set so that about 16 features a layer fire at
a position (the 98.5th percentile of each feature's pre-activation on random prompts), written by Forma in
circuit-tracer's format. circuit-tracer runs in its own environment (.venv-ct; tests/ct/circuit_tracer_side.py, a
subprocess), Forma here; both attribute the same prompts (position 0 circuit-tracer's special token) with 128
targets per backward pass, on this machine's default threads. Per prompt length: wall time and peak resident memory
above the start of the call, the number of active features, and the largest difference of the shared edges.
Writes benchmarks/results/graphs_circuit_tracer.json.

    make venv-ct && python -m benchmarks.graphs_circuit_tracer
"""

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
from lab.hf.convert import from_hf
from tests.ct.peer import compare, run_circuit_tracer, tiny_gpt2, transcoders_for

LENGTHS = (8, 16, 32, 64, 128)


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


def main() -> None:
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work)
        model = from_hf(tiny_gpt2(folder, layers=4, d_model=128, vocab=4096, n_ctx=128))
        transcoders = calibrated(model)
        transcoders.to_circuit_tracer(folder / "transcoders")
        generator = torch.Generator().manual_seed(9)
        prompts = [[0, *torch.randint(1, 4096, (n - 1,), generator=generator).tolist()] for n in LENGTHS]
        attribute(model, transcoders, prompts[0])  # warm up
        forma = []
        for prompt in prompts:
            holder = {}
            start = time.perf_counter()
            peak = peak_memory(
                lambda holder=holder, prompt=prompt: holder.setdefault("g", attribute(model, transcoders, prompt)),
                "cpu",
            )
            forma.append(
                {
                    "n_pos": len(prompt),
                    "seconds": time.perf_counter() - start,
                    "peak_bytes": peak,
                    "n_features": holder["g"].n_features,
                }
            )
            holder["g"].save(folder / f"forma-{len(prompt)}")
            print("forma", json.dumps(forma[-1]), flush=True)
        ct = run_circuit_tracer({folder: prompts}, batch_size=128, threads=threads)[folder]
        rows = []
        for i, prompt in enumerate(prompts):
            agreement = compare(
                Graph.load(folder / f"forma-{len(prompt)}"), load_file(str(folder / f"ct-{i}.safetensors"))
            )
            rows.append(
                {
                    "n_pos": len(prompt),
                    "forma": forma[i],
                    "circuit_tracer": ct["prompts"][i],
                    "time_ratio_forma_over_ct": forma[i]["seconds"] / ct["prompts"][i]["seconds"],
                    "memory_ratio_forma_over_ct": forma[i]["peak_bytes"] / max(1, ct["prompts"][i]["peak_bytes"]),
                    "agreement": agreement,
                }
            )
            print("row", json.dumps(rows[-1]), flush=True)
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


if __name__ == "__main__":
    main()
