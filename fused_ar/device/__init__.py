"""One GPU: a spec's loaded function and typed launch, launch plans per call key, the input rules, and the
single-GPU ops (add_rmsnorm, add_rmsnorm_fp8) that are also the fallback's epilogue."""
