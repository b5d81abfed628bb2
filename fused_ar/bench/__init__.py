"""Benchmarks. `sweep` runs `python -m fused_ar bench` (every path and baseline, graph-timed; `group` holds
the ranks, `steps` what each path runs, `timing` the method); `results` and `report` turn its numbers into
tables, CSV/JSON, CDF plots and thresholds on any machine; `add_rmsnorm` times the local kernel alone.
"""
