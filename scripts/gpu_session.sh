#!/usr/bin/env bash
# One device call for the open GPU work: the cache warmed, the ordering diagnosis, the benchmark
# (BENCH_ARGS, packed into $OUT/bench.tar.gz), then scripts/gpu_issue4.sh (the production-path tests, the
# rest of the GPU suite, the check cost); logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUDA_DEVICE_MAX_CONNECTIONS=32
OUT=${OUT:-/tmp/fused_ar_out}; mkdir -p "$OUT"
python3 -m fused_ar warm --dtype bf16,fp16,fp32 --ngpus 1,2,4,8 2>&1 | tail -1 | tee "$OUT/warm.txt"
{ FUSED_AR_TIMEOUT_S=5 timeout 60 python3 scripts/diag_order.py; FUSED_AR_TIMEOUT_S=5 timeout 60 python3 scripts/diag_mismatch.py; } \
  > "$OUT/diag.txt" 2>&1
grep -c "report=0x0" "$OUT/diag.txt"; grep -i "error\|raised" "$OUT/diag.txt" | grep -v "error=0x0" | head -5
BENCH_TIMEOUT=${BENCH_TIMEOUT:-150} bash scripts/gpu_bench.sh | tail -25
bash scripts/gpu_issue4.sh
