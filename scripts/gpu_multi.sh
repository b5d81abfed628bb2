#!/usr/bin/env bash
# Issue 6 in one device call on a multi-GPU kind (nvidia-h200-x2/-x4/-x8), results under $OUT:
# 1. the real peer-access probe and the GPU suite with one process per GPU (tests/gpu/test_multi_process.py:
#    every path, dtype and shape, 200-call stress, graphs, timeout, mismatch; TP up to the GPUs here);
# 2. the benchmark at those TPs, hidden 4096/7168/8192, bf16, m = 1..1024, every path and baseline, with
#    --write-thresholds; 3. the benchmark again after the thresholds, and auto against the best forced path.
# NVLink multicast stays off. On one GPU this is a dry run (tests share the GPU, the bench emulates).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUDA_DEVICE_MAX_CONNECTIONS=32
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/fused_ar_out}; mkdir -p "$OUT"
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())")
TPS=$(python3 -c "print(','.join(str(t) for t in (2, 4, 8) if t <= max($GPUS, 8 if $GPUS == 1 else 0)))")
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1; nvidia-smi >> "$OUT/topo.txt" 2>&1
python3 -m fused_ar warm --ngpus 1,2,4,8 2>&1 | tail -1
python3 -m fused_ar.probe $(seq 0 $((GPUS - 1))) 2>&1 | tee "$OUT/probe.txt"
timeout "${TEST_TIMEOUT:-420}" python3 -m pytest -q tests/gpu/test_multi_process.py 2>&1 | tee "$OUT/pytest_multi.txt" \
  | grep -E "passed|failed|^FAILED|^E " | head -20
D1=$(mktemp -d)/bench; D2=$(mktemp -d)/bench_auto
timeout "${BENCH_TIMEOUT:-1200}" python3 -m fused_ar bench --tp "$TPS" --hidden 4096,7168,8192 --m 1..1024 \
  ${BENCH_ARGS:-} --out "$D1" $([ "$GPUS" -gt 1 ] && echo --write-thresholds) 2>&1 | tee "$OUT/bench_log.txt" | tail -30
if [ "$GPUS" -gt 1 ]; then
  timeout "${BENCH_TIMEOUT:-1200}" python3 -m fused_ar bench --tp "$TPS" --hidden 4096,7168,8192 --m 1..1024 \
    --paths fused_1stage,fused_2stage,fused_auto,fallback ${BENCH_ARGS:-} --out "$D2" 2>&1 | tail -5
  python3 scripts/auto_vs_best.py "$D2/results.json" --out "$D2/auto_vs_best.md" | tail -3
fi
tar -czf "$OUT/bench.tar.gz" -C "$(dirname "$D1")" bench $([ -d "$D2" ] && echo -C "$(dirname "$D2")" bench_auto)
