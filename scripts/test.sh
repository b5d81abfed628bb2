#!/usr/bin/env bash
# The test command of README.md: full setup on a fresh machine, then the whole suite (GPU tests skip
# with a reason where no GPU is visible; the real-hiprtc tests (ROCm 5.2 and 6.4) must run, not skip, and so must the tests
# against the engines' own modules unless the package registry could not be reached).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/rocm.sh
bash scripts/engines.sh
export PATH="$PWD/.venv/lib/python3.11/site-packages/nvidia/cu13/bin:$PATH"
export LD_LIBRARY_PATH="$PWD/.venv/rocm-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
.venv/bin/python -m pytest --require-hiprtc --require-engines "$@"
