#!/usr/bin/env bash
# The second real hiprtc the tests compile with, beside Debian stable's ROCm 5.2 (scripts/setup.sh): ROCm 6.4.3
# from Debian's unstable suite, unpacked into .venv/rocm64 by scripts/hiprtc-sid.sh (a private prefix run under
# that suite's own loader, nothing installed into the system; its LLVM 21 disassembles gfx950), and hip-python
# 6.4.3 (the bindings released with ROCm 6.4) in .venv/hip-python-6.4, beside the newest that the [rocm] extra
# installs into .venv. Re-running reuses what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
HIP_PYTHON_ROCM64=hip-python==6.4.3.555.40
bash scripts/hiprtc-sid.sh .venv/rocm64 .venv/bin/python --objdump
if [ ! -d .venv/hip-python-6.4/hip ]; then
  echo "rocm: pip install --target .venv/hip-python-6.4 $HIP_PYTHON_ROCM64"
  .venv/bin/python -m pip install -q --no-deps --target .venv/hip-python-6.4 "$HIP_PYTHON_ROCM64"
fi
