"""How soon `forma demo` shows something: from its start to the dashboard's first page served, and to the
first progress a page shows.

Each round starts `forma demo --quick --only EXPERIMENT` (default kl, whose job trains, so its progress has a
step / total) in a fresh private runs folder ($FORMA_RUNS_DIR; this checkout's zoo, which --only leaves
alone) and times, from the moment the process is started:
    health          the server's health check answers `ok`;
    first_page      the home page served: HTTP 200 for / with Streamlit's page, and the app's content drawn
                    in Debian's Chromium (Playwright): the script finished, its title there;
    first_progress  the experiment's page shows its job's progress bar (lab.progress, read by the page);
    first_step      that bar counts steps (the job's training has begun: "step k/N").
Then the demo is stopped (SIGTERM to its process group). Target: first page ≤ 30 s on 2 cores. Writes
benchmarks/results/demo.json.
"""

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.timing import machine, write
from lab.cli.dashboard import free_port, wait_until_serving

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
RENDERED = "[data-testid='stApp'][data-test-connection-state='CONNECTED'][data-test-script-state='notRunning']"
TARGET_FIRST_PAGE_S = 30.0
MARKS = ("health", "first_page", "first_progress", "first_step")


def served(url: str) -> bool:
    """GET / answers 200 with Streamlit's page (the app's shell, which the browser then fills)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200 and b"<title>Streamlit</title>" in response.read()
    except OSError:
        return False


def one_round(experiment: str, browser, limit_s: float) -> dict[str, float]:
    """Seconds from `forma demo`'s start to each of MARKS."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="forma-demo-bench-") as runs:
        env = os.environ | {"FORMA_RUNS_DIR": runs, "HF_HUB_OFFLINE": "1"}
        start = time.perf_counter()
        demo = subprocess.Popen(
            [sys.executable, "-m", "lab.cli", "demo", "--quick", "--only", experiment, "--port", str(port)],
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        marks: dict[str, float] = {}
        try:
            wait_until_serving(url, demo, timeout_s=limit_s)
            marks["health"] = time.perf_counter() - start
            while not served(url):
                time.sleep(0.1)
            page = browser.new_page()
            try:
                page.goto(url)
                page.wait_for_selector(RENDERED, timeout=limit_s * 1000)
                page.get_by_text("Forma").first.wait_for(timeout=limit_s * 1000)
                marks["first_page"] = time.perf_counter() - start
                page.goto(f"{url}/{experiment}")
                page.wait_for_selector("[data-testid='stProgress']", timeout=limit_s * 1000)
                marks["first_progress"] = time.perf_counter() - start
                page.locator("[data-testid='stProgress']", has_text="step").first.wait_for(timeout=limit_s * 1000)
                marks["first_step"] = time.perf_counter() - start
            finally:
                page.close()
        finally:
            os.killpg(demo.pid, signal.SIGTERM)
            demo.wait(timeout=60)
    return marks


def main() -> None:
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="demo starts to time (default 3)")
    parser.add_argument("--experiment", default="kl", help="the demo's one job: `forma run NAME --quick` (default kl)")
    parser.add_argument("--limit", type=float, default=600.0, help="seconds to wait for each mark (default 600)")
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        raise SystemExit(f"benchmarks.demo needs Debian's chromium at {CHROMIUM} (apt-get install chromium)")
    load = list(os.getloadavg())
    rounds = []
    user_data = Path(tempfile.mkdtemp(prefix="forma-chromium-"))
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(user_data),
            executable_path=CHROMIUM,
            headless=True,
            viewport={"width": 1280, "height": 1100},
            args=CHROMIUM_ARGS,
        )
        try:
            for index in range(args.rounds):
                rounds.append(one_round(args.experiment, context, args.limit))
                print(f"round {index + 1}: " + ", ".join(f"{k} {v:.1f} s" for k, v in rounds[-1].items()), flush=True)
        finally:
            context.close()
            shutil.rmtree(user_data, ignore_errors=True)
    timing = {
        mark: {
            "median_s": statistics.median(r[mark] for r in rounds),
            "min_s": min(r[mark] for r in rounds),
            "max_s": max(r[mark] for r in rounds),
            "rounds": len(rounds),
        }
        for mark in MARKS
    }
    for mark, row in timing.items():
        print(f"forma demo start → {mark:15s} {row['median_s']:.1f} s (median of {row['rounds']})")
    path = write(
        "demo",
        {
            "machine": machine() | {"load_average_1_5_15": load},
            "command": f"forma demo --quick --only {args.experiment}",
            "timing": timing,
            "target_first_page_s": TARGET_FIRST_PAGE_S,
            "per_round": rounds,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
