"""cffi (API mode) build of csrc/cpu/token_bitmask.c as ``engine.structured_output._bitmask``; run by
setup.py (or ``python engine/structured_output/_build_bitmask.py`` from the repository root).
A module of its own, so building it never replaces the kernels a running engine has loaded."""

import os

from cffi import FFI

_HERE = os.path.dirname(os.path.abspath(__file__))
_CSRC = os.path.join(os.path.dirname(os.path.dirname(_HERE)), "csrc", "cpu")


def _rel(path):
    try:
        return os.path.relpath(path)
    except ValueError:
        return path


def _builder(place=_rel) -> FFI:
    ffi = FFI()
    ffi.cdef(
        "void ringllm_apply_token_bitmask_f32(float *logits, int64_t row_stride, const int32_t *bitmask, "
        "int64_t words, const int64_t *rows, int64_t n_rows, int64_t vocab);"
    )
    ffi.set_source(
        "engine.structured_output._bitmask",
        '#include "token_bitmask.h"\n',
        sources=[place(os.path.join(_CSRC, "token_bitmask.c"))],
        include_dirs=[place(_CSRC)],
        depends=[place(os.path.join(_CSRC, "token_bitmask.h"))],
        libraries=["m"],
        extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wextra"],
    )
    return ffi


ffibuilder = _builder()

if __name__ == "__main__":
    import glob
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:  # the generated C and objects stay out of the tree
        built = _builder(os.path.abspath).compile(tmpdir=tmp, verbose=False)
        for old in glob.glob(os.path.join(_HERE, "_bitmask.*.so")):
            os.unlink(old)  # unlinked, not overwritten: a process that loaded it keeps its copy
        shutil.copy(built, os.path.join(_HERE, os.path.basename(built)))
