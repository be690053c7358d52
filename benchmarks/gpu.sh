#!/usr/bin/env bash
# The GPU check: CUDA tests, then every benchmark that takes a device, on the GPU. Run on a machine with a GPU
# whose Python already has torch and transformers; the other packages come as wheels in .whl/ (see README).
# Results: benchmarks/results/*_cuda.json and summary_cuda.md (copied to $OUT when it is set).
# benchmarks.harvest_saelens runs in the SAE environment (sae-lens beside transformer-lens 3.9): $SAE_PYTHON,
# by default .venv-sae/bin/python; where that Python has no sae_lens it is reported and skipped.
# Without a GPU it says so and runs nothing (exit 0). A benchmark module that is not in this checkout is
# reported and skipped; one that fails is reported, the others still run, and the exit status is 1.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
SAE_PY=${SAE_PYTHON:-.venv-sae/bin/python}
if [ -d .whl ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1

# module, then its arguments on the GPU (each gets --device cuda): every benchmark of issue 21 (real sizes,
# patching sweeps and attribution, harvesting against the bridge and against SAELens), then the streaming one, then
# harvests and sweeps on 2 ranks against 1 (2 GPUs; on 1 GPU it records the 1-rank figures and says why).
BENCHMARKS=(
  "peers --rounds 21 --batch 8 --tokens 256 --new-tokens 256"
  "real_sizes --rounds 11"
  "patching --heads-by-position"
  "harvest --batch 8 --batches 4 --memory-sequences 64 --rounds 5"
  "harvest_saelens --batch 8 --batches 4 --rounds 5"
  "activations"
  "distributed --rounds 5 --sequences 2048 --pairs 96"
)
python_for() {  # the interpreter a benchmark runs in
  if [ "$1" = harvest_saelens ]; then echo "$SAE_PY"; else echo "$PY"; fi
}
planned=()  # the plan first, GPU or not: which benchmarks this checkout has, and which of them take a device
for entry in "${BENCHMARKS[@]}"; do
  read -r module _ <<<"$entry"
  if [ ! -f "benchmarks/$module.py" ]; then
    echo "benchmarks.$module: not in this checkout, skipped"
  elif ! grep -q -- '"--device"' "benchmarks/$module.py"; then  # its argparse option, read without importing torch
    echo "benchmarks.$module: takes no --device (it measures the CPU), skipped"
  elif [ "$module" = harvest_saelens ] && ! "$SAE_PY" -c \
      "import importlib.util, sys; sys.exit(importlib.util.find_spec('sae_lens') is None)" 2>/dev/null; then
    echo "benchmarks.$module: no SAE environment ($SAE_PY has no sae_lens; set SAE_PYTHON), skipped"
  else
    echo "benchmarks.$module: will run on the GPU"
    planned+=("$entry")
  fi
done
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "benchmarks/gpu.sh: no CUDA GPU here (torch.cuda.is_available() is False, or torch is missing): the GPU" \
       "benchmarks need one, so nothing was run. On the CPU: make bench." >&2
  exit 0
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'gpu', torch.cuda.get_device_name())"
[ "${SKIP_TESTS:-0}" = 1 ] || "$PY" -m pytest -q -p no:cacheprovider tests/lab/model/test_cuda.py tests/lab/model/test_model.py tests/lab/test_generate.py 2>&1 | tail -25

failed=()
for entry in ${planned[@]+"${planned[@]}"}; do
  read -r module args <<<"$entry"
  echo "== benchmarks.$module --device cuda $args"
  # shellcheck disable=SC2086  # the arguments are words
  "$(python_for "$module")" -m "benchmarks.$module" --device cuda $args || failed+=("$module")
done
"$PY" -c "from benchmarks.summary import write_summary; print(write_summary('cuda').read_text())" || failed+=(summary)
if [ -n "${OUT:-}" ]; then cp benchmarks/results/*_cuda.json benchmarks/results/summary_cuda.md "$OUT"/ 2>/dev/null; fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "benchmarks/gpu.sh: failed: ${failed[*]}" >&2
  exit 1
fi
echo "benchmarks/gpu.sh: done"
