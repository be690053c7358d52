"""The torchrun entry point: `python -m lab.train --demo-markov ...`, alone or under torchrun (DDP: gloo on CPU,
NCCL on CUDA), on the demo model and an order-1 Markov stream."""

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from lab.data.sources import MarkovSource
from lab.distributed import init_distributed
from lab.files import atomic_write
from lab.model.config import ModelConfig
from lab.model.transformer import HookedTransformer
from lab.train.batches import TokenStream
from lab.train.config import TrainConfig
from lab.train.loop import TrainingInterrupted, train

DEMO_MODEL = ModelConfig(d_vocab=16, d_model=32, n_layers=2, n_heads=2, n_ctx=64, tokenizer="markov-16")
DEMO_TRAIN = TrainConfig(
    steps=200, batch_size=16, seq_len=32, lr=3e-3, min_lr=3e-4, warmup_steps=20, eval_interval=50, eval_batches=4
)


def demo_markov(seed: int = 0) -> tuple[HookedTransformer, TokenStream]:
    """A tiny model and an order-1 Markov stream over 16 tokens (`MarkovSource(16, order=1, seed=0)`)."""
    source = MarkovSource(vocab_size=16, order=1, seed=0)
    data = TokenStream(
        torch.from_numpy(source.sample(256, 128, seed=1)), torch.from_numpy(source.sample(32, 128, seed=2))
    )
    return HookedTransformer(DEMO_MODEL, seed=seed), data


def _parser() -> argparse.ArgumentParser:
    """python -m lab.train's arguments: the run's folder and switches, and one flag per TrainConfig field."""
    parser = argparse.ArgumentParser(
        prog="python -m lab.train",
        description="The training loop: one process or many under torchrun (DDP), resumable to the bit.",
    )
    parser.add_argument(
        "--demo-markov",
        action="store_true",
        help="train the demo model on an order-1 Markov stream (zoo models: `forma build NAME`)",
    )
    parser.add_argument("--out", type=Path, required=True, help="run folder: checkpoint/, metrics.jsonl, the model")
    parser.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--save-rank-weights",
        action="store_true",
        help="each rank also writes its final weights to OUT/rank{r}.safetensors (DDP checks)",
    )
    for f in fields(TrainConfig):  # one flag per TrainConfig field, defaulting to the demo recipe
        parser.add_argument(
            f"--{f.name.replace('_', '-')}",
            type=type(f.default),
            default=getattr(DEMO_TRAIN, f.name),
            help=f"TrainConfig.{f.name}",
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.demo_markov:
        parser.error("choose the data: --demo-markov (zoo models train with `forma build NAME`)")
    try:
        cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
    except ValueError as err:
        parser.error(str(err))

    rank, world = init_distributed(cfg.device)
    try:
        model, data = demo_markov()
        try:
            result = train(model, cfg, data, args.out, resume=args.resume, progress=not args.no_progress)
        except TrainingInterrupted as stop:
            if rank == 0:
                print(f"python -m lab.train: {stop}; continue with the same command and --resume", file=sys.stderr)
            return 128 + stop.signum
        except (ValueError, FileNotFoundError, FloatingPointError) as err:
            print(f"python -m lab.train: error: {err}", file=sys.stderr)
            return 1 if isinstance(err, FloatingPointError) else 2
        if rank == 0:
            model.save(args.out)
            print(
                json.dumps(
                    {
                        "step": result.step,
                        "train_loss_nats": result.train_loss_nats,
                        "best_val_loss_nats": result.best_val_loss_nats,
                        "world_size": world,
                    }
                )
            )
        if args.save_rank_weights:
            state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
            atomic_write(args.out / f"rank{rank}.safetensors", lambda path: save_file(state, str(path)))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0
