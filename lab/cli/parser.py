"""The `forma` command line's parser: its argument types, the subcommands (each in its own module of lab.cli)
and `main`, which turns a ValueError, FileNotFoundError or KeyError into one line and exit 2. Only the
standard library and lab's light modules are imported here: `--help` and an argument error answer without
torch (tests/test_cli.py)."""

import argparse
import sys

import lab
from lab.cli.children import Stopped
from lab.cli.dashboard import cmd_dashboard
from lab.cli.demo import cmd_demo
from lab.cli.models import cmd_hooks, cmd_train, cmd_trust
from lab.cli.runs import cmd_cards, cmd_run


def port_number(text: str) -> int:
    """argparse type: a TCP port, 1 … 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 1 … 65535, got {port}")
    return port


MAX_SEED = 2**63 - 1  # torch.manual_seed takes < 2**64 and experiments add small offsets; numpy takes any size


def seed_number(text: str) -> int:
    """argparse type: a seed, 0 … 2**63 − 1 (what every generator an experiment seeds can take, with room for
    the small offsets experiments add to derive their streams)."""
    try:
        seed = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 0 <= seed <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"seed must be 0 … 2**63 − 1 = {MAX_SEED}, got {seed}")
    return seed


def worker_count(text: str) -> int:
    """argparse type: a number of worker processes, ≥ 1."""
    try:
        workers = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if workers < 1:
        raise argparse.ArgumentTypeError(f"workers must be ≥ 1, got {workers}")
    return workers


def model_name(text: str) -> str:
    """argparse type: a zoo name or a folder; an empty one would be read as the current folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the model name is empty: give a zoo name (forma train --help lists "
                                         "them) or a model folder")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="forma", description=lab.__doc__)
    parser.add_argument("--version", action="version", version=f"forma {lab.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    hooks = sub.add_parser("hooks", help="list a model's hook points and their shapes",
                           description=cmd_hooks.__doc__)
    hooks.add_argument("model", type=model_name, help="zoo name, Forma model folder, or local Hugging Face folder")
    hooks.add_argument("--tokens", type=int, default=8, help="length of the probe sequence, 1 … n_ctx (default 8)")
    hooks.set_defaults(func=cmd_hooks)

    trust = sub.add_parser("trust", help="check a model against HF, its own fast paths and bfloat16",
                           description=cmd_trust.__doc__)
    trust.add_argument("model", type=model_name, help="zoo name, Forma model folder, or local Hugging Face folder")
    trust.set_defaults(func=cmd_trust)

    from lab.folders import zoo_names

    train = sub.add_parser("train", help="train a zoo model into models/NAME/", description=cmd_train.__doc__)
    train.add_argument("name", choices=zoo_names(), metavar="NAME", help=f"zoo model: {', '.join(zoo_names())}")
    train.add_argument("--quick", action="store_true", help="the recipe's small profile (tests, smoke runs)")
    train.add_argument("--resume", action="store_true", help="continue from models/NAME/train/checkpoint")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.set_defaults(func=cmd_train)

    import experiments

    run = sub.add_parser("run", help="run an experiment into runs/NAME/<timestamp>/ and print its headlines",
                         description=cmd_run.__doc__)
    run.add_argument("name", choices=experiments.experiment_names(), metavar="NAME",
                     help=f"experiment: {', '.join(experiments.experiment_names()) or 'none yet'}")
    run.add_argument("--quick", action="store_true", help="the small profile (≤ 90 s on 2 cores): tests and the demo")
    run.add_argument("--out", help="run folder (default runs/NAME/<UTC timestamp>/)")
    run.add_argument("--seed", type=seed_number, help="random seed, 0 … 2**63 − 1 (default: the experiment's)")
    run.add_argument("--workers", type=worker_count, help="processes that share an experiment's independent "
                     "trainings, for experiments that have them (default 2); results do not depend on it")
    run.add_argument("--model", type=model_name, help="zoo name or local model folder, for experiments that take one")
    run.add_argument("--mmlu", metavar="FILE", help="an MMLU-layout CSV (question, A, B, C, D, answer), for "
                                                     "experiments that take one (calibration, with --model)")
    run.add_argument("--qa", metavar="FILE", help="a question–answer CSV (question, answer), for experiments that "
                                                  "take one (monitor, with --model)")
    run.set_defaults(func=cmd_run)

    cards = sub.add_parser("cards", help="record cards and runs into docs/measured/, rewrite the documents' numbers",
                           description=cmd_cards.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cards.add_argument("--model", action="append", default=[], metavar="NAME",
                       help="record models/NAME/card.json (trained with the default recipe); repeatable")
    cards.add_argument("--run", action="append", default=[], metavar="DIR|NAME",
                       help="record a finished default-profile run folder, or NAME's latest run; repeatable")
    cards.add_argument("--check", action="store_true",
                       help="record and rewrite nothing; report every mismatch (exit 1 if any)")
    cards.set_defaults(func=cmd_cards)

    dashboard = sub.add_parser("dashboard", help="serve the dashboard on 127.0.0.1", description=cmd_dashboard.__doc__)
    dashboard.add_argument("--port", type=port_number, default=8501, help="port (default 8501)")
    dashboard.set_defaults(func=cmd_dashboard)

    demo = sub.add_parser("demo", help="train missing models, run quick experiments, open the dashboard",
                          description=cmd_demo.__doc__)
    demo.add_argument("--quick", action="store_true", help="train missing zoo models with their quick profile")
    demo.add_argument("--no-dashboard", action="store_true", help="stop before serving the dashboard")
    demo.add_argument("--port", type=port_number, default=8501, help="dashboard port (default 8501)")
    demo.add_argument("--only", action="append", default=[], metavar="NAME",
                      help="make only this demo model or experiment (if missing); repeatable")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, KeyError) as err:
        print(f"forma {args.command}: error: {err}", file=sys.stderr)
        return 2
    except FloatingPointError as err:  # a diverging run: the message says where, and what to change
        print(f"forma {args.command}: error: {err}", file=sys.stderr)
        return 1
    except Stopped as stop:  # its children have ended; exit as a shell reports a process ended by a signal
        return 128 + stop.signum
