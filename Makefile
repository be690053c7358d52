# Forma: `make demo` (main job) and `make test` (the suite).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# The SAE environment: forma-lab[sae] beside transformer-lens 3.9, since sae-lens does not install beside 4.
SAE_VENV  := .venv-sae
SAE_STAMP := $(SAE_VENV)/.installed
OFFLINE   := HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1

.PHONY: venv venv-sae test test-sae bench demo lint clean

venv: $(STAMP)

venv-sae: $(SAE_STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# .venv-sae sees .venv's packages behind its own (a .pth file adds .venv's site-packages after its own), so
# only what differs installs into it: transformer-lens 3.9, sae-lens and sae-lens's own dependencies. pip never
# changes .venv from there ("outside environment"), and .venv-sae's own copies come first on its path.
$(SAE_STAMP): $(STAMP) pyproject.toml constraints-sae.txt
	test -x $(SAE_VENV)/bin/python || $(PY) -m venv $(SAE_VENV)
	echo "import site; site.addsitedir('$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')')" \
	  > "$$($(SAE_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/forma-base.pth"
	$(SAE_VENV)/bin/python -m pip install -q -c constraints-sae.txt -e '.[sae]'
	touch $(SAE_STAMP)

# The SAE environment's tests first (test-sae), then the whole suite in .venv.
test: $(STAMP) test-sae
	$(OFFLINE) $(BIN)/python -m pytest -q --durations=25

# SAELens' trainer on a Forma hook (tests/sae), TransformerLens's own tests on Forma and on transformer-lens 3.9's
# HookedTransformer (tests/transformer_lens, which writes docs/measured/transformer_lens.json), and the model's own
# tests on transformer-lens 3.9.
test-sae: $(SAE_STAMP)
	$(OFFLINE) $(SAE_VENV)/bin/python -m pytest -q tests/sae tests/transformer_lens tests/test_model.py tests/test_hook_misuse.py tests/test_lens.py

# Peers first (minutes; the harvest against SAELens runs in the SAE environment), then what a user waits for
# (about an hour: a fresh clone's install, `make demo`, every experiment's profiles); then the dashboard's
# response times over this checkout's models and runs, the monitor's overhead, the command line's start and
# how soon `forma demo` serves and shows progress.
bench: $(STAMP) $(SAE_STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.forward
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.peers
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.real_sizes
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.patching
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.activations
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.harvest
	$(OFFLINE) $(SAE_VENV)/bin/python -m benchmarks.harvest_saelens
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.walltime
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.dashboard
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.monitor
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.cli
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.demo

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/forma demo $(DEMO_ARGS)

lint: $(STAMP)
	$(BIN)/python -m compileall -q lab experiments dashboards benchmarks tests

clean:
	rm -rf $(VENV) $(SAE_VENV) *.egg-info
