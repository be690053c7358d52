"""The `forma` command line (`python -m lab.cli`, or `forma`: `lab.cli:main`).

The modules: `parser` (build_parser, the argument types, main), `models` (hooks, trust, train), `datasets`
(harvest, patch: a model over a dataset, in one process or as torchrun's ranks), `runs` (run, cards),
`dashboard` (dashboard, and starting and waiting for Streamlit), `demo` (demo), `job_board` (the demo's one line per
job) and `signals` (the signals that end forma, and the processes it starts, which end with it). Each imports what
its command computes with inside the command, so that `forma --help` and an argument error answer without torch.
"""

from lab.cli.dashboard import cmd_dashboard, dashboard_command, free_port, wait_until_serving
from lab.cli.demo import DASHBOARD_START_S, DEMO_MODELS, DEMO_ORDER, cmd_demo, run_side_by_side, show_generations
from lab.cli.job_board import BOARD_EVERY_S, JobBoard, job_progress
from lab.cli.models import cmd_build, cmd_hooks, cmd_trust
from lab.cli.parser import MAX_SEED, build_parser, main, model_name, port_number, seed_number, worker_count
from lab.cli.runs import cmd_cards, cmd_run
from lab.cli.signals import CHILDREN, Children, Stopped

# Every name of the former lab/cli.py module stays importable from lab.cli.
__all__ = [
    "BOARD_EVERY_S",
    "CHILDREN",
    "DASHBOARD_START_S",
    "DEMO_MODELS",
    "DEMO_ORDER",
    "MAX_SEED",
    "Children",
    "JobBoard",
    "Stopped",
    "build_parser",
    "cmd_cards",
    "cmd_dashboard",
    "cmd_demo",
    "cmd_hooks",
    "cmd_run",
    "cmd_build",
    "cmd_trust",
    "dashboard_command",
    "free_port",
    "job_progress",
    "main",
    "model_name",
    "port_number",
    "run_side_by_side",
    "seed_number",
    "show_generations",
    "wait_until_serving",
    "worker_count",
]
