"""What this host's CPU and build can run, read without importing torch or the kernels: the CPU's
feature flags (/proc/cpuinfo), whether the C kernels were built, and the model's thread count.

Apart from the config's rules so that tests can pretend to be another CPU by replacing one
function here (``cpu_flags``)."""

from __future__ import annotations

import importlib.util
import os


_KERNELS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kernels")


def cpu_flags() -> set[str]:
    """The CPU's feature flags as /proc/cpuinfo lists them (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[-1].split())
    except OSError:
        pass
    return set()


def cpu_has_bf16() -> bool:
    flags = cpu_flags()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_kernels_built() -> bool:
    """Whether the compiled CPU kernels (engine/kernels/_cpu.*.so) are there, without importing them."""
    return any(name.startswith("_cpu.") and name.endswith(".so") for name in os.listdir(_KERNELS_DIR))


def int8_kernel_built() -> bool:
    """Whether the W8A8 kernels are importable and built, checked without importing torch."""
    return importlib.util.find_spec("engine.kernels.int8_linear") is not None and cpu_kernels_built()
