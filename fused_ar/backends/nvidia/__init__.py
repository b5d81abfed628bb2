"""NVIDIA: NVRTC through cuda-bindings (compiler, loaded only to compile) and the CUDA driver's C API through
ctypes (runtime). Reached only through fused_ar.backends."""
