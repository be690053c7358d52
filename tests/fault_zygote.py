"""A process that imports Forma once and forks `forma` commands on request, for the fault trials.

Starting Python, torch and Forma costs seconds, paid once here instead of by each of the dozens of
runs that the trials kill. Each child is a fork that runs `lab.cli.parser.main(argv)` exactly as
`python -m lab.cli ARGV` does after its imports, with its own environment, its output in a log file,
and optionally a fault planted by an audit hook (PEP 578), which sees every file operation Python
makes before the operation happens:

    {"kill": N}                       SIGKILL itself just before watched file operation number N
    {"signal": "SIGINT", "at": N}     send itself the signal just before watched operation N
    {"trace": PATH}                   append every watched operation to PATH, one JSON line each (with a fault
                                      too: the trace ends with the operation it was planted before)
    {"match": SUFFIX, ...}            count only the operations on paths that end with SUFFIX
    {"event": EVENT, ...}             count only the operations of that kind ("os.rename", "os.remove", …)

Watched operations: renames (os.rename, os.replace), symlinks, removals, rmtree, mkstemp/mkdtemp and
opening a file for writing. Protocol, one JSON object a line: {"run": {argv, env, log, fault}} →
{"pid": P}; {"wait": P} → {"status": S} (the exit code, or −signal); {"quit": true} ends the zygote.

    python -m tests.fault_zygote     (the test starts it at the thread count a user's process gets; as a module,
                                      so that tests/transformer_lens never stands in for the package)

The tests talk to it through classes Zygote (the server) and Forks (a test's children), below.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(REPO)}

WATCHED = {
    "os.rename",
    "os.symlink",
    "os.remove",
    "os.rmdir",
    "shutil.rmtree",
    "tempfile.mkstemp",
    "tempfile.mkdtemp",
    "open",
}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT


def watched_path(event: str, args: tuple) -> str | None:
    """The path a watched operation acts on (the destination, for a rename or a link), else None."""
    if event not in WATCHED:
        return None
    if event == "open":
        path, mode, flags = args
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & WRITE_FLAGS
        )
        return str(path) if writing and isinstance(path, (str, bytes, os.PathLike)) else None
    if event in ("os.rename", "os.symlink"):
        return str(args[1])
    return str(args[0])


def plant(fault: dict) -> None:
    """Install the audit hook that carries out `fault` in this (child) process."""
    seen = count = 0
    trace = os.open(fault["trace"], os.O_WRONLY | os.O_CREAT | os.O_APPEND) if "trace" in fault else None
    when = fault.get("kill", fault.get("at"))
    signum = signal.SIGKILL if "kill" in fault else getattr(signal, fault.get("signal", "SIGKILL"))
    suffix, kind = fault.get("match", ""), fault.get("event")

    def hook(event: str, args: tuple) -> None:
        nonlocal seen, count
        path = watched_path(event, args)
        if path is None:
            return
        seen += 1
        if trace is not None:  # every watched operation, whatever the fault counts
            os.write(trace, (json.dumps({"n": seen, "event": event, "path": path}) + "\n").encode())
        if path.endswith(suffix) and kind in (None, event):
            count += 1
            if count == when:
                os.kill(os.getpid(), signum)

    sys.addaudithook(hook)


def child(request: dict) -> None:
    os.environ.update(request.get("env", {}))
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 1)
    os.dup2(log, 2)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a fresh interpreter
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    code = 1
    try:
        if request.get("fault"):
            plant(request["fault"])
        from lab.cli.parser import main

        code = main(request["argv"])
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    import torch

    import lab.cli.parser
    import lab.train.loop
    import lab.zoo.building  # noqa: F401

    lab.cli.parser.build_parser()  # imports the experiments, as every `forma` command does
    import plotly.graph_objects  # noqa: F401  (every run's figures)

    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])  # its first use imports torch._dynamo (seconds)
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if "run" in request:
            pid = os.fork()
            if pid == 0:
                child(request["run"])
            print(json.dumps({"pid": pid}), flush=True)
        elif "wait" in request:
            _, status = os.waitpid(request["wait"], 0)
            print(json.dumps({"status": os.waitstatus_to_exitcode(status)}), flush=True)
        elif request.get("quit"):
            return


class Zygote:
    """The fork server, started once for the session's fault trials (tests/conftest.py::fault_zygote)."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.fault_zygote"],
            cwd=REPO,
            env=os.environ | ENV,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert "ready" in self.ask({})

    def ask(self, request: dict) -> dict:
        if request:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, "the fault zygote died"
        return json.loads(line)

    def close(self) -> None:
        self.process.stdin.write(json.dumps({"quit": True}) + "\n")
        self.process.stdin.close()
        self.process.wait(timeout=60)


class Forks:
    """One test's children of the fork server: run(argv) → pid, wait(pid) → exit status (−signal if killed).
    `env` is added to each child's environment (FORMA_ZOO_DIR, FORMA_RUNS_DIR); each child's output goes to a
    log in `logs`."""

    def __init__(self, zygote: Zygote, logs: Path, env: dict[str, str]) -> None:
        self.zygote, self.logs, self.env, self.runs = zygote, logs, env, 0

    def run(self, argv: list[str], fault: dict | None = None) -> tuple[int, Path]:
        self.runs += 1
        log = self.logs / f"{self.runs:03d}-{'-'.join(argv[:2])}.log"
        request = {"argv": argv, "env": self.env, "log": str(log), "fault": fault}
        return self.zygote.ask({"run": request})["pid"], log

    def wait(self, pid: int) -> int:
        return self.zygote.ask({"wait": pid})["status"]

    def call(self, argv: list[str], fault: dict | None = None) -> tuple[int, str]:
        pid, log = self.run(argv, fault)
        return self.wait(pid), log.read_text()


if __name__ == "__main__":
    main()
