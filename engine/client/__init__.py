"""Clients that connect the frontend to an EngineCore (in-process or behind the ring)."""
from engine.client.core_client import EngineCoreClient, InprocClient

__all__ = ["EngineCoreClient", "InprocClient"]
