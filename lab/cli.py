"""The `forma` command line."""

import argparse
import sys
from contextlib import contextmanager

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


def cmd_demo(args: argparse.Namespace) -> int:
    """Fresh clone to filled-in dashboard. The dashboard serves first; then the missing zoo models train and
    each experiment's quick profile that has no run yet runs, side by side, while every page shows its job's
    progress (step / total, elapsed, ETA) and fills in when the job ends; then generations with per-token
    probabilities. The jobs are independent: one per CPU core (at most four), each in its own process with its
    share of the cores; the terminal shows one line per job, and each job's output goes to runs/demo/<job>.log.
    A job that fails is reported with the end of its log; the dashboard keeps serving the others (exit 1)."""
    import signal
    import time

    import experiments
    from lab.runs import latest_run

    start = time.perf_counter()
    known = [*DEMO_MODELS, *experiments.experiment_names()]
    unknown = [name for name in args.only if name not in known]
    if unknown:
        raise ValueError(f"--only {unknown[0]!r} is neither a demo model nor an experiment; give one of "
                         f"{', '.join(known)}")
    chosen = set(args.only or known)
    server = None if args.no_dashboard else CHILDREN.start(dashboard_command(args.port))  # boots while we list

    from lab.zoo import is_trained  # loads torch: seconds the dashboard spends starting anyway

    jobs: list[tuple[str, list[str]]] = []
    for name in (m for m in DEMO_MODELS if m in chosen):
        if is_trained(name):
            print(f"[demo] {name}: already trained")
        else:
            jobs.append((f"forma train {name}{' --quick' if args.quick else ''}",
                         ["train", name, *(["--quick"] if args.quick else [])]))
    for name in (e for e in experiments.experiment_names() if e in chosen):
        if latest_run(name) is not None:
            print(f"[demo] {name}: a run exists ({latest_run(name)})")
        else:
            jobs.append((f"forma run {name} --quick", ["run", name, "--quick"]))
    if server is not None:
        url = f"http://127.0.0.1:{args.port}"
        try:
            with CHILDREN.forwarding_signals():
                wait_until_serving(url, server, timeout_s=DASHBOARD_START_S)
        except RuntimeError as err:  # it exited (a port in use, say) or never answered: nothing to fill in
            if CHILDREN.signum is not None:  # it exited because a signal told it to
                raise Stopped(CHILDREN.signum) from None
            CHILDREN.signal_all(signal.SIGTERM)
            print(f"forma demo: {err}", file=sys.stderr)
            return 1
        print(f"[demo] dashboard at {url} after {time.perf_counter() - start:.0f} s; each page shows its job's "
              "progress and fills in when the job ends (Ctrl-C stops)", flush=True)
    ok = run_side_by_side(jobs) if jobs else True  # a signal: Stopped, once every job and the server have ended
    if ok and is_trained("pydoc"):
        show_generations()
    print(f"[demo] {'ready' if ok else 'done, with a failed job (above)'} in {time.perf_counter() - start:.0f} s",
          flush=True)
    if server is None:
        return 0 if ok else 1
    if not ok:
        print("[demo] the dashboard keeps serving what finished (Ctrl-C stops it)", flush=True)
    try:
        with CHILDREN.forwarding_signals():
            code = server.wait()
    except Stopped:
        code = 0  # Ctrl-C, SIGTERM or SIGHUP: the server was told too, and has ended
    return code if ok else 1


DASHBOARD_START_S = 120.0  # how long the demo waits for Streamlit to answer before it gives up


def job_progress(argv: list[str]):
    """The progress record (lab.progress) of the job `forma ARGV`, or None: a run's from its run folder, a
    training's from its model folder."""
    from pathlib import Path

    from lab.progress import PROGRESS_FILE, model_progress, read_progress, run_progress

    command, name = argv[0], argv[1]
    if command == "train":
        return model_progress(name)
    if command == "run" and "--out" in argv[:-1]:
        return read_progress(Path(argv[argv.index("--out") + 1]) / PROGRESS_FILE)
    return run_progress(name) if command == "run" else None


class JobBoard:
    """One line per demo job on the terminal: waiting, starting, its progress (lab.progress: elapsed, stage,
    step / total, ETA), done or failed. On a terminal the lines are redrawn in place every second, below the
    messages; otherwise (a log, a pipe) each running job's line is printed every `every_s` seconds."""

    def __init__(self, jobs: list[tuple[str, list[str]]], stream=None, every_s: float | None = None):
        import threading

        self.stream = stream if stream is not None else sys.stdout
        try:
            self.terminal = self.stream.isatty()
        except (AttributeError, ValueError):
            self.terminal = False
        self.every_s = every_s if every_s is not None else (1.0 if self.terminal else BOARD_EVERY_S)
        self.argv = dict(jobs)
        self.rows = {label: f"{label}: waiting for a free core" for label, _ in jobs}
        self.began: dict[str, float] = {}
        self.drawn = 0
        self.lock = threading.RLock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="demo job board", daemon=True)

    def __enter__(self) -> "JobBoard":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        if self.terminal:
            self.draw()

    def started(self, label: str) -> None:
        import time

        with self.lock:
            self.began[label] = time.time()
            self.rows[label] = f"{label}: starting"
        self.say(f"[demo] {label} …")

    def ended(self, label: str, row: str, message: str, error: bool = False) -> None:
        with self.lock:
            self.began.pop(label, None)
            self.rows[label] = row
        self.say(message, error)

    def say(self, message: str, error: bool = False) -> None:
        """A message above the board (stderr when `error`)."""
        with self.lock:
            self._clear()
            print(message, file=sys.stderr if error else self.stream, flush=True)
            if self.terminal:
                self.draw()

    def status(self, label: str) -> str:
        import time

        from lab.progress import clock

        began = self.began.get(label)
        if began is None:
            return self.rows[label]
        progress = job_progress(self.argv[label])
        if progress is not None and progress.updated >= began and progress.active:
            return progress.line()
        return f"{label}: starting ({clock(time.time() - began)})"

    def draw(self) -> None:
        with self.lock:
            lines = [f"[demo] {self.status(label)}" for label in self.rows]
            if self.terminal:  # one screen line each, or the redraw would miscount the lines to go up
                import shutil

                width = shutil.get_terminal_size().columns - 1
                self._clear()
                self.stream.write("".join(f"\x1b[2K{line[:width]}\n" for line in lines))
                self.drawn = len(lines)
            else:
                self.stream.write("".join(f"{line}\n" for label, line in zip(self.rows, lines) if label in self.began))
            self.stream.flush()

    def _clear(self) -> None:
        if self.terminal and self.drawn:
            self.stream.write(f"\x1b[{self.drawn}F\x1b[0J")  # up to the board's first line, erase to the end
            self.stream.flush()
            self.drawn = 0

    def _loop(self) -> None:
        while not self.stop.wait(self.every_s):
            self.draw()


BOARD_EVERY_S = 15.0  # a line per running job this often when the demo's output is a log, not a terminal


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
    board = JobBoard(jobs)

    def run(job: tuple[str, list[str]]) -> bool:
        label, argv = job
        log = logs / (label.removeprefix("forma ").replace(" --", "-").replace(" ", "-") + ".log")
        board.started(label)
        began = time.perf_counter()
        with log.open("w") as out:
            code = CHILDREN.start([sys.executable, "-m", "lab.cli", *argv], env=env, stdout=out,
                                  stderr=subprocess.STDOUT).wait()
        if CHILDREN.signum is not None:
            return False
        seconds = time.perf_counter() - began
        if code == 0:
            board.ended(label, f"{label}: done in {seconds:.0f} s", f"[demo] {label}: done in {seconds:.0f} s")
            return True
        tail = log.read_text().strip().splitlines()[-5:]
        board.ended(label, f"{label}: FAILED (exit {code}); see {log}",
                    f"[demo] {label}: FAILED (exit {code}) after {seconds:.0f} s; last lines of {log}:\n    "
                    + "\n    ".join(tail), error=True)
        return False

    pool = ThreadPoolExecutor(workers)
    with CHILDREN.forwarding_signals(), board:  # a signal: every job hears it, no new one starts, then Stopped
        try:
            return all(list(pool.map(run, jobs)))
        except Stopped:  # a job that would have started after the signal
            return False
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


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
    print(f"Forma dashboard at http://127.0.0.1:{args.port}  (Ctrl-C to stop)", flush=True)
    try:
        with CHILDREN.forwarding_signals():
            code = CHILDREN.start(dashboard_command(args.port)).wait()
    except Stopped:
        return 0  # Ctrl-C, SIGTERM or SIGHUP: the server was told too, and has ended
    return code


class Stopped(BaseException):
    """SIGTERM, SIGINT or SIGHUP ended `forma` while it waited on its children (who were told, and have ended)."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by signal {signum}")
        self.signum = signum


class Children:
    """The processes `forma dashboard` and `forma demo` start, which must end with `forma`, whatever ends it.

    Each child runs in its own process group and asks the kernel (Linux prctl PR_SET_PDEATHSIG) for SIGTERM
    when its parent dies: that covers SIGKILL, which no handler sees. Inside `forwarding_signals()`, SIGTERM,
    SIGINT and SIGHUP are passed on to every child's process group (so Streamlit, and whatever a job started,
    hears them), no new child starts, a group still alive `grace_s` later gets SIGKILL, and once the block is
    done `Stopped` is raised. (A terminal's Ctrl-C reaches only `forma`'s own group; it is forwarded too.)"""

    SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")
    PR_SET_PDEATHSIG = 1  # linux/prctl.h

    def __init__(self, grace_s: float = 10.0):
        import threading

        self.grace_s = grace_s
        self.signum: int | None = None  # the first signal received, once one is
        self._live: list = []
        self._lock = threading.RLock()  # re-entrant: the handler may run inside start(), in the main thread

    def start(self, argv: list[str], **popen: object):
        """Popen(argv) in a new process group, told to die with this process; `Stopped` once a signal came."""
        import subprocess

        with self._lock:
            if self.signum is not None:
                raise Stopped(self.signum)
            process = subprocess.Popen(argv, process_group=0, preexec_fn=self._die_with_parent(), **popen)
            self._live = [p for p in self._live if p.poll() is None] + [process]
            if self.signum is not None:  # it came while Popen ran: this child was not yet in the list
                self._signal(process, self.signum)
        return process

    def _die_with_parent(self):
        """What the child runs between fork and exec. The libc look-up is done here, in the parent: a child
        forked from a threaded process must do as little as possible before exec."""
        import ctypes
        import os
        import signal

        if not sys.platform.startswith("linux"):
            return None
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        option, signum, parent = self.PR_SET_PDEATHSIG, int(signal.SIGTERM), os.getpid()

        def preexec() -> None:
            prctl(option, signum)
            if os.getppid() != parent:  # the parent died before prctl took effect: no signal will come
                os._exit(1)

        return preexec

    @staticmethod
    def _signal(process, signum: int) -> None:
        import os

        try:
            os.killpg(process.pid, signum)
        except (ProcessLookupError, PermissionError):  # the group has ended already
            pass

    def signal_all(self, signum: int) -> None:
        with self._lock:
            live = [p for p in self._live if p.poll() is None]
        for process in live:
            self._signal(process, signum)

    @contextmanager
    def forwarding_signals(self):
        import signal
        import threading

        if threading.current_thread() is not threading.main_thread():  # handlers can only be set there
            yield
            return
        with self._lock:
            self.signum = None

        def forward(signum: int, frame: object) -> None:
            first = self.signum is None
            if first:
                self.signum = signum
            self.signal_all(signum)
            if first:
                timer = threading.Timer(self.grace_s, self.signal_all, (signal.SIGKILL,))
                timer.daemon = True
                timer.start()

        previous = {name: signal.signal(getattr(signal, name), forward) for name in self.SIGNALS}
        try:
            yield
        finally:
            for name, handler in previous.items():
                signal.signal(getattr(signal, name), handler)
        if self.signum is not None:
            raise Stopped(self.signum)


CHILDREN = Children()


def cmd_run(args: argparse.Namespace) -> int:
    """Run an experiment and write config.json, provenance.json, figures and results.json into its run folder."""
    import dataclasses
    from pathlib import Path

    import experiments
    from lab.progress import PROGRESS_FILE, recording
    from lab.runs import run_and_record

    module = experiments.load(args.name)
    fields = {f.name for f in dataclasses.fields(module.Config)}
    given = {"seed": args.seed, "quick": args.quick, "model": args.model, "mmlu": args.mmlu, "qa": args.qa,
             "workers": args.workers}
    unsupported = [k for k, v in given.items() if v not in (None, False) and k not in fields]
    if unsupported:
        raise ValueError(f"experiment {args.name!r} takes no --{unsupported[0]}")
    cfg = module.Config(**{k: v for k, v in given.items() if k in fields and v is not None})
    job = f"forma run {args.name}{' --quick' if args.quick else ''}"

    def run_with_progress(config: object, folder: Path) -> dict:
        # The experiment's own trainings show no bar; the job's line (stderr) and its progress file (which
        # the dashboard and `forma demo` read) say which stage it is in, and how far.
        with recording(folder / PROGRESS_FILE, job, echo=True):
            return module.run(config, folder)

    folder = run_and_record(args.name, cfg, run_with_progress, out=args.out, seed=getattr(cfg, "seed", None))
    (folder / PROGRESS_FILE).unlink(missing_ok=True)  # results.json is there now: the run's state is in it
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
    from lab.folders import zoo_dir

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

    run = sub.add_parser("run", help="run an experiment into runs/NAME/<timestamp>/", description=cmd_run.__doc__)
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


if __name__ == "__main__":
    sys.exit(main())
