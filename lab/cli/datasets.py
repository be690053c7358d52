"""The commands that run a model over a dataset, in one process or as the ranks of torchrun (`torchrun
--nproc-per-node K -m lab.cli COMMAND ...`), resumable by running the same command again: `forma harvest` (hook
activations over a corpus into shards and one index) and `forma patch` (patching sweeps over prompt pairs, one table
per sweep); `forma transcoders` (lab/cli/models.py) joins the group the same way. docs/distributed.md shows both on one
machine and on several."""

import argparse
import contextlib
import signal
from collections.abc import Iterator

# lab.analysis.sweeps.SWEEPS's names, here so that `forma patch --help` answers without importing torch
# (tests/lab/cli/test_cli_datasets.py holds the two equal).
SWEEP_NAMES = ("resid_pre", "attn_out", "mlp_out", "resid_post", "head", "head_pos")
# How long a rank that is done waits for the others at the end (the collective's timeout): a rank's share of the
# parts may take longer than another's by up to a part, and by what a rerun still had to do.
WAIT_S = 24 * 3600.0


@contextlib.contextmanager
def process_group(device: str) -> Iterator[tuple[int, int]]:
    """Join torchrun's process group (when there is one) for the body, as (rank, world size), and leave it whatever
    happens: together with the other ranks when the body returns (a rank that is done does not tear its connections
    down while another still works: rank 0 alone measures and writes), at once when it raises (torchrun then ends
    the others)."""
    from lab.distributed import barrier, close_distributed, init_distributed

    rank, world = init_distributed(device, timeout_s=WAIT_S)
    if world > 1:
        # torchrun's SIGTERM (another rank failed, or the job is being stopped) ends a rank at once, even one that
        # waits inside a collective, where no Python handler runs until it returns. Nothing is lost: every file is
        # written atomically, and the same command resumes.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    done = False
    try:
        yield rank, world
        done = True
    finally:
        if done:
            barrier()
        close_distributed()


def run_model_job(args: argparse.Namespace, job) -> int:
    """In torchrun's process group (`process_group`), load the model on this rank's device and call job(model,
    rank, world)."""
    import torch

    from lab.load import load_model

    with process_group(args.device) as (rank, world):
        device = f"cuda:{torch.cuda.current_device()}" if args.device == "cuda" else args.device
        return job(load_model(args.model, device).eval(), rank, world)


def cmd_harvest(args: argparse.Namespace) -> int:
    """Harvest hook activations over a corpus into safetensors shards and one index.json (read them with
    lab.analysis.activations.store.ActivationStore). Under torchrun each rank takes a share of the corpus's parts into
    their own shards; rank 0 merges the index at the end. Interrupted (any rank, any way), the same command
    continues where it stopped."""
    import torch

    from lab.analysis.activations.harvest import harvest, split_corpus

    def job(model, rank: int, world: int) -> int:
        corpus, left_over = split_corpus(args.corpus, model, seq_len=args.seq_len, tokens=args.tokens)
        store = harvest(
            model,
            corpus,
            args.hook,
            args.out,
            args.positions,
            batch_size=args.batch_size,
            dtype=None if args.dtype is None else getattr(torch, args.dtype),
            shard_mb=args.shard_mb,
            progress=not args.no_progress,
            overwrite=args.overwrite,
        )
        if store is not None:
            print(
                f"harvested {len(store):,} rows of {', '.join(store.names)} from {corpus.shape[0]:,} sequences of "
                f"{corpus.shape[1]} tokens into {args.out} ({world} rank{'s' if world > 1 else ''})"
                + (f"; {left_over:,} tokens left over, fewer than a sequence, not harvested" if left_over else "")
            )
        return 0

    return run_model_job(args, job)


def cmd_patch(args: argparse.Namespace) -> int:
    """Patching sweeps over a dataset of clean/corrupted prompt pairs (CSV or JSONL: clean, corrupted, answer,
    wrong), each pair swept alone with the logit difference at its last position as the metric; one table per
    sweep, [pair, layer, position] or [pair, layer, head] (read them with lab.analysis.sweeps.load_sweep). Under
    torchrun each rank sweeps a share of the pairs and rank 0 gathers the tables. Interrupted, the same command
    continues where it stopped."""
    from lab.analysis.sweeps import read_pairs, sweep_pairs

    def job(model, rank: int, world: int) -> int:
        pairs = read_pairs(args.pairs, model)
        tables = sweep_pairs(
            model,
            pairs,
            args.sweep,
            args.out,
            direction=args.direction,
            max_batch=args.max_batch,
            progress=not args.no_progress,
            overwrite=args.overwrite,
        )
        if tables is not None:
            for name, table in tables.items():
                print(
                    f"{name}: {list(table.values.shape)} into {args.out}/{name}.safetensors; mean logit "
                    f"difference clean {table.clean.mean():.4f}, corrupted {table.corrupted.mean():.4f}"
                )
            print(f"swept {len(pairs):,} pairs ({world} rank{'s' if world > 1 else ''})")
        return 0

    return run_model_job(args, job)
