"""The commands about one model: `forma hooks` (its hook points and their shapes), `forma trust` (how far to
trust its numbers) and `forma train` (a zoo model built from its recipe, resumable)."""

import argparse
import sys


def cmd_hooks(args: argparse.Namespace) -> int:
    """Print every hook point of a model with the shape it carries for a one-sequence input."""
    import torch

    from lab.load import load_model

    model = load_model(args.model)
    if args.tokens < 1:
        raise ValueError(f"--tokens must be at least 1, got {args.tokens}")
    tokens = torch.zeros(1, args.tokens, dtype=torch.long)  # longer than n_ctx: the model's own error
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda name: True)  # per-head results too
    for name in model.hook_dict:
        print(f"{name:40s} {list(cache[name].shape)}")
    return 0


def cmd_trust(args: argparse.Namespace) -> int:
    """Check how far to trust a model's numbers; write trust.json beside it. Exit 1 if a check fails."""
    from lab.trust import run_trust, summary_lines

    report, path = run_trust(args.model)
    print("\n".join(summary_lines(report)))
    print(f"wrote {path}")
    return 0 if report["passed"] else 1


def cmd_train(args: argparse.Namespace) -> int:
    """Train a zoo model from models/NAME/model.toml into models/NAME/. The previous model stays in place
    until the new one is complete; an interrupted build (Ctrl-C, SIGTERM, a crash) continues with --resume."""
    import signal

    from lab.folders import zoo_dir
    from lab.progress import PROGRESS_FILE, recording
    from lab.train import TrainingInterrupted
    from lab.zoo import build

    again = f"forma train {args.name}{' --quick' if args.quick else ''} --resume"

    def stop(signum: int, frame: object) -> None:
        raise TrainingInterrupted(signum)

    # SIGTERM stops like Ctrl-C wherever it lands; in the training loop `train` handles both itself,
    # finishing the step and writing a checkpoint first.
    before = signal.signal(signal.SIGTERM, stop)
    job = f"forma train {args.name}{' --quick' if args.quick else ''}"
    progress_file = zoo_dir() / args.name / PROGRESS_FILE  # what the dashboard and `forma demo` read
    try:
        with recording(progress_file, job):  # the training bar itself says where it is (unless --no-progress)
            directory = build(args.name, quick=args.quick, progress=not args.no_progress, resume=args.resume)
        progress_file.unlink(missing_ok=True)
    except TrainingInterrupted as interrupted:
        print(f"forma train: {interrupted}; continue with `{again}`", file=sys.stderr)
        return 128 + interrupted.signum
    except KeyboardInterrupt:
        print(f"forma train: interrupted; continue with `{again}`", file=sys.stderr)
        return 128 + signal.SIGINT
    finally:
        signal.signal(signal.SIGTERM, before)
    print(f"trained {args.name} into {directory}")
    return 0
