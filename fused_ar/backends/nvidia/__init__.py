"""NVIDIA: NVRTC through cuda-bindings (compiler) and the CUDA driver (runtime). Reached only through
fused_ar.backends."""
