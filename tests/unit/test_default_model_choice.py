"""Which weights the default model runs from: its own Q4_1 GGUF on the CPU kind where Q4_1 served
a batch of 64 faster than bf16 (Zen4: AVX-512 VNNI and BF16, no AMX; benchmarks/RESULTS.md), the
converted float directory on every other kind and whenever a dtype, quantization or load format
is asked for (engine/config/model_discovery.py, ``default_runs_its_gguf``). The CPU flags are set per test, so
each kind is checked on any host."""

from __future__ import annotations

import pytest

import engine.config.cpu_probe as cpu_probe
import engine.config.device_config as device_config
from engine.config import DEFAULT_MODEL, EngineArgs
from engine.models.default_model import GGUF_NAME

ZEN4 = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"}
SPR = ZEN4 | {"amx_tile", "amx_bf16", "amx_int8"}
AVX2_ONLY = {"avx2", "fma", "f16c"}


@pytest.fixture
def cpu_flags(monkeypatch):
    def use(flags):
        monkeypatch.setattr(cpu_probe, "cpu_flags", lambda: set(flags))
        monkeypatch.setattr(device_config, "resolve_device", lambda device: "cpu")

    return use


def _model_config(**kwargs):
    return EngineArgs(**kwargs).create_engine_config().model_config


@pytest.mark.skipif(not cpu_probe.cpu_kernels_built(), reason="the CPU kernels are not built")
def test_the_default_runs_its_q4_1_file_on_zen4(cpu_flags):
    cpu_flags(ZEN4)
    mc = _model_config()
    assert (mc.load_format, mc.quantization) == ("gguf", "gguf")
    assert mc.model_path.endswith(GGUF_NAME) and mc.served_model_name == DEFAULT_MODEL


@pytest.mark.parametrize("flags", [SPR, AVX2_ONLY], ids=["amx", "avx2"])
def test_other_cpu_kinds_keep_the_float_directory(cpu_flags, flags):
    cpu_flags(flags)
    mc = _model_config()
    assert (mc.load_format, mc.quantization) == ("safetensors", None)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(dtype="bfloat16"),
        dict(dtype="float32"),
        dict(quantization="int8"),
        dict(load_format="dummy"),
        dict(compilation_config=1),
    ],
    ids=["bf16", "fp32", "int8", "dummy", "compiled"],
)
def test_an_explicit_request_keeps_the_float_directory_on_zen4(cpu_flags, kwargs):
    if kwargs.get("quantization") == "int8" and not cpu_probe.int8_kernel_built():
        pytest.skip("the W8A8 kernels are not built")
    cpu_flags(ZEN4)
    mc = _model_config(**kwargs)
    assert mc.load_format in ("safetensors", "dummy") and mc.quantization == kwargs.get("quantization")


@pytest.mark.parametrize("flags", [ZEN4, SPR, AVX2_ONLY], ids=["zen4", "amx", "avx2"])
@pytest.mark.parametrize(
    "kwargs", [dict(quantization="gguf"), dict(load_format="gguf")], ids=["quantization", "load_format"]
)
def test_asking_for_gguf_runs_the_default_from_its_file_on_any_cpu(cpu_flags, flags, kwargs):
    # Used to be refused ("quantization must be 'gguf' only with a .gguf model file, got 'gguf'"),
    # and load_format="gguf" silently ran the float directory.
    cpu_flags(flags)
    mc = _model_config(**kwargs)
    assert (mc.load_format, mc.quantization) == ("gguf", "gguf")
    assert mc.model_path.endswith(GGUF_NAME) and mc.served_model_name == DEFAULT_MODEL


def test_gguf_quantization_with_another_load_format_names_load_format(cpu_flags):
    cpu_flags(AVX2_ONLY)
    with pytest.raises(ValueError, match="load_format must be 'auto' or 'gguf' for a .gguf model, got 'dummy'"):
        _model_config(quantization="gguf", load_format="dummy")
