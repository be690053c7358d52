"""The `forma` command line."""

import argparse
import sys

import lab


def cmd_hooks(args: argparse.Namespace) -> int:
    """Print every hook point of a model with the shape it carries for a one-sequence input."""
    import torch

    from lab import HookedTransformer

    model = HookedTransformer.from_pretrained(args.model)
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
    """Train a zoo model from models/NAME/model.toml into models/NAME/."""
    from lab.zoo import build

    directory = build(args.name, quick=args.quick, progress=not args.no_progress, resume=args.resume)
    print(f"trained {args.name} into {directory}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Fresh clone to filled-in dashboard: train missing zoo models, run each experiment's quick profile
    that has no run yet, show generations with per-token probabilities, then serve the dashboard.
    The jobs are independent, so they run side by side, one per CPU core (at most four), each in its
    own process with its share of the cores; each job's output goes to runs/demo/<job>.log."""
    import time

    import experiments
    from lab.runs import latest_run
    from lab.zoo import is_trained

    start = time.perf_counter()
    jobs: list[tuple[str, list[str]]] = []
    for name in DEMO_MODELS:
        if is_trained(name):
            print(f"[demo] {name}: already trained")
        else:
            jobs.append((f"forma train {name}{' --quick' if args.quick else ''}",
                         ["train", name, "--no-progress", *(["--quick"] if args.quick else [])]))
    for name in experiments.experiment_names():
        if latest_run(name) is not None:
            print(f"[demo] {name}: a run exists ({latest_run(name)})")
        else:
            jobs.append((f"forma run {name} --quick", ["run", name, "--quick"]))
    if jobs and not run_side_by_side(jobs):
        return 1
    show_generations()
    print(f"[demo] ready in {time.perf_counter() - start:.0f} s", flush=True)
    if args.no_dashboard:
        return 0
    return cmd_dashboard(argparse.Namespace(port=args.port))


def run_side_by_side(jobs: list[tuple[str, list[str]]]) -> bool:
    """Run `forma ARGS` jobs in parallel processes, longest first; True when every one succeeded.

    Small models train fastest on one thread each (two threads that wait for each other cost more
    than they gain), so n cores run min(n, 4) jobs at a time with n // jobs threads apiece."""
    import os
    import subprocess
    import time
    from concurrent.futures import ThreadPoolExecutor

    from lab.runs import runs_dir

    cores = os.cpu_count() or 1
    workers = max(1, min(len(jobs), cores, 4))
    env = os.environ | {"OMP_NUM_THREADS": str(max(1, cores // workers))}
    logs = runs_dir() / "demo"
    logs.mkdir(parents=True, exist_ok=True)
    def rank(job: tuple[str, list[str]]) -> int:
        what = " ".join(job[1][:2])  # "train pydoc", "run kl"
        return DEMO_ORDER.index(what) if what in DEMO_ORDER else len(DEMO_ORDER)

    jobs = sorted(jobs, key=rank)
    print(f"[demo] {len(jobs)} jobs, {workers} at a time; logs in {logs}", flush=True)

    def run(job: tuple[str, list[str]]) -> bool:
        label, argv = job
        log = logs / (label.removeprefix("forma ").replace(" --", "-").replace(" ", "-") + ".log")
        print(f"[demo] {label} …", flush=True)
        began = time.perf_counter()
        with log.open("w") as out:
            code = subprocess.call([sys.executable, "-m", "lab.cli", *argv], env=env, stdout=out, stderr=subprocess.STDOUT)
        seconds = time.perf_counter() - began
        if code == 0:
            print(f"[demo] {label}: done in {seconds:.0f} s", flush=True)
            return True
        tail = log.read_text().strip().splitlines()[-5:]
        print(f"[demo] {label}: FAILED (exit {code}) after {seconds:.0f} s; last lines of {log}:\n    "
              + "\n    ".join(tail), file=sys.stderr, flush=True)
        return False

    with ThreadPoolExecutor(workers) as pool:
        return all(list(pool.map(run, jobs)))


def show_generations() -> None:
    import torch

    from lab import HookedTransformer

    model = HookedTransformer.from_pretrained("pydoc")
    print("\n[demo] pydoc generations (temperature 0.8, nucleus 0.95); each token with its probability:")
    for seed, prompt in enumerate(["Return the", "This module provides", "If the file"]):
        tokens = model.to_tokens(prompt)
        with torch.inference_mode():
            out = model.generate(tokens, 16, temperature=0.8, top_p=0.95, seed=seed)
            probs = model(out).softmax(-1)[0, tokens.shape[1] - 1 : -1]
        new = out[0, tokens.shape[1]:]
        pieces = [f"{model.to_string([t])!r}:{probs[i, t].item():.2f}" for i, t in enumerate(new.tolist())]
        print(f"  {prompt!r} → {model.to_string(new)!r}")
        print("    " + " ".join(pieces))


DEMO_MODELS = ("markov", "facts", "pydoc")
# Longest first, so that two cores finish together (measured times in benchmarks/results/walltime.json).
DEMO_ORDER = ("train pydoc", "train markov", "run kl", "run calibration", "train facts", "run hallucination",
              "run equations")


def dashboard_command(port: int) -> list[str]:
    """The Streamlit command line: bound to 127.0.0.1, headless, no usage statistics, no file watcher."""
    from pathlib import Path

    app = Path(__file__).resolve().parents[1] / "dashboards" / "app.py"
    return [sys.executable, "-m", "streamlit", "run", str(app), "--server.headless", "true",
            "--server.address", "127.0.0.1", "--server.port", str(port), "--browser.gatherUsageStats", "false",
            "--server.fileWatcherType", "none", "--client.toolbarMode", "viewer"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_serving(url: str, process, timeout_s: float) -> None:
    """Block until the dashboard at `url` answers its health check; RuntimeError if `process` exits first
    or `timeout_s` passes (the tests, the demo's wall-time benchmark and the response benchmark wait so)."""
    import time
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                return
        except OSError:
            pass
        if process.poll() is not None:
            raise RuntimeError(f"the dashboard process exited with {process.returncode} before serving {url}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the dashboard at {url} did not answer within {timeout_s:.0f} s")
        time.sleep(0.5)


def cmd_dashboard(args: argparse.Namespace) -> int:
    """Serve the dashboard at http://127.0.0.1:PORT (Ctrl-C stops it)."""
    import subprocess

    print(f"Forma dashboard at http://127.0.0.1:{args.port}  (Ctrl-C to stop)", flush=True)
    try:
        return subprocess.call(dashboard_command(args.port))
    except KeyboardInterrupt:
        return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Run an experiment and write config.json, provenance.json, figures and results.json into its run folder."""
    import dataclasses

    import experiments
    from lab.runs import run_and_record

    module = experiments.load(args.name)
    fields = {f.name for f in dataclasses.fields(module.Config)}
    given = {"seed": args.seed, "quick": args.quick, "model": args.model, "mmlu": args.mmlu}
    unsupported = [k for k, v in given.items() if v not in (None, False) and k not in fields]
    if unsupported:
        raise ValueError(f"experiment {args.name!r} takes no --{unsupported[0]}")
    cfg = module.Config(**{k: v for k, v in given.items() if k in fields and v is not None})
    folder = run_and_record(args.name, cfg, module.run, out=args.out, seed=getattr(cfg, "seed", None))
    print(f"results in {folder}")
    return 0


def cmd_cards(args: argparse.Namespace) -> int:
    """Record reference measurements into docs/measured/ and rewrite every marked number of README.md,
    models/*/MODEL.md and docs/*.md from the file it cites.

    --model NAME copies models/NAME/card.json (a default-recipe card: `forma train NAME`) to
    docs/measured/cards/NAME.json; --run copies a finished default-profile run's results.json and
    provenance.json to docs/measured/runs/. Quick cards, quick runs and unfinished runs are refused.
    A number is written <!-- measured FILE FIELD FORMAT -->0.065<!-- /measured --> (lab/measured.py).
    Exit 1 when a document still has a problem: a marker whose file or field is missing, or a bare
    measured-looking number in a "Measured" section or a README/MODEL.md table."""
    from pathlib import Path

    from lab.measured import REPO, check_document, documents, record_card, record_run, rewrite_document
    from lab.runs import latest_run
    from lab.zoo import zoo_dir

    if args.check and (args.model or args.run):
        raise ValueError("--check records nothing: give it without --model and --run")
    for name in args.model:
        print(f"recorded {record_card(zoo_dir() / name).relative_to(REPO)}")
    for given in args.run:
        folder = Path(given)
        if not folder.is_dir():
            folder = latest_run(given)
            if folder is None:
                raise FileNotFoundError(f"--run {given}: not a run folder, and no finished run of an experiment "
                                        f"of that name")
        print(f"recorded {record_run(folder).relative_to(REPO)} (from {folder})")
    problems = []
    for document in documents():
        if not args.check and rewrite_document(document):
            print(f"rewrote {document.relative_to(REPO)}")
        problems += check_document(document)
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        print(f"every marked number of {len(documents())} documents matches its file")
    return 1 if problems else 0


def port_number(text: str) -> int:
    """argparse type: a TCP port, 1 … 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 1 … 65535, got {port}")
    return port


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="forma", description=lab.__doc__)
    parser.add_argument("--version", action="version", version=f"forma {lab.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    hooks = sub.add_parser("hooks", help="list a model's hook points and their shapes",
                           description=cmd_hooks.__doc__)
    hooks.add_argument("model", help="zoo name, Forma model folder, or local Hugging Face folder")
    hooks.add_argument("--tokens", type=int, default=8, help="length of the probe sequence, 1 … n_ctx (default 8)")
    hooks.set_defaults(func=cmd_hooks)

    trust = sub.add_parser("trust", help="check a model against HF, its own fast paths and bfloat16",
                           description=cmd_trust.__doc__)
    trust.add_argument("model", help="zoo name, Forma model folder, or local Hugging Face folder")
    trust.set_defaults(func=cmd_trust)

    from lab.zoo import zoo_names

    train = sub.add_parser("train", help="train a zoo model into models/NAME/", description=cmd_train.__doc__)
    train.add_argument("name", choices=zoo_names(), metavar="NAME", help=f"zoo model: {', '.join(zoo_names())}")
    train.add_argument("--quick", action="store_true", help="the recipe's small profile (tests, smoke runs)")
    train.add_argument("--resume", action="store_true", help="continue from models/NAME/train/checkpoint")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.set_defaults(func=cmd_train)

    import experiments

    run = sub.add_parser("run", help="run an experiment into runs/NAME/<timestamp>/", description=cmd_run.__doc__)
    run.add_argument("name", choices=experiments.experiment_names(), metavar="NAME",
                     help=f"experiment: {', '.join(experiments.experiment_names()) or 'none yet'}")
    run.add_argument("--quick", action="store_true", help="the small profile (≤ 90 s on 2 cores): tests and the demo")
    run.add_argument("--out", help="run folder (default runs/NAME/<UTC timestamp>/)")
    run.add_argument("--seed", type=int, help="random seed (default: the experiment's)")
    run.add_argument("--model", help="zoo name or local model folder, for experiments that take one")
    run.add_argument("--mmlu", metavar="FILE", help="an MMLU-layout CSV (question, A, B, C, D, answer), for "
                                                     "experiments that take one (calibration, with --model)")
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
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, KeyError) as err:
        print(f"forma {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
