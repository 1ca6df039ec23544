"""cffi (API mode) build of the C ring in csrc/ring/ as the extension module ``shm_transport._ring``.

Run by setuptools through ``cffi_modules`` in setup.py. API mode compiles a real extension, so
every call is a direct C call, and cffi releases the GIL around each one (the default, kept on
purpose: blocking waits must let other Python threads run).
"""

import os
import re

from cffi import FFI

_HERE = os.path.dirname(os.path.abspath(__file__))
_CSRC = os.path.join(os.path.dirname(_HERE), "csrc", "ring")


def _rel(path):
    """setuptools wants source paths relative to setup.py's folder (the cwd of a build)."""
    try:
        return os.path.relpath(path)
    except ValueError:
        return path


_SOURCES = ("ring.c", "producer.c", "consumer.c", "wake.c")
_HEADERS = ("ring.h", "ring_atomic.h", "ring_internal.h", "ring_wake.h")

_BEGIN, _END = "/* cffi-cdef: begin */", "/* cffi-cdef: end */"
_DEFINE = re.compile(r"^(\s*#\s*define\s+[A-Za-z_]\w*)\s+.*$", re.MULTILINE)


def cdef_from_header(path: str) -> str:
    """The declarations cffi binds, taken from ring.h (its single source of truth): the text
    between each begin/end marker pair, with #define values left to the compiler ("...")."""
    with open(path) as f:
        text = f.read()
    parts = []
    pos = 0
    while True:
        begin = text.find(_BEGIN, pos)
        if begin < 0:
            break
        end = text.find(_END, begin)
        if end < 0:
            raise ValueError(f"{path}: {_BEGIN} without a matching {_END}")
        parts.append(text[begin + len(_BEGIN) : end])
        pos = end + len(_END)
    if not parts:
        raise ValueError(f"{path}: no {_BEGIN} ... {_END} section")
    return _DEFINE.sub(r"\1 ...", "\n".join(parts))


CDEF = cdef_from_header(os.path.join(_CSRC, "ring.h"))

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "shm_transport._ring",
    '#include "ring.h"\n',
    sources=[_rel(os.path.join(_CSRC, name)) for name in _SOURCES],
    include_dirs=[_rel(_CSRC)],
    depends=[_rel(os.path.join(_CSRC, name)) for name in _SOURCES + _HEADERS],
    extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wextra"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
