#!/usr/bin/env bash
# Sets up a fresh Debian machine for fused_ar: apt toolchain for the AMD check (clang-19, lld-19,
# llvm-19), a venv in .venv, torch 2.13.0 (the CPU build; a bare `torch` would pull a multi-GB CUDA
# build), and the package (editable) with its cuda, rocm and test extras. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
for tool in clang-19 ld.lld-19 llvm-objdump-19; do
  command -v "$tool" >/dev/null 2>&1 || need_apt+=("$tool")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang-19 lld-19 llvm-19 >/dev/null
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[cuda,rocm,bench,test]"
