"""A tensor-parallel group: the Communicator and what it owns or consults (IPC memory, graph buffers, the
path policy and measured thresholds, the peer-access probe, the kernels' error reports, the registry of
open communicators)."""
