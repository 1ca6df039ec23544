"""The device and dtype the model runs in: ``device`` "auto" is CUDA only when torch was built for
a GPU and sees one, and dtype "auto" is bf16 only where the hardware computes in it.

The frontend resolves both without importing torch on a CPU-only build (~1.5 s of CPU it has no
other use for): whether torch was built for a GPU is read from its ``version.py``."""

from __future__ import annotations

import ast
import importlib.util
import os
from typing import Any

from engine.config.checks import bad_value
from engine.config.cpu_probe import cpu_has_bf16
from engine.torch_env import prepare_torch_env

DTYPES = ("auto", "float32", "bfloat16", "float16")


def torch_built_for_gpu() -> bool:
    """Whether the installed torch was built for CUDA or ROCm, read from its ``version.py``
    without importing torch. When that file cannot be read, True: torch is asked."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False
    try:
        with open(os.path.join(spec.submodule_search_locations[0], "version.py")) as f:
            tree = ast.parse(f.read())
        builds = {}
        for node in tree.body:
            target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
            if isinstance(target, ast.Name) and target.id in ("cuda", "hip") and node.value is not None:
                builds[target.id] = ast.literal_eval(node.value)
    except (OSError, SyntaxError, ValueError):
        return True
    return builds.get("cuda", True) is not None or builds.get("hip", True) is not None


def resolve_device(device: str) -> str:
    """``device`` ("auto", "cpu" or "cuda") as the device the model will run on."""
    if device not in ("auto", "cpu", "cuda"):
        raise bad_value("device", "'auto', 'cpu' or 'cuda'", device)
    if device == "cpu" or (device == "auto" and not torch_built_for_gpu()):
        return "cpu"
    prepare_torch_env()  # torch's first import in this process may be this one
    import torch  # deferred: only a GPU build of torch is imported, and only here

    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' was asked for but torch sees no CUDA device")
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_dtype(dtype: str, device: str, hf_config: Any) -> str:
    """``dtype`` as float32, bfloat16 or float16; "auto" is bf16 where the device computes in it."""
    if dtype not in DTYPES:
        raise bad_value("dtype", f"one of {DTYPES}", dtype)
    if dtype != "auto":
        return dtype
    if device == "cuda":
        import torch  # deferred: device "cuda" was resolved by importing torch already

        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "bfloat16" if cpu_has_bf16() else "float32"
