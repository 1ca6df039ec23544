"""``KVEventsConfig``: whether and where the EngineCore publishes its KV-cache events (vLLM's
``kv_events_config``, same fields and defaults).

    ringllm serve --kv-events-config '{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557"}'

A msgspec Struct, so a dict converts with type checks and the config crosses to the EngineCore
process as plain JSON with the other EngineArgs. ``resolve_kv_events_config`` is what
``create_engine_config`` calls: every problem is a ValueError naming the field.
"""
from __future__ import annotations

from typing import Any, Optional

import msgspec

PUBLISHERS = ("null", "zmq")
ENDPOINT_SCHEMES = ("tcp://", "ipc://", "inproc://")


class KVEventsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    enable_kv_cache_events: bool = False
    # "zmq" or "null"; None: zmq when events are enabled, else null (as vLLM)
    publisher: Optional[str] = None
    # PUB address: with "*" or "::", or ipc:// / inproc://, it binds; otherwise it connects (vLLM's rule)
    endpoint: str = "tcp://*:5557"
    # ROUTER address where a subscriber asks for the batches it missed from a sequence number on
    replay_endpoint: Optional[str] = None
    buffer_steps: int = 10_000  # batches kept for replay
    hwm: int = 100_000  # the PUB socket's high-water mark
    max_queue_size: int = 100_000  # batches waiting for the publisher thread; past it they are dropped
    topic: str = ""

    @property
    def active(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"


def resolve_kv_events_config(value: Any) -> Optional[KVEventsConfig]:
    """A dict or a KVEventsConfig, checked; None when no events are to be published."""
    if value is None:
        return None
    try:
        config = value if isinstance(value, KVEventsConfig) else msgspec.convert(value, KVEventsConfig)
    except msgspec.ValidationError as e:
        raise ValueError(f"kv_events_config: {e}") from e
    if config.publisher is None:
        config = msgspec.structs.replace(config, publisher="zmq" if config.enable_kv_cache_events else "null")
    if config.publisher not in PUBLISHERS:
        raise ValueError(f"kv_events_config.publisher must be one of {', '.join(PUBLISHERS)}, got {config.publisher!r}")
    for name in ("endpoint", "replay_endpoint"):
        endpoint = getattr(config, name)
        if endpoint is not None and not endpoint.startswith(ENDPOINT_SCHEMES):
            raise ValueError(f"kv_events_config.{name} must start with {', '.join(ENDPOINT_SCHEMES)}, got {endpoint!r}")
    for name in ("buffer_steps", "hwm", "max_queue_size"):
        if getattr(config, name) < 1:
            raise ValueError(f"kv_events_config.{name} must be >= 1, got {getattr(config, name)!r}")
    return config if config.active else None
