#!/usr/bin/env bash
# The communicator GPU tests with 32 hardware queues, then the demo; logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FUSED_AR_TIMEOUT_S=5 CUDA_DEVICE_MAX_CONNECTIONS=32
OUT=${OUT:-/tmp/fused_ar_out}; mkdir -p "$OUT"
timeout 200 python3 -m pytest -q -x tests/gpu/test_communicator_gpu.py 2>&1 | tee "$OUT/pytest_comm.txt" | tail -12
timeout 60 python3 -m fused_ar demo 2>&1 | tee "$OUT/demo.txt"
