"""`python -m fused_ar ...`: see fused_ar.cli."""

from .cli import main

raise SystemExit(main())
