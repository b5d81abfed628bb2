"""The fused all-reduce + add + RMSNorm benchmark: the same code and options as `python -m fused_ar bench`
(every path and baseline in one run, graph-timed; tables, CSV/JSON, CDF plots under --out).

    python examples/bench_fused_ar_rmsnorm.py --tp 8 --hidden 8192 --m 1..1024 --out bench_out
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from fused_ar.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["bench", "allreduce_rmsnorm", *sys.argv[1:]]))
