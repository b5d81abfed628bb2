#!/usr/bin/env bash
# The benchmark suite in one device call: `python -m fused_ar bench` with BENCH_ARGS, its outputs packed into
# $OUT/bench.tar.gz (the device returns at most 8 files) plus the tables and the log beside it.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/fused_ar_out}; mkdir -p "$OUT"
DIR=$(mktemp -d)/bench
# shellcheck disable=SC2086
timeout "${BENCH_TIMEOUT:-500}" python3 -m fused_ar bench ${BENCH_ARGS:---tp 2,4,8} --out "$DIR" 2>&1 \
  | tee "$OUT/bench_log.txt" | tail -40
tar -czf "$OUT/bench.tar.gz" -C "$(dirname "$DIR")" bench
