"""`forma demo`: from a fresh clone to a filled-in dashboard. The dashboard serves first; the missing zoo
models train and the missing quick runs run side by side (`run_side_by_side`, one line each on the board, a job
after the one whose result it reads), then the pydoc model's generations are shown with each token's
probability."""

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from lab.cli.dashboard import dashboard_command, wait_until_serving
from lab.cli.job_board import JobBoard
from lab.cli.stopping import CHILDREN, Stopped


def cmd_demo(args: argparse.Namespace) -> int:
    """Fresh clone to filled-in dashboard. The dashboard serves first; then the missing zoo models train and
    each experiment's quick profile that has no run yet runs, side by side, while every page shows its job's
    progress (step / total, elapsed, ETA) and fills in when the job ends; then generations with per-token
    probabilities. One job per CPU core (at most four), each in its own process with its share of the cores; a
    job that reads another's result waits for it (the calibration run reads the pydoc model, so it starts once
    pydoc's training has ended), and the queue is kept in runs/demo/queue.json, so that a page whose job waits
    says so. The terminal shows one line per job, and each job's output goes to runs/demo/<job>.log.
    A job that fails is reported with the end of its log; the dashboard keeps serving the others (exit 1)."""
    start = time.perf_counter()
    chosen = _chosen(args.only)
    server = None if args.no_dashboard else CHILDREN.start(dashboard_command(args.port))  # boots while we list

    from lab.folders import is_trained  # loads torch: seconds the dashboard spends starting anyway

    jobs = missing_jobs(chosen, args.quick)
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
        print(
            f"[demo] dashboard at {url} after {time.perf_counter() - start:.0f} s; each page shows its job's "
            "progress and fills in when the job ends (Ctrl-C stops)",
            flush=True,
        )
    ok = run_side_by_side(jobs) if jobs else True  # a signal: Stopped, once every job and the server have ended
    if ok and is_trained("pydoc"):
        show_generations()
    print(
        f"[demo] {'ready' if ok else 'done, with a failed job (above)'} in {time.perf_counter() - start:.0f} s",
        flush=True,
    )
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


def _chosen(only: list[str]) -> set[str]:
    """The demo models and experiments --only names (all of them when it names none); ValueError for a name that
    is neither."""
    import experiments

    known = [*DEMO_MODELS, *experiments.experiment_names()]
    unknown = [name for name in only if name not in known]
    if unknown:
        raise ValueError(
            f"--only {unknown[0]!r} is neither a demo model nor an experiment; give one of {', '.join(known)}"
        )
    return set(only or known)


def missing_jobs(chosen: set[str], quick: bool) -> list[tuple[str, list[str]]]:
    """The jobs (label, forma's argv) that make what is chosen and missing: the untrained zoo models' trainings,
    the transcoders the attribution-graphs page draws with, then the quick runs of the experiments that have no
    run; what exists already is said on the terminal."""
    import experiments
    from lab.folders import is_trained, zoo_dir
    from lab.runs import latest_run
    from lab.zoo.transcoders import transcoder_sets

    jobs: list[tuple[str, list[str]]] = []
    for name in (m for m in DEMO_MODELS if m in chosen):
        if is_trained(name):
            print(f"[demo] {name}: already built")
        else:
            profile = ["--quick"] if quick and name not in PRETRAINED_MODELS else []  # a file has no quick profile
            jobs.append((" ".join(["forma", "build", name, *profile]), ["build", name, *profile]))
    for name in (m for m in DEMO_TRANSCODERS if m in chosen):
        if transcoder_sets(zoo_dir() / name):
            print(f"[demo] {name}'s transcoders: already built")
        else:
            argv = ["transcoders", name, *DEMO_TRANSCODERS[name]]
            jobs.append((" ".join(["forma", *argv]), argv))
    for name in (e for e in experiments.experiment_names() if e in chosen):
        if latest_run(name) is not None:
            print(f"[demo] {name}: a run exists ({latest_run(name)})")
        else:
            jobs.append((f"forma run {name} --quick", ["run", name, "--quick"]))
    return jobs


DASHBOARD_START_S = 120.0  # how long the demo waits for Streamlit to answer before it gives up


class JobQueue:
    """The demo's jobs in the order they start, each waiting until the jobs whose result it reads (lab.jobs.NEEDS)
    have ended, shared by the worker threads. It is written to runs/demo/queue.json as it moves (lab.jobs), so
    that each page says where its job waits."""

    def __init__(self, jobs: list[tuple[str, list[str]]]) -> None:
        from lab.jobs import NEEDS, what

        self.jobs = jobs
        self.states = {label: "waiting" for label, _ in jobs}
        label_of = {what(argv): label for label, argv in jobs}
        self.needs = {
            label: [label_of[need] for need in NEEDS.get(what(argv), ()) if need in label_of] for label, argv in jobs
        }
        self.changed = threading.Condition()
        self.write()

    def write(self) -> None:
        from lab.jobs import write_queue

        write_queue(self.jobs, self.states)

    def next_job(self) -> tuple[str, list[str]] | None:
        """The first waiting job whose needs have ended (marked running), or None when none is left or a signal
        came."""
        with self.changed:
            while True:
                if CHILDREN.signum is not None:
                    return None
                waiting = [(label, argv) for label, argv in self.jobs if self.states[label] == "waiting"]
                if not waiting:
                    return None
                job = next(
                    (j for j in waiting if all(self.states[n] in ("done", "failed") for n in self.needs[j[0]])), None
                )
                if job is not None:
                    self.states[job[0]] = "running"
                    self.write()
                    return job
                self.changed.wait(timeout=0.5)  # a signal sets CHILDREN.signum without a notify

    def ended(self, label: str, ok: bool) -> None:
        """A job has ended, whatever ended it: the jobs that wait for it go on."""
        with self.changed:
            self.states[label] = "done" if ok else "failed"
            self.write()
            self.changed.notify_all()


def run_job(job: tuple[str, list[str]], queue: JobQueue, board: JobBoard, logs: Path, env: dict[str, str]) -> bool:
    """Run one `forma ARGS` job in its own process, its output to its log in `logs`; its line on the board says
    how it ended (a failure with the end of its log). True when it succeeded."""
    label, argv = job
    log = logs / (label.removeprefix("forma ").replace(" --", "-").replace(" ", "-") + ".log")
    board.started(label)
    began, code = time.perf_counter(), None
    try:
        with log.open("w") as out:
            code = CHILDREN.start(
                [sys.executable, "-m", "lab.cli", *argv], env=env, stdout=out, stderr=subprocess.STDOUT
            ).wait()
    finally:
        queue.ended(label, code == 0)
    if CHILDREN.signum is not None:
        return False
    seconds = time.perf_counter() - began
    if code == 0:
        board.ended(label, f"{label}: done in {seconds:.0f} s", f"[demo] {label}: done in {seconds:.0f} s")
        return True
    tail = log.read_text().strip().splitlines()[-5:]
    board.ended(
        label,
        f"{label}: FAILED (exit {code}); see {log}",
        f"[demo] {label}: FAILED (exit {code}) after {seconds:.0f} s; last lines of {log}:\n    " + "\n    ".join(tail),
        error=True,
    )
    return False


def run_side_by_side(jobs: list[tuple[str, list[str]]]) -> bool:
    """Run `forma ARGS` jobs in parallel processes, longest first (DEMO_ORDER), each only once the jobs it
    reads the result of (lab.jobs.NEEDS) have ended (JobQueue); True when every one succeeded.

    Small models train fastest on one thread each (two threads that wait for each other cost more
    than they gain), so n cores run min(n, 4) jobs at a time with n // jobs threads apiece."""
    from lab.jobs import what
    from lab.runs import runs_dir

    cores = os.cpu_count() or 1
    workers = max(1, min(len(jobs), cores, 4))
    env = os.environ | {"OMP_NUM_THREADS": str(max(1, cores // workers))}
    logs = runs_dir() / "demo"
    logs.mkdir(parents=True, exist_ok=True)
    jobs = sorted(jobs, key=lambda job: DEMO_ORDER.index(w) if (w := what(job[1])) in DEMO_ORDER else len(DEMO_ORDER))
    print(f"[demo] {len(jobs)} jobs, {workers} at a time; logs in {logs}", flush=True)
    board = JobBoard(jobs)
    queue = JobQueue(jobs)
    for label, before in queue.needs.items():
        if before:
            board.rows[label] = f"{label}: waiting for {', '.join(before)} (it reads its result)"
    outcomes: list[bool] = []
    errors: list[BaseException] = []

    def work() -> None:
        ok = True
        try:
            while (job := queue.next_job()) is not None:
                ok = run_job(job, queue, board, logs, env) and ok
        except Stopped:  # a job that would have started after the signal
            ok = False
        except BaseException as err:  # raised again in the main thread, after the others have ended
            errors.append(err)
            return
        outcomes.append(ok)

    threads = [threading.Thread(target=work, name=f"demo worker {i}", daemon=True) for i in range(workers)]
    with CHILDREN.forwarding_signals(), board:  # a signal: every job hears it, no new one starts, then Stopped
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(timeout=0.5)  # short waits: the main thread stays free for the signal handlers
    if errors:
        raise errors[0]
    return len(outcomes) == workers and all(outcomes) and all(state == "done" for state in queue.states.values())


def show_generations() -> None:
    import torch

    from lab import HookedTransformer
    from lab.model.decoding import generate

    model = HookedTransformer.from_pretrained("pydoc")
    print("\n[demo] pydoc generations (temperature 0.8, nucleus 0.95); each token with its probability:")
    for seed, prompt in enumerate(["Return the", "This module provides", "If the file"]):
        tokens = model.to_tokens(prompt)
        with torch.inference_mode():
            out = generate(model, tokens, 16, temperature=0.8, top_p=0.95, seed=seed)
            probs = model(out).softmax(-1)[0, tokens.shape[1] - 1 : -1]
        new = out[0, tokens.shape[1] :]
        pieces = [f"{model.to_string([t])!r}:{probs[i, t].item():.2f}" for i, t in enumerate(new.tolist())]
        print(f"  {prompt!r} → {model.to_string(new)!r}")
        print("    " + " ".join(pieces))


DEMO_MODELS = ("smollm2", "markov", "facts", "pydoc")
PRETRAINED_MODELS = ("smollm2",)  # made from a file in seconds (lab.zoo.imports), not trained
# Longest first, so that two cores finish together (measured times in benchmarks/results/walltime.json); a job
# that needs another's result (lab.jobs.NEEDS) waits for it, and the next job in this order runs meanwhile.
# The transcoders the demo trains, and with what, for the attribution-graphs page: markov's, small (a minute or two
# on 2 cores: benchmarks/results/walltime.json), since pydoc's at `forma transcoders`' defaults take many minutes.
DEMO_TRANSCODERS = {"markov": ["--features", "256", "--steps", "300", "--windows", "256"]}
DEMO_ORDER = (
    "build smollm2",  # seconds, and the explorer opens on it
    "build pydoc",
    "build markov",
    "transcoders markov",
    "run kl",
    "run calibration",
    "build facts",
    "run hallucination",
    "run equations",
)
