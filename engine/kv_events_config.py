"""``KVEventsConfig``: whether and where the EngineCore publishes its KV-cache events (vLLM's
``kv_events_config``, its fields, and two of ours that make it safe by default).

    ringllm serve --kv-events-config '{"enable_kv_cache_events": true}'

The events describe what users' prompts put in the cache, so they never leave the host unless
asked, and carry no more than a router needs:

- ``endpoint`` unset: an ``ipc://`` socket in a private directory (0700) that the publisher makes
  and removes (``shm_transport/ipc_dir.py``): only this user's processes can subscribe. Its path
  is logged at start. vLLM's default, ``tcp://*:5557``, listens on every interface unauthenticated.
- An endpoint (or ``replay_endpoint``) that is not loopback, an ipc path or inproc (a wildcard such
  as ``tcp://*:P``, an address or name of another interface or host) is refused unless
  ``allow_remote`` is true, and the publisher warns when it opens one.
- ``token_ids`` of ``BlockStored`` (the prompt's text, in effect) is sent empty, and its
  ``extra_keys`` (a request's ``cache_salt``, which a tenant keeps secret so that nobody else
  shares its cache) absent, unless ``include_token_ids``: routers such as llm-d's indexer key on
  the block hashes, and ours are the cache's own digests, which no subscriber recomputes from
  tokens. The fields stay in the message, so vLLM-compatible subscribers decode it either way.

A msgspec Struct, so a dict converts with type checks and the config crosses to the EngineCore
process as plain JSON with the other EngineArgs. ``resolve_kv_events_config`` is what
``create_engine_config`` calls: every problem is a ValueError naming the field.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Optional

import msgspec

PUBLISHERS = ("null", "zmq")
ENDPOINT_SCHEMES = ("tcp://", "ipc://", "inproc://")


class KVEventsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    enable_kv_cache_events: bool = False
    # "zmq" or "null"; None: zmq when events are enabled, else null (as vLLM)
    publisher: Optional[str] = None
    # PUB address: with "*" or "::", or ipc:// / inproc://, it binds; otherwise it connects (vLLM's rule).
    # None: ipc://<a private directory>/kv-events, bound (see the module docstring)
    endpoint: Optional[str] = None
    # ROUTER address where a subscriber asks for the batches it missed from a sequence number on
    replay_endpoint: Optional[str] = None
    buffer_steps: int = 10_000  # batches kept for replay
    hwm: int = 100_000  # the PUB socket's high-water mark
    max_queue_size: int = 100_000  # batches waiting for the publisher thread; past it they are dropped
    topic: str = ""
    allow_remote: bool = False  # endpoints other hosts can reach (a wildcard, another interface or host)
    include_token_ids: bool = False  # BlockStored.token_ids (and extra_keys: cache salts) filled, else empty

    @property
    def active(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"


def is_remote(endpoint: str) -> bool:
    """Whether another host may reach ``endpoint``: a tcp address that is not loopback (a
    wildcard, another interface's address or name, a remote host). ipc and inproc stay local."""
    if not endpoint.startswith("tcp://"):
        return False
    # zmq's tcp address is [source;]host:port; every host named must be loopback
    for address in endpoint[len("tcp://") :].split(";"):
        host = address.rpartition(":")[0].strip("[]")
        if host == "localhost":
            continue
        try:
            if not ipaddress.ip_address(host).is_loopback:
                return True
        except ValueError:  # "*", an interface name, a host name
            return True
    return False


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
        if endpoint is None:
            continue
        if not endpoint.startswith(ENDPOINT_SCHEMES):
            raise ValueError(f"kv_events_config.{name} must start with {', '.join(ENDPOINT_SCHEMES)}, got {endpoint!r}")
        if is_remote(endpoint) and not config.allow_remote:
            raise ValueError(
                f"kv_events_config.{name} {endpoint!r} can be reached from other hosts, and the events "
                "reveal what users' prompts cached: use a loopback or ipc:// address, or set "
                "kv_events_config.allow_remote to true"
            )
    for name in ("buffer_steps", "hwm", "max_queue_size"):
        if getattr(config, name) < 1:
            raise ValueError(f"kv_events_config.{name} must be >= 1, got {getattr(config, name)!r}")
    return config if config.active else None
