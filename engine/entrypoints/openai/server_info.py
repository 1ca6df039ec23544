"""GET /server_info: the public summary of what this server runs, for operators and routers.

vLLM answers with its whole config; this answers with a list of named fields chosen here, so
nothing is told by accident: no API key, no local path (the model is named by its served name),
no environment. A field is added here on purpose or not at all.
"""

from __future__ import annotations

from typing import Any

from engine.entrypoints.openai.serving_misc import ringllm_version


def server_info(config: Any, settings: Any) -> dict[str, Any]:
    """``config``: the engine's EngineConfig; ``settings``: the server's ServerSettings."""
    model, cache, scheduler = config.model_config, config.cache_config, config.scheduler_config
    parser = settings.tool_serving.parser_cls
    store = settings.responses_store
    return {
        "version": ringllm_version(),
        "model": {
            "served_model_name": model.served_model_name,
            "architecture": model.architecture,
            "runner": model.runner_type,
            "dtype": model.dtype,
            "quantization": model.quantization,
            "max_model_len": model.max_model_len,
            "vocab_size": model.vocab_size,
        },
        "engine": {
            "device": config.device,
            "num_threads": config.num_threads,
            "transport": config.transport,
            "data_parallel_size": config.parallel_config.data_parallel_size,
        },
        "cache": {"block_size": cache.block_size, "enable_prefix_caching": cache.enable_prefix_caching},
        "scheduler": {
            "max_num_seqs": scheduler.max_num_seqs,
            "max_num_batched_tokens": scheduler.max_num_batched_tokens,
            "enable_chunked_prefill": scheduler.enable_chunked_prefill,
            "policy": scheduler.policy,
        },
        "server": {
            "api_key_required": settings.api_key is not None,
            "max_request_body_bytes": settings.max_request_body_bytes,
            "max_waiting_requests": settings.max_waiting_requests,
            "request_timeout_s": settings.request_timeout_s,
            "enable_auto_tool_choice": settings.tool_serving.enable_auto_tool_choice,
            "tool_call_parser": parser.__name__ if parser else None,
            "responses_store": {
                "max_entries": store.max_entries,
                "max_bytes": store.max_bytes,
                "max_age_s": store.max_age_s,
            },
        },
    }
