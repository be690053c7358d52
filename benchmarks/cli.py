"""How long the `forma` command takes to answer when it computes nothing: `forma --help`, `forma run --help`
and an argument error, each a fresh process, against two peers timed in the same rounds: a bare Python
start (`python -c pass`, the floor) and `python -c "import torch"` (what any command that computes pays
first). Target: under 1 s each on 2 cores. Writes benchmarks/results/cli.json and refreshes the summary.
"""

import argparse
import os
import subprocess
import sys

from benchmarks.summary import write_summary
from benchmarks.timing import interleaved, machine, write

COMMANDS = {  # name in cli.json: (what it is, the interpreter's arguments)
    "help": ("forma --help", ["-m", "lab.cli", "--help"]),
    "run_help": ("forma run --help", ["-m", "lab.cli", "run", "--help"]),
    "argument_error": ("forma run with an unknown experiment", ["-m", "lab.cli", "run", "no-such-experiment"]),
    "peer_python": ("python -c pass (peer: the floor)", ["-c", "pass"]),
    "peer_import_torch": ("python -c 'import torch' (peer)", ["-c", "import torch"]),
}
TARGET_S = 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    args = parser.parse_args()
    env = os.environ | {"HF_HUB_OFFLINE": "1"}

    def start(argv: list[str]):
        return lambda: subprocess.run([sys.executable, *argv], env=env, capture_output=True, check=False)

    timing = interleaved({name: start(argv) for name, (_, argv) in COMMANDS.items()}, rounds=args.rounds, warmup=1)
    for name, row in timing.items():
        row["command"] = COMMANDS[name][0]
        print(f"{row['command']:40s} {row['median_s']:.3f} s")
    path = write(
        "cli",
        {"machine": machine() | {"load_average_1_5_15": list(os.getloadavg())}, "timing": timing, "target_s": TARGET_S},
    )
    print(f"wrote {path} and {write_summary()}")


if __name__ == "__main__":
    main()
