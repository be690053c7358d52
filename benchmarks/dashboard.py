"""How fast each dashboard page answers, in a real browser, after warm-up.

Serves `forma dashboard` from this checkout (its models/ and runs/, or $FORMA_ZOO_DIR and $FORMA_RUNS_DIR:
run `make demo` first so that every page has something to show), opens each page once to warm up
(models load once per server, `st.cache_resource`), then loads it `--rounds` times in Debian's Chromium
(Playwright) and times navigation → the page fully rendered (the script finished, no skeleton or stale
element left, every plotly chart drawn). Two interactions are timed the same way: a new prompt in the
explorer, and a new temperature on the calibration page. Target: ≤ 3 s each on 2 cores. Writes
benchmarks/results/dashboard.json and refreshes the Markdown summary.
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

from benchmarks.summary import write_summary
from benchmarks.timing import machine, write
from dashboards.pages import pages
from lab.cli.dashboard import dashboard_command, free_port, wait_until_serving

CHROMIUM = "/usr/bin/chromium"
# Every page of the dashboard but Compare runs (its selection, not its loading, is what a reader waits on),
# by name and address (dashboards.pages: the registry's experiments among them).
PAGES = {name: "" if name == "home" else name for name, _ in pages() if name != "compare"}
RENDERED = "[data-testid='stApp'][data-test-connection-state='CONNECTED'][data-test-script-state='notRunning']"
SETTLED = (
    "!document.querySelector(\"[data-testid='stSkeleton']\") && !document.querySelector(\"[data-stale='true']\")"
    " && [...document.querySelectorAll(\"[data-testid='stPlotlyChart']\")].every(c => c.querySelector('.main-svg'))"
)
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


def settle(page, timeout_ms: float = 120_000) -> None:
    page.wait_for_selector(RENDERED, timeout=timeout_ms)
    page.wait_for_function(SETTLED, timeout=timeout_ms)


def load_time(page, url: str) -> float:
    start = time.perf_counter()
    page.goto(url)
    settle(page)
    return time.perf_counter() - start


def interaction_time(page, act) -> float:
    """Time from a widget change until the rerun has finished and the page has settled again."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    start = time.perf_counter()
    act()
    try:  # the rerun starts; a very fast one may be over before this looks
        page.wait_for_selector("[data-test-script-state='running']", timeout=5_000, state="attached")
    except PlaywrightTimeout:
        pass
    settle(page)
    return time.perf_counter() - start


def summarise(times: list[float]) -> dict[str, float]:
    return {"median_s": statistics.median(times), "max_s": max(times), "min_s": min(times), "rounds": len(times)}


def _time_interactions(page, url: str, rounds: int) -> dict[str, dict]:
    """The time from an action to the page at rest: a new prompt in the explorer, and a step of the calibration
    page's temperature slider (where the page has one)."""
    interactions = {}
    load_time(page, f"{url}/explorer")
    prompts = ["Return the number of items.", "This module provides functions.", "If the file exists."]
    box = page.get_by_label("Prompt", exact=True)
    interactions["explorer: new prompt"] = summarise(
        [
            interaction_time(page, lambda text=text: (box.fill(text), box.press("Enter")))
            for text in (prompts * rounds)[:rounds]
        ]
    )
    load_time(page, f"{url}/calibration")
    slider = page.get_by_role("slider").first
    if slider.count():
        interactions["calibration: temperature"] = summarise(
            [interaction_time(page, lambda: (slider.focus(), slider.press("ArrowRight"))) for _ in range(rounds)]
        )
    return interactions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if not os.path.exists(CHROMIUM):
        sys.exit(f"needs Debian's chromium at {CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    port = free_port()
    server = subprocess.Popen(
        dashboard_command(port), start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    user_data = tempfile.mkdtemp(prefix="forma-chromium-")
    results = {"benchmark": "dashboard", "machine": machine(), "rounds": args.rounds, "pages": {}, "interactions": {}}
    try:
        wait_until_serving(url, server, timeout_s=120)
        with sync_playwright() as p:
            browser = p.chromium.launch_persistent_context(
                user_data,
                executable_path=CHROMIUM,
                headless=True,
                viewport={"width": 1280, "height": 1100},
                args=CHROMIUM_ARGS,
            )
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda err: errors.append(str(err)))
            warm_up = {name: load_time(page, f"{url}/{path}") for name, path in PAGES.items()}
            for name, path in PAGES.items():
                results["pages"][name] = summarise([load_time(page, f"{url}/{path}") for _ in range(args.rounds)])
                results["pages"][name]["warm_up_s"] = warm_up[name]
                print(
                    f"{name:14s} {results['pages'][name]['median_s']:.2f} s (warm-up {warm_up[name]:.2f} s)", flush=True
                )
            results["interactions"] = _time_interactions(page, url, args.rounds)
            for name, row in results["interactions"].items():
                print(f"{name:28s} {row['median_s']:.2f} s", flush=True)
            results["page_errors"] = errors
            browser.close()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        shutil.rmtree(user_data, ignore_errors=True)
    print(f"wrote {write('dashboard', results)}")
    write_summary()


if __name__ == "__main__":
    main()
