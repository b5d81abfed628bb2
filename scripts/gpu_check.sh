#!/usr/bin/env bash
# One device call: the GPU tests, the example and the add_rmsnorm benchmark, logs and tables under $OUT.
# Runs from the source tree (the device machine has torch, cuda-bindings, NVRTC, filelock, pytest).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/fused_ar_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import cuda.bindings, torch; print('cuda-bindings', cuda.bindings.__version__, 'torch', torch.__version__)" | tee -a "$OUT/gpu.txt"
python3 -m fused_ar info 2>&1 | tee -a "$OUT/gpu.txt"
python3 examples/add_rmsnorm_example.py 2>&1 | tee "$OUT/example.txt"
python3 -m pytest -q -x tests/gpu ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/pytest_gpu.txt" | tail -30
[ "${SKIP_BENCH:-0}" = 1 ] || python3 -m fused_ar bench add_rmsnorm --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tail -45
