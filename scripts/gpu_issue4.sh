#!/usr/bin/env bash
# Issue 4 on one GPU in one device call: the production-path tests (graphs, timeout, mismatch, custom ops,
# fallback, tp_decode), the GPU suite outside that file (every kernel path against the reference), then
# the check-cost measurement (COST=0 skips it); logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUDA_DEVICE_MAX_CONNECTIONS=32
OUT=${OUT:-/tmp/fused_ar_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
echo "## FUSED_AR_TIMEOUT_S=10 python3 -m pytest -v --timeout 280 tests/gpu/test_production_gpu.py" > "$OUT/pytest_production.txt"
FUSED_AR_TIMEOUT_S=10 timeout "${PROD_TIMEOUT:-400}" python3 -m pytest -v -rA --durations=0 --timeout 280 \
  tests/gpu/test_production_gpu.py 2>&1 | tee -a "$OUT/pytest_production.txt" | grep -E "PASS|FAIL|SKIP|passed|failed|^E " | head -40
echo "## FUSED_AR_TIMEOUT_S=2 python3 -m pytest -q tests/gpu --ignore=tests/gpu/test_production_gpu.py" > "$OUT/pytest_gpu.txt"
FUSED_AR_TIMEOUT_S=2 timeout "${REST_TIMEOUT:-170}" python3 -m pytest -q tests/gpu --ignore=tests/gpu/test_production_gpu.py \
  2>&1 | tee -a "$OUT/pytest_gpu.txt" | grep -E "passed|failed|^FAILED|^E " | head -20
[ "${COST:-1}" = 1 ] && timeout "${COST_TIMEOUT:-200}" python3 scripts/check_cost.py --ranks 8 --m 1 128 --out "$OUT/check_cost.md" 2>&1 | tail -12
