#!/usr/bin/env bash
# The test command of README.md: full setup on a fresh machine, then the whole suite (GPU tests skip
# with a reason where no GPU is visible).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/lib/python3.11/site-packages/nvidia/cu13/bin:$PATH"
.venv/bin/python -m pytest "$@"
