#!/usr/bin/env bash
# Diagnosis of the N=4 emulation timeout (scripts/diag_local_group.py dumps every rank's signal buffer on a
# timeout), variants that isolate the cause, then the whole GPU suite and the demo; logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FUSED_AR_TIMEOUT_S=2 CUDA_DEVICE_MAX_CONNECTIONS=32
OUT=${OUT:-/tmp/fused_ar_out}; mkdir -p "$OUT"
D="timeout 40 python3 scripts/diag_local_group.py"
{
echo "== N4 n512 bf16 1stage, as the test";            $D --ranks 4
echo "== same, CUDA_MODULE_LOADING=EAGER";               CUDA_MODULE_LOADING=EAGER $D --ranks 4
echo "== same, max_bytes 16 MiB";                        $D --ranks 4 --max-bytes $((16 << 20))
echo "== same, fused only";                              $D --ranks 4 --plain 0
echo "== N8 n4096";                                      $D --ranks 8 --n 4096
echo "== isolated pytest case";  timeout 60 python3 -m pytest -q -x tests/gpu/test_communicator_gpu.py \
    -k 'N4 and 512 and bfloat16 and 1stage and reference' 2>&1 | grep -E "^E  .*rank|passed|failed" | head -5
} 2>&1 | tee "$OUT/diag.txt"
timeout 330 python3 -m pytest -q tests/gpu 2>&1 | tee "$OUT/pytest_gpu.txt" | grep -E "passed|failed|^FAILED|^E  .*rank" | head -40
