#!/usr/bin/env bash
# Diagnosis of the N=4 emulation timeout: the failing case alone with the default hardware queues, then
# with CUDA_DEVICE_MAX_CONNECTIONS=32, then the whole communicator suite and the demo with it.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FUSED_AR_TIMEOUT_S=5
OUT=${OUT:-/tmp/fused_ar_out}; mkdir -p "$OUT"
K='N4 and 512 and bfloat16 and 1stage and reference'
echo "== default connections"; CUDA_DEVICE_MAX_CONNECTIONS=8 timeout 45 python3 -m pytest -q -x tests/gpu/test_communicator_gpu.py -k "$K" 2>&1 | grep -E "^E  .*rank|passed|failed" | head -5
export CUDA_DEVICE_MAX_CONNECTIONS=32
echo "== 32 connections"; timeout 45 python3 -m pytest -q -x tests/gpu/test_communicator_gpu.py -k "$K" 2>&1 | grep -E "^E  .*rank|passed|failed" | head -5
export FUSED_AR_TIMEOUT_S=10
timeout 300 python3 -m pytest -q -x tests/gpu 2>&1 | tee "$OUT/pytest_gpu.txt" | tail -15
timeout 90 python3 -m fused_ar demo 2>&1 | tee "$OUT/demo.txt"
