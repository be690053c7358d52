"""The `forma` command line (`python -m lab.cli`, or `forma`: `lab.cli:main`).

The modules: `parser` (build_parser, the argument types, main), `models` (hooks, trust, train), `datasets`
(harvest, patch: a model over a dataset, in one process or as torchrun's ranks), `runs` (run, cards),
`dashboard` (dashboard, and starting and waiting for Streamlit), `demo` (demo), `job_board` (the demo's one line per
job) and `signals` (the signals that end forma, and the processes it starts, which end with it). Each imports what
its command computes with inside the command, so that `forma --help` and an argument error answer without torch.
"""
