"""KV transfer between engines (vLLM's ``kv_transfer_config``): config.py validates the config,
shared_storage.py is the one connector, store.py and entry.py the directory and its file layout."""

from __future__ import annotations

from typing import Any

# The package imports none of its modules at its top: engine/config/ imports config.py, and
# a package that imported its own submodules back would sit in an import circle with them.
__all__ = ["make_kv_connector"]


def make_kv_connector(config: Any, model: Any):
    """The EngineCore's connector for ``config.kv_transfer_config`` (None: no KV transfer).
    ``model`` gives the KV block geometry and dtype the entries must match."""
    kv_config = getattr(config, "kv_transfer_config", None)
    if kv_config is None or kv_config.kv_connector is None:
        return None
    from engine.kv_transfer.shared_storage import SharedStorageConnector, layout_for

    return SharedStorageConnector(kv_config, layout_for(config, model))
