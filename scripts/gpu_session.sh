#!/usr/bin/env bash
# One device call for the open GPU work, most needed first: the ordering diagnosis, the production-path
# tests, the check cost, the whole GPU suite, then a short benchmark (BENCH_ARGS); logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUDA_DEVICE_MAX_CONNECTIONS=32
OUT=${OUT:-/tmp/fused_ar_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
python3 -m fused_ar warm --dtype bf16,fp16,fp32 --ngpus 1,2,4,8 2>&1 | tail -1 | tee -a "$OUT/gpu.txt"
FUSED_AR_TIMEOUT_S=5 timeout 60 python3 scripts/diag_order.py > "$OUT/diag.txt" 2>&1
FUSED_AR_TIMEOUT_S=5 timeout 60 python3 scripts/diag_mismatch.py >> "$OUT/diag.txt" 2>&1
tail -4 "$OUT/diag.txt"
FUSED_AR_TIMEOUT_S=10 timeout "${PROD_TIMEOUT:-240}" python3 -m pytest -q -x tests/gpu/test_production_gpu.py 2>&1 \
  | tee "$OUT/pytest_production.txt" | grep -E "passed|failed|^FAILED|^E " | head -20
timeout 90 python3 scripts/check_cost.py --ranks 8 --m 1 128 --out "$OUT/check_cost.md" 2>&1 | tail -6
FUSED_AR_TIMEOUT_S=2 timeout 150 python3 -m pytest -q tests/gpu --ignore=tests/gpu/test_production_gpu.py 2>&1 \
  | tee "$OUT/pytest_gpu.txt" | grep -E "passed|failed|^FAILED|^E " | head -20
BENCH_TIMEOUT=${BENCH_TIMEOUT:-120} bash scripts/gpu_bench.sh
