#!/usr/bin/env bash
# The GPU work of a maintainer, from the repository root of a GPU machine with torch, cuda-bindings and NVRTC
# (no setup, no network: the device tool's H200 image), logs and results under $OUT (default /tmp/fused_ar_out).
#
#   bash scripts/gpu.sh suite   the warm matrix, then every GPU test (tests/gpu, or the files in TESTS), a log each
#   bash scripts/gpu.sh user    what a new user runs: the demo and every example with its defaults
#   bash scripts/gpu.sh host    CPU cost of eager calls: python -m fused_ar bench host
#   bash scripts/gpu.sh bench   the all-reduce suite (BENCH_ARGS, default --tp 2,4,8), packed in bench.tar.gz
#   bash scripts/gpu.sh cost    what the kernels' timeout and mismatch checks cost (scripts/check_cost.py)
#   bash scripts/gpu.sh norm    the local add_rmsnorm against torch, its input variants (strided, fp32 weight,
#                               in place) against contiguous rows, and every block size
#   bash scripts/gpu.sh multi   on 2, 4 or 8 GPUs: the probe, the multi-process tests, the bench at every TP
#                               with --write-thresholds, then auto against the best forced path
#   bash scripts/gpu.sh peers   README's add_rmsnorm tables against the engines' kernels (PEER_TABLES, default
#                               "bf16 fp16 fp8"; FlashInfer and Liger where importable), each into $OUT/peers_<table>
# Several subcommands run in order: `bash scripts/gpu.sh suite user host`.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUDA_DEVICE_MAX_CONNECTIONS=32
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # no NVLink multicast
OUT=${OUT:-/tmp/fused_ar_out}; mkdir -p "$OUT"
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)

suite() {
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
  python3 -m fused_ar warm 2>&1 | tail -1 | tee "$OUT/warm.txt"
  for file in ${TESTS:-tests/gpu/test_*.py}; do
    name=$(basename "$file" .py)
    echo "## FUSED_AR_TIMEOUT_S=5 python3 -m pytest -q $file" > "$OUT/$name.txt"
    FUSED_AR_TIMEOUT_S=5 timeout "${TEST_TIMEOUT:-400}" python3 -m pytest -q -rfE "$file" 2>&1 \
      | tee -a "$OUT/$name.txt" | grep -E "passed|failed|^FAILED|^ERROR|^E " | head -12
  done
}

user() {
  { for cmd in "-m fused_ar demo" "examples/add_rmsnorm_example.py" "examples/tp_decode.py"; do
      echo "## python3 $cmd"; timeout 300 python3 $cmd; echo "exit $?"
    done; } > "$OUT/user.txt" 2>&1
  grep -E "^## |^exit |error" "$OUT/user.txt"
}

host() {
  timeout "${HOST_TIMEOUT:-300}" python3 -m fused_ar bench host --out "$OUT/host" 2>&1 | tail -30
}

bench() {
  local dir; dir=$(mktemp -d)/bench
  # shellcheck disable=SC2086
  timeout "${BENCH_TIMEOUT:-500}" python3 -m fused_ar bench ${BENCH_ARGS:---tp 2,4,8} --out "$dir" 2>&1 \
    | tee "$OUT/bench_log.txt" | tail -40
  tar -czf "$OUT/bench.tar.gz" -C "$(dirname "$dir")" bench
}

cost() {
  timeout "${COST_TIMEOUT:-200}" python3 scripts/check_cost.py --ranks 8 --m 1 128 --out "$OUT/check_cost.md" 2>&1 | tail -12
}

norm() {
  timeout "${NORM_TIMEOUT:-400}" python3 -m fused_ar bench add_rmsnorm --dtype bf16 --hidden 2048,4096,8192,16384 \
    --m 1,64,1024,16384 --variants --sweep-blocks --out "$OUT/add_rmsnorm" 2>&1 | tail -30
}

peers() {
  local table args
  for table in ${PEER_TABLES:-bf16 fp16 fp8}; do
    case "$table" in
      bf16) args="--dtype bf16 --hidden 2048,4096,5120,7168,8192 --m 1,2,4,8,16,32,64,128,256,1024,4096" ;;
      fp16) args="--dtype fp16 --hidden 4096,8192 --m 1,16,64,256,1024,4096" ;;
      fp8) args="--dtype bf16 --hidden 4096,8192 --m 1,16,64,256,1024,4096 --fp8" ;;
      *) echo "peers: unknown table '$table' (bf16, fp16, fp8)"; return 2 ;;
    esac
    # shellcheck disable=SC2086
    timeout "${PEERS_TIMEOUT:-560}" python3 -m fused_ar bench add_rmsnorm $args --out "$OUT/peers_$table" \
      > "$OUT/peers_${table}_log.txt" 2>&1
    echo "peers $table: exit $?"; tail -2 "$OUT/peers_${table}_log.txt"
  done
}

multi() {
  local tps d1 d2
  tps=$(python3 -c "print(','.join(str(t) for t in (2, 4, 8) if t <= $GPUS))")
  [ -n "$tps" ] || { echo "multi: needs 2 or more GPUs, this machine has $GPUS"; return 1; }
  nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
  python3 -m fused_ar warm 2>&1 | tail -1
  python3 -m fused_ar probe $(seq 0 $((GPUS - 1))) 2>&1 | tee "$OUT/probe.txt"
  timeout "${TEST_TIMEOUT:-420}" python3 -m pytest -q tests/gpu/test_multi_process.py 2>&1 \
    | tee "$OUT/pytest_multi.txt" | grep -E "passed|failed|^FAILED|^E " | head -20
  d1=$(mktemp -d)/bench; d2=$(mktemp -d)/bench_auto
  timeout "${BENCH_TIMEOUT:-1200}" python3 -m fused_ar bench --tp "$tps" --hidden 4096,7168,8192 --m 1..1024 \
    ${BENCH_ARGS:-} --out "$d1" --write-thresholds 2>&1 | tee "$OUT/bench_log.txt" | tail -30
  timeout "${BENCH_TIMEOUT:-1200}" python3 -m fused_ar bench --tp "$tps" --hidden 4096,7168,8192 --m 1..1024 \
    --paths fused_1stage,fused_2stage,fused_auto,fallback ${BENCH_ARGS:-} --out "$d2" 2>&1 | tail -5
  python3 scripts/auto_vs_best.py "$d2/results.json" --out "$d2/auto_vs_best.md" | tail -3
  tar -czf "$OUT/bench.tar.gz" -C "$(dirname "$d1")" bench -C "$(dirname "$d2")" bench_auto
}

[ $# -gt 0 ] || { sed -n '2,16p' "$0"; exit 2; }
for step in "$@"; do
  case "$step" in
    suite|user|host|bench|cost|norm|peers|multi) echo "== gpu.sh $step"; "$step" ;;
    *) echo "gpu.sh: unknown step '$step' (suite, user, host, bench, cost, norm, peers, multi)"; exit 2 ;;
  esac
done
