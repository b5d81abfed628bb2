#!/usr/bin/env bash
# One device call for the communicator: demo, GPU tests (communicator first), the warm timing; under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FUSED_AR_TIMEOUT_S=${FUSED_AR_TIMEOUT_S:-10}
OUT=${OUT:-/tmp/fused_ar_out}; mkdir -p "$OUT"
[ "${SKIP_DEMO:-0}" = 1 ] || timeout 120 python3 -m fused_ar demo 2>&1 | tee "$OUT/demo.txt"
rm -rf /tmp/warmcache
FUSED_AR_CACHE_DIR=/tmp/warmcache python3 -m fused_ar warm --dtype bf16 --ngpus 2,4,8 -j 16 > "$OUT/warm.txt" 2>&1; tail -1 "$OUT/warm.txt"
timeout ${TEST_TIMEOUT:-400} python3 -m pytest -q -x ${PYTEST_FILES:-tests/gpu} ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 | tee "$OUT/pytest_gpu.txt" | tail -25
