#!/usr/bin/env bash
# Sets up a fresh Debian machine (12 or 13) for fused_ar's tests and main job, skipping what is there:
#  - apt: clang-19, lld-19, llvm-19 (the offline AMD compile and disassembly) and the ROCm runtime that the
#    release offers (libamdhip64, hiprtc builtins, comgr: a real hiprtc, no GPU needed);
#  - .venv/rocm-lib/libhiprtc.so and libamdhip64.so, links to the libraries that provide hiprtc and HIP
#    (hip-python opens those unversioned names, which only ROCm's -dev packages carry; on ROCm 5.x hiprtc
#    lives inside libamdhip64); scripts/test.sh puts the directory on LD_LIBRARY_PATH;
#  - a venv in .venv with torch 2.13.0 (the CPU build; a bare `torch` would pull a multi-GB CUDA build) and
#    the package (editable) with its cuda, rocm, bench and test extras.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "setup: $*"; }
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
# Wait for another apt/dpkg (unattended upgrades, a parallel setup) instead of failing on its lock.
APT=(env DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 -y -qq)

first_available() {  # the first of the named packages this release offers
  for pkg in "$@"; do
    if apt-cache show "$pkg" >/dev/null 2>&1; then echo "$pkg"; return; fi
  done
}

need=()
for tool in clang-19 ld.lld-19 llvm-objdump-19 llvm-readelf-19 opt-19; do
  command -v "$tool" >/dev/null 2>&1 || need+=("$tool")
done
so_path() { ldconfig -p | awk -v re="$1" '$1 ~ re {print $NF}' | sort | head -1; }
hip_lib() { so_path '^libamdhip64\\.so\\.[0-9]'; }
# ROCm >= 6 ships libhiprtc.so.N; ROCm 5.x has hiprtc inside libamdhip64.
rocm_lib() { local rtc; rtc=$(so_path '^libhiprtc\\.so\\.[0-9]'); echo "${rtc:-$(hip_lib)}"; }
if [ ${#need[@]} -gt 0 ] || [ -z "$(rocm_lib)" ]; then
  say "apt-get update (missing: ${need[*]:-} $([ -z "$(rocm_lib)" ] && echo 'ROCm runtime'))"
  "${APT[@]}" update
  packages=(clang-19 lld-19 llvm-19)
  for choice in "libamdhip64-6 libamdhip64-5" "libhiprtc6 libhiprtc5" "libhiprtc-builtins6 libhiprtc-builtins5" \
                "libamd-comgr3 libamd-comgr2"; do
    # shellcheck disable=SC2086
    pkg=$(first_available $choice)
    [ -n "$pkg" ] && packages+=("$pkg")
  done
  say "apt-get install ${packages[*]}"
  "${APT[@]}" install "${packages[@]}" >/dev/null
else
  say "clang-19, llvm-19 and the ROCm runtime are installed"
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
lib=$(rocm_lib)
if [ -n "$lib" ]; then
  mkdir -p .venv/rocm-lib
  ln -sfn "$lib" .venv/rocm-lib/libhiprtc.so
  ln -sfn "$(hip_lib)" .venv/rocm-lib/libamdhip64.so
  say "hiprtc: .venv/rocm-lib/libhiprtc.so -> $lib, libamdhip64.so -> $(hip_lib)"
else
  say "no ROCm runtime found: the real-hiprtc tests will fail under scripts/test.sh"
fi
if ! .venv/bin/python -c "import torch, sys; sys.exit(torch.__version__ != '2.13.0+cpu')" 2>/dev/null; then
  say "pip install torch==2.13.0 (CPU build)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "torch==2.13.0"
fi
# strict: the package is found through a link tree, so a directory named fused_ar in the working directory
# (the clone itself, seen from its parent) cannot shadow it as an empty namespace package
say "pip install -e .[cuda,rocm,bench,test] (editable_mode=strict)"
.venv/bin/python -m pip install -q -e ".[cuda,rocm,bench,test]" --config-settings editable_mode=strict
say "done"
