"""``KVTransferConfig``: which KV connector an engine uses, and in which role (vLLM's names).

    LLM(model, kv_transfer_config={"kv_connector": "SharedStorageConnector", "kv_role": "kv_both",
                                   "kv_connector_extra_config": {"shared_storage_path": "/dev/shm/kv-$USER"}})

A msgspec Struct, so that a dict converts with type checks (``msgspec.convert``) and the
config crosses to the EngineCore process as a plain JSON object with the other EngineArgs.
``resolve_kv_transfer_config`` is the one entry point ``create_engine_config`` calls: it
accepts a dict or a ``KVTransferConfig``, and every problem (unknown connector or role, an
unknown key, a wrong type, a missing or unusable storage path) is a ValueError naming the
field, whose ``__cause__`` is the underlying error (msgspec's ValidationError, an OSError),
as vLLM re-raises its pydantic errors. It runs in the frontend, before any process starts,
and so a store directory that is not private to this user (store_dir.py) is refused there, by
name, owner and mode, before the EngineCore starts (the core checks it again when it opens it).
"""

from __future__ import annotations

import os
from typing import Any, Optional, Union

import msgspec

from engine.kv_transfer.store_dir import StoreDir, StoreDirError

KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")

# Default bound on the bytes a shared-storage directory may hold (see SharedStorageParams).
DEFAULT_MAX_BYTES = 4 << 30


class SharedStorageParams(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``kv_connector_extra_config`` of the SharedStorageConnector.

    shared_storage_path: the directory of entries, private to the server's user: created mode 0700
        if missing, refused if another user owns it or its group or others may write to it. On
        /dev/shm it is shared memory between the instances of one user on one host.
    max_bytes: bound on the bytes of all entries in the directory; least recently used entries
        are evicted beyond it. Default: the smaller of 4 GiB and half the filesystem's size.
    fsync: fsync each entry before publishing it (only useful on a disk that may lose power).
    io_timeout_s: how long a step waits for the store's file work (one request's loads, one
        step's saves) before going on without the store until that work returns (io_worker.py).
    """

    shared_storage_path: str
    max_bytes: Optional[int] = None
    fsync: bool = False
    io_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if not self.shared_storage_path:
            raise ValueError("shared_storage_path must be a non-empty directory path")
        if self.max_bytes is not None and self.max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {self.max_bytes}")
        if not self.io_timeout_s > 0:
            raise ValueError(f"io_timeout_s must be > 0, got {self.io_timeout_s}")


# Connector name -> the Struct its kv_connector_extra_config must convert to.
CONNECTOR_PARAMS: dict[str, type[msgspec.Struct]] = {"SharedStorageConnector": SharedStorageParams}


class KVTransferConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    kv_connector: Optional[str] = None  # None: no KV transfer
    kv_role: Optional[str] = None  # kv_producer | kv_consumer | kv_both
    kv_connector_extra_config: dict[str, Any] = {}

    def __post_init__(self) -> None:
        if self.kv_connector is None:
            return
        if self.kv_connector not in CONNECTOR_PARAMS:
            raise ValueError(f"kv_connector must be one of {sorted(CONNECTOR_PARAMS)}, got {self.kv_connector!r}")
        if self.kv_role not in KV_ROLES:
            raise ValueError(f"kv_role must be one of {KV_ROLES} when kv_connector is set, got {self.kv_role!r}")
        if not isinstance(self.kv_connector_extra_config, dict):
            raise ValueError(f"kv_connector_extra_config must be a dict, got {self.kv_connector_extra_config!r}")
        try:
            self.connector_params()
        except msgspec.ValidationError as e:
            raise ValueError(f"kv_connector_extra_config: {e}") from e

    @property
    def is_kv_transfer_instance(self) -> bool:
        return self.kv_connector is not None

    @property
    def is_kv_producer(self) -> bool:
        return self.kv_connector is not None and self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_kv_consumer(self) -> bool:
        return self.kv_connector is not None and self.kv_role in ("kv_consumer", "kv_both")

    def get_from_extra_config(self, key: str, default: Any) -> Any:
        return self.kv_connector_extra_config.get(key, default)

    def connector_params(self) -> msgspec.Struct:
        """The extra config as its connector's typed parameters (raises ValidationError)."""
        return msgspec.convert(self.kv_connector_extra_config, CONNECTOR_PARAMS[self.kv_connector])


def resolve_kv_transfer_config(value: Union[None, dict, KVTransferConfig]) -> Optional[KVTransferConfig]:
    """The validated config (None: no KV transfer), its storage directory created and checked."""
    if value is None:
        return None
    # A Struct built directly ran __post_init__ but had no type checks: convert it again.
    raw = msgspec.to_builtins(value) if isinstance(value, KVTransferConfig) else value
    try:
        value = msgspec.convert(raw, KVTransferConfig)
    except msgspec.ValidationError as e:
        raise ValueError(f"kv_transfer_config: {e}") from e
    if value.kv_connector is None:
        return None
    _check_storage(value)
    return value


def _check_storage(config: KVTransferConfig) -> None:
    """The directory exists (created, mode 0700, if missing), is private to this user, has a
    usable secret, and allows what the role needs."""
    path = config.connector_params().shared_storage_path
    field = "kv_transfer_config.kv_connector_extra_config.shared_storage_path"
    try:
        StoreDir(path).close()
    except StoreDirError as e:
        raise ValueError(f"{field}: {e}") from e.__cause__
    need = os.R_OK | os.X_OK | (os.W_OK if config.is_kv_producer else 0)
    if not os.access(path, need):
        cause = PermissionError(f"access({path!r}) denied for the {config.kv_role} role")
        raise ValueError(
            f"{field}: directory {path!r} is not {'writable' if config.is_kv_producer else 'readable'}"
        ) from cause
