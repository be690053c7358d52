#!/usr/bin/env bash
# The GPU check: CUDA tests, then the peer benchmarks on the device. Run on a machine with a GPU whose
# Python already has torch and transformers; the other packages come as wheels in .whl/ (see README).
# Results: benchmarks/results/peers_cuda.json and summary_cuda.md (copied to $OUT when it is set).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
[ "${SKIP_TESTS:-0}" = 1 ] || python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_model.py tests/test_generate.py 2>&1 | tail -25
python3 -m benchmarks.peers --device cuda --rounds 21 --batch 8 --tokens 256 --new-tokens 256
if [ -n "${OUT:-}" ]; then cp benchmarks/results/peers_cuda.json benchmarks/results/summary_cuda.md "$OUT"/ 2>/dev/null; fi
