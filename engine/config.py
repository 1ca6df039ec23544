"""Engine arguments and the frozen configuration derived from them.

``EngineArgs`` is the one schema shared by ``LLM``, ``AsyncLLM`` and the
``ringllm serve`` flags (vLLM's field names). ``create_engine_config()`` is the
only place a config is derived and validated: every bad value raises ValueError
naming the field and what is allowed.
"""
from __future__ import annotations

import ast
import dataclasses
import importlib.util
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Optional, Union

from engine.hf_config import check_config_values, config_from_dict, read_hf_config
from engine.kv_events_config import KVEventsConfig, resolve_kv_events_config
from engine.kv_transfer.config import KVTransferConfig, resolve_kv_transfer_config
from engine.lora.config import LoRAConfig, resolve_lora_config
from engine.models import SUPPORTED_ARCHITECTURES  # the registry's names (it imports nothing)
from engine.pooler_config import PoolerConfig, classifier_labels, is_classifier, resolve_runner
from engine.spec_decode.config import SpeculativeConfig, resolve_speculative_config
from engine.structured_output.config import StructuredOutputsConfig, resolve_structured_outputs_config
from engine.thread_policy import default_num_threads

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
SEQS_PER_REQUEST_IN_BATCHES = 8  # see EngineConfig.max_seqs_per_request
# ``max_num_prefill_tokens="auto"`` (engine/core/prefill_pacer.py): each step near this long, and
# this cap until measured (the fixed cap chosen on the slowest CPU measured, float32 on one AVX2
# core: ~0.5 s a step). Here, not in the pacer, so that the config imports nothing of the core.
PACED_STEP_TARGET_S = 0.5
PACED_INITIAL_TOKENS = 128
_GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}
_DTYPES = ("auto", "float32", "bfloat16", "float16")
_LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")


def _bad(field_name: str, allowed: str, value: Any) -> ValueError:
    return ValueError(f"{field_name} must be {allowed}, got {value!r}")


@dataclass
class CompilationConfig:
    """mode 0 runs the model eagerly; mode >= 1 runs its forward through torch.compile.
    cudagraph_capture_sizes: decode batch sizes captured as CUDA graphs on a GPU (None: the
    default ladder, engine/worker/cuda_graphs.py; []: none, as ``enforce_eager=True`` sets)."""

    mode: int = 0
    cudagraph_capture_sizes: Optional[list[int]] = None

    def __post_init__(self) -> None:
        if not isinstance(self.mode, int) or not 0 <= self.mode <= 3:
            raise _bad("compilation_config.mode", "an int in [0, 3]", self.mode)
        sizes = self.cudagraph_capture_sizes
        if sizes is not None and not (isinstance(sizes, (list, tuple)) and all(
                isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in sizes)):
            raise _bad("compilation_config.cudagraph_capture_sizes", "a list of positive ints", sizes)


@dataclass
class EngineArgs:
    model: str = DEFAULT_MODEL
    tokenizer: Optional[str] = None
    trust_remote_code: bool = False
    dtype: str = "auto"
    seed: Optional[int] = 0
    max_model_len: Optional[int] = None
    block_size: int = 16
    max_num_seqs: Optional[int] = None
    max_num_batched_tokens: Optional[int] = None
    # Most prompt tokens computed in one step (decodes not counted); None/0: no cap; "auto": as
    # many as fit a time budget per step, measured (engine/core/prefill_pacer.py). `ringllm
    # serve` on CPU uses "auto" (see engine/entrypoints/serve.py).
    max_num_prefill_tokens: Optional[Union[int, Literal["auto"]]] = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    load_format: str = "auto"
    device: str = "auto"
    # KV cache bytes (vLLM's name; CPU default 2 GiB, CUDA: gpu_memory_utilization)
    kv_cache_memory_bytes: Optional[int] = None
    kv_cache_memory: Optional[int] = None  # the same, by its older ringllm name
    gpu_memory_utilization: float = 0.9
    max_logprobs: int = 20
    max_prompt_logprobs_entries: int = 65536  # prompt tokens x (prompt_logprobs + 1) x n, per request
    num_threads: Optional[int] = None  # torch threads in the process that runs the model
    enforce_eager: bool = False
    compilation_config: Optional[CompilationConfig | int | dict] = None
    data_parallel_size: int = 1
    data_parallel_rank: Optional[int] = None
    data_parallel_external_lb: bool = False
    transport: Literal["shm", "zmq"] = "shm"
    ring_capacity: int = 1 << 22  # bytes per ring direction
    skip_tokenizer_init: bool = False
    disable_log_stats: bool = False
    renderer_num_workers: int = 1
    served_model_name: Optional[str] = None
    hf_overrides: Optional[dict] = None
    # vLLM keywords for what ringllm runs one way only: accepted at that value, refused otherwise.
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    quantization: Optional[str] = None
    # Seconds AsyncLLM.shutdown() gives the EngineCore(s) to exit before killing them.
    shutdown_timeout: float = 5.0
    # The EngineCore's worker: "auto" (engine.worker.Worker), a dotted path "module.Class" or
    # a Worker subclass, cloudpickled to the EngineCore process at launch (see _worker_cls).
    worker_cls: Union[str, type] = "auto"
    # vLLM's KV connector config (engine/kv_transfer/): a dict or a KVTransferConfig.
    kv_transfer_config: Optional[KVTransferConfig | dict] = None
    # vLLM's KV-cache events (engine/core/kv_events.py): a dict or a KVEventsConfig.
    kv_events_config: Optional[KVEventsConfig | dict] = None
    # Structured outputs (engine/structured_output/): {"backend": "auto" | "xgrammar" | "guidance", ...}.
    structured_outputs_config: Optional[StructuredOutputsConfig | dict] = None
    # vLLM's runner and convert: "pooling" serves a *ForCausalLM as an embedding model
    # (convert "embed": the final normed hidden states, pooled as pooler_config says).
    runner: Literal["auto", "generate", "pooling"] = "auto"
    convert: Literal["auto", "none", "embed"] = "auto"
    pooler_config: Optional[PoolerConfig | dict] = None
    # Greedy output (tokens and logprobs) the same at any batch size and with or without
    # prefix-cache hits: one kernel path per op whatever the row count (vLLM's batch invariance,
    # VLLM_BATCH_INVARIANT). CPU, eager forward only; costs speed (README, "Determinism").
    deterministic: bool = False
    # vLLM's speculative decoding (engine/spec_decode/): a dict, e.g. {"method": "ngram",
    # "num_speculative_tokens": 4, "prompt_lookup_max": 5}, or a SpeculativeConfig.
    speculative_config: Optional[SpeculativeConfig | dict] = None
    # vLLM's LoRA serving (engine/lora/): requests may name an adapter (lora_request); at most
    # max_loras adapters run in one step, each of rank <= max_lora_rank; max_cpu_loras stay loaded.
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: Optional[int] = None

    def create_engine_config(self) -> "EngineConfig":
        return create_engine_config(self)

    @classmethod
    def from_cli_args(cls, args: Any) -> "EngineArgs":
        """From an argparse namespace holding one attribute per field, as the flags that
        ``engine.entrypoints.cli_args.add_engine_args`` generates from this dataclass."""
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


@dataclass
class AsyncEngineArgs(EngineArgs):
    enable_log_requests: bool = False


@dataclass(frozen=True)
class ModelConfig:
    model: str  # what the user asked for (name or path)
    model_path: str  # resolved local HF directory or .gguf file
    tokenizer: str  # local directory (or .gguf file) holding the tokenizer
    load_format: str  # resolved: safetensors | gguf | dummy
    hf_config: Any  # engine.hf_config.HFConfig, or a transformers PretrainedConfig for other models
    architecture: str
    dtype: str  # resolved: float32 | bfloat16 | float16
    max_model_len: int
    vocab_size: int
    seed: Optional[int]
    max_logprobs: int
    max_prompt_logprobs_entries: int
    served_model_name: str
    skip_tokenizer_init: bool
    runner_type: str = "generate"  # resolved: generate | pooling
    convert_type: str = "none"  # resolved: none | embed
    pooler_config: Optional[PoolerConfig] = None  # resolved (pooling_type, normalize) with runner "pooling"
    quantization: Optional[str] = None  # resolved: None | "gguf" (a .gguf model's own blocks) | "int8" (W8A8)
    deterministic: bool = False  # batch-invariant kernels (EngineArgs.deterministic)

    @property
    def pooling_task(self) -> Optional[str]:
        """What the pooler computes: "classify" for a *ForSequenceClassification model, "embed"
        for a decoder served with runner "pooling", None for a generating model."""
        if self.runner_type != "pooling":
            return None
        return "classify" if is_classifier(self.architecture) else "embed"

    @property
    def classifier_labels(self) -> Optional[list[str]]:
        """A classification model's labels in class order (``id2label``); None for other models."""
        return classifier_labels(self.hf_config) if self.pooling_task == "classify" else None

    @property
    def gguf_file(self) -> Optional[str]:
        return self.model_path if self.load_format == "gguf" else None


@dataclass(frozen=True)
class CacheConfig:
    block_size: int
    enable_prefix_caching: bool
    kv_cache_memory: Optional[int]  # bytes; None (CUDA, not given): the runner sizes by gpu_memory_utilization
    gpu_memory_utilization: float


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool
    policy: str
    max_num_prefill_tokens: int = 0  # 0: no cap beyond max_num_batched_tokens; the first cap when paced
    prefill_step_target_s: float = 0.0  # > 0: the cap follows this time per step (prefill_pacer.py)


@dataclass(frozen=True)
class ParallelConfig:
    data_parallel_size: int
    data_parallel_rank: Optional[int]
    data_parallel_external_lb: bool

    @property
    def frontend_engine_indices(self) -> list[int]:
        """The ranks one frontend launches and talks to: all of them, or only its own when an
        external load balancer spreads requests over one frontend per rank."""
        if self.data_parallel_size > 1 and self.data_parallel_external_lb:
            return [self.data_parallel_rank or 0]
        return list(range(self.data_parallel_size))


@dataclass(frozen=True)
class CoreLaunch:
    """What starting EngineCore processes takes, known from the arguments alone (``core_launch``).

    Why apart from EngineConfig: the core derives its own EngineConfig from ``engine_args``, so it
    can start importing torch and loading the model while the frontend reads the model's config
    and tokenizer; one after the other, the two were most of the start-up time."""
    transport: str
    ring_capacity: int
    num_threads: int
    worker_cls: Union[str, type]
    parallel_config: ParallelConfig
    engine_args: EngineArgs = field(repr=False, compare=False, default=None)


@dataclass(frozen=True)
class EngineConfig:
    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    parallel_config: ParallelConfig
    compilation_config: CompilationConfig
    device: str  # resolved: cpu | cuda
    num_threads: int
    transport: str
    ring_capacity: int
    disable_log_stats: bool
    engine_args: EngineArgs = field(repr=False, compare=False, default=None)
    worker_cls: Union[str, type] = "auto"  # "auto", a dotted path or an engine.worker.Worker subclass
    kv_transfer_config: Optional[KVTransferConfig] = None  # validated; None: no KV connector
    kv_events_config: Optional[KVEventsConfig] = None  # validated; None: no KV events published
    speculative_config: Optional[SpeculativeConfig] = None  # validated; None: no speculative decoding
    lora_config: Optional[LoRAConfig] = None  # validated; None: no LoRA adapters (enable_lora=False)

    @property
    def core_launch(self) -> CoreLaunch:
        return CoreLaunch(self.transport, self.ring_capacity, self.num_threads, self.worker_cls,
                          self.parallel_config, self.engine_args)

    @property
    def max_seqs_per_request(self) -> int:
        """The most sequences (prompts x n) one request may ask for: SEQS_PER_REQUEST_IN_BATCHES
        scheduler batches (max_num_seqs, over all data-parallel ranks). More could never run
        together and would hold the engine for many batch lengths; the server refuses such a
        request with a 400 (split it), and every entry point refuses such an ``n``."""
        batch = self.scheduler_config.max_num_seqs * self.parallel_config.data_parallel_size
        return SEQS_PER_REQUEST_IN_BATCHES * batch


def _resolve_model(args: EngineArgs) -> tuple[str, str]:
    """Return (local path, load format); never touches the network."""
    model = args.model
    if model in (None, "", DEFAULT_MODEL):
        from engine.models.default_model import default_gguf_path, default_model_path

        if not _default_runs_its_gguf(args):
            return default_model_path(), ("dummy" if args.load_format == "dummy" else "safetensors")
        model = default_gguf_path()  # checked below as any .gguf model
    path = os.path.expanduser(model)
    if path.endswith(".gguf"):
        if not os.path.isfile(path):
            raise ValueError(f"model: GGUF file {path!r} does not exist")
        if args.load_format not in ("auto", "gguf"):
            raise _bad("load_format", "'auto' or 'gguf' for a .gguf model", args.load_format)
        return path, "gguf"
    if not os.path.isdir(path):
        raise ValueError(
            f"model: {model!r} is not a local directory or .gguf file "
            "(ringllm never downloads from a model hub)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(f"model: directory {path!r} has no config.json")
    fmt = "safetensors" if args.load_format == "auto" else args.load_format
    if fmt == "gguf":
        raise _bad("load_format", "'auto', 'safetensors' or 'dummy' for an HF directory", fmt)
    return path, fmt


def _default_runs_its_gguf(args: EngineArgs) -> bool:
    """Whether the default model runs from its own Q4_1 GGUF (quantization "gguf") instead of the
    converted float directory: always when quantization or load_format "gguf" is asked for (only
    the file has GGUF blocks); otherwise when no dtype, quantization, load format, runner or
    compiled forward is asked for, on the CPU kind where Q4_1 served a batch of 64 faster than
    bf16. That is the Zen4 kind (AVX-512 VNNI and BF16, no AMX): benchmarks/RESULTS.md,
    "Quantized kernels, per call (Zen4)" (offline 64 x 128 490-498 vs 405-426 tok/s, the same
    run; the int8 GEMM beat oneDNN's bf16 GEMM on every projection shape from 8 rows). Kinds not
    measured that way (AVX2 only; AMX, where oneDNN's bf16 GEMMs run on AMX tiles) keep the float
    directory."""
    if "gguf" in (args.quantization, args.load_format):
        return True
    if (args.dtype != "auto" or args.quantization is not None or args.load_format != "auto"
            or args.runner not in ("auto", "generate") or args.convert not in ("auto", "none")
            or args.pooler_config is not None or _compilation(args.compilation_config, args.enforce_eager).mode != 0
            or resolve_device(args.device) != "cpu" or not _cpu_kernels_built()):
        return False
    flags = _cpu_flags()
    return {"avx512_vnni", "avx512_bf16"} <= flags and "amx_tile" not in flags


def _tokenizer_for(path: str) -> str:
    """Where a model's tokenizer is read: its own directory or file, except the embedded
    default model's GGUF, whose tokenizer is already converted (reading it from the GGUF
    takes transformers ~10 s in each process)."""
    if path.endswith(".gguf"):
        from engine.models.default_model import GGUF_NAME, default_gguf_path, default_tokenizer_path

        if os.path.basename(path) == GGUF_NAME and os.path.realpath(path) == os.path.realpath(default_gguf_path()):
            return default_tokenizer_path()
    return path


def _config_file(path: str, load_format: str) -> str:
    """The file a model's config comes from, for error messages."""
    return path if load_format == "gguf" else os.path.join(path, "config.json")


def _load_hf_config(path: str, load_format: str, args: EngineArgs) -> Any:
    """The model's config: read as JSON (or from a GGUF's metadata) for the model types ringllm
    runs (engine/hf_config.py: no transformers, no torch), through ``AutoConfig`` otherwise."""
    if load_format == "gguf":
        from engine.gguf_file import config_dict  # its metadata, as config.json's fields

        data = config_dict(path)
        cfg = None if data is None else config_from_dict(data, path) or _transformers_config(data, path)
    else:
        cfg = read_hf_config(path)
    if cfg is None:
        cfg = _auto_config(path, load_format, args)
    for key, value in (args.hf_overrides or {}).items():
        setattr(cfg, key, value)
    return cfg


def _transformers_config(data: dict[str, Any], path: str) -> Any:
    """A GGUF's fields (engine/gguf_file.py) in transformers' config class for their model type,
    which derives what the file leaves out (Gemma's layer types, rope parameters) as HF does."""
    from transformers import AutoConfig

    check_config_values(data, path)
    return AutoConfig.for_model(**data)


def _auto_config(path: str, load_format: str, args: EngineArgs) -> Any:
    from transformers import AutoConfig

    if load_format == "gguf":
        return AutoConfig.from_pretrained(os.path.dirname(path) or ".", gguf_file=os.path.basename(path))
    return AutoConfig.from_pretrained(path, trust_remote_code=args.trust_remote_code)


def _cpu_flags() -> set[str]:
    """The CPU's feature flags as /proc/cpuinfo lists them (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[-1].split())
    except OSError:
        pass
    return set()


def _cpu_has_bf16() -> bool:
    flags = _cpu_flags()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _torch_built_for_gpu() -> bool:
    """Whether the installed torch was built for CUDA or ROCm, read from its ``version.py``
    without importing torch (~1.5 s of CPU the frontend has no other use for). When that file
    cannot be read, True: torch is asked."""
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
        raise _bad("device", "'auto', 'cpu' or 'cuda'", device)
    if device == "cpu" or (device == "auto" and not _torch_built_for_gpu()):
        return "cpu"
    from engine.torch_env import prepare_torch_env

    prepare_torch_env()  # torch's first import in this process may be this one
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' was asked for but torch sees no CUDA device")
    return "cuda" if torch.cuda.is_available() else "cpu"


def _resolve_dtype(dtype: str, device: str, hf_config: Any) -> str:
    if dtype not in _DTYPES:
        raise _bad("dtype", f"one of {_DTYPES}", dtype)
    if dtype != "auto":
        return dtype
    if device == "cuda":
        import torch

        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "bfloat16" if _cpu_has_bf16() else "float32"


def _positive_int(name: str, value: Any, low: int = 1, high: Optional[int] = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        rng = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise _bad(name, f"an int {rng}", value)
    return value


def _compilation(value: Any, enforce_eager: bool) -> CompilationConfig:
    if value is None:
        cfg = CompilationConfig()
    elif isinstance(value, CompilationConfig):
        cfg = value
    elif isinstance(value, int) and not isinstance(value, bool):
        cfg = CompilationConfig(mode=value)
    elif isinstance(value, dict):
        cfg = CompilationConfig(**value)
    else:
        raise _bad("compilation_config", "an int, a dict or a CompilationConfig", value)
    return CompilationConfig(mode=0, cudagraph_capture_sizes=[]) if enforce_eager else cfg


def _worker_cls(value: Any) -> Union[str, type]:
    """``worker_cls`` checked before any launch: "auto", a dotted path (imported here, and by
    the EngineCore at launch) or a class (cloudpickled into the launch spec,
    engine/client/core_launcher.py). ValueError unless it names an ``engine.worker.Worker``."""
    if isinstance(value, str) and value == "auto":
        return value
    from engine.worker import resolve_worker_cls

    resolve_worker_cls(value)
    return value


def _kv_cache_memory_bytes(args: EngineArgs, device: str) -> Optional[int]:
    """``kv_cache_memory_bytes``, or its alias ``kv_cache_memory``; by default 2 GiB on CPU and,
    on CUDA, None: the runner sizes the cache from free memory and ``gpu_memory_utilization``."""
    given = {name: getattr(args, name) for name in ("kv_cache_memory_bytes", "kv_cache_memory")
             if getattr(args, name) is not None}
    if len(set(given.values())) > 1:
        raise ValueError(f"kv_cache_memory_bytes and its alias kv_cache_memory disagree: {given}")
    if not given:
        return 2 << 30 if device == "cpu" else None
    name, value = next(iter(given.items()))
    return _positive_int(name, value, 1)


_QUANTIZATIONS = (None, "gguf", "int8")


def int8_kernel_built() -> bool:
    """Whether the W8A8 kernels are importable and built, checked without importing torch."""
    import importlib.util

    return importlib.util.find_spec("engine.kernels.int8_linear") is not None and _cpu_kernels_built()


def _cpu_kernels_built() -> bool:
    """Whether the compiled CPU kernels (engine/kernels/_cpu.*.so) are there, without importing them."""
    kernels = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")
    return any(name.startswith("_cpu.") and name.endswith(".so") for name in os.listdir(kernels))


def _resolve_quantization(args: EngineArgs, load_format: str, device: str) -> Optional[str]:
    """A .gguf model runs its own blocks ("gguf", vLLM's name, the default there); "int8"
    quantizes a float checkpoint's projections at load (CPU, when the kernel is built)."""
    q = args.quantization
    if load_format == "gguf":
        if q not in (None, "gguf"):
            raise _bad("quantization", "None or 'gguf' for a .gguf model", q)
        return "gguf"
    if q == "gguf":
        raise ValueError(f"quantization='gguf' runs the quantized blocks of a .gguf file, but model "
                         f"{args.model!r} is a directory of float weights: pass a .gguf file as model, "
                         "or leave quantization unset (or 'int8' to quantize these weights at load)")
    if q == "int8":
        if device != "cpu":
            raise ValueError(f"quantization='int8' runs only on the CPU (its W8A8 kernels are C), but "
                             f"device is {device!r}: use device='cpu' or leave quantization unset")
        if not int8_kernel_built():
            raise ValueError("quantization='int8' is not supported here: the W8A8 kernels "
                             "(engine/kernels/int8_linear.py) are not built (run scripts/setup.sh)")
    return q


def _check_single_device(args: EngineArgs) -> None:
    """vLLM's parallelism and quantization keywords, at the one value ringllm runs."""
    for name in ("tensor_parallel_size", "pipeline_parallel_size"):
        value = getattr(args, name)
        if value != 1:
            raise ValueError(f"{name}={value!r} is not supported: each EngineCore runs the whole model on one "
                             f"device, so {name} must be 1 (for more engines use data_parallel_size)")
    if args.quantization not in _QUANTIZATIONS:
        raise ValueError(f"quantization={args.quantization!r} is not supported; supported: None (weights in the "
                         "model's dtype), 'gguf' (a .gguf model's own blocks, its default), 'int8' (dynamic W8A8 "
                         "from a float checkpoint)")
    if not isinstance(args.shutdown_timeout, (int, float)) or isinstance(args.shutdown_timeout, bool) \
            or not 0 <= args.shutdown_timeout < float("inf"):
        raise _bad("shutdown_timeout", "a finite number of seconds >= 0", args.shutdown_timeout)


class _CheckedArgs(NamedTuple):
    block_size: int
    compilation: CompilationConfig
    kv_transfer: Optional[KVTransferConfig]
    launch: CoreLaunch


def _check_args(args: EngineArgs) -> _CheckedArgs:
    """Every check that needs no model (ValueError naming the field): milliseconds, so it runs
    before any core process starts, where reading the model's config takes seconds."""
    if args.load_format not in _LOAD_FORMATS:
        raise _bad("load_format", f"one of {_LOAD_FORMATS}", args.load_format)
    if args.transport not in ("shm", "zmq"):
        raise _bad("transport", "'shm' or 'zmq'", args.transport)
    if args.scheduling_policy not in ("fcfs", "priority"):
        raise _bad("scheduling_policy", "'fcfs' or 'priority'", args.scheduling_policy)
    block_size = _positive_int("block_size", args.block_size, 1, 1024)
    if block_size & (block_size - 1):
        raise _bad("block_size", "a power of two in [1, 1024]", block_size)
    dp = _positive_int("data_parallel_size", args.data_parallel_size, 1, 64)
    if args.data_parallel_rank is not None:
        _positive_int("data_parallel_rank", args.data_parallel_rank, 0, dp - 1)
    if not 0.0 < args.gpu_memory_utilization <= 1.0:
        raise _bad("gpu_memory_utilization", "in (0, 1]", args.gpu_memory_utilization)
    _positive_int("max_logprobs", args.max_logprobs, 0)
    _positive_int("max_prompt_logprobs_entries", args.max_prompt_logprobs_entries, 0)
    _positive_int("renderer_num_workers", args.renderer_num_workers, 1)
    ring_capacity = _positive_int("ring_capacity", args.ring_capacity, 1 << 12, 1 << 32)
    if ring_capacity & (ring_capacity - 1):
        raise _bad("ring_capacity", "a power of two in [4096, 2**32]", ring_capacity)
    _check_single_device(args)
    compilation = _compilation(args.compilation_config, args.enforce_eager)
    if args.deterministic and compilation.mode != 0:
        raise ValueError("deterministic: runs the eager forward (its kernels are chosen per op, not per "
                         "graph); drop compilation_config or set its mode to 0")
    worker_cls = _worker_cls(args.worker_cls)
    kv_transfer = resolve_kv_transfer_config(args.kv_transfer_config)
    resolve_kv_events_config(args.kv_events_config)
    resolve_structured_outputs_config(args.structured_outputs_config)
    resolve_speculative_config(args.speculative_config)
    if resolve_lora_config(args) is not None and compilation.mode != 0:
        raise ValueError("enable_lora: the compiled graphs do not carry the adapters' per-row updates; drop "
                         "compilation_config or set its mode to 0")
    num_threads = args.num_threads if args.num_threads is not None else default_num_threads(args.model)
    _positive_int("num_threads", num_threads, 1, 1024)
    parallel = ParallelConfig(data_parallel_size=dp, data_parallel_rank=args.data_parallel_rank,
                              data_parallel_external_lb=args.data_parallel_external_lb)
    launch = CoreLaunch(args.transport, ring_capacity, num_threads, worker_cls, parallel, args)
    return _CheckedArgs(block_size, compilation, kv_transfer, launch)


def core_launch(args: EngineArgs) -> CoreLaunch:
    """What a core launch takes, after every check that needs no model: arguments that are wrong
    on their face never start a process (see CoreLaunch)."""
    return _check_args(args).launch


def create_engine_config(args: EngineArgs) -> EngineConfig:
    block_size, compilation, kv_transfer, launch = _check_args(args)

    path, load_format = _resolve_model(args)
    hf_config = _load_hf_config(path, load_format, args)
    archs = list(getattr(hf_config, "architectures", None) or [])
    if not archs and load_format == "gguf":  # a GGUF's config names its model_type only
        model_type = getattr(hf_config, "model_type", "?")
        archs = [_GGUF_ARCHITECTURES.get(model_type, model_type)]
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise ValueError(
            f"model: {_config_file(path, load_format)}: architecture "
            f"{archs or getattr(hf_config, 'model_type', '?')} is not supported; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    runner, convert, pooler = resolve_runner(args.runner, args.convert, args.pooler_config, arch)
    if is_classifier(arch):
        classifier_labels(hf_config)  # a bad id2label is refused at start, not at the first request
    # MEAN pooling needs every prompt row computed: no prefix cache, no KV loaded by a connector
    # (LAST pooling always computes the last prompt token, so both are fine there).
    mean_pooling = pooler is not None and pooler.pooling_type == "MEAN"
    if mean_pooling and kv_transfer is not None:
        raise ValueError("kv_transfer_config: MEAN pooling computes every prompt token, so KV loaded from a "
                         "connector cannot be used; drop kv_transfer_config or use pooling_type LAST")

    device = resolve_device(args.device)
    if args.deterministic and device != "cpu":
        raise ValueError(f"deterministic: batch-invariant kernels exist for the CPU only, not for device {device!r}")
    dtype = _resolve_dtype(args.dtype, device, hf_config)
    max_pos = int(getattr(hf_config, "max_position_embeddings", 2048))
    max_model_len = max_pos if args.max_model_len is None else _positive_int(
        "max_model_len", args.max_model_len, 1, max_pos)

    max_num_seqs = _positive_int("max_num_seqs", args.max_num_seqs if args.max_num_seqs is not None else 256, 1, 4096)
    if args.max_num_batched_tokens is None:
        max_batched = 2048 if args.enable_chunked_prefill else max(max_model_len, 2048)
    else:
        max_batched = _positive_int("max_num_batched_tokens", args.max_num_batched_tokens, 1)
    if not args.enable_chunked_prefill and max_batched < max_model_len:
        raise ValueError(
            f"max_num_batched_tokens must be >= max_model_len={max_model_len} when chunked prefill is "
            f"disabled, got {max_batched}")
    if args.max_num_prefill_tokens == "auto":
        max_prefill, step_target = PACED_INITIAL_TOKENS, PACED_STEP_TARGET_S
    else:
        max_prefill, step_target = _positive_int("max_num_prefill_tokens", args.max_num_prefill_tokens or 0, 0), 0.0
    if max_batched < max_num_seqs:
        max_num_seqs = max_batched  # one token per sequence per step is the least a step can give

    kv_mem = _kv_cache_memory_bytes(args, device)

    served = args.served_model_name or args.model or DEFAULT_MODEL
    return EngineConfig(
        model_config=ModelConfig(
            model=args.model or DEFAULT_MODEL, model_path=path,
            tokenizer=os.path.expanduser(args.tokenizer) if args.tokenizer else _tokenizer_for(path),
            load_format=load_format, hf_config=hf_config, architecture=arch, dtype=dtype,
            max_model_len=max_model_len, vocab_size=int(hf_config.vocab_size), seed=args.seed,
            max_logprobs=args.max_logprobs, max_prompt_logprobs_entries=args.max_prompt_logprobs_entries,
            served_model_name=served,
            skip_tokenizer_init=args.skip_tokenizer_init, runner_type=runner, convert_type=convert,
            pooler_config=pooler, quantization=_resolve_quantization(args, load_format, device),
            deterministic=bool(args.deterministic)),
        cache_config=CacheConfig(block_size=block_size,
                                 enable_prefix_caching=bool(args.enable_prefix_caching) and not mean_pooling,
                                 kv_cache_memory=kv_mem, gpu_memory_utilization=args.gpu_memory_utilization),
        scheduler_config=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_batched,
                                         enable_chunked_prefill=bool(args.enable_chunked_prefill),
                                         policy=args.scheduling_policy, max_num_prefill_tokens=max_prefill,
                                         prefill_step_target_s=step_target),
        parallel_config=launch.parallel_config,
        compilation_config=compilation, device=device, num_threads=launch.num_threads,
        transport=launch.transport, ring_capacity=launch.ring_capacity,
        disable_log_stats=args.disable_log_stats, engine_args=args, worker_cls=launch.worker_cls,
        kv_transfer_config=kv_transfer, kv_events_config=resolve_kv_events_config(args.kv_events_config),
        speculative_config=resolve_speculative_config(args.speculative_config),
        lora_config=resolve_lora_config(args),
    )


def non_default_args(args: EngineArgs) -> dict[str, Any]:
    """The fields a user set, for the one log line LLM prints at start-up."""
    defaults = type(args)()
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(args)
            if getattr(args, f.name) != getattr(defaults, f.name)}
