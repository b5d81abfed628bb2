#!/usr/bin/env bash
# The main job of README.md: set up, warm the kernel cache for sm_90 (works with no GPU: NVRTC only),
# and where a GPU is visible run the example against the reference.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m fused_ar warm --arch "${FUSED_AR_WARM_ARCH:-sm_90}" --dtype bf16,fp16,fp32
if .venv/bin/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  .venv/bin/python examples/add_rmsnorm_example.py
else
  echo "no GPU visible: cache warmed; the example needs a GPU"
fi
