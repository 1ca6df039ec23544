"""Hand-written CPU kernels for the few places torch has no fast path here (C in csrc/cpu/), and
their torch ops (ops.py)."""
