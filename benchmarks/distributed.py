"""Scaling past one process: a harvest (`forma harvest`'s call, lab.analysis.activations.harvest.harvest), a
patching sweep over prompt pairs (`forma patch`'s, lab.analysis.sweeps.sweep_pairs) and transcoder training
(`forma transcoders`', lab.analysis.transcoders.train.train_transcoders, data- and module-parallel) on 1 and on 2
ranks under torchrun, one intra-op thread a rank.

    harvest         tokens/s: every position of one hook (the last block's resid_post) of a random-token corpus,
                    into shards on disk, at a small GPT-like shape (SHAPE)
    sweep           pairs/s: the resid_pre and head sweeps of random clean/corrupted pairs
    train_data      tokens/s: top-k transcoders (TRANSCODERS) of every layer of SHAPE trained on a harvest of its
                    MLPs' inputs and outputs (made once, before the launches), TRAIN_STEPS steps of TRAIN_BATCH rows
                    (a row a token); data-parallel: every rank every layer on half of each batch
    train_modules   the same, module-parallel: each rank half of the layers on whole batches

Each timed call is one torchrun launch of this module's worker (--worker), which builds the model and the data,
meets the other ranks at a barrier, runs the call, and meets them again: the time between the barriers is the
job's (its slowest rank's), without process start-up and model loading (nor the modules torch imports on first
use: torch.optim's first optimizer imports torch._dynamo, which the worker imports before the barrier, as a process
that trains more than once pays it once); the launch's wall time, start-up included, is recorded beside it. Rounds
alternate 1 and 2 ranks; medians. scaling = 2-rank rate / 1-rank rate, target ≥ 1.8. The load average is
recorded: on a machine whose cores other work shares, 2 ranks cannot have 2 cores.

--device cuda: each rank on a GPU of its own (NCCL); with fewer than 2 GPUs the 2-rank runs are skipped, and the
file says so. Writes benchmarks/results/distributed.json (distributed_cuda.json on a GPU).

    python -m benchmarks.distributed [--rounds 5] [--sequences 384] [--pairs 32] [--device cpu] [--quick]

With --device cuda the training is not timed (the transcoder trainer runs on the CPU only), and the file says so.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHAPE = {"d_vocab": 4096, "d_model": 256, "n_layers": 4, "n_heads": 4, "n_ctx": 128}
SEQ_LEN, BATCH, PAIR_LEN = 128, 16, 16
HOOK = f"blocks.{SHAPE['n_layers'] - 1}.hook_resid_post"
SWEEPS = ("resid_pre", "head")
TRANSCODERS = {
    "d_model": SHAPE["d_model"],
    "n_layers": SHAPE["n_layers"],
    "d_features": 1024,
    "activation": "topk",
    "k": 32,
}
TRAIN_STEPS, TRAIN_BATCH, TRAIN_SEQUENCES = 10, 4096, 64  # batches of tokens as SAE trainers take them
TARGET = 1.8
KINDS = ("harvest", "sweep", "train_data", "train_modules")


def worker(args: argparse.Namespace) -> None:
    """One rank of a timed launch: build, barrier, the call, barrier; rank 0 writes the seconds to args.result."""
    import torch
    import torch.distributed as dist

    from lab import HookedTransformer, ModelConfig
    from lab.analysis.activations.harvest import harvest
    from lab.analysis.sweeps import PromptPair, sweep_pairs
    from lab.distributed import close_distributed, init_distributed

    torch.set_num_threads(1)
    rank, world = init_distributed(args.device)
    device = f"cuda:{torch.cuda.current_device()}" if args.device == "cuda" else "cpu"
    model = HookedTransformer(ModelConfig(**SHAPE), seed=0).to(device).eval()
    generator = torch.Generator().manual_seed(1)
    if args.worker.startswith("train_"):
        import torch._dynamo  # noqa: F401 (start-up: torch.optim's first optimizer imports it, once a process)

        from lab.analysis.transcoders.model import TranscoderConfig
        from lab.analysis.transcoders.train import TranscoderTraining, train_transcoders

        training = TranscoderTraining(steps=TRAIN_STEPS, batch_size=TRAIN_BATCH, lr=1e-3)

        def call() -> None:
            train_transcoders(
                args.harvest,
                TranscoderConfig(**TRANSCODERS),
                training,
                args.out,
                parallel=args.worker.removeprefix("train_"),
            )
    elif args.worker == "harvest":
        corpus = torch.randint(0, SHAPE["d_vocab"], (args.sequences, SEQ_LEN), generator=generator)

        def call() -> None:
            harvest(model, corpus, HOOK, args.out, batch_size=BATCH, progress=False)
    else:
        clean = torch.randint(0, SHAPE["d_vocab"], (args.pairs, PAIR_LEN), generator=generator)
        corrupted = clean.clone()
        corrupted[:, -3] = (clean[:, -3] + 1) % SHAPE["d_vocab"]
        answers = torch.randint(0, SHAPE["d_vocab"], (args.pairs, 2), generator=generator)
        pairs = [PromptPair(c, k, int(a), int(w)) for c, k, (a, w) in zip(clean, corrupted, answers)]

        def call() -> None:
            sweep_pairs(model, pairs, SWEEPS, args.out, progress=False)

    if world > 1:
        dist.barrier()
    start = time.perf_counter()
    call()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    if world > 1:
        dist.barrier()
    seconds = time.perf_counter() - start
    if rank == 0:
        Path(args.result).write_text(json.dumps({"seconds": seconds, "world": world}))
    close_distributed()


def transcoder_harvest(directory: Path) -> None:
    """What the training launches train on: every position of TRAIN_SEQUENCES random sequences of SHAPE's model,
    at each layer's MLP input and output."""
    import torch

    from lab import HookedTransformer, ModelConfig
    from lab.analysis.activations.store import save_activations
    from lab.analysis.transcoders.model import TranscoderConfig

    model = HookedTransformer(ModelConfig(**SHAPE), seed=0).eval()
    tokens = torch.randint(0, SHAPE["d_vocab"], (TRAIN_SEQUENCES, SEQ_LEN), generator=torch.Generator().manual_seed(2))
    save_activations(
        model,
        tokens,
        TranscoderConfig(**TRANSCODERS).hooks(),
        directory,
        positions="all",
        batch_size=BATCH,
        shard_mb=8,
        progress=False,
    )


def launch(kind: str, ranks: int, args: argparse.Namespace, scratch: Path) -> dict:
    """One torchrun launch of the worker: {"seconds" (between the barriers), "wall_s" (the launch)}."""
    out, result = scratch / f"{kind}-{ranks}", scratch / f"{kind}-{ranks}.json"
    shutil.rmtree(out, ignore_errors=True)
    env = os.environ | {
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={ranks}",
        "-m",
        "benchmarks.distributed",
        "--worker",
        kind,
        "--out",
        str(out),
        "--result",
        str(result),
        "--device",
        args.device,
        "--sequences",
        str(args.sequences),
        "--pairs",
        str(args.pairs),
        "--harvest",
        str(scratch / "transcoder-harvest"),
    ]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{kind} on {ranks} ranks failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return {"seconds": json.loads(result.read_text())["seconds"], "wall_s": wall}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sequences", type=int, default=384, help=f"harvested sequences of {SEQ_LEN} tokens")
    parser.add_argument("--pairs", type=int, default=32, help=f"swept pairs of {PAIR_LEN} tokens")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--quick", action="store_true", help="one round at small sizes (a smoke run)")
    parser.add_argument("--worker", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--harvest", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return {}
    if args.quick:
        args.rounds, args.sequences, args.pairs = 1, 32, 8

    import torch

    from benchmarks.summary import write_summary
    from benchmarks.timing import result_name, write

    ranks = [1, 2]
    skipped = None
    if args.device == "cuda" and torch.cuda.device_count() < 2:
        ranks, skipped = [1], f"2 ranks need 2 GPUs; this machine has {torch.cuda.device_count()}"
    kinds = KINDS if args.device == "cpu" else ("harvest", "sweep")
    times = timed_rounds(kinds, ranks, args)
    work = {
        "harvest": ("tokens", args.sequences * SEQ_LEN),
        "sweep": ("pairs", args.pairs),
        "train_data": ("tokens", TRAIN_STEPS * TRAIN_BATCH),
        "train_modules": ("tokens", TRAIN_STEPS * TRAIN_BATCH),
    }
    results = settings(args, skipped, trained="train_data" in kinds)
    for kind in kinds:
        results[kind] = scaling_section(times[kind], *work[kind])
    path = write(result_name("distributed", args.device), results)
    print(json.dumps({kind: results[kind]["scaling"] for kind in kinds}), f"-> {path}")
    write_summary(args.device)
    return results


def timed_rounds(kinds: Sequence[str], ranks: list[int], args: argparse.Namespace) -> dict[str, dict[int, list]]:
    """args.rounds rounds of a launch of each kind on each world size (alternating which goes first):
    {kind: {ranks: [launch(...) of each round]}}."""
    times: dict[str, dict[int, list[dict]]] = {kind: {k: [] for k in ranks} for kind in kinds}
    with tempfile.TemporaryDirectory(prefix="forma-distributed-") as scratch:
        if "train_data" in kinds:
            transcoder_harvest(Path(scratch) / "transcoder-harvest")
        for round_ in range(args.rounds):
            for kind in times:
                order = ranks if round_ % 2 == 0 else ranks[::-1]  # neither world size always goes first
                for k in order:
                    times[kind][k].append(launch(kind, k, args, Path(scratch)))
                    print(
                        f"round {round_ + 1}/{args.rounds} {kind} on {k} rank(s): "
                        f"{times[kind][k][-1]['seconds']:.2f} s",
                        flush=True,
                    )
    return times


def settings(args: argparse.Namespace, skipped: str | None, trained: bool) -> dict:
    """What the file records besides the times: the machine, the shapes and sizes, the target."""
    from benchmarks.timing import machine

    return {
        "machine": machine() | {"threads_per_rank": 1},
        "device": args.device,
        "rounds": args.rounds,
        "shape": SHAPE
        | {
            "seq_len": SEQ_LEN,
            "batch_size": BATCH,
            "hook": HOOK,
            "pair_len": PAIR_LEN,
            "sweeps": list(SWEEPS),
            "transcoders": TRANSCODERS,
            "train_steps": TRAIN_STEPS,
            "train_batch": TRAIN_BATCH,
            "train_rows": TRAIN_SEQUENCES * SEQ_LEN,
        },
        "target_scaling": TARGET,
        "skipped": skipped,
        "training_skipped": None if trained else "the transcoder trainer runs on the CPU only",
    }


def scaling_section(times: dict[int, list[dict]], unit: str, amount: int) -> dict:
    """One kind's medians per world size, its rate, and the scaling (2-rank rate / 1-rank rate; None without 2)."""
    section: dict = {unit: amount}
    for k, launches in times.items():
        seconds = statistics.median(t["seconds"] for t in launches)
        section[f"ranks_{k}"] = {
            "seconds": seconds,
            f"{unit}_per_s": amount / seconds,
            "wall_s": statistics.median(t["wall_s"] for t in launches),
            "seconds_each": [t["seconds"] for t in launches],
        }
    paired = 2 in times
    section["scaling"] = section["ranks_2"][f"{unit}_per_s"] / section["ranks_1"][f"{unit}_per_s"] if paired else None
    # Each round's own ratio (its two launches ran back to back): how much a round's load moved it.
    section["scaling_each_round"] = (
        [one["seconds"] / two["seconds"] for one, two in zip(times[1], times[2])] if paired else None
    )
    return section


if __name__ == "__main__":
    main()
