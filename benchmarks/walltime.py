"""Wall time of what a user waits for: a clean install, `make demo` after it, and every experiment's profiles.

Everything runs in a fresh clone of this checkout's HEAD in a temporary folder, so nothing built here is
reused (no .venv, no trained zoo model, no run):

    install      `make venv`: a new .venv from constraints.txt, with pip's cache off (PIP_NO_CACHE_DIR=1)
    demo         `make demo` in that clone, until the dashboard answers on its port: the zoo models are
                 trained and each experiment's quick profile runs, as on a user's first day (demo_after_install, at
                 rest); with --busy N, the same while N processes spin on the cores (demo_under_load, a machine
                 under load), the at-rest figure left as it was
    experiments  `forma run NAME --quick` and `forma run NAME` for every experiment, one at a time; and the
                 real-model tracks, `forma run NAME --model smollm2 [--quick]` (profiles real-quick and
                 real-default; the clone builds smollm2 first, `forma build smollm2`)

Each figure is one run (these take minutes; there is no peer to interleave with), measured with the machine
otherwise idle, and each entry names the commit it ran and the load around it (the 1-minute load average at its
start, and for the demo its mean over the run, sampled every 2 s). Writes benchmarks/results/walltime.json and
refreshes the Markdown summary.
"""

import argparse
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.summary import write_summary
from benchmarks.timing import machine, write
from lab.cli.dashboard import free_port, wait_until_serving

REPO = Path(__file__).resolve().parents[1]
STEPS = ("install", "demo", "experiments")
REAL_MODEL = "smollm2"
# profile: (flags of `forma run NAME`, whether it is a real-model track's)
PROFILES = {
    "quick": (["--quick"], False),
    "default": ([], False),
    "real-quick": (["--model", REAL_MODEL, "--quick"], True),
    "real-default": (["--model", REAL_MODEL], True),
}


def timed_run(command: list[str], cwd: Path, env: dict[str, str], log: Path) -> float:
    """Run a command to completion (output to `log`); its wall time in seconds, or an error naming the log."""
    start = time.perf_counter()
    with log.open("w") as out:
        code = subprocess.call(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    if code != 0:
        raise RuntimeError(f"{' '.join(command)} exited with {code}; see {log}")
    return time.perf_counter() - start


def time_demo(clone: Path, env: dict[str, str], log: Path, limit_s: float = 3600) -> dict[str, float]:
    """`make demo` until its dashboard answers (it serves first, while its jobs run), then until the demo
    reports every job done ("[demo] ready in N s": every page filled in)."""
    port = free_port()
    start = time.perf_counter()
    with log.open("w") as out:
        process = subprocess.Popen(
            ["make", "demo", f"DEMO_ARGS=--port {port}"],
            cwd=clone,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_until_serving(f"http://127.0.0.1:{port}", process, timeout_s=limit_s)
            serving = time.perf_counter() - start
            while not ready_lines(log):
                if process.poll() is not None:
                    raise RuntimeError(f"make demo ended before its jobs were done; see {log}")
                if time.perf_counter() - start > limit_s:
                    raise RuntimeError(f"make demo was not ready after {limit_s:.0f} s; see {log}")
                time.sleep(1)
            filled = time.perf_counter() - start
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)
    return {
        "until_dashboard_serves_s": serving,
        "until_every_job_done_s": filled,
        "demo_reported_ready_s": float(ready_lines(log)[-1].split()[3]),
    }


@contextmanager
def load_around(entry: dict) -> Iterator[None]:
    """Record in `entry` the 1-minute load average at the start and its mean over the block (sampled every 2 s)."""
    samples = [os.getloadavg()[0]]
    entry["load_average_1min_at_start"] = samples[0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(2.0):
            samples.append(os.getloadavg()[0])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield
    finally:
        done.set()
        sampler.join()
        entry["load_average_1min_mean"] = sum(samples) / len(samples)


def _spin() -> None:
    while True:
        pass


@contextmanager
def busy(n: int) -> Iterator[None]:
    """n processes spinning on the cores for the block's duration (a machine under load)."""
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(n)]
    for spinner in spinners:
        spinner.start()
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.terminate()
            spinner.join()


def measure_demo(clone: Path, env: dict[str, str], log: Path, commit: str, spinning: int = 0) -> dict:
    """time_demo's figures, with the commit, the load around the run and the processes spinning beside it."""
    entry: dict = {"commit": commit, "busy_processes": spinning}
    with busy(spinning), load_around(entry):
        entry |= time_demo(clone, env, log)
    return entry


def ready_lines(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("[demo] ready in")]


def _clean_env() -> dict[str, str]:
    """The environment every step runs in: this one without Forma's settings or an active venv, offline, pip
    caching nothing (a clean install is timed as a first install)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FORMA_", "VIRTUAL_ENV"))}
    return env | {"PIP_NO_CACHE_DIR": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _experiment_names(clone: Path, env: dict[str, str], real: bool = False) -> list[str]:
    """The experiments the clone's own installed Forma knows (real: those with a real-model track, `--model`)."""
    which = (
        "[e.name for e in experiments.REGISTRY if 'model' in e.options]" if real else "experiments.experiment_names()"
    )
    return subprocess.run(
        [
            str(clone / ".venv" / "bin" / "python"),
            "-c",
            f"import experiments; print(' '.join({which}))",
        ],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()


def time_experiments(
    clone: Path,
    env: dict[str, str],
    root: Path,
    logs: Path,
    profiles: list[str],
    into: dict,
    commit: str,
    only: list[str] | None = None,
) -> None:
    """Each experiment's run of each profile, one at a time, into `into[name][profile]` (entries of earlier
    invocations stay: each names the commit and the load it was measured at)."""
    forma = str(clone / ".venv" / "bin" / "forma")
    if any(PROFILES[profile][1] for profile in profiles):
        timed_run([forma, "build", REAL_MODEL], clone, env, logs / f"build-{REAL_MODEL}.log")
    for profile in profiles:
        flags, real = PROFILES[profile]
        for name in [n for n in _experiment_names(clone, env, real) if not only or n in only]:
            out = root / "runs" / f"{name}-{profile}"
            load = os.getloadavg()[0]
            seconds = timed_run(
                [forma, "run", name, *flags, "--out", str(out)], clone, env, logs / f"{name}-{profile}.log"
            )
            provenance = json.loads((out / "provenance.json").read_text())
            peak = json.loads((out / "results.json").read_text()).get("peak_rss_gb")
            into.setdefault(name, {})[profile] = {
                "process_s": seconds,
                "experiment_s": provenance.get("wall_time_s"),
                "commit": commit,
                "load_average_1min_at_start": load,
            } | ({"peak_rss_gb": peak} if peak is not None else {})
            print(f"forma run {name} {' '.join(flags)}: {seconds:.0f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", choices=STEPS, help="steps to time (default: all)")
    parser.add_argument(
        "--profiles",
        nargs="*",
        choices=tuple(PROFILES),
        default=["quick", "default"],
        help="the experiments step's profiles (default: quick and default; real-quick and real-default time "
        f"`forma run NAME --model {REAL_MODEL} [--quick]`)",
    )
    parser.add_argument(
        "--busy",
        type=int,
        default=0,
        metavar="N",
        help="the demo step times `make demo` while N processes spin on the cores (demo_under_load) instead of at rest",
    )
    parser.add_argument(
        "--experiments", nargs="*", metavar="NAME", help="the experiments step's experiments (default: all)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the clone (its path is printed)")
    args = parser.parse_args()
    steps = set(args.only or STEPS)
    path = REPO / "benchmarks" / "results" / "walltime.json"
    results = json.loads(path.read_text()) if path.is_file() else {}
    results |= {"benchmark": "walltime", "machine": machine(), "load_average_at_start": os.getloadavg()}
    root = Path(tempfile.mkdtemp(prefix="forma-walltime-"))
    clone = root / "forma"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout.strip()
    results["commit"] = commit
    env = _clean_env()
    logs = root / "logs"
    logs.mkdir()
    try:
        seconds = timed_run(["make", "venv"], clone, env, logs / "install.log")  # every step needs it
        if "install" in steps:
            results["clean_install_s"] = seconds
            results["clean_install_commit"] = commit
            print(f"clean install (make venv): {seconds:.0f} s", flush=True)
        if "demo" in steps:
            key = "demo_under_load" if args.busy else "demo_after_install"
            results[key] = measure_demo(clone, env, logs / "demo.log", commit, args.busy)
            print(f"make demo after install ({key}): {results[key]}", flush=True)
        if "experiments" in steps:
            into = results.setdefault("experiments", {})
            time_experiments(clone, env, root, logs, args.profiles, into, commit, args.experiments)
    finally:
        results["clone"] = str(clone) if args.keep else None
        print(f"wrote {write('walltime', results)}")
        write_summary()
        if not args.keep:
            subprocess.run(["rm", "-rf", str(root)])


if __name__ == "__main__":
    sys.exit(main())
