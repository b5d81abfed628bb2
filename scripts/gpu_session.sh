#!/usr/bin/env bash
# One device call for the open GPU work: the ordering diagnosis, the benchmark (BENCH_ARGS, packed into
# $OUT/bench.tar.gz), the production-path tests, the check cost, then the rest of the GPU suite; logs
# under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUDA_DEVICE_MAX_CONNECTIONS=32
OUT=${OUT:-/tmp/fused_ar_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
python3 -m fused_ar warm --dtype bf16,fp16,fp32 --ngpus 1,2,4,8 2>&1 | tail -1 | tee -a "$OUT/gpu.txt"
{ FUSED_AR_TIMEOUT_S=5 timeout 60 python3 scripts/diag_order.py; FUSED_AR_TIMEOUT_S=5 timeout 60 python3 scripts/diag_mismatch.py; } \
  > "$OUT/diag.txt" 2>&1
grep -c "report=0x0" "$OUT/diag.txt"; grep -i "error\|raised" "$OUT/diag.txt" | grep -v "error=0x0" | head -5
BENCH_TIMEOUT=${BENCH_TIMEOUT:-150} bash scripts/gpu_bench.sh | tail -25
FUSED_AR_TIMEOUT_S=10 timeout "${PROD_TIMEOUT:-240}" python3 -m pytest -q tests/gpu/test_production_gpu.py 2>&1 \
  | tee "$OUT/pytest_production.txt" | grep -E "passed|failed|^FAILED|^E " | head -20
timeout 80 python3 scripts/check_cost.py --ranks 8 --m 1 128 --out "$OUT/check_cost.md" 2>&1 | tail -6
FUSED_AR_TIMEOUT_S=2 timeout "${REST_TIMEOUT:-150}" python3 -m pytest -q tests/gpu --ignore=tests/gpu/test_production_gpu.py \
  --ignore=tests/gpu/test_multi_process.py 2>&1 | tee "$OUT/pytest_gpu.txt" | grep -E "passed|failed|^FAILED|^E " | head -20
timeout "${MULTI_TIMEOUT:-120}" python3 -m pytest -q -rs tests/gpu/test_multi_process.py 2>&1 | tee "$OUT/pytest_multi.txt" \
  | grep -E "passed|failed|^FAILED|^E " | head -10
