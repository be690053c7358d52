"""`forma dashboard`: Streamlit serving the app on 127.0.0.1 as a child of `forma`, and the helpers the demo,
the tests and the benchmarks start and wait for it with (`dashboard_command`, `free_port`,
`wait_until_serving`)."""

import argparse
import socket
import sys
import time
import urllib.request
from pathlib import Path

from lab.cli.stopping import CHILDREN, Stopped


def dashboard_command(port: int) -> list[str]:
    """The Streamlit command line: bound to 127.0.0.1, headless, no usage statistics, no file watcher."""
    app = Path(__file__).resolve().parents[2] / "dashboards" / "app.py"
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(app),
        "--server.headless",
        "true",
        "--server.address",
        "127.0.0.1",
        "--server.port",
        str(port),
        "--browser.gatherUsageStats",
        "false",
        "--server.fileWatcherType",
        "none",
        "--client.toolbarMode",
        "viewer",
    ]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_serving(url: str, process, timeout_s: float) -> None:
    """Block until the dashboard at `url` answers its health check; RuntimeError if `process` exits first
    or `timeout_s` passes (the tests, the demo's wall-time benchmark and the response benchmark wait so)."""
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
