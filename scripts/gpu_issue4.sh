#!/usr/bin/env bash
# Issue 4 on one GPU in one device call: the production-path tests (graphs, timeout, mismatch, fallback,
# custom ops, tp_decode), the check-cost measurement, then the whole GPU suite; logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUDA_DEVICE_MAX_CONNECTIONS=32
OUT=${OUT:-/tmp/fused_ar_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
timeout 60 python3 scripts/diag_mismatch.py 2>&1 | tee "$OUT/diag_mismatch.txt"
FUSED_AR_TIMEOUT_S=10 timeout ${PROD_TIMEOUT:-300} python3 -m pytest -q tests/gpu/test_production_gpu.py 2>&1 \
  | tee "$OUT/pytest_production.txt" | tail -30
if [ "${FULL:-0}" = 1 ]; then
  timeout 100 python3 scripts/check_cost.py --ranks 8 --m 1 128 --out "$OUT/check_cost.md" 2>&1 | tail -12
  FUSED_AR_TIMEOUT_S=2 timeout 170 python3 -m pytest -q tests/gpu --ignore=tests/gpu/test_production_gpu.py 2>&1 \
    | tee "$OUT/pytest_gpu.txt" | grep -E "passed|failed|^FAILED|^E " | head -30
fi
