"""AMD: hiprtc through hip-python (compiler), the HIP runtime, the offline clang-19 check of the HIP
source and the ISA rules its code objects must pass. Reached only through fused_ar.backends (the clang
check and ISA rules also by tests and tools)."""
