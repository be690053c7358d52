"""The `forma` command line's parser: its argument types, the subcommands (each in its own module of lab.cli)
and `main`, which turns a ValueError, KeyError or any OSError (FileNotFoundError, FileExistsError, a folder that cannot
be written) into one line and exit 2,
and a signal into one line and exit 128 + the signal. Only the standard library and lab's light modules are
imported here: `--help` and an argument error answer without torch (tests/lab/cli/test_cli.py)."""

import argparse
import difflib
import signal
import sys
from typing import Any

import lab
from lab.cli.corpus import CORPORA, DEFAULT_HELD_OUT, cmd_corpus
from lab.cli.dashboard import cmd_dashboard
from lab.cli.datasets import SWEEP_NAMES, cmd_harvest, cmd_patch
from lab.cli.demo import cmd_demo
from lab.cli.models import cmd_build, cmd_graphs, cmd_hooks, cmd_transcoders, cmd_trust
from lab.cli.questions import cmd_questions
from lab.cli.runs import cmd_cards, cmd_run
from lab.cli.stopping import Stopped, interrupting_signals

Commands = Any  # what ArgumentParser.add_subparsers returns: each _add_* builder adds one command to it


def port_number(text: str) -> int:
    """argparse type: a TCP port, 1 … 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 1 … 65535, got {port}")
    return port


# lab.zoo.transcoders.PRESETS' names, written here so that --help loads no torch (a test holds them equal)
TRANSCODER_KINDS = ("topk", "relu", "jumprelu", "clt")
GRAPH_MODELS = ("smollm2",)  # lab.zoo.graphs.KNOWN_MODELS, likewise
TRANSCODER_PARALLEL = ("data", "modules")  # lab.analysis.transcoders.train.PARALLEL, likewise
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


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def open_fraction(text: str) -> float:
    """argparse type: a number strictly between 0 and 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (exclusive), got {text}")
    return value


def worker_count(text: str) -> int:
    """argparse type: a number of worker processes, ≥ 1."""
    try:
        workers = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if workers < 1:
        raise argparse.ArgumentTypeError(f"workers must be ≥ 1, got {workers}")
    return workers


def positive_count(text: str) -> int:
    """argparse type: a count, ≥ 1."""
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"must be ≥ 1, got {count}")
    return count


def layer_list(text: str) -> list[int] | None:
    """argparse type: `all` (None) or layers separated by commas, each ≥ 0 (`0,1`)."""
    if text.strip() == "all":
        return None
    try:
        layers = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"`all` or layers separated by commas (0,1), not {text!r}") from None
    if min(layers) < 0:
        raise argparse.ArgumentTypeError(f"a layer is ≥ 0, got {min(layers)}")
    return layers


def model_name(text: str) -> str:
    """argparse type: a zoo name or a folder; an empty one would be read as the current folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "the model name is empty: give a zoo name (forma build --help lists them) or a model folder"
        )
    return text


class Parser(argparse.ArgumentParser):
    """argparse's parser, but an argument no command takes is an error of the command it was given to, with that
    command's usage and the nearest option it has: `forma run equations --quik` answers "forma run: error:
    unrecognized arguments: --quik (did you mean --quick?)"."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]

        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            options = [o for o in self._option_string_actions if o.startswith("--")]
            near = [
                difflib.get_close_matches(extra.split("=", 1)[0], options, n=1, cutoff=0.6)
                for extra in extras
                if extra.startswith("-")
            ]
            hint = "".join(f" (did you mean {found[0]}?)" for found in near if found)
            self.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return namespace, extras


def _add_hooks(sub: Commands) -> None:
    """forma hooks MODEL."""
    hooks = sub.add_parser("hooks", help="list a model's hook points and their shapes", description=cmd_hooks.__doc__)
    hooks.add_argument("model", type=model_name, help="zoo name, Forma model folder, or local Hugging Face folder")
    hooks.add_argument("--tokens", type=int, default=8, help="length of the probe sequence, 1 … n_ctx (default 8)")
    hooks.set_defaults(func=cmd_hooks)


def _add_trust(sub: Commands) -> None:
    """forma trust MODEL."""
    trust = sub.add_parser(
        "trust", help="check a model against HF, its own fast paths and bfloat16", description=cmd_trust.__doc__
    )
    trust.add_argument("model", type=model_name, help="zoo name, Forma model folder, or local Hugging Face folder")
    trust.add_argument(
        "--out",
        metavar="FILE",
        help="where to write the report (default: trust.json in the model's "
        "folder; needed when that folder is read-only)",
    )
    trust.set_defaults(func=cmd_trust)


def _add_build(sub: Commands) -> None:
    """forma build NAME."""
    from lab.folders import PRETRAINED, TRAINED, zoo_names

    names = zoo_names()
    build = sub.add_parser(
        "build",
        help="build a zoo model into models/NAME/ (train it, or make a pretrained one from its file)",
        description=cmd_build.__doc__,
    )
    build.add_argument(
        "name",
        choices=names,
        metavar="NAME",
        help=f"zoo model: trained here: {', '.join(zoo_names(TRAINED))}; "
        f"pretrained, made from a file a package ships: {', '.join(zoo_names(PRETRAINED)) or 'none'}",
    )
    build.add_argument("--quick", action="store_true", help="the recipe's small profile (tests, smoke runs)")
    build.add_argument("--resume", action="store_true", help="continue from models/NAME/train/checkpoint")
    build.add_argument(
        "--replace", action="store_true", help="with --quick: replace a model of the full recipe (refused without it)"
    )
    build.add_argument("--no-progress", action="store_true", help="no progress bar")
    build.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="a pretrained model's stored weights (default float32)",
    )
    build.set_defaults(func=cmd_build)


def _add_transcoders(sub: Commands) -> None:
    """forma transcoders NAME."""
    from lab.folders import PRETRAINED, zoo_names

    transcoders = sub.add_parser(
        "transcoders",
        help="train transcoders for a zoo model (attribution graphs; one process, or torchrun ranks)",
        description=cmd_transcoders.__doc__,
    )
    names = zoo_names()
    transcoders.add_argument(
        "name",
        choices=names,
        metavar="NAME",
        help=f"zoo model: {', '.join(names)} (a pretrained one, {', '.join(zoo_names(PRETRAINED))}, needs --corpus)",
    )
    transcoders.add_argument(
        "--corpus",
        metavar="DIR",
        help="a pretrained model's windows: the folder `forma corpus real --out DIR` wrote (train.npy to train on, "
        "held_out.npy's documents to measure on); a model trained here reads its own world",
    )
    transcoders.add_argument(
        "--kind",
        default="topk",
        choices=TRANSCODER_KINDS,
        help="top-k, ReLU or JumpReLU per-layer transcoders, or a cross-layer ReLU one",
    )
    transcoders.add_argument(
        "--steps", type=positive_count, default=1500, help="training steps of 512 rows (default 1500)"
    )
    transcoders.add_argument(
        "--windows", type=positive_count, default=1024, help="windows of 64 tokens to train on (default 1024)"
    )
    transcoders.add_argument(
        "--held-out-windows",
        type=positive_count,
        default=64,
        help="held-out windows of 64 tokens the measures read (default 64)",
    )
    transcoders.add_argument("--features", type=positive_count, default=1024, help="features per layer (default 1024)")
    transcoders.add_argument(
        "--disk-budget",
        type=positive_float,
        default=20.0,
        metavar="GB",
        help="the disk the harvests may take (default 20 GB): where they would take more, the activations stream "
        "from the model into training instead (no harvest on disk); the command says which and why",
    )
    transcoders.add_argument(
        "--layers",
        type=layer_list,
        default=None,
        metavar="all|L,L,…",
        help="the layers to train transcoders for (default all; e.g. 0,1 for a quick profile): the loss recovered "
        "replaces those layers' MLPs alone; attribution graphs need all",
    )
    transcoders.add_argument(
        "--parallel",
        choices=TRANSCODER_PARALLEL,
        default="data",
        help="under torchrun: data (every rank trains every layer on a slice of each batch, "
        "gradients all-reduced; default) or modules (each rank trains a share of the "
        "layers; not for clt)",
    )
    transcoders.add_argument(
        "--checkpoint-interval",
        type=positive_count,
        default=100,
        help="steps between checkpoints (default 100); a rerun resumes from the last",
    )
    transcoders.add_argument(
        "--overwrite",
        action="store_true",
        help="start afresh, ignoring a checkpoint or harvest an interrupted run left",
    )
    transcoders.add_argument("--no-progress", action="store_true", help="no progress bar")
    transcoders.set_defaults(func=cmd_transcoders)


def _add_graphs(sub: Commands) -> None:
    """forma graphs NAME."""
    graphs = sub.add_parser(
        "graphs",
        help="attribution graphs of a zoo model's prompts whose answer is known, checked against the model",
        description=cmd_graphs.__doc__,
    )
    graphs.add_argument(
        "name",
        choices=GRAPH_MODELS,
        metavar="NAME",
        help=f"zoo model whose prompts are known: {', '.join(GRAPH_MODELS)}",
    )
    graphs.add_argument(
        "--kind",
        default="topk",
        choices=TRANSCODER_KINDS,
        help="the transcoder set (`forma transcoders NAME --kind KIND`; default topk), one for every layer",
    )
    graphs.add_argument(
        "--max-feature-nodes",
        type=positive_count,
        default=256,
        help="the feature budget of each graph: the features of largest activation × decoder norm, the rest "
        "folded into the error nodes (default 256)",
    )
    graphs.add_argument(
        "--top",
        type=positive_count,
        default=5,
        help="features ablated in the full model, those with the largest edges into the logits (default 5)",
    )
    graphs.add_argument(
        "--out", metavar="FILE", help="the report (default: known_graphs.json in the transcoder set's folder)"
    )
    graphs.set_defaults(func=cmd_graphs)


class RunHelp(argparse.Action):
    """`forma run --help`, and after an experiment's name (`forma run kl --help`) what its --quick changes, read
    from its Config's profiles, the real-model track's apart (experiments.quick_changes: this loads the experiment,
    and torch with it)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: Any = None):
        parser.print_help()
        name = getattr(namespace, "name", None)
        if name:
            import experiments

            for track, changes in experiments.quick_changes(experiments.load(name).Config).items():
                where = f"{name}'s real-model track (--model)" if track == "real" else name
                print(f"\n--quick in {where} (default → quick):")
                print("\n".join(f"  {line}" for line in changes) if changes else "  nothing: it has one size")
        parser.exit()


def _add_run(sub: Commands) -> None:
    """forma run NAME."""
    import experiments

    run = sub.add_parser(
        "run",
        help="run an experiment into runs/NAME/<timestamp>/ and print its headlines",
        description=cmd_run.__doc__,
        add_help=False,
    )
    run.add_argument("-h", "--help", action=RunHelp, nargs=0, help="show this help (after NAME: what --quick changes)")
    run.add_argument(
        "name",
        choices=experiments.experiment_names(),
        metavar="NAME",
        help=f"experiment: {', '.join(experiments.experiment_names()) or 'none yet'}",
    )
    run.add_argument(
        "--quick",
        action="store_true",
        help="the small profile: tests and the demo (`forma run NAME --help` lists what it changes; its wall "
        "times: benchmarks/results/walltime.json)",
    )
    run.add_argument(
        "--out",
        help="run folder (default runs/NAME/<UTC timestamp>/): new, empty, or an unfinished run of NAME, which the "
        "run finishes; its .forma-folder.json lists every file the run writes",
    )
    run.add_argument(
        "--overwrite",
        action="store_true",
        help="run in an --out that holds files Forma did not write (left where they are; one named like a file "
        "the run writes is replaced) or a finished run (what it wrote is removed first)",
    )
    run.add_argument("--seed", type=seed_number, help="random seed, 0 … 2**63 − 1 (default: the experiment's)")
    run.add_argument(
        "--workers",
        type=worker_count,
        help="processes that share an experiment's independent "
        "trainings, for experiments that have them (default 2); results do not depend on it",
    )
    run.add_argument("--model", type=model_name, help="zoo name or local model folder, for experiments that take one")
    run.add_argument(
        "--mmlu",
        metavar="FILE",
        help="an MMLU-layout CSV (question, A, B, C, D, answer), for "
        "experiments that take one (calibration, with --model)",
    )
    run.add_argument(
        "--qa",
        metavar="FILE",
        help="a question–answer CSV (question, answer), for experiments that take one (monitor, with --model)",
    )
    run.add_argument(
        "--corpus",
        metavar="DIR",
        help="the real corpus (`forma corpus real --out DIR`), for experiments that take one (scoreboard, with "
        "--model: its lenses are fitted and graded on it; without it they are left out)",
    )
    run.set_defaults(func=cmd_run)


def _add_cards(sub: Commands) -> None:
    """forma cards."""
    cards = sub.add_parser(
        "cards",
        help="record cards and runs into docs/measured/, rewrite the documents' numbers",
        description=cmd_cards.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cards.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME",
        help="record models/NAME/card.json (trained with the default recipe); repeatable",
    )
    cards.add_argument(
        "--run",
        action="append",
        default=[],
        metavar="DIR|NAME",
        help="record a finished default-profile run folder, or NAME's latest run; repeatable",
    )
    cards.add_argument(
        "--check", action="store_true", help="record and rewrite nothing; report every mismatch (exit 1 if any)"
    )
    cards.set_defaults(func=cmd_cards)


def _add_dashboard(sub: Commands) -> None:
    """forma dashboard."""
    dashboard = sub.add_parser("dashboard", help="serve the dashboard on 127.0.0.1", description=cmd_dashboard.__doc__)
    dashboard.add_argument("--port", type=port_number, default=8501, help="port (default 8501)")
    dashboard.set_defaults(func=cmd_dashboard)


def _dataset_options() -> argparse.ArgumentParser:
    """The arguments forma harvest and forma patch share: a model over a dataset, in one process or as torchrun's
    ranks."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("model", type=model_name, help="zoo name, Forma model folder, or local Hugging Face folder")
    common.add_argument("--out", required=True, help="output folder; run the same command again to resume into it")
    common.add_argument(
        "--device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="cpu (gloo across ranks) or cuda (NCCL; each rank on the GPU of its LOCAL_RANK)",
    )
    common.add_argument(
        "--overwrite",
        action="store_true",
        help="start afresh; also into an --out that holds files Forma did not write (they are left as they are)",
    )
    common.add_argument("--no-progress", action="store_true", help="no progress bar")
    return common


def _add_harvest(sub: Commands, common: argparse.ArgumentParser) -> None:
    """forma harvest MODEL --out DIR --hook NAME --corpus FILE."""
    harvest = sub.add_parser(
        "harvest",
        parents=[common],
        help="hook activations over a corpus into shards (one process, or torchrun ranks)",
        description=cmd_harvest.__doc__,
    )
    harvest.add_argument(
        "--hook",
        action="extend",
        nargs="+",
        required=True,
        metavar="NAME",
        help="hook name(s), e.g. blocks.0.hook_resid_post (`forma hooks MODEL` lists them)",
    )
    harvest.add_argument(
        "--corpus",
        required=True,
        metavar="FILE",
        help="a .txt (text, encoded by the model's tokenizer) or .npy (token ids, 1-D or [n, seq_len]) file",
    )
    harvest.add_argument(
        "--tokens",
        type=positive_count,
        metavar="N",
        help="harvest the sequences the first N tokens fill (default: the whole corpus)",
    )
    harvest.add_argument(
        "--seq-len", type=positive_count, help="tokens a sequence (default: a 2-D .npy's width, else min(128, n_ctx))"
    )
    harvest.add_argument(
        "--positions",
        choices=("all", "last"),
        default="all",
        help="every position of a sequence (default), or its last",
    )
    harvest.add_argument("--batch-size", type=positive_count, default=32, help="sequences a forward pass (default 32)")
    harvest.add_argument(
        "--dtype", choices=("float32", "float16", "bfloat16"), help="stored dtype (default: the model's)"
    )
    harvest.add_argument("--shard-mb", type=positive_float, default=32.0, help="MB a shard at most (default 32)")
    harvest.set_defaults(func=cmd_harvest)


def _add_patch(sub: Commands, common: argparse.ArgumentParser) -> None:
    """forma patch MODEL --out DIR --pairs FILE --sweep NAME."""
    patch = sub.add_parser(
        "patch",
        parents=[common],
        help="patching sweeps over clean/corrupted prompt pairs (one process, or torchrun ranks)",
        description=cmd_patch.__doc__,
    )
    patch.add_argument(
        "--pairs", required=True, metavar="FILE", help="a .csv or .jsonl of clean, corrupted, answer, wrong"
    )
    patch.add_argument(
        "--sweep",
        action="extend",
        nargs="+",
        required=True,
        choices=SWEEP_NAMES,
        metavar="NAME",
        help=f"sweep(s): {', '.join(SWEEP_NAMES)}",
    )
    patch.add_argument(
        "--direction",
        choices=("denoise", "noise"),
        default="denoise",
        help="denoise: clean activations into the corrupted run (default); noise: the reverse",
    )
    patch.add_argument("--max-batch", type=positive_count, default=64, help="rows a patched forward pass (default 64)")
    patch.set_defaults(func=cmd_patch)


def _add_questions(sub: Commands) -> None:
    """forma questions [--seed N] [--out FILE] [--check]."""
    questions = sub.add_parser(
        "questions",
        help="build the real question set (countries' facts, three forms) from countryinfo",
        description=cmd_questions.__doc__,
    )
    questions.add_argument(
        "--seed", type=seed_number, default=0, help="seed of distractors, option order and true/false (default 0)"
    )
    questions.add_argument(
        "--out", metavar="FILE", help="where to write the set (default: the shipped lab/data/questions.json)"
    )
    questions.add_argument(
        "--check", action="store_true", help="write nothing: rebuild and compare with FILE (exit 1 when they differ)"
    )
    questions.set_defaults(func=cmd_questions)


def _add_corpus(sub: Commands) -> None:
    """forma corpus NAME [--out DIR] [--seed N] [--held-out F] [--overwrite] [--record | --check]."""
    corpus = sub.add_parser(
        "corpus",
        help="build a corpus of real English and code, tokenized for smollm2, held out by document",
        description=cmd_corpus.__doc__,
    )
    corpus.add_argument("name", choices=CORPORA, metavar="NAME", help=f"the corpus: {', '.join(CORPORA)}")
    corpus.add_argument("--out", metavar="DIR", default="corpora/real", help="where to write it (default corpora/real)")
    corpus.add_argument("--seed", type=seed_number, default=0, help="seed of the held-out hash (default 0)")
    corpus.add_argument(
        "--held-out",
        type=open_fraction,
        default=DEFAULT_HELD_OUT,
        help=f"share of documents held out, 0 … 1 exclusive (default {DEFAULT_HELD_OUT})",
    )
    corpus.add_argument("--overwrite", action="store_true", help="write beside files Forma did not write in DIR")
    measured = corpus.add_mutually_exclusive_group()
    measured.add_argument(
        "--record", action="store_true", help="also write the totals to docs/measured/corpus/NAME.json"
    )
    measured.add_argument(
        "--check", action="store_true", help="compare the files with that record (exit 1 when they differ)"
    )
    corpus.set_defaults(func=cmd_corpus)


def _add_demo(sub: Commands) -> None:
    """forma demo."""
    demo = sub.add_parser(
        "demo", help="train missing models, run quick experiments, open the dashboard", description=cmd_demo.__doc__
    )
    demo.add_argument("--quick", action="store_true", help="train missing zoo models with their quick profile")
    demo.add_argument("--no-dashboard", action="store_true", help="stop before serving the dashboard")
    demo.add_argument("--port", type=port_number, default=8501, help="dashboard port (default 8501)")
    demo.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help="make only this demo model or experiment (if missing); repeatable",
    )
    demo.set_defaults(func=cmd_demo)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="forma", description=lab.__doc__)
    parser.add_argument("--version", action="version", version=f"forma {lab.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in (
        _add_hooks,
        _add_trust,
        _add_build,
        _add_transcoders,
        _add_graphs,
        _add_run,
        _add_cards,
        _add_dashboard,
        _add_questions,
        _add_corpus,
    ):
        add(sub)
    common = _dataset_options()
    _add_harvest(sub, common)
    _add_patch(sub, common)
    _add_demo(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with interrupting_signals():  # SIGTERM and SIGHUP end a command as Ctrl-C does, through its clean-up
            return args.func(args)
    except (ValueError, KeyError, OSError) as err:  # OSError: a folder that cannot be written, a full disk, …
        print(f"forma {args.command}: error: {err}", file=sys.stderr)
        return 2
    except FloatingPointError as err:  # a diverging run: the message says where, and what to change
        print(f"forma {args.command}: error: {err}", file=sys.stderr)
        return 1
    except Stopped as stop:  # its children have ended; exit as a shell reports a process ended by a signal
        return 128 + stop.signum
    except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM or SIGHUP: what was in flight has been cleaned up
        signum = getattr(stop, "signum", signal.SIGINT)
        print(f"forma {args.command}: interrupted by {signal.Signals(signum).name}", file=sys.stderr)
        return 128 + signum
