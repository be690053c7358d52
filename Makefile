# Forma: `make demo` (main job) and `make test` (the suite).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: venv test bench demo lint clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

test: $(STAMP)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(BIN)/python -m pytest -q

# Peers first (minutes), then what a user waits for (about an hour: a fresh clone's install, `make demo`,
# every experiment's profiles); then the dashboard's response times over this checkout's models and runs,
# the monitor's overhead and the command line's start.
bench: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.forward
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.peers
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.activations
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.walltime
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.dashboard
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.monitor
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.cli

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/forma demo $(DEMO_ARGS)

lint: $(STAMP)
	$(BIN)/python -m compileall -q lab experiments dashboards benchmarks tests

clean:
	rm -rf $(VENV) *.egg-info
