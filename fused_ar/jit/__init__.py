"""What to build and how it is kept: spec, the op table, render, the compiler and runtime interfaces, the
disk cache (trust, locks, remembered verdicts) and warming. Names no vendor: a backend implements the
interfaces here and fused_ar.backends picks one."""
