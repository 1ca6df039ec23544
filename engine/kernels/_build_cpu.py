"""cffi (API mode) build of the CPU kernels in csrc/cpu/ as ``engine.kernels._cpu``; run by setup.py.

The cdef is the headers' declarations, read from the headers themselves so the two never
drift. Calls release the GIL (cffi's default): the kernels touch no Python object.
"""

import os
import re

from cffi import FFI

_HERE = os.path.dirname(os.path.abspath(__file__))
_CSRC = os.path.join(os.path.dirname(os.path.dirname(_HERE)), "csrc", "cpu")
_NAMES = (
    "cpu_features",
    "gemv_bf16",
    "paged_attention",
    "activation",
    "quant_types",
    "quant_gemv",
    "quant_moe",
    "int8_gemv",
    "lora_sgmv",
)
_HEADERS = [os.path.join(_CSRC, f"{name}.h") for name in _NAMES]
_INTERNAL_HEADERS = (
    "avx2_math.h",
    "avx512_math.h",
    "paged_attention_impl.h",
    "parallel.h",
    "quant_half.h",
    "quant_scratch.h",
    "quant_kquants.h",
    "quant_gemm.h",
    "quant_gemv_ordered.h",
    "quant_gemv_rows.h",
    "quant_kgemm.h",
    "quant_kblock.h",
    "quant_tile.h",
)
_INTERNAL_SOURCES = (
    "quant_scratch.c",
    "quant_kquants.c",
    "quant_gemm.c",
    "quant_kgemm.c",
    "quant_gemv_ordered.c",
)  # compiled in, declared only in an internal header


def _rel(path):
    """setuptools wants source paths relative to setup.py's folder (the cwd of a build)."""
    try:
        return os.path.relpath(path)
    except ValueError:
        return path


def _cdef() -> str:
    """The headers minus comments and include guards: plain #defines and prototypes."""
    keep = []
    for header in _HEADERS:
        with open(header) as f:
            text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
        keep += [
            line
            for line in text.splitlines()
            if line.strip() and not line.startswith(("#ifndef", "#endif", "#include", "#define RINGLLM_"))
        ]
    return "\n".join(keep)


ffibuilder = FFI()
ffibuilder.cdef(_cdef())
ffibuilder.set_source(
    "engine.kernels._cpu",
    "".join(f'#include "{name}.h"\n' for name in _NAMES),
    sources=[_rel(os.path.join(_CSRC, f"{name}.c")) for name in _NAMES]
    + [_rel(os.path.join(_CSRC, f)) for f in _INTERNAL_SOURCES],
    include_dirs=[_rel(_CSRC)],
    depends=[_rel(h) for h in _HEADERS + [os.path.join(_CSRC, f) for f in _INTERNAL_HEADERS]],
    libraries=["m"],
    # OpenMP (csrc/cpu/parallel.h): libgomp.so.1, the soname of torch's own libgomp, so the process
    # holds one OpenMP runtime and the kernels share torch's thread pool (engine/kernels/cpu.py
    # imports torch first, so torch's copy is the one loaded).
    extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wextra", "-fopenmp"],
    extra_link_args=["-fopenmp"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
