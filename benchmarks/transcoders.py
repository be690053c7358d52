"""Transcoders on the pydoc zoo model (4 layers, d_model 128, SwiGLU MLPs of 384): per-layer top-k, ReLU and
JumpReLU transcoders and a cross-layer ReLU transcoder, 1,024 features a layer, trained out of core on one harvest of
the model's training windows (every position of `--windows` windows of 64 tokens: each layer's ln2.hook_normalized
and hook_mlp_out), measured on held-out windows: per layer FVU, L0 and dead share, and the replacement's loss (every
MLP replaced) as a share of the gap to zero-ablation. The transcoders stay in models/pydoc/transcoders/KIND (what the
graph benchmark and the dashboard read). Writes benchmarks/results/transcoders.json.

    python -m benchmarks.transcoders [--kinds topk relu jumprelu clt] [--steps 1500] [--windows 1024]
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.summary import write_summary
from benchmarks.timing import RESULTS, machine, write
from lab.folders import is_trained, zoo_dir
from lab.zoo.transcoders import PRESETS, build_transcoders, harvest_windows, load_quality, preset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="pydoc")
    parser.add_argument("--kinds", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--windows", type=int, default=1024)
    parser.add_argument("--features", type=int, default=1024)
    args = parser.parse_args()
    torch.manual_seed(0)
    folder = zoo_dir() / args.model
    if not is_trained(args.model):
        raise SystemExit(f"benchmarks.transcoders needs a trained {args.model}: run `forma build {args.model}` first")
    path = RESULTS / "transcoders.json"
    previous = json.loads(path.read_text()) if path.is_file() else {}
    if previous.get("model") != args.model:
        previous = {}
    # Kinds run apart keep the others' figures (each kind records its own harvest size and training).
    results = {"machine": machine(), "model": args.model, "kinds": previous.get("kinds", {})}
    with tempfile.TemporaryDirectory() as work:
        base, _ = preset("topk", folder, args.features)
        start = time.perf_counter()
        train = harvest_windows(folder, base.hooks(), Path(work) / "train", n_windows=args.windows, window=64)
        held_out = harvest_windows(
            folder, base.hooks(), Path(work) / "held-out", n_windows=128, window=64, split="val", seed=1
        )
        results["harvest_s"] = time.perf_counter() - start
        results["train_rows"], results["held_out_rows"] = len(train[0]), len(held_out[0])
        for kind in args.kinds:
            cfg, training = preset(kind, folder, args.features, args.steps)
            start = time.perf_counter()
            out = build_transcoders(folder, cfg, training, kind, train=train, held_out=held_out)
            quality = load_quality(out)
            quality["train_s"] = time.perf_counter() - start
            quality["harvest_s"], quality["train_rows"] = results["harvest_s"], results["train_rows"]
            results["kinds"][kind] = quality
            print(
                kind,
                json.dumps({k: quality["held_out"][k] for k in ("fvu", "l0", "dead")}),
                quality["loss"],
                flush=True,
            )
            write("transcoders", results)
    write_summary()


if __name__ == "__main__":
    main()
