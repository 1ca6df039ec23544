"""cffi (API mode) build of csrc/gemv_bf16.c as ``engine.kernels._gemv``; run by setup.py.

The cdef is the header's declarations, read from csrc/gemv_bf16.h itself so the two never
drift. Calls release the GIL (cffi's default): the kernel touches no Python object.
"""
import os
import re

from cffi import FFI

_HERE = os.path.dirname(os.path.abspath(__file__))
_CSRC = os.path.join(os.path.dirname(os.path.dirname(_HERE)), "csrc")
_HEADER = os.path.join(_CSRC, "gemv_bf16.h")


def _rel(path):
    """setuptools wants source paths relative to setup.py's folder (the cwd of a build)."""
    try:
        return os.path.relpath(path)
    except ValueError:
        return path


def _cdef() -> str:
    """The header minus comments and include guards: plain #defines and prototypes."""
    with open(_HEADER) as f:
        text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
    keep = [line for line in text.splitlines()
            if line.strip() and not line.startswith(("#ifndef", "#endif", "#include", "#define RINGLLM_"))]
    return "\n".join(keep)


ffibuilder = FFI()
ffibuilder.cdef(_cdef())
ffibuilder.set_source(
    "engine.kernels._gemv",
    '#include "gemv_bf16.h"\n',
    sources=[_rel(os.path.join(_CSRC, "gemv_bf16.c"))],
    include_dirs=[_rel(_CSRC)],
    depends=[_rel(_HEADER)],
    extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wextra"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
