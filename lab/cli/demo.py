"""`forma demo`: from a fresh clone to a filled-in dashboard. The dashboard serves first; the missing zoo
models train and the missing quick runs run side by side (`run_side_by_side`, one line each on the board),
then the pydoc model's generations are shown with each token's probability."""

import argparse
import sys

from lab.cli.board import JobBoard
from lab.cli.children import CHILDREN, Stopped
from lab.cli.dashboard import dashboard_command, wait_until_serving


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
    from lab.generate import generate

    model = HookedTransformer.from_pretrained("pydoc")
    print("\n[demo] pydoc generations (temperature 0.8, nucleus 0.95); each token with its probability:")
    for seed, prompt in enumerate(["Return the", "This module provides", "If the file"]):
        tokens = model.to_tokens(prompt)
        with torch.inference_mode():
            out = generate(model, tokens, 16, temperature=0.8, top_p=0.95, seed=seed)
            probs = model(out).softmax(-1)[0, tokens.shape[1] - 1 : -1]
        new = out[0, tokens.shape[1]:]
        pieces = [f"{model.to_string([t])!r}:{probs[i, t].item():.2f}" for i, t in enumerate(new.tolist())]
        print(f"  {prompt!r} → {model.to_string(new)!r}")
        print("    " + " ".join(pieces))


DEMO_MODELS = ("markov", "facts", "pydoc")
# Longest first, so that two cores finish together (measured times in benchmarks/results/walltime.json).
DEMO_ORDER = ("train pydoc", "train markov", "run kl", "run calibration", "train facts", "run hallucination",
              "run equations")
