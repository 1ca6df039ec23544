"""Build and install ringllm.

The shared-memory ring is C (csrc/ring/) compiled as a cffi extension in API mode, so the
hot path is a direct C call with the GIL released around every blocking wait. The CPU
kernels (csrc/cpu/: GEMVs on bf16, GGUF and int8 weights, activations, paged decode
attention) are a second one, registered as torch ops by engine/kernels/ops.py.
"""

from setuptools import find_packages, setup

setup(
    name="ringllm",
    version="0.1.0",
    description="Colocated LLM serving over a shared-memory SPSC ring",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(
        include=["engine", "engine.*", "shm_transport", "shm_transport.*", "benchmarks", "benchmarks.*"]
    ),
    package_data={"benchmarks": ["*.md"]},
    setup_requires=["cffi>=1.16"],
    cffi_modules=[
        "shm_transport/_build_ring.py:ffibuilder",
        "engine/kernels/_build_cpu.py:ffibuilder",
        "engine/structured_output/_build_bitmask.py:ffibuilder",
    ],
    install_requires=[
        "torch==2.13.0",
        "numpy",
        "cffi>=1.16",
        "posix_ipc>=1.1",
        "msgspec>=0.18",
        "cloudpickle",
        "pyzmq>=25",
        "transformers>=4.45",
        "tokenizers",
        "safetensors",
        "accelerate",
        "gguf",
        "aiohttp>=3.14",  # web.RequestKey
        "prometheus_client",
        "tqdm",
        "triton",
        "uvloop",
        "openai",
        "xgrammar>=0.2.8",
        "llguidance>=1.9",
    ],
    extras_require={
        "test": [
            "pytest>=8",
            "pytest-timeout",
            "pytest-xdist",
            "hypothesis",
            "pytest-asyncio",
            "jsonschema",
            "openai-agents",
            "vllm-router",
            "anthropic",
            "ruff==0.17.6",
            "mypy==2.4.1",
            "peft",
        ],
        "bench": ["matplotlib", "sentencepiece"],  # sentencepiece: llama.cpp's convert_hf_to_gguf.py imports it
    },
    entry_points={"console_scripts": ["ringllm=engine.entrypoints.cli:main"]},
)
